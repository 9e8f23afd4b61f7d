"""Engine-shaped entry points: what vLLM, SGLang and FlashInfer call, computed by rotary's kernels.

``rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)`` is vLLM's and SGLang's
operator; ``apply_rope_with_cos_sin_cache_inplace`` is FlashInfer's (and sgl-kernel's) function of the
same arguments. Both rotate ``query`` and ``key`` in place from the caller's ``cos_sin_cache``: rotary's
caller-angles source (``CallerAngles`` per position, the cache's cos half then its sin half), so the
engine's table is used as it is, and rotary only does the rotation (one kernel call, no Python
arithmetic on the tensors).

Both go through one torch operator, ``torch.ops.rotary.rotary_embedding(positions, query, key,
head_size, cos_sin_cache, is_neox) -> ()``, which mutates query and key (schema ``Tensor(a!) query,
Tensor(b!)? key``): ``torch.compile(fullgraph=True)`` traces it without a graph break, its fake kernel
gives shapes only, and its CUDA kernel queues on torch's current stream without waiting (CUDA-graph
safe), as ``rotary.torch``'s other operators. In eager mode the wrappers call the kernel directly.

Multimodal RoPE (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V), as vLLM's ``MRotaryEmbedding``
(``vllm/model_executor/layers/rotary_embedding/mrope.py``, ``forward_native`` and
``apply_interleaved_rope``): ``rotary_embedding(..., mrope_section=[t, h, w], mrope_interleaved=...)``
with positions ``[3, tokens]`` (temporal, height and width streams). Each token's cos/sin row is put
together from the three streams' rows of ``cos_sin_cache`` by torch gathers only (the cache's bits;
the only arithmetic is on indices), and query and key are then rotated by that ``[tokens,
rotary_dim]`` table exactly as in a 1-D call, through the same operator (positions
``arange(tokens)``): traceable with ``fullgraph=True`` and CUDA-graph safe (no host synchronisation,
no branching on tensor values). Both pairings (``is_neox`` True and False) take the same table;
vLLM's Triton M-RoPE kernel was NeoX-only until its GLM-OCR / GLM-4.1V fix (vLLM issue 42016, pull
request 42765).
"""
from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

import torch

from .. import _rotary
from .._rope import Rope
from . import _KERNEL_DEVICES, _dispatch_modes, _is_compiling, _no_kernel, _same_kind, _shapes_only

__all__ = ["rotary_embedding", "apply_rope_with_cos_sin_cache_inplace"]

Tensor = torch.Tensor

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_POSITION_DTYPES = (torch.int64, torch.int32)

# One Rope per (head_size, rotary_dim, is_neox): it carries the descriptor (head_dim, the rotated
# slice, the pairing) that the kernel checks the call against; its own frequencies are never read
# (the caller's cos_sin_cache gives the angles). A handful of entries per process.
_ropes: dict[tuple[int, int, bool], Rope] = {}
_ropes_lock = threading.Lock()


def _engine_rope(head_size: int, rotary_dim: int, is_neox: bool) -> Rope:
    key = (head_size, rotary_dim, is_neox)
    rope = _ropes.get(key)
    if rope is None:
        with _ropes_lock:
            rope = _ropes.get(key)
            if rope is None:
                rope = Rope(head_size, rotary_dim, pairing="half" if is_neox else "interleaved")
                _ropes[key] = rope
    return rope


def _heads_view(t: Tensor, name: str, lead: tuple, head_size: int) -> Tensor:
    """``t`` as ``[*lead, heads, head_size]`` (lead: ``(tokens,)`` or ``(batch, seq)``), a view of the
    caller's memory (written in place)."""
    if t.ndim == len(lead) + 2:
        if t.shape[-1] != head_size:
            raise ValueError(f"{name} shape {tuple(t.shape)} must be [{', '.join(_LEAD[len(lead)])}, heads, "
                             f"head_size={head_size}] (or [{', '.join(_LEAD[len(lead)])}, heads * head_size])")
        return t
    if t.shape[-1] % head_size != 0:
        raise ValueError(f"{name} width={t.shape[-1]} must be a multiple of head_size={head_size} "
                         f"([{', '.join(_LEAD[len(lead)])}, heads * head_size])")
    return t.view(*lead, t.shape[-1] // head_size, head_size)  # splitting a dimension: always a view


_LEAD = {1: ("tokens",), 2: ("batch", "seq")}


def _positions_and_cache_checks(positions: Tensor, cos_sin_cache: Tensor, head_size: Optional[int]) -> int:
    """The dtype and shape rules of positions and cos_sin_cache shared by every engine call; returns the
    rotary_dim (cos_sin_cache's width), checked even, positive and (head_size given) <= head_size."""
    if positions.dtype not in _POSITION_DTYPES:
        raise TypeError(f"positions must be an int64 or int32 tensor, got dtype {positions.dtype}")
    if cos_sin_cache.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"cos_sin_cache dtype must be float32, float64, float16 or bfloat16, got {cos_sin_cache.dtype}")
    if cos_sin_cache.ndim != 2:
        raise ValueError(f"cos_sin_cache must have 2 dimensions ([max_position, rotary_dim]: cos half, then sin "
                         f"half), got {cos_sin_cache.ndim}")
    rotary_dim = cos_sin_cache.shape[1]
    if head_size is None:
        if rotary_dim <= 0 or rotary_dim % 2 != 0:
            raise ValueError(f"cos_sin_cache width={rotary_dim} is the rotary_dim, which must be even and positive")
    elif rotary_dim <= 0 or rotary_dim % 2 != 0 or rotary_dim > head_size:
        raise ValueError(f"cos_sin_cache width={rotary_dim} is the rotary_dim, which must be even, positive and <= "
                         f"head_size={head_size}")
    return rotary_dim


def _engine_call(positions: Any, query: Any, key: Any, head_size: Any, cos_sin_cache: Any,
                 is_neox: Any) -> tuple[Tensor, Optional[Tensor]]:
    """Checks an engine call (kinds, shapes, dtypes, devices: everything but the positions' values,
    which the kernel checks against the cache's rows) and returns the ``[tokens, heads, head_size]``
    (or ``[batch, seq, heads, head_size]``) views of query and key. Raises before anything is written. Traceable (no lock, no Rope): the
    wrappers run it while torch.compile traces, so that a wrong kind is named then."""
    for name, t in (("positions", positions), ("query", query), ("cos_sin_cache", cos_sin_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if key is not None and not isinstance(key, torch.Tensor):
        raise TypeError(f"key must be a torch.Tensor or None, got {type(key).__name__}")
    if not isinstance(head_size, int) or isinstance(head_size, bool):
        raise TypeError(f"head_size must be an int, got {type(head_size).__name__}")
    if not isinstance(is_neox, bool):
        raise TypeError(f"is_neox must be a bool, got {type(is_neox).__name__}")
    if head_size <= 0:
        raise ValueError(f"head_size={head_size} must be positive")
    rotary_dim = _positions_and_cache_checks(positions, cos_sin_cache, head_size)
    if positions.ndim not in (1, 2):
        raise ValueError(f"positions must have 1 dimension ([tokens]) or 2 ([batch, seq]), got {positions.ndim}")
    lead_dims = positions.ndim  # [tokens] or [batch, seq], which query's leading dimensions follow
    for name, t in (("query", query), ("key", key)):
        if t is None:
            continue
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} dtype must be float32, float64, float16 or bfloat16, got {t.dtype}")
        if t.ndim not in (lead_dims + 1, lead_dims + 2):
            lead = ", ".join(_LEAD[lead_dims])
            raise ValueError(f"{name} must have {lead_dims + 1} dimensions ([{lead}, heads * head_size]) or "
                             f"{lead_dims + 2} ([{lead}, heads, head_size]) with positions [{lead}], got {t.ndim}")
        if t.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{name} requires grad, and an in-place rotation cannot be differentiated: use "
                             "rotary.torch.apply_rope (out of place, differentiable)")
        if 0 in t.stride() and any(stride == 0 and extent > 1 for stride, extent in zip(t.stride(), t.shape)):
            raise ValueError(f"{name} strides {tuple(t.stride())} repeat elements (an expanded tensor): rotated in "
                             f"place, each would be written more than once")
    lead = tuple(query.shape[:lead_dims])
    if tuple(positions.shape) != lead:
        raise ValueError(f"positions shape {tuple(positions.shape)} must be query's leading "
                         f"[{', '.join(f'{n}={e}' for n, e in zip(_LEAD[lead_dims], lead))}] (one position per "
                         f"token of query)")
    if key is not None and tuple(key.shape[:lead_dims]) != lead:
        raise ValueError(f"key's tokens {tuple(key.shape[:lead_dims])} differ from query's {lead}")
    if key is not None and key.dtype != query.dtype:
        raise TypeError(f"key dtype {key.dtype} differs from query dtype {query.dtype}")
    for name, t in (("positions", positions), ("key", key), ("cos_sin_cache", cos_sin_cache)):
        if t is not None and t.device != query.device:
            raise ValueError(f"{name} is on {t.device} but query is on {query.device} (every tensor of a call must "
                             f"be on one device)")
    q3 = _heads_view(query, "query", lead, head_size)
    k3 = None if key is None else _heads_view(key, "key", lead, head_size)
    return q3, k3


def _rotate_engine(positions: Tensor, query: Tensor, key: Optional[Tensor], head_size: int, cos_sin_cache: Tensor,
                   is_neox: bool) -> None:
    """The kernel of every device: Rope.apply in place on the [tokens, heads, head_size] views, the
    caller's cos_sin_cache indexed by positions."""
    q3, k3 = _engine_call(positions, query, key, head_size, cos_sin_cache, is_neox)
    rope = _engine_rope(head_size, cos_sin_cache.shape[1], is_neox)
    layout = "thd" if q3.ndim == 3 else "bshd"
    rope._apply(q3, k3, positions, 0, layout, True, False, "exact", 0, None, None, cos_sin_cache, None)


@torch.library.custom_op("rotary::rotary_embedding", mutates_args=("query", "key"))
def _rotary_embedding_op(positions: Tensor, query: Tensor, key: Optional[Tensor], head_size: int,
                         cos_sin_cache: Tensor, is_neox: bool) -> None:
    # Devices without a kernel of their own land here (the CPU kernel is registered below).
    raise _no_kernel("rotary_embedding", positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)


@_rotary_embedding_op.register_kernel("cpu")
def _rotary_embedding_cpu(positions, query, key, head_size, cos_sin_cache, is_neox):
    _rotate_engine(positions, query, key, head_size, cos_sin_cache, is_neox)


if _rotary.cuda:
    @_rotary_embedding_op.register_kernel("cuda")
    def _rotary_embedding_cuda(positions, query, key, head_size, cos_sin_cache, is_neox):
        _same_kind("rotary_embedding", positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
        _rotate_engine(positions, query, key, head_size, cos_sin_cache, is_neox)


@_rotary_embedding_op.register_fake
def _rotary_embedding_fake(positions, query, key, head_size, cos_sin_cache, is_neox):
    _shapes_only("rotary_embedding", positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
    return None


# ---- M-RoPE (multimodal RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V) --------------------------------

def _short(value: Any) -> str:
    """repr(value), cut to about 100 characters, for error messages."""
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _mrope_section_arg(mrope_section: Any, rotary_dim: int) -> tuple[int, int, int]:
    """``mrope_section`` checked against the cache's rotary_dim: three non-negative ints (temporal,
    height, width) summing to rotary_dim/2, as vLLM's ``MRotaryEmbedding`` asserts."""
    if isinstance(mrope_section, (str, bytes)) or not isinstance(mrope_section, Sequence):
        raise TypeError(f"mrope_section must be a sequence of 3 ints (temporal, height, width), got "
                        f"{type(mrope_section).__name__} {_short(mrope_section)}")
    section = list(mrope_section)
    if len(section) != 3:
        raise ValueError(f"mrope_section={_short(section)} must have 3 entries (temporal, height, width), got "
                         f"{len(section)}")
    for i, s in enumerate(section):
        if isinstance(s, bool) or not hasattr(type(s), "__index__"):
            raise TypeError(f"mrope_section[{i}]={_short(s)} must be an int, got {type(s).__name__}")
    section = [s.__index__() for s in section]
    for i, s in enumerate(section):
        if s < 0:
            raise ValueError(f"mrope_section[{i}]={s} must be >= 0 (mrope_section={section})")
    if sum(section) != rotary_dim // 2:
        raise ValueError(f"mrope_section={section} sums to {sum(section)}, but must sum to rotary_dim/2="
                         f"{rotary_dim // 2} (cos_sin_cache width {rotary_dim})")
    return section[0], section[1], section[2]


def _mrope_streams(section: tuple[int, int, int], interleaved: bool, rotary_dim: int, device: Any) -> Tensor:
    """``[rotary_dim]`` int64: the position stream (0 temporal, 1 height, 2 width) of each column of
    the cos/sin table (the cos half and the sin half alike). Computed on ``device`` from an arange
    (no host-to-device copy: capturable in a CUDA graph).

    Chunked (Qwen2-VL, Qwen2.5-VL, GLM-4.1V; vLLM's ``torch.cat([m[i] for i, m in
    enumerate(cos.split(mrope_section, dim=-1))])``): pair j takes stream i when j falls in the i-th
    section. Interleaved (Qwen3-VL; vLLM's ``apply_interleaved_rope``): pair j takes height when
    ``j % 3 == 1 and j < 3 * mrope_section[1]``, width when ``j % 3 == 2 and j < 3 * mrope_section[2]``,
    temporal otherwise."""
    j = torch.arange(rotary_dim, device=device) % (rotary_dim // 2)
    if interleaved:
        height = (j % 3 == 1) & (j < 3 * section[1])
        width = (j % 3 == 2) & (j < 3 * section[2])
        return height.long() + 2 * width.long()
    return (j >= section[0]).long() + (j >= section[0] + section[1]).long()


def _mrope_table(positions: Any, query: Any, cos_sin_cache: Any, mrope_section: Any,
                 mrope_interleaved: bool) -> tuple[Tensor, Tensor]:
    """Checks an M-RoPE call's positions (``[3, tokens]``) and section, and returns ``(kernel_positions,
    table)``: ``table`` ``[tokens, rotary_dim]`` is each token's cos/sin row, column c taken from
    ``cos_sin_cache[positions[stream(c), t], c]`` (gathers only: the cache's bits, no arithmetic on
    them); ``kernel_positions`` is ``arange(tokens)`` (each token its own row of the table), -1 for a
    token any of whose three positions is outside ``[0, max_position)`` (the kernel refuses it on the
    CPU, skips it on a CUDA device). No host synchronisation, no branching on tensor values:
    traceable by torch.compile and capturable in a CUDA graph."""
    for name, t in (("positions", positions), ("query", query), ("cos_sin_cache", cos_sin_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    rotary_dim = _positions_and_cache_checks(positions, cos_sin_cache, None)
    section = _mrope_section_arg(mrope_section, rotary_dim)
    if positions.ndim != 2 or positions.shape[0] != 3:
        raise ValueError(f"positions shape {tuple(positions.shape)} must be [3, tokens] (temporal, height, width) "
                         f"or [tokens] (text only) with mrope_section")
    tokens = positions.shape[1]
    if query.ndim not in (2, 3) or query.shape[0] != tokens:
        raise ValueError(f"query shape {tuple(query.shape)} must be [tokens={tokens}, heads * head_size] or "
                         f"[tokens={tokens}, heads, head_size] with M-RoPE positions {tuple(positions.shape)}")
    for name, t in (("positions", positions), ("cos_sin_cache", cos_sin_cache)):
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device} but query is on {query.device} (every tensor of a call must "
                             f"be on one device)")
    device = positions.device
    max_position = cos_sin_cache.shape[0]
    pos = positions.long()
    unusable = ((pos < 0) | (pos >= max_position)).any(dim=0)  # [tokens]
    kernel_positions = torch.where(unusable, -1, torch.arange(tokens, device=device))
    if tokens == 0 or max_position == 0:  # nothing to gather: the cache itself, judged as in a 1-D call
        return kernel_positions, cos_sin_cache
    streams = _mrope_streams(section, mrope_interleaved, rotary_dim, device)
    # rows[t, c] = positions[streams[c], t], clamped into the cache (its token is refused anyway).
    rows = pos.index_select(0, streams).t().clamp(0, max_position - 1)
    return kernel_positions, cos_sin_cache.gather(0, rows)


_STREAMS = ("temporal", "height", "width")


def _mrope_refuse_eagerly(positions: Tensor, cos_sin_cache: Tensor) -> None:
    """On the CPU in eager mode: names the first unusable M-RoPE position (stream and token) instead of
    the kernel's -1."""
    if positions.device.type != "cpu" or positions.numel() == 0:
        return
    bad = (positions < 0) | (positions >= cos_sin_cache.shape[0])
    if bool(bad.any()):
        stream, token = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"positions[{stream}, {token}]={int(positions[stream, token])} ({_STREAMS[stream]} "
                         f"stream) is outside [0, {cos_sin_cache.shape[0]}), the rows of cos_sin_cache")


def _mrope_checks(positions: Any, query: Any, mrope_section: Any, mrope_interleaved: Any) -> bool:
    """Whether the call is an M-RoPE one (``[3, tokens]`` positions with ``mrope_section``); raises on
    the combinations that cannot be: 3 position streams without ``mrope_section``, ``mrope_interleaved``
    without it."""
    if not isinstance(mrope_interleaved, bool):
        raise TypeError(f"mrope_interleaved must be a bool, got {type(mrope_interleaved).__name__}")
    if mrope_section is None:
        if mrope_interleaved:
            raise ValueError("mrope_interleaved=True needs mrope_section (the temporal, height and width sections)")
        if (isinstance(positions, torch.Tensor) and isinstance(query, torch.Tensor) and positions.ndim == 2
                and positions.shape[0] == 3 and query.ndim >= 1 and query.shape[0] == positions.shape[1]
                and tuple(query.shape[:2]) != tuple(positions.shape)):
            raise ValueError(f"positions shape {tuple(positions.shape)} is M-RoPE's [3, tokens] (temporal, height, "
                             f"width): pass mrope_section (e.g. [16, 24, 24], summing to rotary_dim/2)")
        return False
    # vLLM's MRotaryEmbedding: [tokens] positions (text only) are plain RoPE, the section still checked.
    return not (isinstance(positions, torch.Tensor) and positions.ndim == 1)


def _direct(*tensors: Optional[Tensor]) -> bool:
    """Call the kernel directly: eager mode, plain CPU or CUDA tensors, nothing tracing (torch.compile,
    a dispatch mode): as rotary.torch's ``_direct``."""
    for t in tensors:
        if t is not None and (type(t) is not Tensor or t.device.type not in _KERNEL_DEVICES):
            return False
    return not _is_compiling() and _dispatch_modes() == 0


def rotary_embedding(positions: Tensor, query: Tensor, key: Optional[Tensor], head_size: int,
                     cos_sin_cache: Tensor, is_neox: bool, *, mrope_section: Optional[Sequence[int]] = None,
                     mrope_interleaved: bool = False) -> None:
    """vLLM's and SGLang's ``rotary_embedding`` operator: rotates query and key in place from the
    caller's ``cos_sin_cache``.

    For token t at position p = positions[t] and pair j of each head (j < rotary_dim/2, rotary_dim =
    ``cos_sin_cache.shape[1]``), with c = cos_sin_cache[p, j] and s = cos_sin_cache[p, rotary_dim/2 + j]:
    ``x1' = x1 c - x2 s``, ``x2' = x2 c + x1 s``, where (x1, x2) = (x[j], x[j + rotary_dim/2]) when
    ``is_neox`` (GPT-NeoX, ``rotate_half``) and (x[2j], x[2j+1]) otherwise (GPT-J, interleaved). Channels
    from rotary_dim to head_size are left alone (partial rotary).

    M-RoPE (with ``mrope_section`` and positions ``[3, tokens]``, as vLLM's ``MRotaryEmbedding``): pair
    j of token t takes c and s from row ``positions[i, t]`` of ``cos_sin_cache``, where stream i
    (0 temporal, 1 height, 2 width) is

    - chunked (``mrope_interleaved=False``: Qwen2-VL, Qwen2.5-VL, GLM-4.1V): the section j falls in,
      i.e. 0 for ``j < t``, 1 for ``t <= j < t + h``, 2 for ``t + h <= j`` with ``mrope_section = [t,
      h, w]``;
    - interleaved (``mrope_interleaved=True``: Qwen3-VL, vLLM's ``apply_interleaved_rope``): 1 when
      ``j % 3 == 1 and j < 3 h``, 2 when ``j % 3 == 2 and j < 3 w``, 0 otherwise (T, H, W, T, H, W,
      ..., the height slots from 3h on and the width slots from 3w on temporal again; t itself only
      enters through the sum).

    The rotation is then the 1-D one above, for either ``is_neox``. Tokens whose three positions are
    equal (text) get plain RoPE's rotation at that position, bit for bit.

    Parameters
    ----------
    positions : torch.Tensor
        ``[tokens]`` (or ``[batch, seq]``), int64 or int32: each token's row of ``cos_sin_cache``.
        With ``mrope_section``: ``[3, tokens]`` (temporal, height, width rows; any strides), or
        ``[tokens]`` (text only: plain RoPE, as vLLM).
    query : torch.Tensor
        ``[tokens, heads * head_size]`` (e.g. a slice of a fused QKV tensor) or ``[tokens, heads,
        head_size]``; with positions ``[batch, seq]``, ``[batch, seq, heads * head_size]`` or ``[batch,
        seq, heads, head_size]`` (vLLM's kernel takes both); any strides; float32, float64, float16 or
        bfloat16. Written in place.
    key : torch.Tensor or None
        As query (its own head count, query's dtype and tokens); None rotates query alone.
    head_size : int
        Width of one head.
    cos_sin_cache : torch.Tensor
        ``[max_position, rotary_dim]``: row p holds the rotary_dim/2 cos values of position p, then the
        rotary_dim/2 sin values (already times any attention factor); float32, float64, float16 or
        bfloat16 (widened to float32, or float64 for float64 data). Only read.
    is_neox : bool
        True: pair channel j with j + rotary_dim/2; False: pair 2j with 2j+1.
    mrope_section : sequence of 3 ints, optional, keyword-only
        M-RoPE's ``[temporal, height, width]`` section sizes in pairs (e.g. ``[16, 24, 24]`` for
        Qwen2-VL, ``[24, 20, 20]`` for Qwen3-VL), each >= 0, summing to rotary_dim/2. None (default):
        no M-RoPE, positions ``[tokens]`` or ``[batch, seq]`` as above.
    mrope_interleaved : bool, keyword-only
        False (default): chunked sections; True: Qwen3-VL's interleaved assignment (needs
        ``mrope_section``).

    Returns
    -------
    None
        query and key are rotated in place.

    Raises
    ------
    TypeError
        An argument of the wrong kind or dtype, naming it.
    ValueError
        A shape, device or position that breaks a rule, naming it (a position outside
        ``[0, max_position)`` on the CPU; on a CUDA device such a token is skipped and reported by
        ``rotary.torch.check_positions``); query and key are then untouched. For M-RoPE: positions
        ``[3, tokens]`` without ``mrope_section``; a ``mrope_section`` of other than 3 entries, with
        a negative entry, or not summing to rotary_dim/2 (the value named); ``mrope_interleaved``
        without ``mrope_section``. An M-RoPE position outside ``[0, max_position)``, on the CPU in eager
        mode, names its stream and token; traced (torch.compile) or on a CUDA device, the token is
        refused (CPU) or skipped and reported (CUDA) as position -1 at its index.

    Notes
    -----
    Arithmetic: float32 for float32, float16 and bfloat16 data, each output one fused multiply-add
    (the larger product fused, the smaller rounded first: see ``rotary.Rope.apply``), rounded once to
    the data's dtype; float64 in float64. vLLM's ``forward_native`` rounds each product and the sum
    (and, for half-precision data, casts the table to the data's dtype first): the results agree to
    within those roundings.
    """
    if _mrope_checks(positions, query, mrope_section, mrope_interleaved):
        direct = _direct(positions, query, key, cos_sin_cache)
        kernel_positions, table = _mrope_table(positions, query, cos_sin_cache, mrope_section, mrope_interleaved)
        _engine_call(kernel_positions, query, key, head_size, table, is_neox)  # the rest, before anything is read
        if direct:
            _mrope_refuse_eagerly(positions, cos_sin_cache)
            _rotate_engine(kernel_positions, query, key, head_size, table, is_neox)
        else:
            torch.ops.rotary.rotary_embedding(kernel_positions, query, key, head_size, table, is_neox)
        return
    if mrope_section is not None and isinstance(cos_sin_cache, torch.Tensor) and cos_sin_cache.ndim == 2:
        _mrope_section_arg(mrope_section, cos_sin_cache.shape[1])  # text-only positions: checked all the same
    if _direct(positions, query, key, cos_sin_cache):
        _rotate_engine(positions, query, key, head_size, cos_sin_cache, is_neox)
    else:
        _engine_call(positions, query, key, head_size, cos_sin_cache, is_neox)  # kinds named while tracing
        torch.ops.rotary.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


def apply_rope_with_cos_sin_cache_inplace(positions: Tensor, query: Tensor, key: Optional[Tensor], head_size: int,
                                          cos_sin_cache: Tensor, is_neox: bool = True) -> None:
    """FlashInfer's ``flashinfer.rope.apply_rope_with_cos_sin_cache_inplace`` (also sgl-kernel's): the
    same rotation as ``rotary_embedding``, with FlashInfer's rule that ``cos_sin_cache`` is float32.

    Parameters
    ----------
    positions : torch.Tensor
        ``[nnz]``, int64 or int32.
    query, key : torch.Tensor
        ``[nnz, heads * head_size]`` (or ``[nnz, heads, head_size]``), rotated in place; key may be
        None (FlashInfer requires it).
    head_size : int
        Width of one head.
    cos_sin_cache : torch.Tensor
        float32 ``[max_seq_len, rotary_dim]``, cos in the first half of each row, sin in the second;
        rotary_dim <= head_size (the first rotary_dim channels of each head rotate).
    is_neox : bool
        True (default): ``rotate_half`` pairs (x[j], x[j + rotary_dim/2]); False: interleaved pairs
        (x[2j], x[2j+1]).

    Returns
    -------
    None

    Raises
    ------
    TypeError, ValueError
        As ``rotary_embedding``; and ValueError when cos_sin_cache is not float32 (FlashInfer's
        ``cos_sin_cache should be float32``).
    """
    if isinstance(cos_sin_cache, torch.Tensor) and cos_sin_cache.dtype != torch.float32:
        raise ValueError(f"cos_sin_cache should be float32 (FlashInfer's rule), got {cos_sin_cache.dtype}")
    rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
