"""Argument helpers shared by rotary's modules: kinds checked and named, positions read, and the
keywords renamed so that each word keeps one meaning (their former names still taken for a release).

Imports no torch: a torch tensor is recognised through ``sys.modules``, and where there is no torch
loaded there is none to recognise.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import warnings
from typing import Any, Callable, Optional, Sequence, TypeVar

import numpy as np

from . import _rotary

_show = _rotary.shown  # repr(value) cut to ~100 characters, for error messages

_F = TypeVar("_F", bound=Callable[..., Any])


def _int_arg(value: Any, name: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _bool_arg(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _is_torch(x: Any) -> bool:
    """x is a torch.Tensor (without importing torch: if it is not loaded, x cannot be one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _written(*tensors: Any) -> None:
    """Tells autograd that these torch tensors were written in place, as torch's own in-place ops do
    (their version counters move): a graph that saved one of them then raises at backward instead of
    using the overwritten values. numpy arrays and None pass; torch leaves inference tensors (no version)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    written = [t for t in tensors if isinstance(t, torch.Tensor)]
    if written:
        torch.autograd.graph.increment_version(written)  # one call for all


def _check_tensor(x: Any, name: str) -> None:
    if isinstance(x, np.ndarray):
        return
    if _is_torch(x):
        _check_strided(x, name)
        return
    raise TypeError(f"{name} must be a numpy.ndarray or torch.Tensor, got {type(x).__name__}")


def _check_strided(x: Any, name: str) -> None:
    """A torch tensor of torch.strided layout (memory the library can address), else a ValueError naming
    it (as the extension refuses one it cannot borrow): sparse (COO, CSR, ...) and MKL-DNN tensors."""
    torch = sys.modules["torch"]
    if x.layout is not torch.strided:
        raise ValueError(f"{name} must be a dense (torch.strided) tensor, got layout {x.layout} (x.to_dense() makes "
                        "one)")


def _empty_like(x: Any) -> Any:
    """A new writable array/tensor shaped like x (numpy: a plain ndarray in x's memory order, even
    for a memmap or a broadcast view; torch: never requiring grad)."""
    if isinstance(x, np.ndarray):
        return np.empty_like(x, subok=False)
    return sys.modules["torch"].empty_like(x)  # never requires grad (requires_grad defaults to False)


_INT64_MAX = np.iinfo(np.int64).max


def _position_range_error(name: str, index: int, value: Any) -> ValueError:
    # The library's rule and wording, for values it cannot receive (beyond int64).
    return ValueError(f"{name}[{index}]={_show(value)} must be in [0, 2^31)")


def _object_positions(arr: np.ndarray, name: str) -> np.ndarray:
    """Python ints of any size (numpy keeps those beyond int64 as objects), in arr's shape."""
    flat = arr.reshape(-1)
    for i, value in enumerate(flat):
        if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name}[{i}] must be an int, got {type(value).__name__}")
        if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
            raise _position_range_error(name, i, value)
    return flat.astype(np.int64).reshape(arr.shape)


def _float_positions(arr: np.ndarray, name: str) -> np.ndarray:
    """Real positions as a float64 array in arr's shape; whole ones (the common case) as int64, so
    that they take the cached table. Beyond int64 they stay float64 for the library's range check."""
    values = np.array(arr, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        whole = bool(np.all((values == np.floor(values)) & (np.abs(values) < 2.0 ** 62)))
    return values.astype(np.int64) if whole else values


def _positions_array(positions: Any, name: str = "positions", real: bool = False) -> np.ndarray:
    """positions as a new C-ordered int64 array in their own shape (or, with ``real``, float64 for
    fractional ones): the library checks the shape ([batch, seq], not a transposed [seq, batch]).
    TypeError unless they are integers (or real numbers), ValueError for values int64 cannot hold
    (the library checks the range of the others). Always a copy: another thread changing the
    caller's array cannot change positions after the library checked them."""
    if _is_torch(positions):
        if positions.is_meta:  # no values to read (the torch operators name the meta tensor the same way)
            raise ValueError(f"{name} is on meta: a meta tensor has no values (give positions on the CPU, or on "
                             "the CUDA device of q)")
        dtype = positions.dtype
        if dtype.is_complex or dtype == sys.modules["torch"].bool or (dtype.is_floating_point and not real):
            raise TypeError(f"{name} must hold integers{' or real numbers' if real else ''}, got dtype {positions.dtype}")
        if dtype.is_floating_point:
            positions = positions.detach().cpu().double()
        positions = positions.detach().cpu().numpy()
    try:
        arr = np.asarray(positions)
    except (TypeError, ValueError, OverflowError) as e:  # ragged lists, broken __array__
        raise TypeError(f"{name} must be an array of integers, got {_show(positions)}") from e
    if arr.dtype == object:
        return _object_positions(arr, name)
    if isinstance(positions, (list, tuple)) and arr.dtype.kind in "iu" and arr.size:
        # numpy reads a bool among ints as 0 or 1 (an all-bool list is refused below, by its dtype)
        return _object_positions(np.asarray(positions, dtype=object), name)
    if real and arr.dtype.kind == "f":
        return _float_positions(arr, name)
    if arr.dtype.kind not in "iu":
        kinds = "integers or real numbers" if real else "integers"
        raise TypeError(f"{name} must hold {kinds}, got dtype {arr.dtype}")
    flat = arr.reshape(-1)
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and flat.size and flat.max() > _INT64_MAX:
        i = int(np.argmax(flat > _INT64_MAX))
        raise _position_range_error(name, i, int(flat[i]))
    return np.array(arr, dtype=np.int64, order="C")


def _empty_reals(positions: Any) -> bool:
    """positions hold no value and have a real dtype: ``[]`` (float64 to numpy), ``torch.tensor([])``
    (float32), an empty float array. Such a selection is empty, not of the wrong kind."""
    if _is_torch(positions):
        return positions.numel() == 0 and positions.dtype.is_floating_point
    try:
        arr = np.asarray(positions)
    except (TypeError, ValueError, OverflowError):
        return False
    return arr.size == 0 and arr.dtype.kind == "f"


def _positions_and_streams(positions: Any) -> tuple[np.ndarray, int]:
    """apply's positions: ``[S, batch, seq]`` or ``[S, 1, seq]`` (S streams, transformers' M-RoPE
    ``position_ids``), ``[batch, seq]`` or ``[seq]`` (one stream); ints or reals."""
    if _is_torch(positions):
        _check_strided(positions, "positions")
    try:
        shape = tuple(positions.shape) if _is_torch(positions) else np.shape(positions)
    except (TypeError, ValueError) as e:  # ragged lists
        raise TypeError(f"positions must be an array of integers or real numbers, got {_show(positions)}") from e
    ndim = len(shape)
    if ndim > 3:
        raise ValueError(f"positions must have at most 3 dimensions ([streams, batch, seq]), got {ndim}")
    streams = 1
    if ndim == 3:  # nested lists and tuples too: np.shape, not .shape
        streams = int(shape[0])
        if streams == 0:
            raise ValueError("positions has 0 streams ([streams, batch, seq] with streams >= 1)")
    if type(positions) is _torch_tensor_type() and positions.dtype in _torch_int_types() and positions.is_cpu:
        return positions, streams  # the extension copies them (through DLPack, any strides)
    if _is_torch(positions) and positions.is_cuda:
        return _device_positions(positions), streams
    return _positions_array(positions, real=True), streams


def _device_positions(positions: Any) -> Any:
    """Positions on a CUDA device as the kernels read them, staying there: a contiguous plain tensor of
    int64, int32, float32 or float64 (other integer and float dtypes widened to int64 and float64, on
    the device). Their values are checked by the kernels."""
    torch = sys.modules["torch"]
    dtype = positions.dtype
    if dtype.is_complex or dtype == torch.bool:
        raise TypeError(f"positions must hold integers or real numbers, got dtype {dtype}")
    positions = positions.detach()
    if type(positions) is not torch.Tensor:
        positions = positions.as_subclass(torch.Tensor)
    if dtype not in (torch.int64, torch.int32, torch.float64, torch.float32):
        positions = positions.to(torch.float64 if dtype.is_floating_point else torch.int64)
    return positions.contiguous()


def _deltas(delta: Any) -> list:
    """rerotate's delta: an int (a 0-d integer array or tensor too), or a sequence of ints (one per
    stream), as a list."""
    if isinstance(delta, (int, np.integer)) and not isinstance(delta, (bool, np.bool_)):
        return [int(delta)]
    if _is_torch(delta):
        delta = delta.detach().cpu().numpy()
    if isinstance(delta, np.ndarray) and delta.ndim == 0:  # a 0-d array: one delta, as rerotate_cache takes it
        delta = delta[()]
        if isinstance(delta, np.integer) and not isinstance(delta, np.bool_):
            return [int(delta)]
        raise TypeError(f"delta must be an int or a sequence of ints (one per stream), got a 0-d array of "
                        f"{np.dtype(type(delta)).name}")
    if isinstance(delta, (str, bytes)) or not isinstance(delta, (Sequence, np.ndarray)) or np.ndim(delta) != 1:
        raise TypeError(f"delta must be an int or a sequence of ints (one per stream), got {_show(delta)}")
    for i, d in enumerate(delta):
        if not isinstance(d, (int, np.integer)) or isinstance(d, (bool, np.bool_)):
            raise TypeError(f"delta[{i}] must be an int, got {type(d).__name__}")
    return [int(d) for d in delta]


def _torch_tensor_type() -> Any:
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


@functools.lru_cache(maxsize=None)
def _torch_int_types() -> tuple:
    import torch
    return (torch.int64, torch.int32)


def _config_source(path_or_dict: Any) -> tuple[Optional[str], Optional[str]]:
    """(JSON text, None) for a dict, (None, path) for a path."""
    if isinstance(path_or_dict, dict):
        try:
            return json.dumps(path_or_dict, allow_nan=False), None
        except (TypeError, ValueError, RecursionError) as e:
            kind = TypeError if isinstance(e, TypeError) else ValueError
            raise kind(f"path_or_dict is not a JSON config: {_show(str(e))}") from None
    if isinstance(path_or_dict, (str, bytes, os.PathLike)):
        return None, os.fsdecode(path_or_dict)
    raise TypeError(f"path_or_dict must be a path or a dict, got {type(path_or_dict).__name__}")


# ---- Renamed keywords: one meaning per word ---------------------------------------------------------

# The tensor orders (order=): [batch, seq, heads, head_dim], [batch, heads, seq, head_dim], packed
# [tokens, heads, head_dim].
_ORDERS = ("bshd", "bhsd", "thd")

# A former keyword -> (its new name, what it names). "layout" is the channel layout (Rope.layout:
# half, interleaved, block_half); "angles" the caller's cos/sin (ApplyArgs::caller_angles).
_FORMER_KEYWORDS = {"layout": ("order", "the tensor order"), "angles": ("numerics", "the angle numerics")}


def _is_compiling() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def _reworded(e: BaseException, words: dict[str, str]) -> None:
    """e's message with each keyword ``name=`` (and ``name must be``) in ``words`` replaced by its
    value; e keeps its type and traceback."""
    if len(e.args) != 1 or not isinstance(e.args[0], str):
        return
    text = e.args[0]
    for name, spelled in words.items():
        text = re.sub(rf"(?<![\w.]){name}(=| must be )", rf"{spelled}\1", text)
    e.args = (text,)


_NEW_WORDS = {old: new for old, (new, _) in _FORMER_KEYWORDS.items()}


def _in_new_words(e: BaseException) -> None:
    """The extension's message about ``layout=`` or ``angles=`` (its argument names: the torch
    operators' schemas keep them) in the keywords the caller passes, ``order=`` and ``numerics=``."""
    _reworded(e, _NEW_WORDS)


def _renamed(*former: str) -> Callable[[_F], _F]:
    """A function whose keywords were renamed, still taking the ``former`` names for one release.

    A former name warns (``DeprecationWarning``, naming the new spelling; not while torch.compile
    traces) and is passed as the new one; both names together are a TypeError naming both. Errors
    about the value then name the former spelling, as the caller wrote it. The signature lists the
    former names after the others, keyword-only, with the new names' defaults. Calls with the new
    names pay one dictionary lookup per former name.
    """
    for name in former:
        if name not in _FORMER_KEYWORDS:
            raise ValueError(f"{name!r} is not a former keyword")

    def decorate(function: _F) -> _F:
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            for name in former:
                if name in kwargs:
                    return _call_with_former(function, positional, args, kwargs)
            return function(*args, **kwargs)

        signature = inspect.signature(function)
        ordered = list(signature.parameters)
        positional: dict[str, Optional[int]] = {}  # former name -> the index of the new one's argument, if any
        for name in former:
            new = signature.parameters[_FORMER_KEYWORDS[name][0]]
            by_position = new.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            positional[name] = ordered.index(new.name) if by_position else None
        parameters = list(signature.parameters.values())
        variadic = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
        named = [p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
        for name in former:
            new = signature.parameters[_FORMER_KEYWORDS[name][0]]
            named.append(new.replace(name=name, kind=inspect.Parameter.KEYWORD_ONLY))
        call.__signature__ = signature.replace(parameters=named + variadic)  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorate


def _call_with_former(function: Callable[..., Any], former: dict[str, Optional[int]], args: tuple,
                      kwargs: dict) -> Any:
    used = {}  # new name -> former name, as the caller wrote it
    for name, index in former.items():
        if name not in kwargs:
            continue
        new, _ = _FORMER_KEYWORDS[name]
        if new in kwargs or (index is not None and len(args) > index):
            raise TypeError(f"{function.__qualname__}() got both {new}= and {name}= ({name}= is its former name): "
                            f"pass {new}= only")
        kwargs[new] = kwargs.pop(name)
        used[new] = name
    if _is_compiling():  # traced once: the eager call warns
        return function(*args, **kwargs)
    for new, name in used.items():
        warnings.warn(f"{name}= is deprecated (it names {_FORMER_KEYWORDS[name][1]}): use {new}=", DeprecationWarning,
                      stacklevel=3)
    try:
        return function(*args, **kwargs)
    except (TypeError, ValueError) as e:
        _reworded(e, used)
        raise
