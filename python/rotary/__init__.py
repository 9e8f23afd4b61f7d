"""rotary: Rotary Position Embeddings, exact at any context length.

Backed by the C++ library: schedules in double, cos/sin tables within 1 ulp at any position below
2^31, SIMD kernels threaded with OpenMP. numpy arrays and torch CPU tensors are borrowed through
DLPack: nothing is copied, and ``inplace=True`` writes the caller's memory.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

import numpy as np

from . import _rotary

__all__ = ["Rope", "permute_for_pairing", "preset_names", "RotaryError"]

RotaryError = _rotary.RotaryError  # a ValueError


def preset_names() -> list[str]:
    """Names of the built-in model presets (real models' RoPE settings)."""
    return list(_rotary.preset_names())


def _require_int(value: Any, name: str) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _check_tensor(x: Any, name: str) -> None:
    if isinstance(x, np.ndarray) or _is_torch(x):
        return
    raise TypeError(f"{name} must be a numpy.ndarray or torch.Tensor, got {type(x).__name__}")


def _empty_like(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.empty_like(x)  # keeps the memory order of x
    import torch
    return torch.empty_like(x)


def _positions_array(positions: Any, name: str = "positions") -> np.ndarray:
    if _is_torch(positions):
        positions = positions.detach().cpu().numpy()
    arr = np.asarray(positions)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)


class Rope:
    """One model's RoPE: frequencies (``inv_freq``), ``attention_factor``, and ``apply``.

    Args:
        head_dim: width of one attention head.
        rotary_dim: rotated leading channels (default ``head_dim``); even.
        base: ``rope_theta``.
        pairing: ``"half"`` (pairs ``(x[i], x[i + r/2])``, Hugging Face ``rotate_half``) or
            ``"interleaved"`` (pairs ``(x[2i], x[2i+1])``, Meta LLaMA / RoFormer).
        schedule: ``default``, ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``
            or ``monotone``.
        seq_len: current sequence length, for ``dynamic`` and ``longrope``.
        **schedule_args: ``factor``, ``original_max_position``, ``max_position``, ``beta_fast``,
            ``beta_slow``, ``mscale``, ``mscale_all_dim``, ``truncate``, ``attention_factor``,
            ``low_freq_factor``, ``high_freq_factor``, ``short_factor``, ``long_factor``,
            ``max_length``, ``monotone_scale``.

    Raises ValueError naming the offending argument (e.g. ``rotary_dim=130 exceeds head_dim=128``).
    """

    def __init__(self, head_dim: int, rotary_dim: Optional[int] = None, base: float = 10000.0,
                 pairing: str = "half", schedule: str = "default", seq_len: Optional[int] = None,
                 **schedule_args: Any) -> None:
        _require_int(head_dim, "head_dim")
        if rotary_dim is not None:
            _require_int(rotary_dim, "rotary_dim")
        if seq_len is not None:
            _require_int(seq_len, "seq_len")
        if not isinstance(base, (int, float, np.integer, np.floating)) or isinstance(base, bool):
            raise TypeError(f"base must be a number, got {type(base).__name__}")
        for name, value in (("pairing", pairing), ("schedule", schedule)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        self._impl = _rotary.Rope(int(head_dim), rotary_dim, float(base), pairing, schedule, seq_len,
                                  schedule_args)
        self.notes: list[str] = []

    @classmethod
    def _wrap(cls, impl: Any, notes: Sequence[str] = ()) -> "Rope":
        rope = cls.__new__(cls)
        rope._impl = impl
        rope.notes = list(notes)
        return rope

    @classmethod
    def from_hf_config(cls, path_or_dict: Any, seq_len: Optional[int] = None) -> "Rope":
        """From a Hugging Face ``config.json`` (path) or its dict, resolved as transformers does."""
        if isinstance(path_or_dict, dict):
            text = json.dumps(path_or_dict)
        elif isinstance(path_or_dict, (str, os.PathLike)):
            with open(path_or_dict, "r", encoding="utf-8") as f:
                text = f.read()
        else:
            raise TypeError(f"path_or_dict must be a path or a dict, got {type(path_or_dict).__name__}")
        impl, notes = _rotary.Rope.from_config_text(text, seq_len)
        return cls._wrap(impl, notes)

    @classmethod
    def from_preset(cls, name: str, seq_len: Optional[int] = None) -> "Rope":
        """From a built-in preset (see ``rotary.preset_names()``); ``notes`` holds what resolving it
        found worth saying (e.g. an explicit YaRN factor overriding the context-length ratio)."""
        impl, notes = _rotary.Rope.from_preset(name, seq_len)
        return cls._wrap(impl, notes)

    inv_freq = property(lambda self: np.array(self._impl.inv_freq, dtype=np.float64),
                        doc="Angular frequency of each pair (radians per position), float64 [rotary_dim/2].")
    attention_factor = property(lambda self: self._impl.attention_factor,
                                doc="Factor multiplied into cos and sin (YaRN mscale, LongRoPE).")
    head_dim = property(lambda self: self._impl.head_dim)
    rotary_dim = property(lambda self: self._impl.rotary_dim)
    pairing = property(lambda self: self._impl.pairing)
    schedule = property(lambda self: self._impl.schedule)
    base = property(lambda self: self._impl.base)

    def table(self, positions: Any, angles: str = "exact") -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin), float32 [len(positions), rotary_dim/2], times attention_factor; within 1 ulp
        of the exact values (``angles="hf-float32"`` reproduces transformers' float32 pipeline)."""
        return self._impl.table(_positions_array(positions), angles)

    def apply(self, q: Any, k: Any = None, *, positions: Any = None, offset: int = 0, layout: str = "bshd",
              inplace: bool = False, inverse: bool = False, angles: str = "table", threads: int = 0) -> Any:
        """Rotates q (and k) and returns them (a tuple when k is given), as the same kind of object.

        Args:
            q, k: numpy arrays or torch CPU tensors, float32/float64/float16/bfloat16, 4-D:
                ``[batch, seq, heads, head_dim]`` (``layout="bshd"``) or ``[batch, heads, seq,
                head_dim]`` (``"bhsd"``); any strides (transposed views work without copies).
            positions: one integer per token, ``[batch, seq]`` (or ``[batch * seq]``); default
                ``offset + 0..seq-1`` for every batch row.
            inplace: write the results into q and k themselves.
            inverse: rotate by -angle (the backward pass).
            angles: ``"table"`` (cached exact cos/sin), ``"on_the_fly"`` (exact, computed per
                call) or ``"hf-float32"`` (transformers' float32 numerics).
            threads: 0 = all; results are bit-identical for any count.
        """
        _check_tensor(q, "q")
        if k is not None:
            _check_tensor(k, "k")
            if type(k) is not type(q):
                raise TypeError(f"k must be the same kind as q ({type(q).__name__}), got {type(k).__name__}")
        if not isinstance(offset, (int, np.integer)) or isinstance(offset, bool):
            raise TypeError(f"offset must be an int, got {type(offset).__name__}")
        pos = None if positions is None else _positions_array(positions)
        q_out = None if inplace else _empty_like(q)
        k_out = None if (inplace or k is None) else _empty_like(k)
        self._impl.apply(q, k, q_out, k_out, pos, int(offset), layout, bool(inverse), angles, int(threads))
        rq = q if inplace else q_out
        if k is None:
            return rq
        return rq, (k if inplace else k_out)

    def __repr__(self) -> str:
        return (f"Rope(head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"pairing='{self.pairing}', schedule='{self.schedule}', attention_factor={self.attention_factor})")


def permute_for_pairing(weight: Any, num_heads: int, to: str = "half", rotary_dim: Optional[int] = None) -> Any:
    """Rows of a q/k projection weight ``[num_heads * head_dim, ...]`` (or bias) permuted per head so
    that RoPE with pairing ``to`` gives the attention scores the other pairing gave (use
    ``num_heads=num_key_value_heads`` for W_k). Returns a new array/tensor of the same kind."""
    _check_tensor(weight, "weight")
    if to not in ("half", "interleaved"):
        raise ValueError(f"to='{to}' must be 'half' or 'interleaved'")
    if not isinstance(num_heads, (int, np.integer)) or num_heads <= 0:
        raise ValueError(f"num_heads={num_heads} must be a positive int")
    rows = weight.shape[0]
    if rows % num_heads:
        raise ValueError(f"weight has {rows} rows, not a multiple of num_heads={num_heads}")
    head_dim = rows // num_heads
    source = _rotary.pairing_permutation(head_dim, rotary_dim or 0, "interleaved" if to == "half" else "half", to)
    index = (np.arange(num_heads)[:, None] * head_dim + np.asarray(source)[None, :]).reshape(-1)
    if isinstance(weight, np.ndarray):
        return weight[index].copy()
    import torch
    return weight.index_select(0, torch.as_tensor(index, device=weight.device))
