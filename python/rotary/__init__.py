"""rotary: Rotary Position Embeddings, exact at any context length.

Backed by the C++ library: schedules in double, cos/sin tables within 1 ulp at any position below
2^31, SIMD kernels threaded with OpenMP, and (``pip install .
--config-settings=cmake.define.ROTARY_CUDA=ON``) CUDA kernels giving the same bits. numpy arrays
(through the buffer protocol) and torch CPU and CUDA tensors (through DLPack) are borrowed: nothing
is copied, inputs are only read (read-only, memory-mapped and broadcast arrays and tensors that
require grad are fine), and ``inplace=True`` writes the caller's memory.
"""
from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import numpy as np

from . import _rotary
from ._version import __version__


def _check_extension(numpy_version: str, pybind11_version: Sequence[int]) -> None:
    """An extension built with pybind11 older than 2.12 misreads numpy 2's arrays (wrong values,
    no error): refuse that combination rather than compute with it."""
    if int(numpy_version.split(".")[0]) >= 2 and tuple(pybind11_version) < (2, 12):
        raise ImportError(f"rotary's extension was built with pybind11 {'.'.join(map(str, pybind11_version))}, "
                          f"which cannot read numpy {numpy_version} arrays; rebuild it with pybind11 >= 2.12 "
                          f"(pip install . does)")


_check_extension(np.__version__, _rotary.pybind11_version)
# The Rope class (rotary/_rope.py) and the argument helpers (rotary/_args.py); the helpers' names stay
# importable from here for code written against earlier releases.
from ._args import (_bool_arg, _check_tensor, _config_source, _int_arg, _is_torch,  # noqa: F401
                    _positions_and_streams, _positions_array, _show)
from ._rope import Rope, _rope_of_handle  # noqa: F401
from .mrope import MROPE_FAMILIES, mrope_decode_positions, mrope_positions

__all__ = ["__version__", "Rope", "permute_for_pairing", "preset_names", "layer_types", "doctor", "RotaryError",
           "max_threads", "mrope_positions", "mrope_decode_positions", "MROPE_FAMILIES", "build_info"]

RotaryError = _rotary.RotaryError  # a ValueError
max_threads: int = _rotary.max_threads  # the most threads one apply call takes


def build_info() -> dict[str, Any]:
    """What this build of rotary is and what it runs on this machine (as ``rotary info --build``).

    Returns
    -------
    dict
        ``version``; ``cpu_target``, the Highway instruction set the CPU kernels use here (``"AVX2"``,
        ``"AVX3"``, ...) and ``cpu_targets``, all those built in; ``cuda``: ``compiled`` (whether the
        CUDA kernels are in this build: ``pip install .`` builds them when it finds nvcc) and, when
        they are, ``architectures`` (``"sm_90"`` machine code, ``"compute_90 (PTX)"``), the CUDA
        ``runtime`` and ``driver`` versions, ``devices``, the current ``device``, ``usable``
        (whether the kernels run on it) and ``why_not``.
    """
    return _rotary.build_info()


def preset_names() -> list[str]:
    """Names of the built-in model presets (real models' RoPE settings).

    Returns
    -------
    list of str
    """
    return list(_rotary.preset_names())


def layer_types(path_or_dict: Any) -> list[str]:
    """The RoPE layer types of a Hugging Face config.

    Parameters
    ----------
    path_or_dict : str, os.PathLike or dict
        ``config.json`` or its dict.

    Returns
    -------
    list of str
        In the order they first appear: what ``Rope.from_hf_config(..., layer_type=...)``
        accepts; ``["full_attention"]`` when every layer shares one RoPE.
    """
    text, path = _config_source(path_or_dict)
    return list(_rotary.layer_types_text(text) if text is not None else _rotary.layer_types_file(path))


def doctor(path_or_dict: Any, context: Optional[int] = None, layer_type: Optional[str] = None) -> dict[str, Any]:
    """Where a model's RoPE loses precision over its context, and the rotary setting that avoids each loss.

    The library's report (``rotary doctor --json`` prints the same): transformers' float32 angle
    ``fl32(fl32(inv_freq) * fl32(p))`` against the exact ``p * inv_freq`` (the angle's own error, not
    reduced mod 2π, as ``rotary info``'s drift line): the first position and pair where it strays by
    more than 1e-3 rad, and each pair's error at the last position; the first position whose bf16
    cos/sin equal those of the next on some pair; each pair's wrap distance ``ceil(2π/inv_freq)``
    (He & Xu's c3) and the pairs that wrap inside the context; LongRoPE's and dynamic NTK's switch at
    the original length, YaRN's ramp and Llama 3's bands; with xPos, the positions beyond its reach
    (``xpos_range``).

    Parameters
    ----------
    path_or_dict : str, os.PathLike, dict or Rope
        A Hugging Face ``config.json`` or its dict, or a ``Rope`` (its settings; ``context`` is then
        needed unless they state a length, e.g. ``max_position``).
    context : int, optional
        Positions 0 .. context-1, in [1, 2^31]; default the model's own context length (its
        ``max_position_embeddings``, or YaRN's and Llama 3's factor times the original length when
        no larger length is stated).
    layer_type : str, optional
        One RoPE of a model whose layer types differ, as in ``Rope.from_hf_config``.

    Returns
    -------
    dict
        ``{"context", "context_source", "positions", "schedule", "float32_drift": {"threshold_rad",
        "first_position" (None: it never strays), "first_pair", "first_position_per_pair",
        "last_position", "max_rad_at_context", "worst_pair_at_context", "max_ulps_at_context",
        "rad_at_context_per_pair"}, "bf16_resolution": {"first_position", "pair"},
        "wrap_distance": [per pair, None for inv_freq 0], "wrapping_pairs", "hazards": [{"kind",
        "position", "detail"}]}``; each hazard's detail says what was found and how to avoid it.

    Raises
    ------
    TypeError
        path_or_dict neither a path, a dict nor a Rope, context not an int, layer_type not a str.
    ValueError
        context outside [1, 2^31] (or needed: the config states no length), an unknown layer_type,
        a config the library refuses or cannot read.
    """
    context = None if context is None else _int_arg(context, "context")
    if isinstance(path_or_dict, Rope):
        if layer_type is not None:
            raise ValueError("layer_type is for a config; a Rope has one set of settings")
        return json.loads(_rotary.doctor_rope(path_or_dict._impl, context))
    layer_type = "" if layer_type is None else layer_type
    text, path = _config_source(path_or_dict)
    if text is not None:
        report = _rotary.doctor_text(text, context, layer_type)
    else:
        report = _rotary.doctor_file(path, context, layer_type)
    return json.loads(report)


def permute_for_pairing(weight: Any, num_heads: int, to: str = "half", rotary_dim: Optional[int] = None) -> Any:
    """A q/k projection weight's rows permuted per head between the two pairings.

    Parameters
    ----------
    weight : numpy.ndarray or torch.Tensor
        ``[num_heads * head_dim, ...]`` (a weight or a bias).
    num_heads : int
        Heads in ``weight`` (``num_key_value_heads`` for W_k).
    to : {"half", "interleaved"}
        The pairing the permuted weight is for: RoPE with it gives the attention scores the
        other pairing gave with the original weight.
    rotary_dim : int, optional
        Width of the rotated slice (default head_dim); the rest stays in place.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        A new array or tensor of the same kind.

    Raises
    ------
    TypeError, ValueError
        An argument of the wrong kind or value, naming it.
    """
    _check_tensor(weight, "weight")
    num_heads = _int_arg(num_heads, "num_heads")
    if not isinstance(to, str):
        raise TypeError(f"to must be a str, got {type(to).__name__}")
    if to not in ("half", "interleaved"):
        raise ValueError(f"to={_show(to)} must be 'half' or 'interleaved'")
    rotary_dim = 0 if rotary_dim is None else _int_arg(rotary_dim, "rotary_dim")
    if num_heads <= 0:
        raise ValueError(f"num_heads={_show(num_heads)} must be > 0")
    if weight.ndim == 0:
        raise ValueError("weight must have at least 1 dimension (its rows), got a 0-d array")
    rows = weight.shape[0]
    if rows % num_heads or rows == 0:
        raise ValueError(f"weight has {rows} rows, not a positive multiple of num_heads={_show(num_heads)}")
    head_dim = rows // num_heads
    source = _rotary.pairing_permutation(head_dim, rotary_dim, "interleaved" if to == "half" else "half", to)
    index = (np.arange(num_heads)[:, None] * head_dim + np.asarray(source)[None, :]).reshape(-1)
    if isinstance(weight, np.ndarray):
        return weight[index].copy()
    import torch
    return weight.index_select(0, torch.as_tensor(index, device=weight.device))
