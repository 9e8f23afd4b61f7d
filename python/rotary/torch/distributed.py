"""Context parallelism: RoPE on a sequence split across the ranks of a torch.distributed group.

Reached as ``rotary.torch.distributed`` (``from rotary.torch import distributed``). Each rank of a
context-parallel (CP) group of ``cp_size`` ranks holds ``seq_len / cp_size`` tokens of every
sequence. Rotating a shard needs each token's *global* position, and causal attention needs it
again to mask the gathered keys: this module gives both, under the two splits in use.

- ``"zigzag"`` (the default): the sequence is cut into ``2 * cp_size`` equal chunks and rank r
  holds chunk r followed by chunk ``2 * cp_size - 1 - r``. Under a causal mask every rank then
  does the same work (an early chunk is paired with a late one). cp_size = 2, seq_len = 8::

      positions  0 1 | 2 3 | 4 5 | 6 7
      chunk        0     1     2     3
      rank 0 holds [0 1 6 7], rank 1 holds [2 3 4 5]

  This is the order of Megatron-LM (``megatron/core/utils.py``,
  ``_get_batch_on_this_cp_rank_per_sequence_balancing``: ``index = [cp_rank, 2 * cp_size -
  cp_rank - 1]`` then ``index_select`` on the sequence dimension) and of TransformerEngine
  (``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``,
  ``get_batch_on_this_cp_rank``: the slice ``[cp_rank * n, (cp_rank + 1) * n)`` then
  ``[(2 * cp_size - cp_rank - 1) * n, (2 * cp_size - cp_rank) * n)`` of each sequence; the same
  order as its ``thd_get_partitioned_indices`` and the bshd split of its CP tests), so shards made
  here line up with theirs token for token.
- ``"contiguous"``: rank r holds the r-th of ``cp_size`` equal blocks (ring attention without load
  balancing; sequence parallelism's split).

What a rank does, given bshd q, k, v of the whole sequence::

    from rotary.torch import distributed as cp
    q, k, v = (cp.shard(t, cp_size, cp_rank, dim=1) for t in (q, k, v))
    positions = cp.shard_positions(seq_len, cp_size, cp_rank)   # global positions, [seq_len/cp_size]
    q, k = rope.apply(q, k, positions=positions)                # M-RoPE: cp.shard(position_ids, ..., dim=-1)
    keys, values = cp.all_gather(k, dim=1), cp.all_gather(v, dim=1)  # whole sequence, in order
    mask = torch.arange(seq_len) <= positions[:, None]          # causal, by global position

Each rotated row is bit-identical to the same row of the single-process rotation: a row's result
depends only on its values and its position. Sharding and gathering copy; they never write their
input.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
import torch

from .._args import _int_arg, _show

__all__ = ["SCHEMES", "shard_positions", "shard", "unshard", "all_gather"]

Array = Union[torch.Tensor, np.ndarray]

SCHEMES = ("zigzag", "contiguous")  # how a sequence is split across the ranks
_POSITION_LIMIT = 1 << 31  # positions are in [0, 2^31), as everywhere in rotary
_REDUCE_SCATTER_BACKENDS = ("nccl", "xccl")  # all_gather's backward reduce-scatters on these, else all-reduces


# ---- The rule -------------------------------------------------------------------------------------

def _scheme_arg(scheme: Any) -> str:
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a str, got {type(scheme).__name__}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={_show(scheme)} must be 'zigzag' or 'contiguous'")
    return scheme


def _cp_size_arg(cp_size: Any, scheme: str) -> int:
    """cp_size in [1, 2^30] ("zigzag") or [1, 2^31] ("contiguous"): the scheme cuts a sequence into
    2 * cp_size (cp_size) chunks, and a sequence holds at most 2^31 positions. Past that no
    sequence but the empty one splits, and nothing is worth computing for it."""
    cp_size = _int_arg(cp_size, "cp_size")
    if cp_size < 1:
        raise ValueError(f"cp_size={_show(cp_size)} must be >= 1")
    chunks = 2 if scheme == "zigzag" else 1
    if cp_size > _POSITION_LIMIT // chunks:
        count = "2*cp_size" if scheme == "zigzag" else "cp_size"
        raise ValueError(f"cp_size={_show(cp_size)} must be <= 2^{31 - chunks + 1}: scheme '{scheme}' cuts a "
                         f"sequence into {count} chunks, and a sequence has at most 2^31 positions")
    return cp_size


def _group_args(cp_size: Any, cp_rank: Any, scheme: Any) -> tuple[int, int, str]:
    """cp_size, cp_rank and scheme checked: kinds first, then values."""
    cp_size = _int_arg(cp_size, "cp_size")
    cp_rank = _int_arg(cp_rank, "cp_rank")
    scheme = _scheme_arg(scheme)
    cp_size = _cp_size_arg(cp_size, scheme)
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank={_show(cp_rank)} must be in [0, cp_size={cp_size})")
    return cp_size, cp_rank, scheme


def _chunk_length(length: int, what: str, cp_size: int, scheme: str) -> int:
    """Tokens per chunk; ValueError unless ``length`` splits into the scheme's equal chunks."""
    chunks = 2 * cp_size if scheme == "zigzag" else cp_size
    if length % chunks:
        count = "2*cp_size" if scheme == "zigzag" else "cp_size"
        raise ValueError(f"{what}={length} is not divisible by {count}={chunks}: scheme '{scheme}' splits the "
                         f"sequence into {count} equal chunks")
    return length // chunks


def _rank_chunks(cp_size: int, cp_rank: int, scheme: str) -> tuple[int, ...]:
    """The chunks rank cp_rank holds, in the order it holds them."""
    if scheme == "zigzag":
        # Megatron-LM _get_batch_on_this_cp_rank_per_sequence_balancing / TransformerEngine
        # get_batch_on_this_cp_rank: index = [cp_rank, 2 * cp_size - cp_rank - 1].
        return (cp_rank, 2 * cp_size - 1 - cp_rank)
    return (cp_rank,)


# ---- Slicing arrays and tensors -------------------------------------------------------------------

def _check_array(x: Any, name: str, torch_only: bool = False) -> None:
    if isinstance(x, torch.Tensor) or (isinstance(x, np.ndarray) and not torch_only):
        return
    kinds = "a torch.Tensor" if torch_only else "a torch.Tensor or numpy.ndarray"
    raise TypeError(f"{name} must be {kinds}, got {type(x).__name__}")


def _dim_arg(x: Array, dim: Any) -> int:
    """dim as an index in [0, x.ndim)."""
    dim = _int_arg(dim, "dim")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim={_show(dim)} is out of range for x of shape {tuple(x.shape)} ({x.ndim} dimensions)")
    return dim % x.ndim


def _concat_chunks(x: Array, dim: int, chunk: int, chunks: list[int]) -> Array:
    """A new array/tensor: chunks ``chunks`` (each ``chunk`` long along dim) of x, in that order."""
    if isinstance(x, torch.Tensor):
        return torch.cat([x.narrow(dim, c * chunk, chunk) for c in chunks], dim)
    lead = (slice(None),) * dim
    return np.concatenate([x[lead + (slice(c * chunk, (c + 1) * chunk),)] for c in chunks], axis=dim)


def _unzigzag(x: Array, dim: int, cp_size: int, chunk: int) -> Array:
    """A new array/tensor: x's zigzag shards in rank order put back in position order, by whole
    strides (no loop over ranks). Along dim x is [cp_size ranks][2 slots][chunk]: rank r's first
    slot holds chunk r, its second chunk 2*cp_size-1-r. So the first slots in rank order are chunks
    0 .. cp_size-1, and the second slots in reverse rank order are chunks cp_size .. 2*cp_size-1."""
    if isinstance(x, torch.Tensor):
        slots = x.unflatten(dim, (cp_size, 2, chunk))
        return torch.cat([slots.select(dim + 1, 0), slots.select(dim + 1, 1).flip(dim)], dim).flatten(dim, dim + 1)
    slots = x.reshape(x.shape[:dim] + (cp_size, 2, chunk) + x.shape[dim + 1:])
    lead = (slice(None),) * (dim + 1)
    ordered = np.concatenate([slots[lead + (0,)], np.flip(slots[lead + (1,)], axis=dim)], axis=dim)
    return ordered.reshape(x.shape)


# ---- The API --------------------------------------------------------------------------------------

def shard_positions(seq_len: int, cp_size: int, cp_rank: int, scheme: str = "zigzag") -> torch.Tensor:
    """The global positions of the tokens that rank cp_rank holds, in the order it holds them.

    Parameters
    ----------
    seq_len : int
        Length of the whole sequence, in [0, 2^31]; divisible by ``2 * cp_size`` (``"zigzag"``)
        or by ``cp_size`` (``"contiguous"``).
    cp_size : int
        Ranks in the context-parallel group: in [1, 2^30] for ``"zigzag"`` (its 2 * cp_size
        chunks cannot outnumber a sequence's 2^31 positions), [1, 2^31] for ``"contiguous"``.
    cp_rank : int
        This rank's index in the group, in [0, cp_size).
    scheme : {"zigzag", "contiguous"}
        ``"zigzag"``: chunks ``cp_rank`` and ``2 * cp_size - 1 - cp_rank`` of ``2 * cp_size``
        (Megatron-LM's and TransformerEngine's load-balanced order); ``"contiguous"``: block
        ``cp_rank`` of ``cp_size``.

    Returns
    -------
    torch.Tensor
        int64 ``[seq_len // cp_size]`` on the CPU, ascending: the ``positions`` argument of
        ``Rope.apply`` / ``rotary.torch.apply_rope`` for this rank's ``[batch, seq_len // cp_size,
        heads, head_dim]`` shard (shared by every batch row; a Rope with several position streams
        takes it for every stream, as text tokens of M-RoPE have). Add an offset for a sequence
        that does not start at position 0, and ``.to(device)`` for a GPU.

    Raises
    ------
    TypeError
        seq_len, cp_size or cp_rank not an int (a bool is not), scheme not a str.
    ValueError
        cp_size outside its range, cp_rank outside [0, cp_size), seq_len outside [0, 2^31] or not
        divisible as the scheme needs, or an unknown scheme, naming the value.
    """
    seq_len = _int_arg(seq_len, "seq_len")
    cp_size, cp_rank, scheme = _group_args(cp_size, cp_rank, scheme)
    if not 0 <= seq_len <= _POSITION_LIMIT:
        raise ValueError(f"seq_len={_show(seq_len)} must be in [0, 2^31]: positions are in [0, 2^31)")
    chunk = _chunk_length(seq_len, "seq_len", cp_size, scheme)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, dtype=torch.int64)
                      for c in _rank_chunks(cp_size, cp_rank, scheme)])


def shard(x: Array, cp_size: int, cp_rank: int, scheme: str = "zigzag", *, dim: int) -> Array:
    """This rank's part of x along its sequence dimension: the tokens ``shard_positions`` names.

    Slices anything that runs along the sequence alike: q, k, v, hidden states, input ids, labels,
    ``[batch, seq]`` positions, M-RoPE's ``[3, batch, seq]`` position ids (every stream the same
    way), each with its own ``dim``.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray
        The whole sequence along ``dim`` (any dtype, device and strides).
    cp_size, cp_rank, scheme
        As ``shard_positions``.
    dim : int
        x's sequence dimension (keyword, no default: it differs between tensors): 1 for bshd q/k/v
        and ``[batch, seq]`` ids, 2 (or -2) for bhsd, -1 for ``[3, batch, seq]`` position ids, 0
        for packed ``[tokens, heads, head_dim]`` holding one sequence.

    Returns
    -------
    torch.Tensor or numpy.ndarray
        A new tensor/array of x's kind, dtype and device (a copy, never a view of x), with
        ``x.shape[dim] // cp_size`` along dim. Differentiable for tensors.

    Raises
    ------
    TypeError
        x not a tensor or array, dim/cp_size/cp_rank not an int, scheme not a str.
    ValueError
        dim out of range, ``x.shape[dim]`` not divisible as the scheme needs, or a bad cp_size,
        cp_rank or scheme, naming the value.
    """
    _check_array(x, "x")
    dim = _dim_arg(x, dim)
    cp_size, cp_rank, scheme = _group_args(cp_size, cp_rank, scheme)
    chunk = _chunk_length(int(x.shape[dim]), f"x.shape[{dim}]", cp_size, scheme)
    return _concat_chunks(x, dim, chunk, list(_rank_chunks(cp_size, cp_rank, scheme)))


def unshard(x: Array, cp_size: int, scheme: str = "zigzag", *, dim: int) -> Array:
    """The whole sequence, in order, from every rank's shard concatenated in rank order.

    The inverse of ``shard``: ``unshard(cat([shard(x, cp_size, r, dim=d) for r in
    range(cp_size)], d), cp_size, dim=d)`` equals x. What ``torch.distributed.all_gather`` gives,
    concatenated, is in rank order; ``all_gather`` below does both steps (differentiably).

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray
        The shards of ranks 0 .. cp_size-1, one after the other along ``dim``.
    cp_size : int
        Ranks in the context-parallel group, as ``shard_positions`` takes it.
    scheme : {"zigzag", "contiguous"}
        The scheme the shards were made with.
    dim : int
        The sequence dimension (keyword, no default).

    Returns
    -------
    torch.Tensor or numpy.ndarray
        A new tensor/array of x's kind and shape, the sequence in position order.
        Differentiable for tensors. Time and memory grow with x's size alone, not with
        cp_size.

    Raises
    ------
    TypeError
        x not a tensor or array, dim/cp_size not an int, scheme not a str.
    ValueError
        dim out of range, ``x.shape[dim]`` not divisible as the scheme needs, cp_size outside its
        range or an unknown scheme, naming the value.
    """
    _check_array(x, "x")
    dim = _dim_arg(x, dim)
    cp_size = _int_arg(cp_size, "cp_size")
    scheme = _scheme_arg(scheme)
    cp_size = _cp_size_arg(cp_size, scheme)
    chunk = _chunk_length(int(x.shape[dim]), f"x.shape[{dim}]", cp_size, scheme)
    if scheme == "contiguous":  # rank order is position order
        return x.clone() if isinstance(x, torch.Tensor) else np.array(x, copy=True)
    return _unzigzag(x, dim, cp_size, chunk)


class _GatherShards(torch.autograd.Function):
    """``[cp_size, *x.shape]``: every rank's x in rank order. Backward: the gradient of this rank's
    slice summed over the ranks (each rank's loss reads every shard): reduce-scatter on NCCL and
    XCCL, else all-reduce and keep this rank's slice (every backend has all-reduce; not every
    torch's gloo has reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        ctx.group = group
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x, group=group)
        return torch.stack(pieces)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        import torch.distributed as dist

        grad = grad.clone(memory_format=torch.contiguous_format)  # the collectives write their input
        if str(dist.get_backend(ctx.group)) in _REDUCE_SCATTER_BACKENDS:
            mine = torch.empty_like(grad[0])
            dist.reduce_scatter_tensor(mine, grad.flatten(0, 1), group=ctx.group)  # ranks along dim 0
            return mine, None
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def all_gather(x: torch.Tensor, *, dim: int, scheme: str = "zigzag", group: Optional[Any] = None) -> torch.Tensor:
    """Every rank's shard of the group, gathered and put back in sequence order (keys, values).

    A collective: every rank of ``group`` calls it with a shard of the same shape, dtype and
    device. Differentiable: the gradient of a shard is the sum over the ranks of the gradient of
    its rows (reduce-scatter on NCCL, all-reduce on gloo), what training with gathered keys and
    values needs.

    Parameters
    ----------
    x : torch.Tensor
        This rank's shard (``shard(..., cp_rank=group rank)``); the group's size is cp_size.
    dim : int
        The sequence dimension (keyword, no default).
    scheme : {"zigzag", "contiguous"}
        The scheme the shards were made with.
    group : torch.distributed.ProcessGroup, optional
        The context-parallel group; default the default (world) group.

    Returns
    -------
    torch.Tensor
        ``cp_size`` times longer along dim: the whole sequence in position order, as
        ``unshard`` gives it; a new tensor.

    Raises
    ------
    TypeError
        x not a torch.Tensor, dim not an int, scheme not a str.
    ValueError
        dim out of range, an odd ``x.shape[dim]`` with ``"zigzag"`` (a shard holds two equal
        chunks), or an unknown scheme, naming the value. torch.distributed's own errors (no
        process group) pass through.
    """
    _check_array(x, "x", torch_only=True)
    dim = _dim_arg(x, dim)
    scheme = _scheme_arg(scheme)
    if scheme == "zigzag" and x.shape[dim] % 2:
        raise ValueError(f"x.shape[{dim}]={x.shape[dim]} is odd: a 'zigzag' shard holds two equal chunks")
    stacked = _GatherShards.apply(x.contiguous(), group)
    return unshard(torch.cat(stacked.unbind(0), dim), stacked.shape[0], scheme, dim=dim)
