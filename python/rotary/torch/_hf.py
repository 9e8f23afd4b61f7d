"""transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` on rotary's kernel, with
the caller's cos and sin: ``rotary.torch.apply_rotary_pos_emb``, also exported by
``rotary.transformers``. Its own module so that ``rotary.torch`` and ``rotary.transformers`` each
import it without importing the other (``rotary.transformers`` builds on ``rotary.torch``, never
the reverse)."""
from __future__ import annotations

from typing import Any

import torch

from .._args import _show
from .._rope import Rope
from . import apply_rope

__all__ = ["apply_rotary_pos_emb"]

# ---- The caller's cos/sin ---------------------------------------------------------------------------

_caller_ropes: dict[tuple[int, int], Rope] = {}  # (head_dim, rotary_dim) -> a Rope for caller angles


@torch.compiler.assume_constant_result  # torch.compile runs it while tracing: no graph break for a new Rope
def _caller_rope(head_dim: int, rotary_dim: int) -> Rope:
    """A half-paired Rope of these widths; its schedule is unused (the caller gives the angles)."""
    rope = _caller_ropes.get((head_dim, rotary_dim))
    if rope is None:  # dict.setdefault is atomic: two threads get the same Rope
        rope = _caller_ropes.setdefault((head_dim, rotary_dim), Rope(head_dim, rotary_dim))
    return rope


def _order(unsqueeze_dim: Any) -> str:
    """transformers' unsqueeze_dim as a tensor order: 1 for [batch, heads, seq, head_dim], 2 for
    [batch, seq, heads, head_dim]."""
    if not isinstance(unsqueeze_dim, int) or isinstance(unsqueeze_dim, bool):
        raise TypeError(f"unsqueeze_dim must be an int, got {type(unsqueeze_dim).__name__}")
    if unsqueeze_dim == 1:
        return "bhsd"
    if unsqueeze_dim == 2:
        return "bshd"
    raise ValueError(f"unsqueeze_dim={_show(unsqueeze_dim)} must be 1 (q, k [batch, heads, seq, head_dim]) "
                     "or 2 ([batch, seq, heads, head_dim])")


def _check_caller_angles(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int) -> None:
    """The shape rules of apply_rotary_pos_emb (unsqueeze_dim already checked), each error naming
    the caller's argument and its shape as passed: the kernel would name its own views of them
    (``angles``, k's shape in [batch, seq, heads, head_dim] order)."""
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions, got shape {tuple(t.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 3:
            raise ValueError(f"{name} must have 3 dimensions ([batch or 1, seq, rotary_dim]), got shape "
                             f"{tuple(t.shape)}")
        if torch.is_grad_enabled() and t.requires_grad:
            raise ValueError(f"{name} requires grad, but rotary treats cos and sin as constants (no gradient "
                             "flows into them): detach them, or use transformers' own apply_rotary_pos_emb")
    if sin.shape != cos.shape:
        raise ValueError(f"sin shape {tuple(sin.shape)} must equal cos shape {tuple(cos.shape)}")
    width, head_dim = cos.shape[-1], q.shape[-1]
    if width % 2 or not 0 < width <= head_dim:
        raise ValueError(f"cos width={width} (rotary_dim) must be even, > 0 and <= head_dim={head_dim}")
    seq_dim = 2 if unsqueeze_dim == 1 else 1  # [batch, heads, seq, head_dim] or [batch, seq, heads, head_dim]
    batch, seq = q.shape[0], q.shape[seq_dim]
    if k.shape[-1] != head_dim or k.shape[0] != batch or k.shape[seq_dim] != seq:
        raise ValueError(f"k shape {tuple(k.shape)} must match q shape {tuple(q.shape)} in batch (dim 0), seq "
                         f"(dim {seq_dim} with unsqueeze_dim={unsqueeze_dim}) and head_dim")
    if cos.shape[0] not in (1, batch) or cos.shape[1] != seq:
        raise ValueError(f"cos shape {tuple(cos.shape)} must be [batch={batch} or 1, seq={seq}, rotary_dim] "
                         f"for q shape {tuple(q.shape)} with unsqueeze_dim={unsqueeze_dim}")


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb`` on rotary's fused kernel: ``q * cos +
    rotate_half(q) * sin`` (and k), computed in float32 and rounded once at the store.

    Parameters
    ----------
    q, k : torch.Tensor
        ``[batch, heads, seq, head_dim]`` (``unsqueeze_dim=1``) or ``[batch, seq, heads, head_dim]``
        (``unsqueeze_dim=2``), float32/float64/float16/bfloat16, CPU, any strides; only read. k may
        have fewer heads (grouped-query attention).
    cos, sin : torch.Tensor
        transformers' ``cos, sin = rotary_emb(x, position_ids)``: ``[batch or 1, seq, rotary_dim]``,
        the two halves of a row equal (``torch.cat((freqs, freqs), -1)``), already times the
        attention factor, in any float dtype (float32 cos/sin with a bf16 q rotate in float32). A
        ``rotary_dim`` below ``head_dim`` rotates the leading channels and passes the others
        through, as transformers' partial-rotary models do. Constants: no gradient flows into them.
    unsqueeze_dim : {1, 2}
        As transformers: where cos and sin would be unsqueezed to broadcast over the heads.

    Returns
    -------
    tuple of torch.Tensor
        ``(q_embed, k_embed)``, new tensors. Gradients flow to q and k (the inverse rotation of the
        upstream gradient).

    Raises
    ------
    TypeError
        A non-tensor argument, unsqueeze_dim not an int, or a dtype the kernel does not take.
    ValueError
        unsqueeze_dim not 1 or 2, tensors of the wrong rank, a cos width that is odd or wider than
        head_dim, sin shaped unlike cos, cos (or k) whose batch or seq disagrees with q's, cos/sin
        that require grad (rotary cannot give them a gradient). Every error names the argument
        (``q``, ``k``, ``cos``, ``sin``, ``unsqueeze_dim``) and shows its shape as passed; q and k
        are untouched.
    """
    order = _order(unsqueeze_dim)
    _check_caller_angles(q, k, cos, sin, unsqueeze_dim)
    rope = _caller_rope(int(q.shape[-1]), int(cos.shape[-1]))
    return apply_rope(rope, q, k, order=order, cos=cos, sin=sin, cos_sin_columns="halves")
