"""PyTorch integration: RoPE as torch operators, differentiable and compilable.

Two operators in the ``rotary`` namespace carry rotary's kernels through PyTorch's dispatcher:

- ``torch.ops.rotary.rope(q, k, rope, positions, offset, layout, inverse, angles, cos, sin,
  cos_sin_cache, cos_sin_columns) -> list[Tensor]`` (its ``layout`` and ``angles`` are
  ``apply_rope``'s ``order`` and ``numerics``): out of place, ``[q_out]`` or ``[q_out, k_out]``;
  differentiable (the gradient of a rotation is the inverse rotation of the gradient, itself this
  operator, so second derivatives work too).
- ``torch.ops.rotary.rope_(...) -> ()``: the same arguments, writes q and k in place; not
  differentiable (a tensor that requires grad is refused: use ``apply_rope``).

An operator cannot take a Python object, so ``rope`` is the Rope's handle (``Rope._handle``, an int
that names one live Rope for the life of the process; a copy or an unpickled Rope gets its own).
Both have fake (meta) implementations, so ``torch.compile(fullgraph=True)`` traces through them
without a graph break; they give shapes only to calls whose tensors are all fake (tracing) or all
on ``meta``: a meta tensor among real ones gets a ValueError naming it, before anything is
written. Kernels are registered for device type ``"cpu"`` and, when rotary was built
with its CUDA kernels (``pip install . --config-settings=cmake.define.ROTARY_CUDA=ON``;
``rotary._rotary.cuda`` says), ``"cuda"``: the same bits as the CPU's, queued on torch's current
stream without waiting (CUDA-graph safe; see ``Rope.apply`` for what runs on the device and
``check_positions`` for the positions' check). Any other device gets a ValueError naming the tensor.

Engines' own signatures (``rotary/torch/engines.py``): ``rotary_embedding(positions, query, key,
head_size, cos_sin_cache, is_neox)`` (vLLM, SGLang) and ``apply_rope_with_cos_sin_cache_inplace``
(FlashInfer), through the in-place operator ``torch.ops.rotary.rotary_embedding``, from the caller's
``cos_sin_cache``. Fused operations for serving engines (``rotary/torch/fused.py``): ``rope_store``
(RoPE + KV-cache write, fp8/int8 caches), ``qk_norm_rope`` (QK-norm + RoPE, optionally + the cache
write) and ``rerotate_cache`` (cached keys moved in place), each bit-identical to its composition of
rotary's primitives, through the operators ``torch.ops.rotary.rope_store``, ``qk_norm_rope`` and
``rerotate_cache`` (CPU kernels).

``apply_rope``, ``apply_rope_`` and ``RotaryEmbedding`` are what to call. In eager mode, when no
gradient is recorded, they call the kernel directly (the dispatcher's Python overhead is several
times the rotation of a decode step); under ``torch.compile``, or when autograd records the call,
they go through the operators. Both paths run the same kernel with the same arguments: the results
are identical.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional, Union

import numpy as np
import torch

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"rotary.torch needs PyTorch 2.4 or later (torch.library.custom_op), found {torch.__version__}")

from .. import _rotary
from .._args import (_ORDERS, _bool_arg, _check_tensor, _int_arg, _positions_and_streams, _renamed,
                     _show)
from .._rope import Rope, _rope_of_handle

__all__ = ["apply_rope", "apply_rope_", "RotaryEmbedding", "apply_rotary_pos_emb", "check_positions",
           "rotary_embedding", "apply_rope_with_cos_sin_cache_inplace", "rope_store", "qk_norm_rope", "rerotate_cache",
           "slots_from_page_table"]

Tensor = torch.Tensor
Rotated = Union[Tensor, tuple[Tensor, Tensor]]

# The operators' arguments after q and k (rope ... cos_sin_columns): no gradient flows into them.
_CONSTANT_ARGS = 10
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


# ---- The operators ---------------------------------------------------------------------------------

def _rotate(q: Tensor, k: Optional[Tensor], rope: int, positions: Optional[Tensor], offset: int, layout: str,
            inverse: bool, angles: str, cos: Optional[Tensor], sin: Optional[Tensor],
            cos_sin_cache: Optional[Tensor], cos_sin_columns: Optional[str], inplace: bool) -> Any:
    """The kernel of every device: ``Rope.apply`` of the Rope with handle ``rope`` (what the eager
    path calls too, with the Rope itself); the schema's ``layout`` and ``angles`` are its ``order``
    and ``numerics``."""
    return _rope_of_handle(rope).apply(q, k, positions=positions, offset=offset, order=layout, inplace=inplace,
                                       inverse=inverse, numerics=angles, cos=cos, sin=sin,
                                       cos_sin_cache=cos_sin_cache, cos_sin_columns=cos_sin_columns)


_KERNEL_DEVICES = ("cpu", "cuda") if _rotary.cuda else ("cpu",)


def _no_kernel(op: str, **tensors: Optional[Tensor]) -> ValueError:
    """The error for a device without a kernel, naming the first tensor on it."""
    for name, t in tensors.items():
        if t is None or t.device.type in _KERNEL_DEVICES:
            continue
        if t.device.type == "cuda":
            return ValueError(f"{name} is on {t.device}, but {_rotary.no_cuda_kernels}")
        kinds = "CPU and CUDA tensors" if _rotary.cuda else "CPU tensors"
        return ValueError(f"{name} is on {t.device}, but rotary::{op} has a kernel for {kinds} only")
    for name, t in tensors.items():  # sparse, MKL-DNN: a layout no kernel addresses
        if t is not None and t.layout is not torch.strided:
            return ValueError(f"{name} must be a dense (torch.strided) tensor, got layout {t.layout}")
    return ValueError(f"rotary::{op} has no kernel for these tensors' device")


@torch.library.custom_op("rotary::rope", mutates_args=())
def _rope_op(q: Tensor, k: Optional[Tensor], rope: int, positions: Optional[Tensor], offset: int, layout: str,
             inverse: bool, angles: str, cos: Optional[Tensor], sin: Optional[Tensor],
             cos_sin_cache: Optional[Tensor], cos_sin_columns: Optional[str]) -> list[Tensor]:
    # Devices without a kernel of their own land here (the CPU kernel is registered below).
    raise _no_kernel("rope", q=q, k=k, positions=positions, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache)


@_rope_op.register_kernel("cpu")
def _rope_cpu(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache, cos_sin_columns):
    out = _rotate(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache, cos_sin_columns,
                  inplace=False)
    return [out] if k is None else list(out)


if _rotary.cuda:
    @_rope_op.register_kernel("cuda")
    def _rope_cuda(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache, cos_sin_columns):
        _same_kind("rope", q=q, k=k, positions=positions, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache)
        return _rope_cpu(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache,
                         cos_sin_columns)


@_rope_op.register_fake
def _rope_fake(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache, cos_sin_columns):
    _shapes_only("rope", q=q, k=k, positions=positions, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache)
    # Rope.apply's outputs: torch.empty_like of q and k (their strides when dense, else contiguous).
    return [torch.empty_like(q)] if k is None else [torch.empty_like(q), torch.empty_like(k)]


def _rope_setup_context(ctx, inputs, output) -> None:
    q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache, cos_sin_columns = inputs
    ctx.save_for_backward(positions, cos, sin, cos_sin_cache)  # checked against later in-place changes
    ctx.has_k = k is not None
    ctx.scalars = (rope, offset, layout, inverse, angles, cos_sin_columns)
    ctx.rope = _rope_of_handle(rope)  # the handle must name it until the backward pass has run


def _rope_backward(ctx, grads):
    # y = R(θ) x, so dL/dx = R(θ)^T dL/dy = R(-θ) dL/dy: the same operator with inverse flipped (itself
    # differentiable). Gradients are materialised: an unused output's is zeros. Angles are constants.
    positions, cos, sin, cos_sin_cache = ctx.saved_tensors
    rope, offset, layout, inverse, angles, cos_sin_columns = ctx.scalars
    rotated = torch.ops.rotary.rope(grads[0], grads[1] if ctx.has_k else None, rope, positions, offset, layout,
                                    not inverse, angles, cos, sin, cos_sin_cache, cos_sin_columns)
    return (rotated[0], rotated[1] if ctx.has_k else None) + (None,) * _CONSTANT_ARGS


_rope_op.register_autograd(_rope_backward, setup_context=_rope_setup_context)


@torch.library.custom_op("rotary::rope_", mutates_args=("q", "k"))
def _rope_inplace_op(q: Tensor, k: Optional[Tensor], rope: int, positions: Optional[Tensor], offset: int,
                     layout: str, inverse: bool, angles: str, cos: Optional[Tensor], sin: Optional[Tensor],
                     cos_sin_cache: Optional[Tensor], cos_sin_columns: Optional[str]) -> None:
    raise _no_kernel("rope_", q=q, k=k, positions=positions, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache)


@_rope_inplace_op.register_kernel("cpu")
def _rope_inplace_cpu(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache,
                      cos_sin_columns):
    _refuse_grad(q, k)  # the operator called directly (apply_rope_ checks before)
    _rotate(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache, cos_sin_columns,
            inplace=True)


if _rotary.cuda:
    @_rope_inplace_op.register_kernel("cuda")
    def _rope_inplace_cuda(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache,
                           cos_sin_columns):
        _same_kind("rope_", q=q, k=k, positions=positions, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache)
        _rope_inplace_cpu(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache,
                          cos_sin_columns)


@_rope_inplace_op.register_fake
def _rope_inplace_fake(q, k, rope, positions, offset, layout, inverse, angles, cos, sin, cos_sin_cache,
                       cos_sin_columns):
    _shapes_only("rope_", q=q, k=k, positions=positions, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache)
    return None


_is_fake = torch._subclasses.fake_tensor.is_fake


def _shapes_only(op: str, **tensors: Optional[Tensor]) -> None:
    """What the fake kernels check before giving shapes. They are for tensors without values: fake
    tensors (torch.compile, FakeTensorMode) or meta tensors, all of a call's. The dispatcher also
    sends them a call mixing meta tensors with real ones (CPU, CUDA: the meta kernel wins), whose
    outputs would be uninitialised memory and whose in-place writes would never happen: that call is
    refused, naming the meta tensor and a real one (the extension's rule and words for mixed
    devices). Values are the kernels' to check: under torch.compile they raise when the graph runs."""
    real = next(((name, t) for name, t in tensors.items()
                 if t is not None and t.device.type != "meta" and not _is_fake(t)), None)
    if real is not None:
        meta = next((name for name, t in tensors.items() if t is not None and t.device.type == "meta"), None)
        if meta is None:  # not a dispatch torch makes today; refused all the same
            raise ValueError(f"{real[0]} is on {real[1].device}, but rotary::{op} was asked for shapes only")
        raise ValueError(f"{meta} is on meta but {real[0]} is on {real[1].device} (every tensor of a call must be "
                         f"on one device; a meta tensor has no values to rotate)")


def _same_kind(op: str, **tensors: Optional[Tensor]) -> None:
    """A tensor the CUDA kernel cannot take (on a device without a kernel) named before the
    extension sees it; mixing the CPU and a CUDA device is the extension's error to name."""
    if any(t is not None and t.device.type not in _KERNEL_DEVICES for t in tensors.values()):
        raise _no_kernel(op, **tensors)


# ---- The Python API --------------------------------------------------------------------------------

def check_positions(device: Any = None) -> None:
    """Raises if a rotary call on a CUDA device skipped tokens since the device's last check.

    On a CUDA device the host checks every argument but the values of per-token positions, which
    stay on the device: the kernels check those, skip a token whose position is unusable (its
    output left unwritten) and record it in the device's error word. This waits for torch's
    current stream of the device, reads the word and clears it. Not for use inside a CUDA graph
    capture (it waits); ``Rope.apply(..., check=True)`` does the same right after one call.

    Parameters
    ----------
    device : torch.device, str or int, optional
        The CUDA device (default: the current one).

    Raises
    ------
    ValueError
        A call skipped tokens (naming the rule their positions broke: outside [0, 2^31), not a
        row of per-position cos/sin, or beyond xPos's reach); ``device`` not a CUDA device; a
        build without CUDA kernels.
    """
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda":
        raise ValueError(f"device={_show(str(device))} is not a CUDA device")
    if not _rotary.cuda:
        raise ValueError(_rotary.no_cuda_kernels)
    _rotary.cuda_check_positions(torch.cuda.current_device() if device.index is None else device.index)


def _refuse_grad(q: Tensor, k: Optional[Tensor]) -> None:
    for name, t in (("q", q), ("k", k)):
        if t is not None and t.requires_grad:
            raise ValueError(f"{name} requires grad, and an in-place rotation cannot be differentiated: use "
                             "rotary.torch.apply_rope (out of place, differentiable)")


def _check_call(rope: Any, q: Any, k: Any) -> None:
    if not isinstance(rope, Rope):
        raise TypeError(f"rope must be a rotary.Rope, got {type(rope).__name__}")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if k is not None and not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a torch.Tensor, got {type(k).__name__}")


_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _direct(q: Any, k: Any) -> bool:
    """Call the kernel directly: eager mode, plain CPU or CUDA tensors (not subclasses), nothing
    tracing or recording: autograd (a tensor that requires grad while grad is enabled),
    torch.compile, or a dispatch mode (make_fx, FlopCounterMode, ...), which must see the operator.
    Written for a decode step's budget: every check is a type test or a C attribute."""
    if type(q) is not Tensor or not (q.is_cpu or q.is_cuda):
        return False
    if k is not None and (type(k) is not Tensor or not (k.is_cpu or k.is_cuda)):
        return False
    if (q.requires_grad or (k is not None and k.requires_grad)) and torch.is_grad_enabled():
        return False
    return not _is_compiling() and _dispatch_modes() == 0


def _str_arg(value: Any, name: str, optional: bool = False) -> Optional[str]:
    if (value is None and optional) or isinstance(value, str):
        return value
    raise TypeError(f"{name} must be a str, got {type(value).__name__}")


def _angles_tensor(value: Any, name: str) -> Optional[Tensor]:
    """The caller's cos/sin as the operator takes them: constants (no gradient flows into them)."""
    if value is None:
        return None
    _check_tensor(value, name)
    return value.detach() if isinstance(value, torch.Tensor) else torch.from_numpy(value)


def _positions_tensor(positions: Any) -> Optional[Tensor]:
    """positions as the operator takes them: a tensor (ints or reals, any of apply's shapes)."""
    if positions is None:
        return None
    if isinstance(positions, torch.Tensor):
        return positions.detach()
    if torch.compiler.is_compiling():
        return torch.as_tensor(positions)
    flat, _ = _positions_and_streams(positions)  # TypeError/ValueError naming positions
    return torch.from_numpy(flat.reshape(np.shape(positions)))


def _op_args(rope: Rope, positions: Any, offset: Any, order: Any, inverse: Any, numerics: Any, cos: Any, sin: Any,
             cos_sin_cache: Any, cos_sin_columns: Any) -> tuple:
    """The operators' arguments after q and k, checked for kind (values are the kernel's to check)."""
    offset = _int_arg(offset, "offset")
    if not torch.compiler.is_compiling():  # compiled, the kernel raises these when the graph runs
        if not _INT64_MIN <= offset <= _INT64_MAX:  # the schema's int
            raise ValueError(f"offset={_show(offset)} must keep positions in [0, 2^31)")  # the kernel's words
        if offset != 0 and positions is not None:  # the kernel's rule and words: an offset would be dropped
            raise ValueError(f"offset={_show(offset)} is for sequential positions only, but positions are given "
                             "(add the offset to the positions, or leave positions out)")
    return (rope._handle, _positions_tensor(positions), offset, _str_arg(order, "order"),
            _bool_arg(inverse, "inverse"), _str_arg(numerics, "numerics"), _angles_tensor(cos, "cos"),
            _angles_tensor(sin, "sin"), _angles_tensor(cos_sin_cache, "cos_sin_cache"),
            _str_arg(cos_sin_columns, "cos_sin_columns", optional=True))


@_renamed("layout", "angles")
def apply_rope(rope: Rope, q: Tensor, k: Optional[Tensor] = None, *, positions: Any = None, offset: int = 0,
               order: str = "bshd", inverse: bool = False, numerics: str = "exact", cos: Any = None,
               sin: Any = None, cos_sin_cache: Any = None, cos_sin_columns: Optional[str] = None) -> Rotated:
    """Rotates q (and k) out of place: differentiable, and compiles without a graph break.

    Parameters
    ----------
    rope : rotary.Rope
        The model's RoPE.
    q, k : torch.Tensor
        ``[batch, seq, heads, head_dim]`` (``order="bshd"``, the default), ``[batch, heads, seq,
        head_dim]`` (``"bhsd"``, transformers' order) or packed ``[tokens, heads, head_dim]``
        (``"thd"``, or any 3-D q under the default), float32/float64/float16/bfloat16, on the CPU
        or one CUDA device (with every other tensor of the call; see ``Rope.apply``), any strides;
        only read.
    positions : torch.Tensor or array-like, optional
        Each token's position, as ``Rope.apply`` takes them: ``[seq]``, ``[batch, seq]``, ``[1, seq]``
        or ``[streams, batch, seq]`` (M-RoPE); packed q: ``[tokens]`` or ``[streams, tokens]``;
        integers (int64, int32 ...) or real numbers; default ``offset + 0..seq-1``. Under
        ``torch.compile``, give a tensor.
    offset : int
        First position when ``positions`` is not given; with ``positions`` it must stay 0
        (ValueError, as ``Rope.apply``).
    order : {"bshd", "bhsd", "thd"}
        Order of q's and k's dimensions; default ``"bshd"`` (as everywhere in rotary). ``layout=``,
        its former name, is taken until the next release, with a DeprecationWarning.
    inverse : bool
        Rotate by -angle with the same scale: the transpose (what autograd's backward pass applies).
        It undoes a forward rotation only when ``attention_factor`` is 1 and there is no xPos; to
        take a rotation back use ``Rope.apply(..., undo=True)``.
    numerics : {"exact", "on_the_fly", "hf-float32"}
        The angles' numerics, as ``Rope.apply``: exact from the cached table (default), exact
        computed per call, or transformers' float32 numerics (but for the correctly rounded power
        ``base**(2j/d)``: see ``Rope.apply``'s Notes). ``angles=``, its former name, is taken until
        the next release, with a DeprecationWarning.
    cos, sin, cos_sin_cache, cos_sin_columns :
        The caller's own angles, as ``Rope.apply`` takes them; constants (no gradient flows into
        them).

    Returns
    -------
    torch.Tensor or tuple of torch.Tensor
        The rotated q, or ``(q, k)`` when k is given: new tensors. Gradients flow to q and k (the
        inverse rotation of the upstream gradient; exact in float64, second derivatives too).

    Raises
    ------
    TypeError
        An argument of the wrong kind, naming it.
    ValueError
        A value that breaks a rule (shapes, positions, order, a tensor on a device without a
        kernel or on ``meta`` among real tensors ...), naming it; q and k are untouched.
    """
    if _direct(q, k) and type(rope) is Rope:
        return rope._apply(q, k, positions, offset, order, False, inverse, numerics, 0, cos, sin, cos_sin_cache,
                           cos_sin_columns)
    _check_call(rope, q, k)
    out = torch.ops.rotary.rope(q, k, *_op_args(rope, positions, offset, order, inverse, numerics, cos, sin,
                                                cos_sin_cache, cos_sin_columns))
    return out[0] if k is None else (out[0], out[1])


@_renamed("layout", "angles")
def apply_rope_(rope: Rope, q: Tensor, k: Optional[Tensor] = None, *, positions: Any = None, offset: int = 0,
                order: str = "bshd", inverse: bool = False, numerics: str = "exact", cos: Any = None,
                sin: Any = None, cos_sin_cache: Any = None, cos_sin_columns: Optional[str] = None) -> Rotated:
    """Rotates q (and k) in place and returns them; compiles without a graph break.

    For inference: q and k must not require grad (autograd cannot record an in-place rotation;
    ``apply_rope`` is the differentiable one).

    Parameters
    ----------
    rope, q, k, positions, offset, order, inverse, numerics, cos, sin, cos_sin_cache, cos_sin_columns
        As ``apply_rope`` (``layout=`` and ``angles=``, the former names, too); q and k are written
        (they must be writable, and may be strided views such as slices of a fused QKV tensor).

    Returns
    -------
    torch.Tensor or tuple of torch.Tensor
        q, or ``(q, k)``: the caller's tensors, rotated.

    Raises
    ------
    TypeError
        An argument of the wrong kind, naming it.
    ValueError
        q or k requires grad, or a value breaks a rule, naming it; q and k are then untouched.
    """
    if _direct(q, k) and type(rope) is Rope and not q.requires_grad and (k is None or not k.requires_grad):
        rope._apply(q, k, positions, offset, order, True, inverse, numerics, 0, cos, sin, cos_sin_cache,
                    cos_sin_columns)
        return q if k is None else (q, k)
    _check_call(rope, q, k)
    _refuse_grad(q, k)
    if _direct(q, k):
        rope._apply(q, k, positions, offset, order, True, inverse, numerics, 0, cos, sin, cos_sin_cache,
                    cos_sin_columns)
    else:
        torch.ops.rotary.rope_(q, k, *_op_args(rope, positions, offset, order, inverse, numerics, cos, sin,
                                               cos_sin_cache, cos_sin_columns))
    return q if k is None else (q, k)


class RotaryEmbedding(torch.nn.Module):
    """Drop-in for the rotary step of a Llama-style attention block.

    ``q, k = rotary(q, k, position_ids)`` with q and k in ``[batch, seq, heads, head_dim]``
    (``order="bshd"``, the default, as everywhere in rotary), ``[batch, heads, seq, head_dim]``
    as transformers' attention keeps them (``"bhsd"``) or packed ``[tokens, heads, head_dim]``
    (``"thd"``). Differentiable, compiles without a graph break, deep-copies, pickles and survives
    ``torch.save``/``torch.load(weights_only=False)``.

    Parameters
    ----------
    rope : rotary.Rope
        The model's RoPE.
    order : {"bshd", "bhsd", "thd"}
        Order of q's and k's dimensions (``layout=``, its former name, is taken until the next
        release, with a DeprecationWarning).

    Raises
    ------
    TypeError
        rope is not a rotary.Rope, or order not a str.
    ValueError
        order is not ``"bshd"``, ``"bhsd"`` or ``"thd"``.
    """

    @_renamed("layout")
    def __init__(self, rope: Rope, order: str = "bshd") -> None:
        super().__init__()
        if not isinstance(rope, Rope):
            raise TypeError(f"rope must be a rotary.Rope, got {type(rope).__name__}")
        if not isinstance(order, str):
            raise TypeError(f"order must be a str, got {type(order).__name__}")
        if order not in _ORDERS:
            raise ValueError(f"order={_show(order)} must be 'bshd', 'bhsd' or 'thd'")
        self.rope = rope
        self.order = order

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A module pickled (or torch.save-d) before order= was named so holds it as ``layout``.
        if "layout" in state and "order" not in state:
            state = dict(state)
            state["order"] = state.pop("layout")
        super().__setstate__(state)

    @property
    def layout(self) -> str:
        """``order``'s former name, read until the next release (DeprecationWarning)."""
        warnings.warn("RotaryEmbedding.layout is deprecated (it names the tensor order): use .order",
                      DeprecationWarning, stacklevel=2)
        return self.order

    @layout.setter
    def layout(self, order: str) -> None:
        warnings.warn("RotaryEmbedding.layout is deprecated (it names the tensor order): use .order",
                      DeprecationWarning, stacklevel=2)
        self.order = order

    def forward(self, q: Tensor, k: Tensor, position_ids: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """Rotates q and k out of place (``apply_rope``).

        Parameters
        ----------
        q, k : torch.Tensor
            In this module's ``order``.
        position_ids : torch.Tensor, optional
            ``[batch, seq]``, ``[1, seq]``, ``[seq]`` or ``[streams, batch, seq]`` (M-RoPE);
            default ``0..seq-1``.

        Returns
        -------
        tuple of torch.Tensor
            The rotated q and k.
        """
        return apply_rope(self.rope, q, k, positions=position_ids, order=self.order)

    def extra_repr(self) -> str:
        return repr(self.rope)


# Engine-shaped entry points (vLLM, SGLang, FlashInfer): rotary/torch/engines.py, on the helpers above.
from .engines import apply_rope_with_cos_sin_cache_inplace, rotary_embedding  # noqa: E402
# Fused operations (rope_store, qk_norm_rope, rerotate_cache): rotary/torch/fused.py.
from .fused import qk_norm_rope, rerotate_cache, rope_store, slots_from_page_table  # noqa: E402
# transformers' apply_rotary_pos_emb signature over the kernel (rotary.transformers exports it too):
# rotary/torch/_hf.py, which needs neither rotary.transformers nor transformers.
from ._hf import apply_rotary_pos_emb  # noqa: E402


def __getattr__(name: str) -> Any:
    if name == "distributed":  # context parallelism (rotary/torch/distributed.py), loaded on first use
        import importlib  # `from . import` would ask this __getattr__ again

        return importlib.import_module(f"{__name__}.distributed")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
