"""PyTorch integration: autograd and a drop-in rotary module for Llama-style attention."""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import Rope, _show

__all__ = ["apply_rope", "RotaryEmbedding"]


class _RopeFunction(torch.autograd.Function):
    """y = R(θ) x; the backward pass is the transpose, i.e. the inverse rotation of the gradient,
    itself a _RopeFunction: so second derivatives work too. Inputs are only read (any strides,
    expanded gradients included), never copied."""

    @staticmethod
    def forward(ctx, rope, positions, offset, layout, inverse, caller, q, k):  # type: ignore[override]
        ctx.call = (rope, positions, offset, layout, inverse, caller)
        ctx.has_k = k is not None
        kw = dict(positions=positions, offset=offset, layout=layout, inverse=inverse, **caller)
        if k is None:
            return rope.apply(q, **kw)
        return rope.apply(q, k, **kw)

    @staticmethod
    def backward(ctx, grad_q, grad_k=None):  # type: ignore[override]
        rope, positions, offset, layout, inverse, caller = ctx.call
        grads = _RopeFunction.apply(rope, positions, offset, layout, not inverse, caller, grad_q,
                                    grad_k if ctx.has_k else None)
        gq, gk = grads if ctx.has_k else (grads, None)
        return None, None, None, None, None, None, gq, gk


def apply_rope(rope: Rope, q: torch.Tensor, k: Optional[torch.Tensor] = None, *, positions: Any = None,
               offset: int = 0, layout: str = "bshd", inverse: bool = False, cos: Any = None, sin: Any = None,
               cos_sin_cache: Any = None, cos_sin_columns: Optional[str] = None):
    """Differentiable RoPE: returns q, or (q, k) when k is given (``inverse=True`` rotates by
    -angle). Gradients are the opposite rotation of the upstream gradients, themselves
    differentiable (exact in float64, gradcheck- and gradgradcheck-clean). Arguments as
    ``Rope.apply`` (M-RoPE positions ``[streams, batch, seq]``, the caller's ``cos``/``sin``:
    constants, no gradient flows into them); q and k are only read."""
    if not isinstance(rope, Rope):
        raise TypeError(f"rope must be a rotary.Rope, got {type(rope).__name__}")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if k is not None and not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a torch.Tensor, got {type(k).__name__}")
    caller = {name: value for name, value in (("cos", cos), ("sin", sin), ("cos_sin_cache", cos_sin_cache),
                                              ("cos_sin_columns", cos_sin_columns)) if value is not None}
    for name in ("cos", "sin", "cos_sin_cache"):
        if isinstance(caller.get(name), torch.Tensor):
            caller[name] = caller[name].detach()
    return _RopeFunction.apply(rope, positions, offset, layout, inverse, caller, q, k)


class RotaryEmbedding(torch.nn.Module):
    """Drop-in for the rotary step of a Llama-style attention block (q, k in ``[batch, heads, seq,
    head_dim]`` as Hugging Face keeps them): ``q, k = rotary(q, k, position_ids)``."""

    def __init__(self, rope: Rope, layout: str = "bhsd") -> None:
        super().__init__()
        if not isinstance(rope, Rope):
            raise TypeError(f"rope must be a rotary.Rope, got {type(rope).__name__}")
        if not isinstance(layout, str):
            raise TypeError(f"layout must be a str, got {type(layout).__name__}")
        if layout not in ("bshd", "bhsd"):
            raise ValueError(f"layout={_show(layout)} must be 'bshd' or 'bhsd'")
        self.rope = rope
        self.layout = layout

    def forward(self, q: torch.Tensor, k: torch.Tensor, position_ids: Optional[torch.Tensor] = None):
        return apply_rope(self.rope, q, k, positions=position_ids, layout=self.layout)

    def extra_repr(self) -> str:
        return repr(self.rope)
