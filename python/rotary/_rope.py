"""The ``Rope`` class (re-exported as ``rotary.Rope``) and the handles by which the torch operators
name a Rope."""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Optional, Sequence

import numpy as np

from . import _rotary
from ._args import (_bool_arg, _check_strided, _check_tensor, _config_source, _deltas, _empty_like, _empty_reals,
                    _in_new_words, _is_torch, _positions_and_streams, _positions_array, _renamed, _show,
                    _torch_tensor_type, _written)


# ---- Handles: a Rope named by an int, for torch operators (they cannot take Python objects) -----

_handles_lock = threading.Lock()
_next_handle = itertools.count(1)  # never reused: a handle names one Rope for the life of the process
_ropes_by_handle: "weakref.WeakValueDictionary[int, Rope]" = weakref.WeakValueDictionary()


def _register(rope: "Rope") -> None:
    """Gives rope a new handle (``rope._handle``); the entry lives as long as the Rope."""
    with _handles_lock:
        rope._handle = next(_next_handle)
        _ropes_by_handle[rope._handle] = rope


def _rope_of_handle(handle: int) -> "Rope":
    """The live Rope with this handle (what ``rotary.torch``'s operators receive)."""
    with _handles_lock:
        rope = _ropes_by_handle.get(handle)
    if rope is None:
        raise ValueError(f"rope handle={_show(handle)} names no live rotary.Rope (handles come from "
                         "Rope objects, and die with them)")
    return rope


class Rope:
    """One model's RoPE: frequencies (``inv_freq``), ``attention_factor``, and ``apply``.

    Parameters
    ----------
    head_dim : int
        Width of one attention head.
    rotary_dim : int, optional
        Width of the rotated slice (default ``head_dim``); even.
    base : float
        ``rope_theta``.
    pairing : {"half", "interleaved"}
        ``"half"``: pairs ``(x[i], x[i + r/2])``, Hugging Face ``rotate_half``, GPT-NeoX;
        ``"interleaved"``: pairs ``(x[2i], x[2i+1])``, Meta LLaMA, RoFormer.
    schedule : str
        ``default``, ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``,
        ``monotone`` or ``proportional``.
    seq_len : int, optional
        Current sequence length, for ``dynamic`` and ``longrope``.
    **schedule_args
        ``factor``, ``original_max_position``, ``max_position``, ``beta_fast``, ``beta_slow``,
        ``mscale``, ``mscale_all_dim``, ``truncate``, ``attention_factor``, ``low_freq_factor``,
        ``high_freq_factor``, ``short_factor``, ``long_factor``, ``max_length``,
        ``monotone_scale``, ``partial_rotary_factor`` (proportional), and for every schedule
        ``rotary_offset`` (first rotated channel), ``blocks`` (> 1: block_half layout),
        ``stream_layout`` (``single``, ``sections``, ``interleaved_sections``,
        ``alternating_sections``, ``axial``, ``axial_even_odd``) with ``sections`` (pairs per
        position stream, e.g. Qwen2-VL's ``mrope_section`` ``[16, 24, 24]``), and
        ``xpos_scale_base`` (xPos, Sun et al. 2022: a query's pair ``j`` at position ``p`` scales
        by ``zeta_j**((p - c) / xpos_scale_base)``, a key's by its inverse, ``zeta_j = (2j +
        0.4 r) / (1.4 r)``; torchscale's default is 512) with ``xpos_center`` ``c`` (default 0).
        With xPos, ``apply(q, k)`` scales ``q`` as queries and ``k`` as keys; to rotate keys
        alone pass them as ``k`` beside a ``q`` with 0 heads. Numbers may be
        Python or numpy scalars (``bool`` is not a number); lists of numbers may be lists, tuples
        or 1-D arrays.

    Attributes
    ----------
    inv_freq, attention_factor
        The frequencies (float64, radians per position) and the factor in cos and sin.
    layout, rotary_offset, blocks, streams, pair_stream
        The descriptor the settings come to: ``layout`` (``half``, ``interleaved`` or
        ``block_half``), the first rotated channel, the blocks of ``block_half``, the position
        streams ``apply`` reads and the stream of each pair (int32 ``[rotary_dim/2]``).
    xpos_scale_base, xpos_center
        xPos's gamma (None: no xPos) and centre.
    notes, rope_layers, rotates_backward, layer_type, layer_types, vision
        What resolving a config found (see ``from_hf_config``).

    Raises
    ------
    TypeError
        An argument of the wrong kind, naming it (``factor must be a number, got str``).
    ValueError
        A value that breaks a rule, naming it (``rotary_dim=130 exceeds head_dim=128``).

    Notes
    -----
    A Rope is safe to share between threads, and pickles and deep-copies (the settings travel and
    the schedule is rebuilt from them, so ``inv_freq`` and results are identical). Each Rope,
    copies included, has its own handle (``_handle``, an int never reused in the process), by which
    the torch operators of ``rotary.torch`` name it.
    """

    __module__ = "rotary"  # rotary.Rope, its public name (and pickles' reference)

    def __init__(self, head_dim: int, rotary_dim: Optional[int] = None, base: float = 10000.0,
                 pairing: str = "half", schedule: str = "default", seq_len: Optional[int] = None,
                 **schedule_args: Any) -> None:
        self._impl = _rotary.Rope(head_dim, rotary_dim, base, pairing, schedule, seq_len, schedule_args)
        self.notes: list[str] = []
        self.rope_layers: Optional[list[bool]] = None
        self.rotates_backward = False
        self.layer_type = "full_attention"
        self.layer_types = ["full_attention"]
        self.vision = False
        _register(self)

    @classmethod
    def _wrap(cls, impl: Any, notes: Sequence[str] = (), rope_layers: Optional[Sequence[bool]] = None,
              rotates_backward: bool = False, layer_type: str = "full_attention",
              layer_types: Sequence[str] = ("full_attention",), vision: bool = False) -> "Rope":
        rope = cls.__new__(cls)
        rope._impl = impl
        rope.notes = list(notes)
        rope.rope_layers = None if rope_layers is None else list(rope_layers)
        rope.rotates_backward = bool(rotates_backward)
        rope.layer_type = str(layer_type)
        rope.layer_types = list(layer_types)
        rope.vision = bool(vision)
        _register(rope)
        return rope

    def __getstate__(self) -> dict[str, Any]:
        # The handle stays behind: a copy is another Rope and gets its own.
        state = self.__dict__.copy()
        state.pop("_handle", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _register(self)

    @classmethod
    def from_hf_config(cls, path_or_dict: Any, seq_len: Optional[int] = None, *,
                       layer_type: Optional[str] = None, vision: bool = False) -> "Rope":
        """From a Hugging Face ``config.json``, resolved as transformers does.

        Parameters
        ----------
        path_or_dict : str, os.PathLike or dict
            The file (read by the library, with its size limit) or its parsed dict.
        seq_len : int, optional
            Current sequence length, for dynamic NTK and LongRoPE.
        layer_type : str, optional
            One RoPE of a model whose layer types differ (Gemma 3's ``"sliding_attention"``;
            ``rotary.layer_types(config)`` lists them); default ``"full_attention"`` when the
            model has it, else its first.
        vision : bool
            Resolve the vision tower (``vision_config``) instead of the text decoder.

        Returns
        -------
        Rope
            With ``notes`` (what resolving the config found worth saying), ``rope_layers`` (which
            decoder layers rotate with these settings; None: all of them; False: a NoPE layer or
            one of another type, see ``notes``), ``rotates_backward`` (the model turns pairs by
            -angle, NanoChat; ``apply`` then does as well), and ``layer_type``, ``layer_types``
            and ``vision`` saying which RoPE it is.

        Raises
        ------
        TypeError
            path_or_dict is neither a path nor a dict, or the dict holds values JSON cannot hold;
            layer_type not a str, vision not a bool.
        ValueError
            The config breaks a rule (naming the key), an unknown layer_type (listing the known
            ones), or the file cannot be read.
        """
        layer_type = "" if layer_type is None else layer_type
        vision = _bool_arg(vision, "vision")
        text, path = _config_source(path_or_dict)
        if text is not None:
            resolved = _rotary.Rope.from_config_text(text, seq_len, layer_type, vision)
        else:
            resolved = _rotary.Rope.from_config_file(path, seq_len, layer_type, vision)
        return cls._wrap(*resolved)

    @classmethod
    def from_preset(cls, name: str, seq_len: Optional[int] = None, *, layer_type: Optional[str] = None,
                    vision: bool = False) -> "Rope":
        """From a built-in preset: a real model's RoPE settings.

        Parameters
        ----------
        name : str
            One of ``rotary.preset_names()``.
        seq_len, layer_type, vision
            As in ``from_hf_config``.

        Returns
        -------
        Rope
            ``notes`` holds what resolving it found worth saying (e.g. an explicit YaRN factor
            overriding the context-length ratio).

        Raises
        ------
        ValueError
            An unknown name (listing the known ones), or a layer_type the model does not have.
        """
        layer_type = "" if layer_type is None else layer_type
        return cls._wrap(*_rotary.Rope.from_preset(name, seq_len, layer_type, _bool_arg(vision, "vision")))

    inv_freq = property(lambda self: np.array(self._impl.inv_freq, dtype=np.float64),
                        doc="Angular frequency of each pair (radians per position), float64 [rotary_dim/2].")
    inv_freq_hf32 = property(lambda self: np.array(self._impl.inv_freq_hf32, dtype=np.float32),
                             doc="transformers' float32 inv_freq (what numerics='hf-float32' turns by), float32 "
                                 "[rotary_dim/2]; its power base**(2j/d) correctly rounded, so one ulp from "
                                 "transformers' on the few pairs where torch's float32 pow is not (see "
                                 "Rope.apply's Notes).")
    attention_factor = property(lambda self: self._impl.attention_factor,
                                doc="Factor multiplied into cos and sin (YaRN mscale, LongRoPE).")
    head_dim = property(lambda self: self._impl.head_dim)
    rotary_dim = property(lambda self: self._impl.rotary_dim)
    pairing = property(lambda self: self._impl.pairing)
    schedule = property(lambda self: self._impl.schedule)
    base = property(lambda self: self._impl.base)
    layout = property(lambda self: self._impl.layout,
                      doc="How channels form pairs: 'half', 'interleaved' or 'block_half'.")
    rotary_offset = property(lambda self: self._impl.rotary_offset, doc="First rotated channel of a head.")
    blocks = property(lambda self: self._impl.blocks, doc="Blocks of the block_half layout (1 otherwise).")
    xpos_scale_base = property(lambda self: self._impl.xpos_scale_base,
                               doc="xPos scale base gamma, or None (no xPos).")
    xpos_center = property(lambda self: self._impl.xpos_center, doc="xPos centre c (0 without xPos).")
    streams = property(lambda self: self._impl.streams, doc="Position streams the pairs read (M-RoPE: 3).")
    stream_layout = property(lambda self: self._impl.stream_layout)
    sections = property(lambda self: list(self._impl.sections))
    pair_stream = property(lambda self: np.array(self._impl.pair_stream, dtype=np.int32),
                           doc="The position stream of each pair, int32 [rotary_dim/2].")

    def narrowed(self) -> "Rope":
        """The same RoPE for tensors that hold only the rotated slice of each head.

        Returns
        -------
        Rope
            ``head_dim = rotary_dim``, the same frequencies, factor, pairing and streams, and this
            Rope's notes and layer fields: what a model that hands ``q[..., :rotary_dim]`` to its
            rotation (Phi's attention) needs. ``rotary_offset`` must be 0.

        Raises
        ------
        ValueError
            The rotated slice does not start at channel 0.
        """
        if self.rotary_offset != 0:
            raise ValueError(f"rotary_offset={self.rotary_offset}: narrowed() keeps the leading slice, which "
                             "this Rope does not rotate")
        _, rotary_dim, base, pairing, schedule, seq_len, args = self._impl.__getstate__()
        impl = _rotary.Rope(rotary_dim, rotary_dim, base, pairing, schedule, seq_len, args)
        return Rope._wrap(impl, self.notes, self.rope_layers, self.rotates_backward, self.layer_type,
                          self.layer_types, self.vision)

    @_renamed("angles")
    def table(self, positions: Any, numerics: str = "exact") -> tuple[np.ndarray, np.ndarray]:
        """cos and sin of each position's angles, times ``attention_factor``.

        Parameters
        ----------
        positions : array-like of int
            Whole positions in [0, 2^31). An empty selection (``[]``, which numpy reads as
            float64, or ``torch.tensor([])``) gives empty cos and sin, as an empty tensor is a
            no-op everywhere in rotary.
        numerics : {"exact", "hf-float32"}
            The angles' numerics (``angles=``, its former name, is taken until the next release):
            ``"exact"``: within 1 ulp of the exact values; ``"hf-float32"``: transformers' float32
            pipeline, but for the power ``base**(2j/d)``, correctly rounded where torch's float32
            pow is not (a few pairs: see ``apply``'s Notes).

        Returns
        -------
        cos, sin : numpy.ndarray
            float32 ``[len(positions), rotary_dim/2]``.

        Raises
        ------
        TypeError
            positions not integers, numerics not a str.
        ValueError
            A position out of range (naming it), or unknown numerics.
        """
        try:
            flat = _positions_array(positions)
        except TypeError:
            if not _empty_reals(positions):
                raise
            flat = np.zeros(0, dtype=np.int64)  # numpy's [] is float64: no value to be whole or not
        try:
            return self._impl.table(flat, numerics)
        except (TypeError, ValueError) as e:
            _in_new_words(e)
            raise

    @_renamed("layout", "angles")
    def apply(self, q: Any, k: Any = None, *, positions: Any = None, offset: int = 0, order: str = "bshd",
              inplace: bool = False, inverse: bool = False, numerics: str = "exact", threads: int = 0,
              cos: Any = None, sin: Any = None, cos_sin_cache: Any = None,
              cos_sin_columns: Optional[str] = None, out: Any = None, check: bool = False,
              undo: bool = False) -> Any:
        """Rotates q (and k) and returns them (a tuple when k is given), as the same kind of object.

        Parameters
        ----------
        q, k : numpy.ndarray or torch.Tensor
            CPU, or (torch, built with CUDA kernels) one CUDA device: then every tensor of the call,
            positions and cos/sin included, is on that device (see Notes);
            float32/float64/float16/bfloat16 (torch), any strides (transposed views work
            without copies). 4-D ``[batch, seq, heads, head_dim]`` (``order="bshd"``, the default
            everywhere in rotary) or ``[batch, heads, seq, head_dim]`` (``"bhsd"``, as transformers
            keeps them); or 3-D ``[tokens, heads, head_dim]``: packed (varlen) sequences, as vLLM and
            flash-attn's varlen kernels keep them (``"thd"``; the default ``"bshd"`` reads a 3-D
            tensor the same way).
        positions : array-like or torch.Tensor, optional
            Each token's position, integers or real numbers (fractional ones turn by the exact real
            angle): ``[batch, seq]`` (or ``[batch * seq]``, or ``[seq]`` shared by every batch row),
            or ``[streams, batch, seq]`` / ``[streams, 1, seq]`` for a Rope with several position
            streams (M-RoPE: transformers' 3-row ``position_ids``; a single stream serves every
            stream). Packed q: ``[tokens]``, or ``[streams, tokens]``. Default ``offset + 0..seq-1``
            for every batch row in every stream (packed: ``offset + 0..tokens-1``).
        offset : int
            First position when ``positions`` is not given (a KV-cache decode step's position);
            with ``positions`` it must stay 0 (ValueError: add it to the positions instead).
        order : {"bshd", "bhsd", "thd"}
            Order of q's and k's dimensions; default ``"bshd"``. (``layout=``, its former name, is
            taken until the next release, with a DeprecationWarning: layout is the channel layout.)
        inplace : bool
            Write the results into q and k themselves.
        inverse : bool
            Rotate by -angle with the same scale: the transpose, i.e. the backward pass. It undoes a
            forward rotation only when ``attention_factor`` is 1 and there is no xPos (otherwise the
            round trip scales each pair by ``(attention_factor * sigma)**2``); see ``undo``.
        numerics : {"exact", "on_the_fly", "hf-float32"}
            The angles' numerics, the same words everywhere in rotary: ``"exact"`` (cos/sin within
            1 ulp of exact at any position, from the Rope's cached table; the default),
            ``"on_the_fly"`` (the same exact values computed per call, no table) or
            ``"hf-float32"`` (transformers' float32 pipeline, a model's training numerics, with
            one exception given in Notes; whole positions). ``"table"`` is accepted as
            ``"exact"``'s former name. (``angles=``, this keyword's former name, is taken until the
            next release, with a DeprecationWarning.)
        threads : int
            0 = all, at most ``rotary.max_threads``; results are bit-identical for any count.
        cos, sin : array-like or torch.Tensor, optional
            The model's own cos and sin (already times its attention factor), used instead of
            rotary's angles (``numerics`` must stay ``"exact"``): 3-D ``[batch or 1, seq, width]``,
            one row per token, as transformers' ``cos, sin = rotary_emb(x, position_ids)`` gives
            them (``positions`` and ``offset`` are then not read, and refused); or 2-D ``[rows,
            width]``, row p for every token at position p (flash-attn's tables; ``positions`` or
            ``offset`` then index them).
        cos_sin_cache : array-like or torch.Tensor, optional
            Instead of cos and sin, vLLM's ``cos_sin_cache`` ``[rows, rotary_dim]``: row p holds the
            rotary_dim/2 cos values of position p, then the sin values.
        cos_sin_columns : {"pairs", "halves", "repeated"}, optional
            Where pair j sits in a cos/sin row: ``"pairs"`` (width rotary_dim/2, column j),
            ``"halves"`` (width rotary_dim, ``rotate_half`` form, column j) or ``"repeated"`` (width
            rotary_dim, ``repeat_interleave`` form, column 2j); default ``"pairs"`` for width
            rotary_dim/2, else ``"halves"``.
        out : numpy.ndarray or torch.Tensor, or a tuple of two, optional
            Where to write the results out of place: ``q_out``, or ``(q_out, k_out)`` when k is
            given, each shaped and typed like its input (any strides) and sharing no memory with
            the inputs. Reusing outputs saves a fresh allocation per call, whose first touch
            costs a page fault per 4 KiB (a large share of a big out-of-place call from Python).
        check : bool
            CUDA tensors: wait for the call and raise ValueError if a per-token position was
            unusable (see Notes); the error covers every earlier unchecked call on the device too.
            CPU: nothing to do (positions are checked before anything is written).
        undo : bool
            Take back a rotation (``inverse`` says which): turn by the opposite angle and divide by
            ``attention_factor`` and by xPos's scale, so ``apply(apply(x), undo=True)`` gives x back
            to a few roundings, e.g. to un-rotate stored keys (pass keys as ``k`` beside a q with 0
            heads to scale them as keys under xPos). With attention_factor 1 and no xPos it equals
            the inverse bit for bit. Exact angles only (a factor other than 1 refuses
            ``numerics="hf-float32"``); not with the caller's cos/sin.

        Returns
        -------
        numpy.ndarray or torch.Tensor, or a tuple of two
            The rotated q, or ``(q, k)``: new arrays, ``out``, or q and k themselves with
            ``inplace=True``.

        Raises
        ------
        TypeError
            An argument of the wrong kind (a list for q, strings for positions, a str for threads
            ...), naming it.
        ValueError
            A value that breaks a rule (shapes, positions outside [0, 2^31), an offset other than 0
            beside positions, a streams count the Rope does not take, cos/sin of the wrong width,
            threads > max_threads, order, tensors on different devices, a CUDA tensor in a build
            without CUDA kernels, a meta tensor ...), naming it; q and k are untouched.
        RuntimeError
            The CUDA runtime failed (``rotary._rotary.CudaError``: no device, memory exhausted).

        Notes
        -----
        Inputs are only read when ``inplace=False``: read-only or memory-mapped arrays, broadcast
        views and tensors that require grad are fine. ``inplace=True`` refuses them (ValueError)
        and leaves them untouched. Empty tensors (a zero extent) give empty results. For autograd
        and ``torch.compile`` use ``rotary.torch.apply_rope``.

        ``numerics="hf-float32"`` replays transformers' float32 arithmetic (``inv_freq_hf32``, the
        angle ``fl32(inv_freq * fl32(p))``, cos/sin within 2 ulps of its forward) but for one step:
        the power ``base**(2j/d)`` is correctly rounded, and torch's float32 pow is not on a few
        pairs (which ones depends on the CPU's vector unit and on the tensor's length; on x86
        AVX2/AVX512, pair 37 of base 1e6 at head_dim 128: Qwen2, Qwen2.5, Qwen3, CodeLlama; pair
        19 of base 5e6: Qwen3-VL). On such a pair ``inv_freq_hf32`` is one ulp from transformers'
        ``inv_freq`` and the angle up to ``2**-21 * p * inv_freq`` from its angle: at p = 2^31 - 1,
        0.06 rad on Qwen's pair 37 and 2 rad on Qwen3-VL's pair 19. To rotate by a model's own
        angles bit for bit, pass its cos and sin (``cos=``, ``sin=``).

        CUDA tensors: the kernels are queued on torch's current stream of their device and the call
        returns without waiting, so it can be captured in a CUDA graph (after one warm-up call on
        the device, which allocates its error word). Results are the CPU's bit for bit (NaNs
        compared as NaN). ``numerics="exact"`` reads the Rope's table copied to the device for
        sequential positions (``offset``) and computes the same values on the device for per-token
        ``positions`` (a tensor on the device, never read back); ``"hf-float32"`` angles likewise
        (transformers' float32 arithmetic replayed on the device for per-token positions). The
        host checks everything but the per-token positions' values, which
        the kernels check: a token whose position is unusable (outside [0, 2^31), not a row of
        per-position cos/sin, or beyond xPos's reach) is skipped, its output left unwritten, and the
        device's error word records it; ``check=True`` or ``rotary.torch.check_positions()`` raise
        for it. Tables copied to a device live as long as the Rope: keep it alive while a CUDA
        graph that uses it may replay. ``threads`` does not apply.
        """
        return self._apply(q, k, positions, offset, order, inplace, inverse, numerics, threads, cos, sin,
                           cos_sin_cache, cos_sin_columns, out, check, undo)

    def _apply(self, q: Any, k: Any, positions: Any, offset: Any, order: Any, inplace: Any, inverse: Any,
               numerics: Any, threads: Any, cos: Any, sin: Any, cos_sin_cache: Any, cos_sin_columns: Any,
               out: Any = None, check: Any = False, undo: Any = False) -> Any:
        """apply with positional arguments (what rotary.torch's eager path calls: a decode step's
        cost is mostly this layer's and the extension's argument handling)."""
        torch_tensor = _torch_tensor_type()
        if type(q) is not torch_tensor or (k is not None and type(k) is not torch_tensor):  # else both tensors
            _check_tensor(q, "q")
            if k is not None:
                _check_tensor(k, "k")
                if isinstance(k, np.ndarray) != isinstance(q, np.ndarray):  # subclasses (memmap) are fine
                    raise TypeError(f"k must be the same kind as q ({type(q).__name__}), got {type(k).__name__}")
        else:  # torch tensors both: memory the library can address
            _check_strided(q, "q")
            if k is not None:
                _check_strided(k, "k")
        if cos is not None or sin is not None or cos_sin_cache is not None:
            for name, value in (("cos", cos), ("sin", sin), ("cos_sin_cache", cos_sin_cache)):
                if value is not None:
                    _check_tensor(value, name)
        if inplace is not True and inplace is not False:
            inplace = _bool_arg(inplace, "inplace")
        packed = q.ndim == 3 or order == "thd"
        if packed:
            self._check_packed(q, k, order)
            positions = self._packed_positions(positions)
        pos, streams = (None, 1) if positions is None else _positions_and_streams(positions)
        if out is not None:
            q_out, k_out = self._outputs(out, q, k, inplace)
        else:
            q_out = None if inplace else _empty_like(q)
            k_out = None if (inplace or k is None) else _empty_like(k)
        if undo is not False and _bool_arg(undo, "undo") and _bool_arg(inverse, "inverse"):
            raise ValueError("inverse=True and undo=True cannot both be given (undo takes back a forward rotation; "
                             "inverse is its transpose)")
        if self.rotates_backward:  # the model's code turns pairs by -angle (NanoChat)
            inverse = not _bool_arg(inverse, "inverse")
        if packed:  # one batch row of bshd views
            q4, k4, q_out4, k_out4 = (None if t is None else t[None] for t in (q, k, q_out, k_out))
            order = "bshd"
        else:
            q4, k4, q_out4, k_out4 = q, k, q_out, k_out
        try:
            self._impl.apply(q4, k4, q_out4, k_out4, pos, streams, offset, order, inverse, numerics, threads,
                             cos, sin, cos_sin_cache, cos_sin_columns, check, undo)
        except (TypeError, ValueError) as e:  # the extension names them layout and angles
            _in_new_words(e)
            raise
        if inplace or out is not None:
            _written(q_out if out is not None else q, k_out if out is not None else k)
        rq = q if inplace else q_out
        if k is None:
            return rq
        return rq, (k if inplace else k_out)

    @_renamed("layout")
    def rerotate(self, k: Any, delta: Any, *, positions: Any = None, offset: int = 0, order: str = "bshd",
                 inplace: bool = False) -> Any:
        """Moves keys rotated at positions p (by ``apply``) to positions p + delta: a KV cache's
        context shift (StreamingLLM eviction) without recomputing the keys.

        Each pair turns by the exact angle ``delta * inv_freq[j]`` (per stream for M-RoPE), with no
        attention factor: the factor the keys carry is kept, not applied again.

        Parameters
        ----------
        k : numpy.ndarray or torch.Tensor
            The rotated keys, as ``apply`` takes q: CPU, float32/float64/float16/bfloat16, any
            strides, ``[batch, seq, heads, head_dim]`` (``"bshd"``), ``[batch, heads, seq,
            head_dim]`` (``"bhsd"``) or packed ``[tokens, heads, head_dim]`` (``"thd"``).
        delta : int or sequence of int
            The shift, any sign, in (-2^31, 2^31); one int for every stream, or one per stream of
            the Rope (M-RoPE ``[t, h, w]``, signs may differ).
        positions : array-like or torch.Tensor, optional
            The positions the keys were rotated at, as ``apply`` takes them (default
            ``offset + 0..seq-1``). Every position plus its stream's delta must stay in [0, 2^31).
        offset : int
            First position when ``positions`` is not given; with ``positions`` it must stay 0.
        order : {"bshd", "bhsd", "thd"}
            Order of k's dimensions (``layout=``, its former name, is taken until the next release).
        inplace : bool
            Write the moved keys into k itself.

        Returns
        -------
        numpy.ndarray or torch.Tensor
            The keys at positions p + delta: a new array, or k itself with ``inplace=True``.

        Raises
        ------
        TypeError
            k not an array or tensor, delta not an int or a sequence of ints (a bool included),
            positions not numbers.
        ValueError
            A position plus delta leaving [0, 2^31) (naming both), a delta outside (-2^31, 2^31),
            an offset other than 0 beside positions,
            a count of deltas that is neither 1 nor the Rope's streams, and everything ``apply``
            refuses; k is untouched.

        Notes
        -----
        Accuracy: within ``apply``'s bound for the stored keys, 2^-23 (|a| + |b|) per pair (each
        pair is rounded once, f16/bf16 once more at the store). Successive shifts each add such a
        rounding; the float32 cos/sin of a repeated step also add up (at most 2^-24 √2 per step).
        """
        deltas = _deltas(delta)
        return self._move(k, positions, offset, order, inplace,
                          lambda *args: self._impl.rerotate(args[0], args[1], deltas, *args[2:]))

    @_renamed("layout")
    def switch(self, k: Any, to: "Rope", *, positions: Any = None, offset: int = 0, order: str = "bshd",
               inplace: bool = False) -> Any:
        """Moves keys rotated by this Rope at their positions to what Rope ``to`` gives at the same
        positions: LongRoPE's short -> long factors once the context passes the original length,
        a dynamic-NTK base change, a new attention factor.

        Each pair turns by ``p * (to.inv_freq[j] - self.inv_freq[j])`` and scales by
        ``to.attention_factor / self.attention_factor``.

        Parameters
        ----------
        k : numpy.ndarray or torch.Tensor
            The keys rotated by this Rope, as ``rerotate`` takes them.
        to : Rope
            The schedule to move to: the same head_dim, rotary_dim, pairing, layout (of the channels),
            rotary_offset, blocks and position streams.
        positions, offset, order, inplace
            As ``rerotate``.

        Returns
        -------
        numpy.ndarray or torch.Tensor
            The keys as ``to.apply`` would have rotated them: a new array, or k itself with
            ``inplace=True``.

        Raises
        ------
        TypeError
            ``to`` not a Rope, and the kinds ``rerotate`` refuses.
        ValueError
            Ropes that differ in a field above (naming it), or one turning pairs backward and the
            other not, and everything ``apply`` refuses; k is untouched.

        Notes
        -----
        Equal attention factors (LongRoPE, dynamic NTK): each pair is rounded once, ``apply``'s
        bound. Different ones: pairs whose frequency falls are scaled, then turned (two roundings).
        """
        if not isinstance(to, Rope):
            raise TypeError(f"to must be a rotary.Rope, got {type(to).__name__}")
        if to.rotates_backward != self.rotates_backward:
            raise ValueError(f"to.rotates_backward={to.rotates_backward} differs from this Rope's "
                             f"{self.rotates_backward} (both must turn pairs the same way)")
        return self._move(k, positions, offset, order, inplace,
                          lambda *args: self._impl.switch(args[0], args[1], to._impl, *args[2:]))

    def _move(self, k: Any, positions: Any, offset: Any, order: Any, inplace: Any, run: Any) -> Any:
        """rerotate's and switch's argument handling: run(k, k_out, positions, streams, offset,
        order, inverse) on 4-D views."""
        _check_tensor(k, "k")
        inplace = _bool_arg(inplace, "inplace")
        packed = k.ndim == 3 or order == "thd"
        if packed:
            if order not in ("bshd", "thd"):
                raise ValueError(f"order={_show(order)} is for 4-D tensors: a 3-D k is packed [tokens, heads, "
                                 "head_dim], order 'thd' (or the default 'bshd')")
            if k.ndim != 3:
                raise ValueError("k must have 3 dimensions ([tokens, heads, head_dim]) with order='thd', "
                                 f"got {k.ndim}")
            positions = self._packed_positions(positions)
        pos, streams = (None, 1) if positions is None else _positions_and_streams(positions)
        out = None if inplace else _empty_like(k)
        k4, out4 = (k[None], None if out is None else out[None]) if packed else (k, out)
        try:
            run(k4, out4, pos, streams, offset, "bshd" if packed else order, self.rotates_backward)
        except (TypeError, ValueError) as e:  # the extension names it layout
            _in_new_words(e)
            raise
        if inplace:
            _written(k)
        return k if inplace else out

    @staticmethod
    def _outputs(out: Any, q: Any, k: Any, inplace: bool) -> tuple:
        """apply's ``out`` as (q_out, k_out), checked for kind and count (shapes, dtypes, strides and
        overlaps are the library's to check, before anything is written)."""
        if inplace:
            raise ValueError("out is given with inplace=True (in place writes q and k themselves)")
        outs = out if isinstance(out, tuple) else (out,)
        want = 1 if k is None else 2
        if len(outs) != want:
            raise ValueError(f"out must be {'q_out' if k is None else 'a tuple (q_out, k_out)'}, got "
                             f"{len(outs)} output{'s' if len(outs) != 1 else ''}")
        for name, o in zip(("q_out", "k_out"), outs):
            _check_tensor(o, f"out ({name})")
            if isinstance(o, np.ndarray) != isinstance(q, np.ndarray):
                raise TypeError(f"out ({name}) must be the same kind as q ({type(q).__name__}), got {type(o).__name__}")
        return outs[0], (outs[1] if k is not None else None)

    @staticmethod
    def _check_packed(q: Any, k: Any, order: Any) -> None:
        """q (and k) packed ``[tokens, heads, head_dim]``, with order 'thd' or the default 'bshd'."""
        if not isinstance(order, str):
            raise TypeError(f"order must be a str, got {type(order).__name__}")
        if order not in ("bshd", "thd"):
            raise ValueError(f"order={_show(order)} is for 4-D tensors: a 3-D q is packed [tokens, heads, "
                             "head_dim], order 'thd' (or the default 'bshd')")
        for name, t in (("q", q), ("k", k)):
            if t is not None and t.ndim != 3:
                raise ValueError(f"{name} must have 3 dimensions ([tokens, heads, head_dim]) with order='thd' or "
                                 f"a 3-D q, got {t.ndim}")

    def _packed_positions(self, positions: Any) -> Any:
        """Packed positions ``[streams, tokens]`` as ``[streams, 1, tokens]`` (one batch row)."""
        if positions is None or self.streams == 1:
            return positions
        try:
            if _is_torch(positions):
                return positions[:, None, :] if positions.dim() == 2 else positions
            arr = np.asarray(positions)
        except (TypeError, ValueError):
            return positions  # _positions_and_streams names what is wrong with them
        return arr[:, None, :] if arr.ndim == 2 else positions

    def __repr__(self) -> str:
        return (f"Rope(head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"pairing='{self.pairing}', schedule='{self.schedule}', attention_factor={self.attention_factor}"
                + (f", xpos_scale_base={self.xpos_scale_base}, xpos_center={self.xpos_center}"
                   if self.xpos_scale_base is not None else "") + ")")
