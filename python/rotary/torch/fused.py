"""Fused operations for serving engines (rotary/fused.hpp): RoPE + KV-cache write, QK-norm + RoPE,
cache re-rotation, as torch operators.

- ``rope_store(rope, q, k, v, k_cache, v_cache, slots, ...)``: q rotated in place; k rotated and, with
  v, written to the caches at the slots (fp8/int8 caches quantised with a scale).
- ``qk_norm_rope(rope, q, k, q_weight, k_weight, *, eps, ...)``: RMSNorm of q and k (per head or over
  all heads), then RoPE, in place; or RoPE then the norm (Llama 4); optionally v's weightless norm
  and rope_store's cache write in the same pass.
- ``slots_from_page_table(kv_indices, kv_indptr, batch_indices, positions, block_size)``: FlashInfer's
  page table as the slots these take.
- ``rerotate_cache(rope, k_cache, slots, delta, ...)``: cached keys moved in place by a per-slot
  position delta (or raw keys rotated once to their positions).

Each is bit-identical to its composition of rotary's primitives (``apply_rope``, then a scatter and
a quantiser: see ``rotary/fused.hpp``), so fusing never changes a model's output. Each goes through a
``torch.library`` operator that declares what it mutates (``torch.ops.rotary.rope_store``,
``qk_norm_rope``, ``rerotate_cache``), with a fake kernel, so ``torch.compile(fullgraph=True)``
traces it without a graph break; in eager mode the kernel is called directly. The operators take
the Rope by its handle (``Rope._handle``), as ``rotary.torch``'s others.

Devices: the CPU, and CUDA when the extension is built with rotary's CUDA kernels (``rotary._rotary.cuda``):
every tensor of a call on one device (positions, slots, scales, weights and ``cos_sin_cache`` too).
On CUDA a call is queued on torch's current stream without a host synchronisation (capturable in a
CUDA graph after a first call on the device): the kernels skip a token whose position is unusable or
whose slot is beyond the cache, write nothing when a scale tensor holds a value not finite and > 0,
and ``rotary.torch.check_positions(device)`` raises for them; slots
are checked for duplicates there only with ``check_duplicate_slots=True`` (otherwise which token
writes a shared slot is undefined), as the CPU always checks them.

Conventions where engines differ: the scale divides (``x / scale``: vLLM, SGLang) unless
``scale_mode="multiply"`` (``x * scale``: FlashInfer, TensorRT-LLM), the two giving different bits;
a duplicate slot is an error (named), a negative slot skips the token's cache write (vLLM's padding).
"""
from __future__ import annotations

import re
from typing import Any, Optional, Union

import torch

from .. import _rotary
from .._args import _renamed, _show, _written
from .._rope import Rope, _rope_of_handle
from . import _dispatch_modes, _is_compiling, _shapes_only

__all__ = ["rope_store", "qk_norm_rope", "rerotate_cache", "slots_from_page_table"]

Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
Scale = Union[None, float, Tensor]

_MODEL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_CACHE_DTYPES = _MODEL_DTYPES + (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
_INDEX_DTYPES = (torch.int64, torch.int32)
_QUANTISED_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
_NUMERICS = ("exact", "hf-float32")


# ---- Arguments -------------------------------------------------------------------------------------

def _tensor(value: Any, name: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, torch.Tensor):
        kinds = "a torch.Tensor or None" if optional else "a torch.Tensor"
        raise TypeError(f"{name} must be {kinds}, got {type(value).__name__}")


def _choice(value: Any, name: str, choices: tuple) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name}={_show(value)} must be " + " or ".join(f"'{c}'" for c in choices))
    return value


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int beyond the largest float
        raise ValueError(f"{name}={value} is beyond the range of a float") from None


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"{name}={value} is beyond int64")
    return value


def _activation(t: Tensor, name: str) -> Tensor:
    """q, k or v as the library's [batch, seq, heads, dim]: packed [tokens, heads, dim] as one batch row."""
    if t.dtype not in _MODEL_DTYPES:
        raise TypeError(f"{name} dtype must be float32, float64, float16 or bfloat16, got {t.dtype}")
    if t.ndim == 3:
        return t.unsqueeze(0)
    if t.ndim == 4:
        return t
    raise ValueError(f"{name} must have 3 dimensions ([tokens, heads, head_dim]) or 4 ([batch, seq, heads, "
                     f"head_dim]), got {t.ndim}")


def _heads(t: Optional[Tensor], name: str, head_dim: int = 0, heads: int = 0) -> Optional[Tensor]:
    """A ``[tokens, heads * head_dim]`` tensor (as engines pass q, k and v) as its ``[tokens, heads,
    head_dim]`` view (splitting a dimension: the caller's memory, any strides); given head_dim (q, k:
    the Rope's) or heads (v: k's heads). Any other shape is returned as it is."""
    if t is None or t.ndim != 2:
        return t
    width = t.shape[1]
    if head_dim:
        if width % head_dim != 0:
            raise ValueError(f"{name} width={width} must be a multiple of head_dim={head_dim} ([tokens, heads * "
                             f"head_dim])")
        return t.view(t.shape[0], width // head_dim, head_dim)
    if heads <= 0 or width % heads != 0:
        raise ValueError(f"{name} width={width} must be a multiple of k's heads={heads} ([tokens, heads * head_dim])")
    return t.view(t.shape[0], heads, width // heads)


def _flat_heads(head_dim: int, q: Tensor, k: Optional[Tensor], v: Optional[Tensor]) -> tuple:
    """q, k and v with engines' ``[tokens, heads * head_dim]`` ones as their ``[tokens, heads, head_dim]``
    views (v split by k's heads); a malformed k is left for the extension to name."""
    q, k = _heads(q, "q", head_dim=head_dim), _heads(k, "k", head_dim=head_dim)
    if v is not None and v.ndim == 2 and k is not None and k.ndim >= 3:
        v = _heads(v, "v", heads=k.shape[-2])
    return q, k, v


def _cache(t: Tensor, name: str, kv_layout: str) -> Tensor:
    """A cache as the library's [num_blocks, block_size, heads, dim] (a view: the same memory)."""
    if t.dtype not in _CACHE_DTYPES:
        raise TypeError(f"{name} dtype must be float32, float64, float16, bfloat16, float8_e4m3fn, float8_e5m2 or "
                        f"int8, got {t.dtype}")
    if t.ndim == 3 and kv_layout == "NHD":  # SGLang's token pool [slots, heads, dim]: blocks of one slot
        return t.unsqueeze(1)
    if t.ndim != 4:
        raise ValueError(f"{name} must have 4 dimensions ([num_blocks, block_size, heads, head_dim] for NHD, "
                         f"[num_blocks, heads, block_size, head_dim] for HND) or 3 ([slots, heads, head_dim], NHD), "
                         f"got {t.ndim}")
    return t if kv_layout == "NHD" else t.transpose(1, 2)


def _indices(t: Tensor, name: str) -> Tensor:
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must be an int64 or int32 tensor, got dtype {t.dtype}")
    if t.ndim != 1:
        raise ValueError(f"{name} must have 1 dimension ([tokens]), got {t.ndim}")
    return t.contiguous()


def _scale(scale: Scale, name: str, like: Tensor) -> Optional[Tensor]:
    """A scale as the library takes it: None (1.0), or contiguous float32 of 1 (per tensor) or heads
    (per head) values, on the cache's device."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        if not scale.dtype.is_floating_point:
            raise TypeError(f"{name} must be a float or a floating-point tensor, got dtype {scale.dtype}")
        if scale.ndim > 1:
            raise ValueError(f"{name} must have 0 or 1 dimension (1 value, or one per head), got {scale.ndim}")
        return scale.detach().reshape(-1).to(torch.float32).contiguous()
    return torch.tensor([_number(scale, name)], dtype=torch.float32, device=like.device)


def _positions(positions: Any, q: Tensor) -> tuple[Optional[Tensor], int]:
    """Per-token positions as the library takes them (contiguous, streams first) and their stream count:
    packed q ``[tokens]`` or ``[streams, tokens]``; 4-D q ``[seq]``, ``[batch, seq]`` or ``[streams,
    batch, seq]``."""
    if positions is None:
        return None, 1
    _tensor(positions, "positions")
    if positions.dtype not in (torch.int64, torch.int32, torch.float64, torch.float32):
        raise TypeError(f"positions must be an int64, int32, float64 or float32 tensor, got dtype {positions.dtype}")
    stream_dims = 2 if q.ndim == 3 else 3
    if positions.ndim > stream_dims:
        raise ValueError(f"positions must have at most {stream_dims} dimensions, got {positions.ndim}")
    streams = positions.shape[0] if positions.ndim == stream_dims else 1
    return positions.detach().contiguous(), streams


def _cos_sin_cache(cache: Optional[Tensor], rope: Rope) -> Optional[Tensor]:
    """The caller's ``cos_sin_cache`` ``[rows, rotary_dim]`` (cos half, then sin half), checked: the
    library reads its two halves by the Rope's rotary_dim."""
    if cache is None:
        return None
    if cache.dtype not in _MODEL_DTYPES:
        raise TypeError(f"cos_sin_cache dtype must be float32, float64, float16 or bfloat16, got {cache.dtype}")
    if cache.ndim != 2 or cache.shape[1] != rope.rotary_dim:
        raise ValueError(f"cos_sin_cache shape {tuple(cache.shape)} must be [rows, rotary_dim={rope.rotary_dim}] (cos "
                         "then sin, rotary_dim/2 columns each)")
    return cache.detach()


def _offset(offset: Any, positions: Any) -> int:
    offset = _int(offset, "offset")
    if offset != 0 and positions is not None:
        raise ValueError(f"offset={offset} is for sequential positions only, but positions are given (add the offset "
                         "to the positions, or leave positions out)")
    return offset


def _one_device(op: str, **tensors: Optional[Tensor]) -> None:
    """Every tensor of the call on the first one's device, a device with fused kernels: the CPU, or
    CUDA in a build with the CUDA kernels (queued on torch's current stream; a position or slot the
    kernels skip is raised by ``rotary.torch.check_positions(device)``). Named before anything is
    written. (Per call: is_cuda, is_cpu and get_device, not Tensor.device, which builds an object.)"""
    first_name, first, first_index = None, None, 0
    for name, t in tensors.items():
        if t is None:
            continue
        if t.is_cuda:
            if not _rotary.cuda:
                raise ValueError(f"{name} is on {t.device}, but {_rotary.no_cuda_kernels}")
            index = t.get_device()
        elif t.is_cpu:
            index = -1
        else:
            kinds = "CPU and CUDA tensors" if _rotary.cuda else "CPU tensors"
            raise ValueError(f"{name} is on {t.device}, but rotary::{op} runs on {kinds} only")
        if first is None:
            first_name, first, first_index = name, t, index
        elif index != first_index:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device} (rotary::{op} takes "
                             "every tensor on one device)")


def _in_call_words(e: ValueError, cache: str = "") -> ValueError:
    """The library's message in this call's words: its CacheQuant fields (k_quant, v_quant, q_quant;
    quant, the rerotated cache's) are the k_scale, v_scale and q_scale arguments, q_quantized is q_out,
    rerotate_cache's `cache` is k_cache, the caller's angles (angles.cos, per_position cos/sin) are
    cos_sin_cache."""
    text = str(e)
    for field, arg in (("k_quant", "k_scale"), ("v_quant", "v_scale"), ("q_quant", "q_scale"),
                       ("k_pass_quant", "k_pass_scale"), ("quant", "k_scale")):
        text = re.sub(rf"\b{field}\.scale\b", arg, text)
        text = re.sub(rf"\b{field}\.count\b", f"{arg} count", text)
    text = re.sub(r"\bq_quantized\b", "q_out", text)
    text = re.sub(r"\b(the )?per_position cos/sin\b|\bangles\.(cos|sin)\b", "cos_sin_cache", text)
    if cache:
        text = re.sub(r"\bcache\b", cache, text)
    return ValueError(text)


def _direct(*tensors: Optional[Tensor]) -> bool:
    """Call the kernel directly: eager mode, plain CPU or CUDA tensors, nothing tracing (as
    rotary.torch's). Any other device goes through the operator, which names it (a meta tensor among
    real ones too)."""
    for t in tensors:
        if t is not None and (type(t) is not Tensor or not (t.is_cpu or t.is_cuda)):
            return False
    return not _is_compiling() and _dispatch_modes() == 0


def _check_rope(rope: Any) -> Rope:
    if not isinstance(rope, Rope):
        raise TypeError(f"rope must be a rotary.Rope, got {type(rope).__name__}")
    return rope


def _refuse_grad(**tensors: Optional[Tensor]) -> None:
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise ValueError(f"{name} requires grad, and the fused operations write in place (not differentiable)")


def _eager(written: tuple, *tensors: Optional[Tensor]) -> bool:
    """Whether a call may take the eager fast path: every tensor given a plain torch.Tensor or an
    nn.Parameter (a model's norm weights), all on one device with fused kernels (the CPU, or CUDA in
    a build with them), none of ``written`` requiring grad while grad is enabled, nothing tracing (as
    ``_direct``). The fast path hands the tensors to the extension as they are; a shape, dtype or
    layout it does not take raises there before anything is written, and the call then takes the
    general path, which converts or names it. Written for a decode step's budget: type tests and C
    attributes only."""
    device = None
    for t in tensors:
        if t is None:
            continue
        if type(t) is not Tensor and type(t) is not _Parameter:  # a model's norm weights are Parameters
            return False
        if t.is_cuda:
            if not _rotary.cuda:
                return False
            index = t.get_device()
        elif t.is_cpu:
            index = -1
        else:
            return False
        if device is None:
            device = index
        elif index != device:
            return False
    if torch.is_grad_enabled():
        for t in written:
            if t is not None and t.requires_grad:
                return False
    return not _is_compiling() and _dispatch_modes() == 0


# ---- rope_store ------------------------------------------------------------------------------------

def _rope_store_kernel(q, k, v, k_cache, v_cache, slots, rope, positions, offset, kv_layout, k_scale, v_scale,
                       scale_mode, q_out, q_scale, k_pass, k_pass_cache, k_pass_scale, cos_sin_cache, angles,
                       check_duplicate_slots=False, k_out=None):
    _one_device("rope_store", q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, slots=slots, positions=positions,
              k_scale=k_scale, v_scale=v_scale, q_out=q_out, q_scale=q_scale, k_pass=k_pass,
              k_pass_cache=k_pass_cache, k_pass_scale=k_pass_scale, cos_sin_cache=cos_sin_cache, k_out=k_out)
    if q_out is not None and q_out.dtype not in _QUANTISED_DTYPES and q_out.dtype != q.dtype:
        raise TypeError(f"q_out dtype must be q's ({q.dtype}: q rotated out of place) or float8_e4m3fn, float8_e5m2 "
                        f"or int8 (a quantised copy of q), got {q_out.dtype}")
    if q_scale is not None and (q_out is None or q_out.dtype not in _QUANTISED_DTYPES):
        raise ValueError("q_scale is given without a quantised q_out (it scales the quantised copy of q)")
    if k_out is not None and k_out.dtype != k.dtype:
        raise TypeError(f"k_out dtype must be k's ({k.dtype}), got {k_out.dtype}")
    r = _rope_of_handle(rope)
    q, k, v = _flat_heads(r.head_dim, q, k, v)
    q_out, k_out = _heads(q_out, "q_out", head_dim=r.head_dim), _heads(k_out, "k_out", head_dim=r.head_dim)
    pos, streams = _positions(positions, q)
    try:
        _rotary.rope_store(r._impl, _activation(q, "q"), _activation(k, "k"),
                           None if v is None else _activation(v, "v"),
                           _cache(k_cache, "k_cache", kv_layout),
                           None if v_cache is None else _cache(v_cache, "v_cache", kv_layout), _indices(slots, "slots"),
                           pos, streams, offset, r.rotates_backward, k_scale, v_scale, scale_mode,
                           None if q_out is None else (q_out.unsqueeze(0) if q_out.ndim == 3 else q_out), q_scale,
                           None if k_pass is None else _activation(k_pass, "k_pass"),
                           None if k_pass_cache is None else _cache(k_pass_cache, "k_pass_cache", kv_layout),
                           k_pass_scale, _cos_sin_cache(cos_sin_cache, r), angles, check_duplicate_slots,
                           None if k_out is None else (k_out.unsqueeze(0) if k_out.ndim == 3 else k_out))
    except ValueError as e:
        raise _in_call_words(e) from None


@torch.library.custom_op("rotary::rope_store",  # k: written when k_out is k itself
                         mutates_args=("q", "k", "k_cache", "v_cache", "q_out", "k_pass_cache", "k_out"))
def _rope_store_op(q: Tensor, k: Tensor, v: Optional[Tensor], k_cache: Tensor, v_cache: Optional[Tensor],
                   slots: Tensor, rope: int, positions: Optional[Tensor], offset: int, kv_layout: str,
                   k_scale: Optional[Tensor], v_scale: Optional[Tensor], scale_mode: str, q_out: Optional[Tensor],
                   q_scale: Optional[Tensor], k_pass: Optional[Tensor], k_pass_cache: Optional[Tensor],
                   k_pass_scale: Optional[Tensor], cos_sin_cache: Optional[Tensor], angles: str,
                   check_duplicate_slots: bool = False, k_out: Optional[Tensor] = None) -> None:
    _rope_store_kernel(q, k, v, k_cache, v_cache, slots, rope, positions, offset, kv_layout, k_scale, v_scale,
                       scale_mode, q_out, q_scale, k_pass, k_pass_cache, k_pass_scale, cos_sin_cache, angles,
                       check_duplicate_slots, k_out)


@_rope_store_op.register_fake
def _rope_store_fake(q, k, v, k_cache, v_cache, slots, rope, positions, offset, kv_layout, k_scale, v_scale,
                     scale_mode, q_out, q_scale, k_pass, k_pass_cache, k_pass_scale, cos_sin_cache, angles,
                     check_duplicate_slots=False, k_out=None):
    _shapes_only("rope_store", q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, slots=slots, positions=positions,
                 k_scale=k_scale, v_scale=v_scale, q_out=q_out, q_scale=q_scale, k_pass=k_pass,
                 k_pass_cache=k_pass_cache, k_pass_scale=k_pass_scale, cos_sin_cache=cos_sin_cache, k_out=k_out)


@_renamed("angles")
def rope_store(rope: Rope, q: Tensor, k: Tensor, v: Optional[Tensor], k_cache: Tensor, v_cache: Optional[Tensor],
               slots: Tensor, *, positions: Optional[Tensor] = None, offset: int = 0, kv_layout: str = "NHD",
               k_scale: Scale = None, v_scale: Scale = None, scale_mode: str = "divide", q_out: Optional[Tensor] = None,
               q_scale: Scale = None, k_pass: Optional[Tensor] = None, k_pass_cache: Optional[Tensor] = None,
               k_pass_scale: Scale = None, cos_sin_cache: Optional[Tensor] = None, numerics: str = "exact",
               check_duplicate_slots: bool = False, k_out: Optional[Tensor] = None) -> Tensor:
    """RoPE + KV-cache write in one pass: q rotated in place; k rotated and written, with v, to the
    caches at the slots.

    The composition it equals bit for bit: ``q, k' = rotary.torch.apply_rope(rope, q, k, ...)`` (k'
    rounded to k's dtype, the whole head: rotated slice and pass-through channels), then for every
    token t with ``slots[t] >= 0``: ``k_cache[slot] = quantise(k'[t])``, ``v_cache[slot] =
    quantise(v[t])``, where a slot addresses block ``slot // block_size``, row ``slot % block_size``.

    Parameters
    ----------
    rope : rotary.Rope
        The model's RoPE (any schedule, pairing, partial rotary, M-RoPE streams, xPos).
    q : torch.Tensor
        ``[tokens, heads, head_dim]`` (or ``[batch, seq, heads, head_dim]``, or ``[tokens, heads *
        head_dim]`` as engines pass it: a view of the same memory), float32/float64/float16/bfloat16,
        any strides; rotated in place.
    k : torch.Tensor
        ``[tokens, kv_heads, head_dim]`` (as q), q's dtype; only read (see k_out).
    v : torch.Tensor or None
        ``[tokens, kv_heads, head_dim_v]`` (or ``[tokens, kv_heads * head_dim_v]``), q's dtype; None
        with v_cache None.
    k_cache, v_cache : torch.Tensor
        ``[num_blocks, block_size, kv_heads, head_dim]`` (``kv_layout="NHD"``: vLLM, FlashInfer NHD),
        ``[num_blocks, kv_heads, block_size, head_dim]`` (``"HND"``), or ``[slots, kv_heads, head_dim]``
        (NHD with blocks of one slot: SGLang's token pool); any strides; float32/float16/bfloat16
        (float64 with float64 data), or quantised: ``torch.float8_e4m3fn``, ``torch.float8_e5m2``,
        ``torch.int8``. Written at the slots only.
    slots : torch.Tensor
        ``[tokens]`` int64 or int32: each token's cache slot (vLLM's ``slot_mapping``); negative: no
        cache write for the token (padding). Separate from the RoPE positions.
    positions : torch.Tensor, optional
        RoPE positions, as ``apply_rope`` takes them for packed q (``[tokens]``, or ``[streams,
        tokens]`` for M-RoPE); default ``offset + 0..tokens-1``.
    offset : int
        First position when positions is not given.
    kv_layout : {"NHD", "HND"}
        The caches' order of dimensions.
    k_scale, v_scale : float or torch.Tensor, optional
        The quantised caches' scales: one value (per tensor) or one per kv head, finite and > 0; for
        fp8/int8 caches only. Default 1.
    scale_mode : {"divide", "multiply"}
        ``"divide"``: code = quantise(x / scale) (vLLM, SGLang); ``"multiply"``: quantise(x * scale)
        (FlashInfer, TensorRT-LLM). In float32, then one rounding: nearest-even, saturating (fp8 e4m3
        to ±448, e5m2 to ±57344, int8 to ±127), NaN kept (int8: 0).
    q_out : torch.Tensor, optional
        q's shape. In q's dtype: the rotated q out of place. Or a quantised copy of the rotated q
        (FlashInfer's fp8 q): float8_e4m3fn, float8_e5m2 or int8, ``quantise(q')`` with ``q_scale``
        (q' rotated and rounded to q's dtype, every channel). q itself is then not written.
    k_out : torch.Tensor, optional
        k's shape and dtype: the rotated k, as the cache receives it before quantising (k itself for
        k rotated in place). Default: k is only read.
    q_scale : float or torch.Tensor, optional
        q_out's scale (1 value or one per head; default 1), applied as ``scale_mode`` says.
    k_pass, k_pass_cache, k_pass_scale : optional
        A part of the key stored beside the rotated one without rotation (MLA's ``kv_c``, a nope
        part): ``[tokens, heads, pass_dim]`` in q's dtype, written to ``k_pass_cache`` at the slots as
        v is to v_cache. MLA rows ``[num_blocks, block_size, kv_lora_rank + rope_dim]`` take two
        views of one row: ``row.unsqueeze(2)[..., :kv_lora_rank]`` for k_pass_cache and
        ``row.unsqueeze(2)[..., kv_lora_rank:]`` for k_cache (k = ``k_pe`` ``[tokens, 1, rope_dim]``).
    cos_sin_cache : torch.Tensor, optional
        The engine's own table instead of rotary's angles: vLLM's ``[rows, rotary_dim]``, row p the
        rotary_dim/2 cos values of position p then the sin values (already times any attention
        factor); ``positions`` index it. Not with xPos.
    numerics : {"exact", "hf-float32"}
        rotary's angles' numerics (without cos_sin_cache): exact (default), or transformers' float32
        numerics (whole positions), as ``apply_rope`` takes them. ``angles=``, its former name, is
        taken until the next release, with a DeprecationWarning.
    check_duplicate_slots : bool
        CUDA: the kernels also look for a slot two tokens share (every token's slot against every
        other's: tokens² compares, a debugging aid at prefill sizes, cheap for decode), write neither
        token's cache rows and flag it, raised by ``rotary.torch.check_positions(device)``. The CPU
        always checks (ValueError, nothing written); there it changes nothing.

    Returns
    -------
    torch.Tensor
        q, rotated in place; or q_out when given (the caller's tensors, as passed).

    Raises
    ------
    TypeError
        An argument of the wrong kind or dtype, naming it.
    ValueError
        A value that breaks a rule, naming it (shapes, a slot beyond a cache's capacity or used
        twice, a scale, positions, a tensor on a device without a kernel, memory shared between a
        cache or output and another tensor the call reads: slots, positions, scales included);
        then nothing is written.
    """
    if (type(rope) is Rope and q is not None and k is not None and k_cache is not None and slots is not None
            and q_out is None and q_scale is None and k_pass is None and k_pass_cache is None and k_out is None
            and k_pass_scale is None and cos_sin_cache is None and type(scale_mode) is str and type(numerics) is str
            and type(kv_layout) is str and kv_layout == "NHD" and type(check_duplicate_slots) is bool
            and type(offset) is int and (offset == 0 or positions is None)
            and (positions is None or (type(positions) is Tensor and positions.ndim == 1))
            and (k_scale is None or type(k_scale) is Tensor) and (v_scale is None or type(v_scale) is Tensor)
            and _eager((q, k_cache, v_cache), q, k, v, k_cache, v_cache, slots, positions, k_scale, v_scale)):
        try:  # the eager fast path (see _eager); anything it does not take, the general path below
            qh, kh, vh = (q, k, v) if q.ndim != 2 else _flat_heads(rope.head_dim, q, k, v)  # engines' flat q, k, v
            _rotary.rope_store(rope._impl, qh, kh, vh, k_cache, v_cache, slots, positions, 1, offset,
                               rope.rotates_backward, k_scale, v_scale, scale_mode, None, None, None, None, None, None,
                               numerics, check_duplicate_slots, None)
            _written(q, k_cache, v_cache)
            return q
        except (TypeError, ValueError):
            pass
    _check_rope(rope)
    for name, t, optional in (("q", q, False), ("k", k, False), ("v", v, True), ("k_cache", k_cache, False),
                              ("v_cache", v_cache, True), ("slots", slots, False)):
        _tensor(t, name, optional)
    for name, t in (("q_out", q_out), ("k_pass", k_pass), ("k_pass_cache", k_pass_cache),
                    ("cos_sin_cache", cos_sin_cache), ("k_out", k_out)):
        _tensor(t, name, optional=True)
    kv_layout = _choice(kv_layout, "kv_layout", ("NHD", "HND"))
    scale_mode = _choice(scale_mode, "scale_mode", ("divide", "multiply"))
    offset = _offset(offset, positions)
    if positions is not None:
        _tensor(positions, "positions")
    _refuse_grad(q=q if q_out is None else None, k_cache=k_cache, v_cache=v_cache, q_out=q_out,
                 k_pass_cache=k_pass_cache, k_out=k_out)
    k_scale_t, v_scale_t = _scale(k_scale, "k_scale", k_cache), _scale(v_scale, "v_scale", k_cache)
    args = (q, k, v, k_cache, v_cache, slots, rope._handle, positions, offset, kv_layout, k_scale_t, v_scale_t,
            scale_mode, q_out, _scale(q_scale, "q_scale", q), k_pass, k_pass_cache,
            _scale(k_pass_scale, "k_pass_scale", k_cache), cos_sin_cache,
            _choice(numerics, "numerics", _NUMERICS), _flag(check_duplicate_slots, "check_duplicate_slots"), k_out)
    if _direct(q, k, v, k_cache, v_cache, slots, positions, q_out, k_pass, k_pass_cache, cos_sin_cache, k_out):
        _rope_store_kernel(*args)
        # Eager, outside the dispatcher (the operator moves its mutated arguments' versions itself).
        _written(q if q_out is None else q_out, k_out, k_cache, v_cache, k_pass_cache)
    else:
        torch.ops.rotary.rope_store(*args)
    return q if q_out is None else q_out


# ---- qk_norm_rope ----------------------------------------------------------------------------------

def _qk_norm_rope_kernel(q, k, q_weight, k_weight, rope, eps, positions, offset, weight_offset, order, scope,
                         rounding, v, v_norm, k_cache, v_cache, slots, kv_layout, k_scale, v_scale, scale_mode,
                         cos_sin_cache, angles, check_duplicate_slots=False, q_out=None, k_out=None):
    _one_device("qk_norm_rope", q=q, k=k, q_weight=q_weight, k_weight=k_weight, positions=positions, v=v,
              k_cache=k_cache, v_cache=v_cache, slots=slots, k_scale=k_scale, v_scale=v_scale,
              cos_sin_cache=cos_sin_cache, q_out=q_out, k_out=k_out)
    for name, out, like in (("q_out", q_out, q), ("k_out", k_out, k)):
        if out is not None and like is not None and out.dtype != like.dtype:
            raise TypeError(f"{name} dtype must be {name[0]}'s ({like.dtype}), got {out.dtype}")
    if k_out is not None and k is None:
        raise ValueError("k_out is given without k")
    r = _rope_of_handle(rope)
    q, k, v = _flat_heads(r.head_dim, q, k, v)
    q_out, k_out = _heads(q_out, "q_out", head_dim=r.head_dim), _heads(k_out, "k_out", head_dim=r.head_dim)
    pos, streams = _positions(positions, q)
    weights = [None if w is None else w.detach().contiguous() for w in (q_weight, k_weight)]
    if k_cache is not None and slots is None:
        raise ValueError("k_cache is given without slots (the cache write needs each token's slot)")
    if k_cache is None and (v_cache is not None or slots is not None):
        raise ValueError(f"{'v_cache' if v_cache is not None else 'slots'} is given without k_cache")
    if v is not None and not v_norm and k_cache is None:
        raise ValueError("v is given but neither v_norm=True nor k_cache (v is read only to be normed or stored)")
    try:
        _rotary.qk_norm_rope(r._impl, _activation(q, "q"), None if k is None else _activation(k, "k"), weights[0],
                             weights[1], eps, pos, streams, offset, r.rotates_backward, weight_offset, order, scope,
                             rounding, None if v is None else _activation(v, "v"), v_norm,
                             None if k_cache is None else _cache(k_cache, "k_cache", kv_layout),
                             None if v_cache is None else _cache(v_cache, "v_cache", kv_layout),
                             None if slots is None else _indices(slots, "slots"), k_scale, v_scale, scale_mode,
                             _cos_sin_cache(cos_sin_cache, r), angles, check_duplicate_slots,
                             None if q_out is None else _activation(q_out, "q_out"),
                             None if k_out is None else _activation(k_out, "k_out"))
    except ValueError as e:
        raise _in_call_words(e) from None


@torch.library.custom_op("rotary::qk_norm_rope", mutates_args=("q", "k", "v", "k_cache", "v_cache", "q_out", "k_out"))
def _qk_norm_rope_op(q: Tensor, k: Optional[Tensor], q_weight: Optional[Tensor], k_weight: Optional[Tensor], rope: int,
                     eps: float, positions: Optional[Tensor], offset: int, weight_offset: float, order: str,
                     scope: str, rounding: str, v: Optional[Tensor], v_norm: bool, k_cache: Optional[Tensor],
                     v_cache: Optional[Tensor], slots: Optional[Tensor], kv_layout: str, k_scale: Optional[Tensor],
                     v_scale: Optional[Tensor], scale_mode: str, cos_sin_cache: Optional[Tensor], angles: str,
                     check_duplicate_slots: bool = False, q_out: Optional[Tensor] = None,
                     k_out: Optional[Tensor] = None) -> None:
    _qk_norm_rope_kernel(q, k, q_weight, k_weight, rope, eps, positions, offset, weight_offset, order, scope, rounding,
                         v, v_norm, k_cache, v_cache, slots, kv_layout, k_scale, v_scale, scale_mode, cos_sin_cache,
                         angles, check_duplicate_slots, q_out, k_out)


@_qk_norm_rope_op.register_fake
def _qk_norm_rope_fake(q, k, q_weight, k_weight, rope, eps, positions, offset, weight_offset, order, scope, rounding,
                       v, v_norm, k_cache, v_cache, slots, kv_layout, k_scale, v_scale, scale_mode, cos_sin_cache,
                       angles, check_duplicate_slots=False, q_out=None, k_out=None):
    _shapes_only("qk_norm_rope", q=q, k=k, q_weight=q_weight, k_weight=k_weight, positions=positions, v=v,
                 k_cache=k_cache, v_cache=v_cache, slots=slots, k_scale=k_scale, v_scale=v_scale,
                 cos_sin_cache=cos_sin_cache, q_out=q_out, k_out=k_out)


@_renamed("angles")
def qk_norm_rope(rope: Rope, q: Tensor, k: Optional[Tensor], q_weight: Optional[Tensor], k_weight: Optional[Tensor],
                 *, eps: float, positions: Optional[Tensor] = None, offset: int = 0, weight_offset: float = 0.0,
                 order: str = "norm_rope", scope: str = "head", rounding: str = "llama", v: Optional[Tensor] = None,
                 v_norm: bool = False, k_cache: Optional[Tensor] = None, v_cache: Optional[Tensor] = None,
                 slots: Optional[Tensor] = None, kv_layout: str = "NHD", k_scale: Scale = None, v_scale: Scale = None,
                 scale_mode: str = "divide", cos_sin_cache: Optional[Tensor] = None,
                 numerics: str = "exact", check_duplicate_slots: bool = False, q_out: Optional[Tensor] = None,
                 k_out: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """QK-norm and RoPE in one pass, in place: RMSNorm of q and k then the rotation (Qwen3, Gemma 3,
    OLMo 2), or the rotation then the norm (Llama 4); optionally a weightless norm of v (Gemma 4) and
    the cache write of ``rope_store`` in the same pass.

    The norm of n values x (one head, or a token's heads together): ``x * r`` with ``r =
    1/sqrt(mean(x^2) + eps)`` (the sum of squares in double, r rounded once to float32), times
    ``weight_offset + w`` when a weight is given; rounded to the data's dtype as ``rounding`` says.
    Bit-identical to that norm (rounded to the data's dtype) followed by ``rotary.torch.apply_rope``,
    or ``apply_rope`` followed by the norm; then ``rope_store``'s quantiser and scatter.

    Parameters
    ----------
    rope : rotary.Rope
        The model's RoPE.
    q, k : torch.Tensor
        ``[tokens, heads, head_dim]`` (or ``[batch, seq, heads, head_dim]``, or ``[tokens, heads *
        head_dim]``: a view of the same memory), float32/float16/bfloat16, any strides; normed and
        rotated in place. k may be None (without a cache).
    q_weight, k_weight : torch.Tensor or None
        The norms' weights: ``[head_dim]`` (``scope="head"``) or ``[heads * head_dim]`` (``"all_heads"``),
        float32 or the data's dtype; None: no weight (Llama 4's L2 norm).
    eps : float
        The norm's epsilon (``rms_norm_eps``), finite and >= 0.
    positions, offset
        As ``rope_store``.
    weight_offset : float
        0: the weight is ``w`` (Llama, Qwen3, OLMo 2); 1: ``1 + w`` (Gemma, Qwen3-Next).
    order : {"norm_rope", "rope_norm"}
        Norm then RoPE, or RoPE then norm (Llama 4).
    scope : {"head", "all_heads"}
        One norm per head, or one over all heads of a token (OLMo 2's q_norm and k_norm).
    rounding : {"llama", "gemma"}
        Where the norm rounds to the data's dtype, as transformers does: ``"llama"`` normalises in
        float32, rounds, then multiplies by the weight (``Qwen3RMSNorm``: ``weight *
        x.to(input_dtype)``); ``"gemma"`` multiplies in float32 and rounds once (Gemma, OLMo 2, Llama 4).
    v : torch.Tensor, optional
        ``[tokens, kv_heads, head_dim_v]``, q's dtype: normed (``v_norm``) and/or stored (``v_cache``).
    v_norm : bool
        A weightless RMSNorm of v per head (Gemma 4), same rounding: in place on v, or, with a cache,
        into v_cache only (v is then not written).
    k_cache, v_cache, slots, kv_layout, k_scale, v_scale, scale_mode
        The cache write, as ``rope_store`` takes them: k (normed and rotated, also left in k) and v go
        to the caches at the slots. All None (default): no write.
    cos_sin_cache, numerics
        The engine's own table instead of rotary's angles, or rotary's angles' numerics, as
        ``rope_store`` takes them (``angles=``, numerics' former name, too).
    check_duplicate_slots : bool
        With the cache write, as ``rope_store`` takes it.
    q_out, k_out : torch.Tensor, optional
        q's (k's) shape and dtype: the normed and rotated q (k) out of place; q (k) is then only read.
        With the cache write, k_out takes what the cache receives before quantising, and k is not
        written.

    Returns
    -------
    tuple of torch.Tensor
        ``(q, k)``: the caller's tensors, normed and rotated (q_out, k_out in their places when given).

    Raises
    ------
    TypeError, ValueError
        As ``rope_store``, naming the argument; then nothing is written.
    """
    if (type(rope) is Rope and q is not None and cos_sin_cache is None
            and type(kv_layout) is str and kv_layout == "NHD" and type(offset) is int
            and (offset == 0 or positions is None) and type(eps) in (float, int) and type(weight_offset) in (float, int)
            and type(v_norm) is bool and type(check_duplicate_slots) is bool and q_out is None and k_out is None
            and (positions is None or (type(positions) is Tensor and positions.ndim == 1))
            and type(order) is str and type(scope) is str and type(rounding) is str and type(numerics) is str
            and scale_mode in ("divide", "multiply")  # (a str: the binding reads it only with a cache)
            and ((k_cache is None and v_cache is None and slots is None and k_scale is None and v_scale is None)
                 or (k_cache is not None and slots is not None))
            and (v is None or v_norm or k_cache is not None)
            and (k_scale is None or type(k_scale) is Tensor) and (v_scale is None or type(v_scale) is Tensor)
            and _eager((q, k, v, k_cache, v_cache), q, k, q_weight, k_weight, positions, v, k_cache, v_cache, slots,
                       k_scale, v_scale)):
        try:  # the eager fast path (see _eager); anything it does not take, the general path below
            qh, kh, vh = (q, k, v) if q.ndim != 2 else _flat_heads(rope.head_dim, q, k, v)  # engines' flat q, k, v
            _rotary.qk_norm_rope(rope._impl, qh, kh, q_weight, k_weight, eps, positions, 1, offset,
                                 rope.rotates_backward, weight_offset, order, scope, rounding, vh, v_norm, k_cache,
                                 v_cache, slots, k_scale,
                                 v_scale, scale_mode, None, numerics, check_duplicate_slots, None, None)
            _written(q, k, v if v_norm else None, k_cache, v_cache)
            return q, k
        except (TypeError, ValueError):
            pass
    _check_rope(rope)
    _tensor(q, "q")
    for name, t in (("k", k), ("q_weight", q_weight), ("k_weight", k_weight), ("v", v), ("k_cache", k_cache),
                    ("v_cache", v_cache), ("slots", slots), ("cos_sin_cache", cos_sin_cache), ("q_out", q_out),
                    ("k_out", k_out)):
        _tensor(t, name, optional=True)
    eps, weight_offset = _number(eps, "eps"), _number(weight_offset, "weight_offset")
    order = _choice(order, "order", ("norm_rope", "rope_norm"))
    scope = _choice(scope, "scope", ("head", "all_heads"))
    rounding = _choice(rounding, "rounding", ("llama", "gemma"))
    kv_layout = _choice(kv_layout, "kv_layout", ("NHD", "HND"))
    scale_mode = _choice(scale_mode, "scale_mode", ("divide", "multiply"))
    if not isinstance(v_norm, bool):
        raise TypeError(f"v_norm must be a bool, got {type(v_norm).__name__}")
    offset = _offset(offset, positions)
    if positions is not None:
        _tensor(positions, "positions")
    _refuse_grad(q=q if q_out is None else None, k=k if k_out is None else None, v=v, k_cache=k_cache,
                 v_cache=v_cache, q_out=q_out, k_out=k_out)
    like = q if k_cache is None else k_cache
    args = (q, k, q_weight, k_weight, rope._handle, eps, positions, offset, weight_offset, order, scope, rounding, v,
            v_norm, k_cache, v_cache, slots, kv_layout, _scale(k_scale, "k_scale", like),
            _scale(v_scale, "v_scale", like), scale_mode, cos_sin_cache,
            _choice(numerics, "numerics", _NUMERICS), _flag(check_duplicate_slots, "check_duplicate_slots"), q_out,
            k_out)
    if _direct(q, k, q_weight, k_weight, positions, v, k_cache, v_cache, slots, cos_sin_cache, q_out, k_out):
        _qk_norm_rope_kernel(*args)
        _written(q if q_out is None else q_out, k if k_out is None else k_out, v if v_norm else None, k_cache, v_cache)
    else:
        torch.ops.rotary.qk_norm_rope(*args)
    return (q if q_out is None else q_out), (k if k_out is None else k_out)


# ---- rerotate_cache --------------------------------------------------------------------------------

def _rerotate_cache_kernel(k_cache, slots, rope, delta, positions, kv_layout, k_scale, scale_mode,
                           check_duplicate_slots=False, numerics="exact"):
    _one_device("rerotate_cache", k_cache=k_cache, slots=slots, delta=delta, positions=positions, k_scale=k_scale)
    r = _rope_of_handle(rope)
    slots = _indices(slots, "slots")
    delta_streams = 1
    if delta is not None:
        if delta.dtype not in _INDEX_DTYPES:
            raise TypeError(f"delta must be an int64 or int32 tensor, got dtype {delta.dtype}")
        if delta.ndim > 2:
            raise ValueError(f"delta must have 1 dimension ([slots]) or 2 ([streams, slots]), got {delta.ndim}")
        delta_streams = delta.shape[0] if delta.ndim == 2 else 1
        if delta.shape[-1] != slots.shape[0]:
            raise ValueError(f"delta shape {tuple(delta.shape)} must be [slots={slots.shape[0]}] or [streams, "
                             f"slots={slots.shape[0]}] (one delta per slot)")
        delta = delta.to(torch.int64).contiguous()
    pos, streams = (None, 1) if positions is None else (positions.detach().contiguous(),
                                                        positions.shape[0] if positions.ndim == 2 else 1)
    try:
        _rotary.rerotate_cache(r._impl, _cache(k_cache, "k_cache", kv_layout), slots, delta, delta_streams, pos,
                               streams, r.rotates_backward, k_scale, scale_mode, check_duplicate_slots, numerics)
    except ValueError as e:
        raise _in_call_words(e, cache="k_cache") from None


@torch.library.custom_op("rotary::rerotate_cache", mutates_args=("k_cache",))
def _rerotate_cache_op(k_cache: Tensor, slots: Tensor, rope: int, delta: Optional[Tensor],
                       positions: Optional[Tensor], kv_layout: str, k_scale: Optional[Tensor], scale_mode: str,
                       check_duplicate_slots: bool = False, numerics: str = "exact") -> None:
    _rerotate_cache_kernel(k_cache, slots, rope, delta, positions, kv_layout, k_scale, scale_mode,
                           check_duplicate_slots, numerics)


@_rerotate_cache_op.register_fake
def _rerotate_cache_fake(k_cache, slots, rope, delta, positions, kv_layout, k_scale, scale_mode,
                         check_duplicate_slots=False, numerics="exact"):
    _shapes_only("rerotate_cache", k_cache=k_cache, slots=slots, delta=delta, positions=positions, k_scale=k_scale)


def rerotate_cache(rope: Rope, k_cache: Tensor, slots: Tensor, delta: Union[None, int, Tensor], *,
                   kv_layout: str = "NHD", k_scale: Scale = None, scale_mode: str = "divide",
                   positions: Optional[Tensor] = None, check_duplicate_slots: bool = False,
                   numerics: str = "exact") -> Tensor:
    """Moves cached keys in place: the keys of each slot, rotated at position p, to p + delta (a
    context shift, StreamingLLM/attention-sink eviction), without recomputing them; or, with
    ``delta=None`` and ``positions``, raw (un-rotated) stored keys rotated once to their positions.

    Bit-identical to gathering the slots' keys, dequantising, ``Rope.rerotate`` (delta; the
    attention factor the keys carry is not applied again) or ``Rope.apply`` (raw), quantising and
    scattering back. A quantised cache adds at most half a code step of the result per move (e4m3
    2^-4 relative, e5m2 2^-3, int8 half a unit) beyond the rotation's own rounding.

    Parameters
    ----------
    rope : rotary.Rope
        The RoPE the keys were (or are to be) rotated with; not xPos.
    k_cache : torch.Tensor
        As ``rope_store`` (NHD, HND or a token pool; float32/float16/bfloat16/fp8/int8); written in
        place at the slots only.
    slots : torch.Tensor
        ``[n]`` int64 or int32: the slots to move (negative: skipped; each at most once).
    delta : int or torch.Tensor or None
        Each slot's position change: one int for all, ``[n]``, or ``[streams, n]`` (M-RoPE); each in
        (-2^31, 2^31). None: raw mode (``positions`` required).
    kv_layout : {"NHD", "HND"}
        The cache's order of dimensions.
    k_scale : float or torch.Tensor, optional
        The quantised cache's scale (1 value or one per kv head).
    scale_mode : {"divide", "multiply"}
        As ``rope_store``.
    positions : torch.Tensor, optional
        Raw mode only: ``[n]`` (or ``[streams, n]``) positions to rotate the raw keys to.
    check_duplicate_slots : bool
        CUDA: the kernel also looks for a slot listed twice, turns neither entry's keys and flags it
        (``rotary.torch.check_positions(device)`` raises), as ``rope_store`` takes it.
    numerics : {"exact", "hf-float32"}
        Raw mode: the angles the raw keys are rotated with, as ``apply_rope`` takes them (exact, or
        transformers' float32 numerics for keys that must match a model run that way). Delta mode
        turns by exact angles of the deltas only.

    Returns
    -------
    torch.Tensor
        k_cache.

    Raises
    ------
    TypeError, ValueError
        As ``rope_store``, naming the argument; then the cache is untouched.
    """
    _check_rope(rope)
    _tensor(k_cache, "k_cache")
    _tensor(slots, "slots")
    kv_layout = _choice(kv_layout, "kv_layout", ("NHD", "HND"))
    scale_mode = _choice(scale_mode, "scale_mode", ("divide", "multiply"))
    numerics = _choice(numerics, "numerics", _NUMERICS)
    if delta is None:
        if positions is None:
            raise ValueError("delta=None rotates raw keys to positions, but positions is not given")
        _tensor(positions, "positions")
    else:
        if positions is not None:
            raise ValueError("positions is for raw keys (delta=None): with delta, keys move by delta")
        if numerics != "exact":
            raise ValueError(f"numerics={numerics!r} is for raw keys (delta=None): with delta, keys turn by exact "
                             f"angles of their deltas")
        if not isinstance(delta, torch.Tensor):
            delta = torch.full(slots.shape, _int(delta, "delta"), dtype=torch.int64, device=slots.device)
        elif delta.ndim == 0 and slots.ndim == 1:  # one delta for every slot, as an int is
            delta = delta.reshape(1).expand(slots.shape).contiguous()
    _refuse_grad(k_cache=k_cache)
    args = (k_cache, slots, rope._handle, delta, positions, kv_layout, _scale(k_scale, "k_scale", k_cache), scale_mode,
            _flag(check_duplicate_slots, "check_duplicate_slots"), numerics)
    if _direct(k_cache, slots, delta, positions):
        _rerotate_cache_kernel(*args)
        _written(k_cache)
    else:
        torch.ops.rotary.rerotate_cache(*args)
    return k_cache


# ---- FlashInfer's page table -----------------------------------------------------------------------

def slots_from_page_table(kv_indices: Tensor, kv_indptr: Tensor, batch_indices: Tensor, positions: Tensor,
                          block_size: int) -> Tensor:
    """FlashInfer's page table as the slots ``rope_store`` takes: token i of request r =
    ``batch_indices[i]`` (negative: padding, slot -1) at ``positions[i]`` within its request lies on page
    ``kv_indices[kv_indptr[r] + positions[i] // block_size]``, row ``positions[i] % block_size``:
    ``slot = page * block_size + positions[i] % block_size``.

    Parameters
    ----------
    kv_indices, kv_indptr, batch_indices, positions : torch.Tensor
        FlashInfer's ``kv_indices`` (physical page of each request's pages), ``kv_indptr`` ([requests +
        1]), and per token ``batch_indices`` and ``positions`` (``get_batch_indices_positions``): 1-D
        integer tensors with values within int32. Read on the host (a CUDA tensor is copied, which
        waits for its stream: compute slots outside a CUDA graph).
    block_size : int
        The page size.

    Returns
    -------
    torch.Tensor
        int64 ``[tokens]`` on the device of batch_indices.

    Raises
    ------
    TypeError
        An argument of the wrong kind.
    ValueError
        An entry that breaks the table (naming it: a request beyond kv_indptr, a page beyond the
        request's pages, a negative page or position), block_size < 1.
    """
    tables = {"kv_indices": kv_indices, "kv_indptr": kv_indptr, "batch_indices": batch_indices,
              "positions": positions}
    host = {}
    for name, t in tables.items():
        _tensor(t, name)
        if t.dtype not in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
            raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")
        if t.ndim != 1:
            raise ValueError(f"{name} must have 1 dimension, got {t.ndim}")
        values = t.detach().to("cpu", torch.int64)
        if values.numel() and (int(values.min()) < -(1 << 31) or int(values.max()) >= 1 << 31):
            raise ValueError(f"{name} holds values beyond int32")
        host[name] = values.to(torch.int32).contiguous()
    block_size = _int(block_size, "block_size")
    slots = _rotary.slots_from_page_table(host["kv_indices"], host["kv_indptr"], host["batch_indices"],
                                          host["positions"], block_size)
    return torch.from_numpy(slots).to(batch_indices.device)

