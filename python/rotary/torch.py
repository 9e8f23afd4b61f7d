"""PyTorch integration: autograd and a drop-in rotary module for Llama-style attention."""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import Rope

__all__ = ["apply_rope", "RotaryEmbedding"]


class _RopeFunction(torch.autograd.Function):
    """y = R(θ) x; the backward pass is the transpose, i.e. the inverse rotation of the gradient."""

    @staticmethod
    def forward(ctx, rope, positions, offset, layout, q, k):  # type: ignore[override]
        ctx.rope, ctx.positions, ctx.offset, ctx.layout = rope, positions, offset, layout
        ctx.has_k = k is not None
        if k is None:
            return rope.apply(q.detach(), positions=positions, offset=offset, layout=layout)
        return rope.apply(q.detach(), k.detach(), positions=positions, offset=offset, layout=layout)

    @staticmethod
    def backward(ctx, grad_q, grad_k=None):  # type: ignore[override]
        rope = ctx.rope
        kw = dict(positions=ctx.positions, offset=ctx.offset, layout=ctx.layout, inverse=True)
        gq = rope.apply(grad_q.contiguous(), **kw) if grad_q is not None else None
        gk = None
        if ctx.has_k and grad_k is not None:
            gk = rope.apply(grad_k.contiguous(), **kw)
        return None, None, None, None, gq, gk


def apply_rope(rope: Rope, q: torch.Tensor, k: Optional[torch.Tensor] = None, *, positions: Any = None,
               offset: int = 0, layout: str = "bshd"):
    """Differentiable RoPE: returns q, or (q, k) when k is given. Gradients are the inverse
    rotation of the upstream gradients (exact in float64, gradcheck-clean)."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if k is not None and not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a torch.Tensor, got {type(k).__name__}")
    return _RopeFunction.apply(rope, positions, offset, layout, q, k)


class RotaryEmbedding(torch.nn.Module):
    """Drop-in for the rotary step of a Llama-style attention block (q, k in ``[batch, heads, seq,
    head_dim]`` as Hugging Face keeps them): ``q, k = rotary(q, k, position_ids)``."""

    def __init__(self, rope: Rope, layout: str = "bhsd") -> None:
        super().__init__()
        self.rope = rope
        self.layout = layout

    def forward(self, q: torch.Tensor, k: torch.Tensor, position_ids: Optional[torch.Tensor] = None):
        return apply_rope(self.rope, q, k, positions=position_ids, layout=self.layout)

    def extra_repr(self) -> str:
        return repr(self.rope)
