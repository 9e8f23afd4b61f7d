"""Hugging Face transformers drop-in: a transformers model rotating with rotary's exact angles and
fused kernel.

``patch(model)`` makes a transformers 5.x model of a supported type (``SUPPORTED_MODEL_TYPES``)
rotate q and k with rotary's exact angles (the cos/sin of ``position * inv_freq`` in float32, each
within 1 ulp of the exact value, times the attention factor, wherever the position is below 2^31)
and its fused kernel (float32 arithmetic, one rounding at the store: a bf16 model rotates with
float32 cos/sin). transformers builds its angles in float32 (``position * inv_freq`` rounded
before the cos), so its rotation drifts with the position: at 10^6 it is off by about 1% of
max |q|, the patched model's by about 2e-7. ``unpatch(model)`` puts transformers' own modules back.

``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` is transformers' function with the same
signature, running rotary's kernel on the caller's cos and sin.

How the patch works
-------------------
- The model's rotary embedding module (``model.model.rotary_emb``; Gemma 3 keeps one per layer type
  inside it; the Qwen VL models' is their text decoder's, ``model.model.language_model.rotary_emb``)
  is replaced by ``ExactRotaryEmbedding``, which returns ``(position_ids, rope)`` in place of
  ``(cos, sin)``: no cos/sin tensors are built, the kernel takes the exact angles of those
  positions from the Rope's cached table.
- The attention modules call their modeling module's global ``apply_rotary_pos_emb`` (for example
  ``transformers.models.llama.modeling_llama.apply_rotary_pos_emb``; DeepSeek-V3 with
  ``rope_interleave`` calls ``apply_rotary_pos_emb_interleave``). While at least one patched model
  of that type exists, those globals are rotary's: given ``(position_ids, rope)`` they run
  ``rotary.torch.apply_rope``; given cos/sin tensors (a model that is not patched) they call
  transformers' own function, so other models of the same type keep their results bit for bit.
  The swap is process-wide for that model type and counted: unpatching the last patched model of
  the type restores transformers' functions. A deep copy, a pickled and loaded, or a
  ``torch.save``/``torch.load``-ed patched model is patched too (and counted).
- Each model type's convention is rotary's Rope of its config (``Rope.from_hf_config``), applied
  to what the attention hands the function:

  ==========================  ==============================================================
  llama, mistral, qwen2/3,    half pairing (``rotate_half``) over the whole head
  gemma, gemma3
  phi3                        half pairing, partial rotary (the leading rotary_dim channels)
  phi                         half pairing; the attention passes only ``q[..., :rotary_dim]``
                              (and k), so the Rope is narrowed to a head of rotary_dim channels
  gpt_neox                    half pairing on the leading ``rotary_pct`` of the head, the rest
                              passes through
  cohere                      interleaved pairs ``(x[2i], x[2i+1])`` over the whole head
  glm, glm4                   interleaved pairs on the leading ``partial_rotary_factor`` of the
                              head (0.5), the rest passes through
  deepseek_v3                 the ``qk_rope_head_dim`` slice (q_pe, k_pe), YaRN with its
                              mscale/mscale_all_dim attention factor; half pairing, or with
                              ``rope_interleave`` interleaved pairs whose two results go to
                              channels i and i + r/2 (transformers' output order)
  qwen2_vl, qwen2_5_vl        M-RoPE: ``position_ids [3, batch, seq]``, pair j reads the stream
                              of the ``mrope_section`` it falls in; half pairing
  qwen3_vl                    interleaved M-RoPE: pair j reads stream 1 if j % 3 == 1 and
                              j < 3 * section[1], 2 if j % 3 == 2 and j < 3 * section[2], else 0
  ==========================  ==============================================================

  The Qwen VL vision towers keep transformers' own 2-D rotary (patch rows and columns, positions
  far too small for float32 angles to drift).
- Dynamic NTK (``rope_type="dynamic"``) and LongRoPE follow transformers' per-forward rules exactly
  (``dynamic_rope_update`` in ``modeling_rope_utils.py``), with ``seq_len = max(position_ids) + 1``:
  LongRoPE takes the long factors when ``seq_len > original_max_position_embeddings``, else the
  short ones, decided afresh every forward; dynamic NTK grows to ``seq_len`` when it exceeds the
  length seen so far (its frequencies are those of the longest sequence since the last reset) and
  resets to the original frequencies when ``seq_len < max_position_embeddings`` after a growth.
  The state starts from the transformers module's state at ``patch`` time; forwards run while
  patched do not update the transformers module (``unpatch`` returns it as it was).
- Before changing anything, ``patch`` resolves every layer type's RoPE with
  ``rotary.Rope.from_hf_config``, checks it against transformers' own ``inv_freq`` and attention
  factor (rope initialisation functions of the model's modeling module), then rotates a probe
  (positions 0..7, distinct in every M-RoPE stream) both ways: transformers' rotary module and
  apply function given rotary's frequencies, and rotary's kernel. A config the two read
  differently, or a pairing, rotated slice or stream mapping that differs, raises ValueError and
  leaves the model untouched.

Under ``torch.compile`` a patched model traces the rotation as rotary's operator, with
``fullgraph=True`` for static schedules (default, linear, llama3, yarn) and LongRoPE (which then
rotates with both factor sets and picks one with ``torch.where``, as transformers picks its
inv_freq); dynamic NTK reads ``max(position_ids)`` on the host every forward, a graph break there
(transformers' dynamic NTK breaks the graph too).
"""
from __future__ import annotations

import copy
import functools
import importlib
import inspect
import math
import threading
import weakref
from typing import Any, Callable, NamedTuple, Optional

import torch

from ._args import _show
from ._rope import Rope
from .torch import apply_rope
from .torch._hf import _order, apply_rotary_pos_emb  # transformers' signature, shared with rotary.torch

__all__ = ["patch", "unpatch", "is_patched", "apply_rotary_pos_emb", "ExactRotaryEmbedding",
           "SUPPORTED_MODEL_TYPES"]


class _Family(NamedTuple):
    """How one model type's attention rotates, in transformers' modeling code."""

    package: str  # under transformers.models
    rotary_class: str  # the decoder's rotary embedding module
    rotated_slice: bool = False  # the attention passes apply only q[..., :rotary_dim] (Phi)
    interleave_function: Optional[str] = None  # called instead when config.rope_interleave (DeepSeek-V3)

    def functions(self) -> tuple[str, ...]:
        """The modeling module's functions patched models call (all are swapped)."""
        return ("apply_rotary_pos_emb",) + ((self.interleave_function,) if self.interleave_function else ())

    def called_function(self, config: Any) -> str:
        """The function this config's attention calls."""
        if self.interleave_function and getattr(config, "rope_interleave", False):
            return self.interleave_function
        return "apply_rotary_pos_emb"


# model_type -> its family. "gemma3" and the Qwen VL types are multimodal models whose text decoder
# ("gemma3_text", "qwen2_vl_text" ...) holds the rotary module; either can be patched.
_FAMILIES: dict[str, _Family] = {
    "cohere": _Family("cohere", "CohereRotaryEmbedding"),
    "deepseek_v3": _Family("deepseek_v3", "DeepseekV3RotaryEmbedding",
                           interleave_function="apply_rotary_pos_emb_interleave"),
    "gemma": _Family("gemma", "GemmaRotaryEmbedding"),
    "gemma3": _Family("gemma3", "Gemma3RotaryEmbedding"),
    "gemma3_text": _Family("gemma3", "Gemma3RotaryEmbedding"),
    "glm": _Family("glm", "GlmRotaryEmbedding"),
    "glm4": _Family("glm4", "Glm4RotaryEmbedding"),
    "gpt_neox": _Family("gpt_neox", "GPTNeoXRotaryEmbedding"),
    "llama": _Family("llama", "LlamaRotaryEmbedding"),
    "mistral": _Family("mistral", "MistralRotaryEmbedding"),
    "phi": _Family("phi", "PhiRotaryEmbedding", rotated_slice=True),
    "phi3": _Family("phi3", "Phi3RotaryEmbedding"),
    "qwen2": _Family("qwen2", "Qwen2RotaryEmbedding"),
    "qwen2_5_vl": _Family("qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding"),
    "qwen2_5_vl_text": _Family("qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding"),
    "qwen2_vl": _Family("qwen2_vl", "Qwen2VLRotaryEmbedding"),
    "qwen2_vl_text": _Family("qwen2_vl", "Qwen2VLRotaryEmbedding"),
    "qwen3": _Family("qwen3", "Qwen3RotaryEmbedding"),
    "qwen3_vl": _Family("qwen3_vl", "Qwen3VLTextRotaryEmbedding"),
    "qwen3_vl_text": _Family("qwen3_vl", "Qwen3VLTextRotaryEmbedding"),
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


def _modeling_name(family: _Family) -> str:
    return f"transformers.models.{family.package}.modeling_{family.package}"


# modeling module name -> the functions its patched models call
_FUNCTIONS: dict[str, tuple[str, ...]] = {_modeling_name(f): f.functions() for f in _FAMILIES.values()}

# rotary's inv_freq against transformers' (float32: its pow, division and, for dynamic NTK, the
# base computed in float32 each cost an ulp or two of 2^-24): a config read differently is off by
# far more.
_INV_FREQ_RTOL = 1e-5
_ATTENTION_FACTOR_RTOL = 1e-6
# The probe rotation (positions 0..7, the same float32 inv_freq both ways), relative to max |q|:
# transformers' float32 angle p * inv_freq is within 8 * 2^-24 of rotary's exact one there, plus a
# few float32 roundings of cos, sin and the products (about 1e-6 in all); another pairing, rotated
# slice or stream moves values by about |q|.
_PROBE_RTOL = 1e-4
_PROBE_SEQ = 8


# ---- Per-forward schedules (transformers' dynamic_rope_update) --------------------------------------

def _seq_len(position_ids: torch.Tensor) -> int:
    """transformers' ``seq_len = torch.max(position_ids) + 1``."""
    return int(position_ids.max()) + 1


class _Static:
    """One Rope for every forward (default, linear, llama3, yarn, ...)."""

    def __init__(self, resolve: Callable[[Optional[int]], Rope]) -> None:
        self.rope = resolve(None)

    def rope_for(self, position_ids: torch.Tensor) -> Rope:
        return self.rope


class _RopeChoice(NamedTuple):
    """LongRoPE's choice under torch.compile, left to the graph: both rotations, then
    ``torch.where(use_long, long, short)`` (transformers' ``torch.where`` on inv_freq, traceable
    without reading the positions on the host)."""

    short: Rope
    long: Rope
    use_long: torch.Tensor


class _LongRope:
    """transformers' ``longrope_frequency_update``: the long factors when ``seq_len >
    original_max_position_embeddings``, else the short ones, decided afresh every forward."""

    def __init__(self, resolve: Callable[[Optional[int]], Rope], original_max_position: int) -> None:
        self.original_max_position = original_max_position
        self.short = resolve(original_max_position)
        self.long = resolve(original_max_position + 1)
        self.rope = self.short  # the last one chosen in eager mode

    def rope_for(self, position_ids: torch.Tensor) -> Any:
        if torch.compiler.is_compiling():
            return _RopeChoice(self.short, self.long, position_ids.max() + 1 > self.original_max_position)
        self.rope = self.long if _seq_len(position_ids) > self.original_max_position else self.short
        return self.rope


class _DynamicNTK:
    """transformers' ``dynamic_frequency_update``: grows to ``seq_len`` when it exceeds the longest
    sequence seen (``max_seq_len_cached``), resets to the original frequencies when ``seq_len <
    max_position_embeddings`` after a growth; in between, the frequencies of the longest."""

    def __init__(self, resolve: Callable[[Optional[int]], Rope], max_position: int, cached: int) -> None:
        self.resolve = resolve
        self.max_position = max_position  # transformers' original_max_seq_len
        self.cached = cached  # transformers' max_seq_len_cached
        self.rope = resolve(cached if cached > max_position else None)

    def rope_for(self, position_ids: torch.Tensor) -> Rope:
        seq_len = _seq_len(position_ids)
        cached = self.cached
        if seq_len > cached:  # growth
            self.rope, self.cached = self.resolve(seq_len), seq_len
        if seq_len < self.max_position and cached > self.max_position:  # reset
            self.rope, self.cached = self.resolve(None), self.max_position
        return self.rope


# ---- The swapped apply functions --------------------------------------------------------------------

class RopePositions(NamedTuple):
    """What a patched model's rotary embedding returns in place of ``(cos, sin)``: the attention
    unpacks it as ``cos, sin`` and hands both to ``apply_rotary_pos_emb`` (or DeepSeek-V3's
    ``apply_rotary_pos_emb_interleave``)."""

    positions: torch.Tensor
    rope: Rope


def _rotate(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, rope: Any,
            unsqueeze_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """rotary's rotation of q and k for a patched model's (positions, rope)."""
    order = _order(unsqueeze_dim)
    if isinstance(rope, _RopeChoice):  # LongRoPE under torch.compile
        q_short, k_short = apply_rope(rope.short, q, k, positions=positions, order=order)
        q_long, k_long = apply_rope(rope.long, q, k, positions=positions, order=order)
        return torch.where(rope.use_long, q_long, q_short), torch.where(rope.use_long, k_long, k_short)
    return apply_rope(rope, q, k, positions=positions, order=order)


def _pairs_to_halves(x: torch.Tensor) -> torch.Tensor:
    """Channels (2i, 2i+1) moved to (i, i + r/2): DeepSeek's interleave output order."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def _exact_apply(original: Callable) -> Callable:
    """A modeling module's apply_rotary_pos_emb while a patched model exists."""

    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if isinstance(sin, (Rope, _RopeChoice)):  # (position_ids, rope) from a patched model
            return _rotate(q, k, cos, sin, unsqueeze_dim)
        return original(q, k, cos, sin, unsqueeze_dim)  # a model that is not patched: transformers' own

    apply_rotary_pos_emb._rotary_original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def _exact_apply_interleave(original: Callable) -> Callable:
    """DeepSeek-V3's apply_rotary_pos_emb_interleave while a patched model exists: pairs (x[2i],
    x[2i+1]) rotated (rotary's interleaved Rope), pair i's two results written to channels i and
    i + r/2, as transformers writes them."""

    @functools.wraps(original)
    def apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        if isinstance(sin, (Rope, _RopeChoice)):
            q_embed, k_embed = _rotate(q, k, cos, sin, unsqueeze_dim)
            return _pairs_to_halves(q_embed), _pairs_to_halves(k_embed)
        return original(q, k, cos, sin, position_ids, unsqueeze_dim)

    apply_rotary_pos_emb_interleave._rotary_original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb_interleave


_WRAPPERS: dict[str, Callable[[Callable], Callable]] = {
    "apply_rotary_pos_emb": _exact_apply,
    "apply_rotary_pos_emb_interleave": _exact_apply_interleave,
}


def _transformers_function(modeling: Any, name: str) -> Callable:
    """transformers' own function, whether or not it is swapped now."""
    function = getattr(modeling, name)
    return getattr(function, "_rotary_original", function)


class _Swap:
    """One modeling module's apply functions, swapped while patched models of it are alive."""

    def __init__(self, modeling: Any, names: tuple[str, ...]) -> None:
        self.modeling = modeling
        self.originals = {name: _transformers_function(modeling, name) for name in names}
        self.functions = {name: _WRAPPERS[name](self.originals[name]) for name in names}
        self.users: "weakref.WeakSet[ExactRotaryEmbedding]" = weakref.WeakSet()

    def installed(self) -> bool:
        return all(getattr(self.modeling, name) is f for name, f in self.functions.items())

    def install(self) -> None:
        for name, function in self.functions.items():
            setattr(self.modeling, name, function)

    def restore(self) -> None:
        for name, function in self.functions.items():
            if getattr(self.modeling, name) is function:  # not replaced by someone else since
                setattr(self.modeling, name, self.originals[name])


_swaps: dict[str, _Swap] = {}  # modeling module name -> its swap
_swaps_lock = threading.Lock()


def _attach(emb: "ExactRotaryEmbedding") -> None:
    modeling = importlib.import_module(emb.modeling_name)
    with _swaps_lock:
        swap = _swaps.get(emb.modeling_name)
        if swap is None or not swap.installed():  # first, or replaced by another
            users = swap.users if swap is not None else ()
            swap = _swaps[emb.modeling_name] = _Swap(modeling, _FUNCTIONS[emb.modeling_name])
            swap.users.update(users)
            swap.install()
        swap.users.add(emb)


def _detach(emb: "ExactRotaryEmbedding") -> None:
    with _swaps_lock:
        swap = _swaps.get(emb.modeling_name)
        if swap is None:
            return
        swap.users.discard(emb)
        if len(swap.users) == 0:
            swap.restore()
            del _swaps[emb.modeling_name]


class ExactRotaryEmbedding(torch.nn.Module):
    """What ``patch`` puts in place of a transformers rotary embedding module.

    ``forward(x, position_ids, layer_type=None)`` returns ``RopePositions(position_ids, rope)``:
    the Rope of that layer type for this forward (LongRoPE's short or long factors, dynamic NTK's
    current frequencies); ``position_ids`` ``[batch, seq]``, or ``[3, batch, seq]`` for M-RoPE.
    ``original`` is transformers' module (a child, so that ``model.to`` moves it), ``ropes()`` the
    current Rope of each layer type (for Phi, narrowed to the rotated channels its attention
    passes).

    Parameters
    ----------
    original : torch.nn.Module
        transformers' rotary embedding module it replaces.
    modeling_name : str
        The modeling module whose ``apply_rotary_pos_emb`` it swaps.
    schedules : dict
        Per layer type (None: one RoPE), the per-forward rule choosing the Rope.
    """

    def __init__(self, original: torch.nn.Module, modeling_name: str, schedules: dict[Optional[str], Any]) -> None:
        super().__init__()
        self.original = original
        self.modeling_name = modeling_name
        self.schedules = schedules

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: Optional[str] = None) -> RopePositions:
        """The positions and the Rope of this forward, in place of transformers' ``(cos, sin)``.

        Parameters
        ----------
        x : torch.Tensor
            The hidden states (unused, as transformers reads only their device and dtype).
        position_ids : torch.Tensor
            ``[batch, seq]``, or ``[3, batch, seq]`` for M-RoPE.
        layer_type : str, optional
            The layer type of a model whose layer types differ.

        Returns
        -------
        RopePositions
        """
        return RopePositions(position_ids, self.schedules[layer_type].rope_for(position_ids))  # type: ignore[arg-type]

    def ropes(self) -> dict[Optional[str], Rope]:
        """The Rope each layer type rotated with last (key None for a model with one RoPE)."""
        return {name: schedule.rope for name, schedule in self.schedules.items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        _attach(self)  # a deep copy or an unpickled model rotates with rotary too

    def extra_repr(self) -> str:
        return ", ".join(f"{name or 'rope'}={schedule.__class__.__name__.lstrip('_')}"
                         for name, schedule in self.schedules.items())


# ---- Resolving and checking a model's RoPE ----------------------------------------------------------

def _family(model: Any) -> tuple[str, _Family, type]:
    """(model_type, family, rotary embedding class) of a supported model."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a transformers model (a torch.nn.Module with a config), got "
                        f"{type(model).__name__}")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not isinstance(model_type, str):
        raise TypeError(f"model must be a transformers model (with config.model_type), got a "
                        f"{type(model).__name__} without one")
    if model_type not in _FAMILIES:
        raise ValueError(f"model_type={_show(model_type)} is not supported by rotary.transformers.patch; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    family = _FAMILIES[model_type]
    return model_type, family, getattr(importlib.import_module(_modeling_name(family)), family.rotary_class)


def _slots(model: torch.nn.Module, kind: type) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """Every (parent, attribute, module) holding a module of this kind (a module shared by two
    parents, as multi-token-prediction heads share the decoder's, appears once per parent)."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if isinstance(child, kind)]


def _transformers_rope(module: torch.nn.Module, layer_type: Optional[str],
                       seq_len: Optional[int]) -> tuple[Any, float]:
    """transformers' own (inv_freq, attention_factor) for this layer type at seq_len."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = module.rope_type if layer_type is None else module.rope_type[layer_type]
    init = module.compute_default_rope_parameters if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type]
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    inv_freq, attention_factor = init(module.config, device=None, seq_len=seq_len, **kwargs)
    return inv_freq.detach().double().cpu().numpy(), float(attention_factor)


def _where(model_type: str, layer_type: Optional[str], seq_len: Optional[int] = None) -> str:
    where = f"model_type={model_type}" + ("" if layer_type is None else f" layer_type={layer_type}")
    return where + ("" if seq_len is None else f" at seq_len={seq_len}")


def _check_same(rope: Rope, module: torch.nn.Module, layer_type: Optional[str], seq_len: Optional[int],
                model_type: str) -> None:
    """ValueError unless rotary's Rope has transformers' rotary_dim, inv_freq and attention factor."""
    inv_freq, attention_factor = _transformers_rope(module, layer_type, seq_len)
    where = _where(model_type, layer_type, seq_len)
    if rope.rotary_dim != 2 * len(inv_freq):
        raise ValueError(f"{where}: rotary resolves rotary_dim={rope.rotary_dim} but transformers rotates "
                         f"{2 * len(inv_freq)} channels; not patched")
    worst = max((abs(a - b) / abs(b) if b else abs(a) for a, b in zip(rope.inv_freq, inv_freq)), default=0.0)
    if worst > _INV_FREQ_RTOL:
        raise ValueError(f"{where}: rotary's inv_freq differs from transformers' by {worst:.3g} (relative), "
                         f"more than {_INV_FREQ_RTOL}; not patched")
    if not math.isclose(rope.attention_factor, attention_factor, rel_tol=_ATTENTION_FACTOR_RTOL):
        raise ValueError(f"{where}: rotary's attention_factor={rope.attention_factor} differs from "
                         f"transformers' {attention_factor}; not patched")


def _probe_positions(streams: int) -> torch.Tensor:
    """Positions 0..7 as ``[1, seq]``, or ``[streams, 1, seq]`` with a different row per stream."""
    p = torch.arange(_PROBE_SEQ)
    if streams == 1:
        return p[None]
    return torch.stack([(p * (2 * s + 1)) % (_PROBE_SEQ + s) + s for s in range(streams)])[:, None]


def _check_rotation(rope: Rope, module: torch.nn.Module, layer_type: Optional[str], family: _Family,
                    model_type: str) -> None:
    """ValueError unless rotary rotates a probe as the model's attention would: transformers' rotary
    module (on a copy given rotary's float32 inv_freq and attention factor, without its dynamic
    update) and the apply function the attention calls, against that function's swapped form.
    This checks what the frequencies cannot: the pairing, the rotated slice, the M-RoPE stream of
    every pair and DeepSeek's output order."""
    modeling = importlib.import_module(_modeling_name(family))
    name = family.called_function(module.config)
    theirs = _transformers_function(modeling, name)
    ours = _WRAPPERS[name](theirs)
    stand_in = copy.deepcopy(module)  # its forward runs on x's device with the inv_freq given here
    prefix = "" if layer_type is None else f"{layer_type}_"
    setattr(stand_in, f"{prefix}inv_freq", torch.tensor(rope.inv_freq, dtype=torch.float32))
    setattr(stand_in, f"{prefix}attention_scaling", rope.attention_factor)
    forward = inspect.unwrap(type(module).forward)  # without dynamic_rope_update, torch.no_grad
    positions = _probe_positions(rope.streams)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, _PROBE_SEQ, rope.head_dim, generator=generator)
    k = torch.randn(1, 1, _PROBE_SEQ, rope.head_dim, generator=generator)
    with torch.no_grad():
        cos, sin = forward(stand_in, q, positions, *(() if layer_type is None else (layer_type,)))
        want = theirs(q, k, cos, sin)
        got = ours(q, k, positions, rope)
    scale = float(torch.cat((q.flatten(), k.flatten())).abs().max())
    worst = max(float((a - b).abs().max()) for a, b in zip(got, want)) / scale
    if not worst <= _PROBE_RTOL:
        raise ValueError(f"{_where(model_type, layer_type)}: rotary (pairing={rope.pairing}, rotary_dim="
                         f"{rope.rotary_dim} of head_dim={rope.head_dim}, streams={rope.streams}) rotates a probe "
                         f"unlike transformers' {name}, by {worst:.3g} of max |q|; not patched")


def _schedule(module: torch.nn.Module, config: dict, layer_type: Optional[str], model_type: str,
              family: _Family) -> Any:
    """The per-forward schedule of one layer type, checked against transformers."""
    rope_type = module.rope_type if layer_type is None else module.rope_type[layer_type]
    params = module.config.rope_parameters if layer_type is None else module.config.rope_parameters[layer_type]
    config_head_dim = getattr(module.config, "head_dim", None)
    head_dim = config_head_dim or module.config.hidden_size // module.config.num_attention_heads

    def resolve(seq_len: Optional[int]) -> Rope:
        rope = Rope.from_hf_config(config, seq_len, layer_type=layer_type)
        if rope.head_dim != head_dim:
            raise ValueError(f"model_type={model_type}: rotary resolves head_dim={rope.head_dim}, the model's "
                             f"is {head_dim}; not patched")
        return rope.narrowed() if family.rotated_slice else rope

    if "dynamic" in rope_type:  # transformers' own test
        max_position = int(module.original_max_seq_len)
        cached = int(getattr(module, f"{layer_type}_max_seq_len_cached", module.max_seq_len_cached)
                     if layer_type is not None else module.max_seq_len_cached)
        schedule: Any = _DynamicNTK(resolve, max_position, cached)
        _check_same(resolve(None), module, layer_type, None, model_type)
        _check_same(resolve(2 * max_position), module, layer_type, 2 * max_position, model_type)
    elif rope_type == "longrope":
        schedule = _LongRope(resolve, int(params["original_max_position_embeddings"]))
        _check_same(schedule.short, module, layer_type, schedule.original_max_position, model_type)
        _check_same(schedule.long, module, layer_type, schedule.original_max_position + 1, model_type)
    else:
        schedule = _Static(resolve)
        _check_same(schedule.rope, module, layer_type, None, model_type)
    _check_rotation(schedule.rope, module, layer_type, family, model_type)
    return schedule


def _replacement(module: torch.nn.Module, family: _Family, model_type: str) -> ExactRotaryEmbedding:
    """The ExactRotaryEmbedding for one transformers rotary module (ValueError if rotary and
    transformers read its config differently)."""
    config = module.config.to_dict()
    if isinstance(module.rope_type, dict):  # one RoPE per layer type (Gemma 3)
        layer_types: list[Optional[str]] = list(module.rope_type)
    else:
        layer_types = [None]
    try:
        schedules = {lt: _schedule(module, config, lt, model_type, family) for lt in layer_types}
    except (TypeError, ValueError) as e:
        raise ValueError(f"rotary.transformers.patch: {e}") from e
    return ExactRotaryEmbedding(module, _modeling_name(family), schedules)


# ---- The public functions ---------------------------------------------------------------------------

def patch(model: torch.nn.Module) -> torch.nn.Module:
    """Makes a transformers model rotate with rotary's exact angles and fused kernel; returns it.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model of a type in ``SUPPORTED_MODEL_TYPES`` (``LlamaForCausalLM``, ``LlamaModel``,
        ``Gemma3ForCausalLM``, ``Gemma3ForConditionalGeneration``, ``Qwen2VLForConditionalGeneration``,
        ``Qwen2VLTextModel`` ...), any dtype, on the CPU or a CUDA device (CUDA when rotary is built with its
        kernels: ``pip install . --config-settings=cmake.define.ROTARY_CUDA=ON``). A multimodal model's text decoder is patched; its vision tower keeps
        transformers' rotary.

    Returns
    -------
    torch.nn.Module
        ``model`` itself, patched in place. Patching a patched model does nothing.

    Notes
    -----
    Swaps the model type's ``apply_rotary_pos_emb`` (and DeepSeek-V3's
    ``apply_rotary_pos_emb_interleave``) process-wide while a patched model of that type exists;
    models of the type that are not patched keep transformers' results bit for bit (see the module
    docstring).

    Raises
    ------
    TypeError
        model is not a torch.nn.Module with a ``config.model_type``.
    ValueError
        An unsupported model type (listing the supported ones), a model without a rotary embedding
        module, or a config that rotary resolves or rotates differently from transformers (naming
        the layer type and what differs). The model is then untouched.
    """
    model_type, family, kind = _family(model)
    if _slots(model, ExactRotaryEmbedding):
        return model
    slots = _slots(model, kind)
    if not slots:
        raise ValueError(f"model_type={model_type}: the model holds no {kind.__name__} module to patch")
    replacements: dict[int, ExactRotaryEmbedding] = {}
    for _, _, module in slots:  # everything checked before the first change
        if id(module) not in replacements:
            replacements[id(module)] = _replacement(module, family, model_type)
    for emb in replacements.values():
        _attach(emb)
    for parent, name, module in slots:
        setattr(parent, name, replacements[id(module)])
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Puts transformers' rotary embedding modules back.

    A model that is not patched is returned unchanged. When no patched model of the type is left,
    the type's ``apply_rotary_pos_emb`` (and DeepSeek-V3's ``apply_rotary_pos_emb_interleave``) is
    transformers' again.

    Parameters
    ----------
    model : torch.nn.Module
        A model ``patch`` patched (or any supported model).

    Returns
    -------
    torch.nn.Module
        The model itself.

    Raises
    ------
    TypeError
        model is not a torch.nn.Module with a ``config.model_type``.
    ValueError
        An unsupported model type (listing the supported ones).
    """
    _family(model)
    slots = _slots(model, ExactRotaryEmbedding)
    for parent, name, emb in slots:
        setattr(parent, name, emb.original)
    for emb in {id(emb): emb for _, _, emb in slots}.values():
        _detach(emb)
    return model


def is_patched(model: torch.nn.Module) -> bool:
    """Whether ``patch(model)`` is in effect.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    bool

    Raises
    ------
    TypeError
        model is not a torch.nn.Module.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return bool(_slots(model, ExactRotaryEmbedding))
