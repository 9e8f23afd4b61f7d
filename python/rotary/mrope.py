"""M-RoPE position ids for Qwen2-VL, Qwen2.5-VL and Qwen3-VL prompts (pure numpy).

``mrope_positions`` is the equivalent of transformers' ``get_rope_index``: from a batch of token ids
and the vision grids it builds the three position rows (temporal, height, width) that multimodal
RoPE rotates by, and the per-row offset that decoding continues from. ``mrope_decode_positions``
gives the positions of the tokens generated after the prompt.

Reference followed (transformers, ``Qwen2VLModel.get_rope_index`` and its copies):

- ``src/transformers/models/qwen2_vl/modeling_qwen2_vl.py``,
  ``src/transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py`` and
  ``src/transformers/models/qwen3_vl/modeling_qwen3_vl.py`` of transformers 4.49 to 4.57: the token
  id driven version (a block is announced by ``vision_start_token_id`` followed by an image or
  video token), with which the three model families were released;
- the same files in transformers 5.x (``get_vision_position_ids``) for the Qwen2.5-VL time index.

The rules, per row of the batch (only the tokens whose ``attention_mask`` is 1, in order):

1. Blocks are found as transformers finds them: the number of images (videos) is the number of
   ``vision_start_token_id`` tokens followed by ``image_token_id`` (``video_token_id``); then,
   repeatedly, the nearest image or video token from the current index starts the next block, which
   takes the next row of ``image_grid_thw`` (``video_grid_thw``). Grid rows are consumed in order
   across the whole batch.
2. A grid ``(t, h, w)`` covers ``t * (h / m) * (w / m)`` tokens (``m = spatial_merge_size``),
   ordered time-major, then height, then width. Its positions are ``start + (time index, row,
   column)``, where ``start`` is the first position after the text before it.
3. Text runs take consecutive positions, equal on all three rows, starting at the largest position
   so far plus one (0 at the beginning of the row).
4. Time index: Qwen2-VL and Qwen3-VL, the temporal patch number ``i``; Qwen2.5-VL videos,
   ``int(i * (tokens_per_second * second_per_grid_t))`` computed in float32 and truncated, as
   transformers does with the processor's float32 ``second_per_grid_ts`` (1.0 when not given).
   Qwen3-VL splits every video of ``t`` temporal patches into ``t`` blocks of one patch each (each
   frame is its own ``<vision_start>`` block after a timestamp in the text), so its video time
   index is always 0.
5. Padding (``attention_mask`` 0) gets position 1 on all three rows.
6. ``deltas[b] = max(positions of row b) + 1 - seq_len``, ``seq_len`` being the padded length
   ``input_ids.shape[1]``: decoded token ``n`` (0-based, after the prompt) has position
   ``seq_len + n + deltas[b]`` on all three rows, what ``mrope_decode_positions`` returns.
7. With neither ``image_grid_thw`` nor ``video_grid_thw`` (text only), transformers' text path:
   without a mask positions are ``0 .. seq_len-1`` and deltas 0; with a mask positions are the
   running count of unmasked tokens minus one, padding gets 1, and ``deltas`` take the maximum
   over the whole row, padding included (so a row with a single real token and padding gets
   ``deltas = 2 - seq_len``, as in transformers).

Where transformers versions differ, what is followed and why:

- Text after a block starts at the block's largest position plus one (4.x, and the worked example
  in its docstring). transformers 5.x advances by ``max(h, w) / m`` only, which is the same for
  images and Qwen3-VL frames (``t = 1``) but not for Qwen2-VL/Qwen2.5-VL videos of several patches.
- Padding gets 1 and deltas use the padded length (4.x; 5.x gives padding 0 and measures deltas
  against the unpadded length, and decodes from the attention mask instead of the cache position:
  the decoded positions are the same).
- Qwen2.5-VL: transformers 4.50 to 4.57 converted ``second_per_grid_t`` to an integer before the
  product (0.5 s per grid gave time index 0); 4.49 and 5.x multiply in float32, as here, in 5.x's
  order ``i * (tokens_per_second * second_per_grid_t)`` (4.49 computes ``(i * second_per_grid_t) *
  tokens_per_second``, which rounds differently in rare cases: 0.7 s, 3 tokens/s, i = 30 gives 62
  here and in 5.x, 63 in 4.49).
  Still images with ``t > 1`` take the patch number as time index (5.x; 4.x gave them 0). Real
  images always have ``t = 1``, where all versions agree.

Input that transformers would reject later or misread (a block running past the row, a block that
is not made of its token, vision tokens that no grid covers, grids left unused) is refused here
with a ``ValueError`` naming the row and the rule. Only numpy and the standard library are used.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

__all__ = ["mrope_positions", "mrope_decode_positions", "MROPE_FAMILIES"]

MROPE_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# Token ids of the Qwen2-VL, Qwen2.5-VL and Qwen3-VL tokenizers (config.json of the released models).
QWEN_IMAGE_TOKEN_ID = 151655
QWEN_VIDEO_TOKEN_ID = 151656
QWEN_VISION_START_TOKEN_ID = 151652
# vision_config.tokens_per_second of the released Qwen2.5-VL checkpoints (the config class default is 4).
QWEN2_5_VL_TOKENS_PER_SECOND = 2

_INT64_MAX = int(np.iinfo(np.int64).max)
_POSITION_LIMIT = 1 << 31  # positions are in [0, 2^31), as everywhere in rotary


def _show(value: Any) -> str:
    """repr(value) cut to ~100 characters, for error messages (repr escapes NUL bytes)."""
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 100 else text[:97] + "..."


def _int_arg(value: Any, name: str, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {_show(value)}")
    if not minimum <= int(value) <= _INT64_MAX:
        raise ValueError(f"{name}={_show(value)} must be in [{minimum}, 2^63)")
    return int(value)


def _int_array(value: Any, name: str) -> np.ndarray:
    """value as an integer ndarray (bools and floats refused)."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as e:  # ragged lists, broken __array__
        raise TypeError(f"{name} must be an array of integers, got {_show(value)}") from e
    if arr.size == 0 and arr.dtype.kind == "f":  # [] is float64 to numpy; its shape is what is wrong
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}: {_show(value)}")
    return arr


def _check_ids(input_ids: Any) -> np.ndarray:
    ids = _int_array(input_ids, "input_ids")
    if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty 2-D array [batch, seq], got shape {ids.shape}")
    if ids.shape[1] > _POSITION_LIMIT:
        raise ValueError(f"input_ids has seq={ids.shape[1]} tokens per row, more than the 2^31 positions "
                         "[0, 2^31) can number")
    return ids


def _check_mask(attention_mask: Any, shape: tuple) -> Optional[np.ndarray]:
    """attention_mask as a bool array of ``shape``, or None."""
    if attention_mask is None:
        return None
    try:
        mask = np.asarray(attention_mask)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"attention_mask must be an array of 0 and 1, got {_show(attention_mask)}") from e
    if mask.dtype.kind not in "biu":
        raise TypeError(f"attention_mask must hold 0 and 1 (integers or bools), got dtype {mask.dtype}")
    if mask.shape != shape:
        raise ValueError(f"attention_mask shape {mask.shape} must equal input_ids shape {shape}")
    bad = (mask != 0) & (mask != 1)
    if bad.any():
        b, s = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"attention_mask[{b}, {s}]={_show(mask[b, s].item())} must be 0 or 1")
    return mask.astype(bool)


def _check_grid(grid: Any, name: str, merge: int, tokens: int) -> list[tuple[int, int, int]]:
    """grid [n, 3] of positive ints, h and w multiples of merge, as a list of Python int triples;
    checked on the array first, so that no more than ``tokens`` (input_ids' size: every row is a block
    of one token at least) rows become Python objects."""
    if grid is None:
        return []
    arr = _int_array(grid, name)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"{name} must have shape [n, 3] (t, h, w), got shape {arr.shape}")
    bad = np.flatnonzero((arr < 1).any(axis=1))
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}]={_show(arr[bad[0]].tolist())} must be positive (t, h, w >= 1)")
    bad = np.flatnonzero((arr[:, 1:] % merge != 0).any(axis=1))
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}]={_show(arr[bad[0]].tolist())}: h and w must be multiples of "
                         f"spatial_merge_size={merge}")
    if arr.shape[0] > tokens:
        raise ValueError(f"{name} has {arr.shape[0]} rows but input_ids hold {tokens} tokens (each row is a block "
                         "of one token at least)")
    return [tuple(int(v) for v in row) for row in arr.tolist()]


def _check_family(family: Any) -> str:
    if not isinstance(family, str):
        raise TypeError(f"family must be a str, one of {', '.join(MROPE_FAMILIES)}; got {type(family).__name__}")
    if family not in MROPE_FAMILIES:
        raise ValueError(f"family={_show(family)} is not one of {', '.join(MROPE_FAMILIES)}")
    return family


def _check_float(value: Any, name: str) -> float:
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {_show(value)}")
    if not math.isfinite(float(value)) or float(value) < 0:
        raise ValueError(f"{name}={_show(value)} must be finite and >= 0")
    return float(value)


def _video_intervals(family: str, videos: list, second_per_grid_ts: Any,
                     tokens_per_second: Any) -> list[np.float32]:
    """Per video, the float32 time step between temporal patches (Qwen2.5-VL), else 1."""
    if family != "qwen2_5_vl":
        for value, name in ((second_per_grid_ts, "second_per_grid_ts"), (tokens_per_second, "tokens_per_second")):
            if value is not None:
                raise ValueError(f"{name}={_show(value)} applies only to family='qwen2_5_vl', not {family!r}")
        return [np.float32(1)] * len(videos)
    tps = QWEN2_5_VL_TOKENS_PER_SECOND if tokens_per_second is None else tokens_per_second
    _check_float(tps, "tokens_per_second")
    if second_per_grid_ts is None:
        seconds = [1.0] * len(videos)
    else:
        try:
            arr = np.asarray(second_per_grid_ts)
        except (TypeError, ValueError, OverflowError) as e:
            raise TypeError(f"second_per_grid_ts must be an array of numbers, got {_show(second_per_grid_ts)}") from e
        if arr.dtype.kind not in "iuf" or arr.ndim != 1:
            raise TypeError(f"second_per_grid_ts must be a 1-D array of numbers [num_videos], got dtype "
                            f"{arr.dtype} shape {arr.shape}")
        if arr.shape[0] != len(videos):
            raise ValueError(f"second_per_grid_ts has {arr.shape[0]} entries but video_grid_thw has "
                             f"{len(videos)} rows")
        seconds = [_check_float(v, f"second_per_grid_ts[{i}]") for i, v in enumerate(arr.tolist())]
    intervals = []
    for i, ((t, _, _), s) in enumerate(zip(videos, seconds)):
        interval = np.float32(tps) * np.float32(s)  # transformers: tokens_per_second * second_per_grid_t
        if float(interval) * (t - 1) >= _POSITION_LIMIT:
            raise ValueError(f"second_per_grid_ts[{i}]={_show(s)} with tokens_per_second={_show(tps)} and "
                             f"t={t} gives time indices beyond 2^31 (positions are in [0, 2^31))")
        intervals.append(interval)
    return intervals


def _block_positions(t: int, h: int, w: int, interval: np.float32, start: int) -> np.ndarray:
    """[3, t*h*w] positions of one vision block of t x h x w merged tokens (time-major)."""
    time = (np.arange(t, dtype=np.float32) * interval).astype(np.int64)  # truncation, as .long()
    tt, hh, ww = np.meshgrid(time, np.arange(h, dtype=np.int64), np.arange(w, dtype=np.int64), indexing="ij")
    return np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + start


class _Grids:
    """The grid rows of one kind (image or video), consumed in order across the batch. ``per_frame``
    (Qwen3-VL videos): each row of t temporal patches is t blocks of one patch, taken one by one as
    the prompt's blocks ask for them, never listed (t is any int: a grid [2^26, 2, 2] of a prompt
    with two frames is refused after two blocks, not after listing 2^26)."""

    def __init__(self, kind: str, name: str, rows: list, intervals: list, token_id: int,
                 per_frame: bool = False):
        self.kind, self.name, self.rows, self.intervals, self.token_id = kind, name, rows, intervals, token_id
        self.per_frame = per_frame
        self.blocks = sum(t for t, _, _ in rows) if per_frame else len(rows)
        self.used = 0  # blocks taken
        self._row, self._frame = 0, 0  # the next block: its grid row and (per_frame) its frame in that row

    def take(self, row: int) -> tuple[tuple[int, int, int], np.float32]:
        if self.used >= self.blocks:
            raise ValueError(f"input_ids row {row} needs {self.kind} block number {self.used + 1} but {self.name} "
                             f"describes only {self.blocks}")
        (t, h, w), interval = self.rows[self._row], self.intervals[self._row]
        self.used += 1
        if not self.per_frame:
            self._row += 1
            return (t, h, w), interval
        self._frame += 1
        if self._frame == t:
            self._row, self._frame = self._row + 1, 0
        return (1, h, w), interval


def _next_index(hits: np.ndarray, st: int, remaining: int, end: int) -> int:
    """Index of the first token of a kind at or after st (transformers' list.index), else end + 1 when
    no block of that kind is left to place."""
    if remaining <= 0:
        return end + 1
    k = int(np.searchsorted(hits, st))
    # Always found: every token of the kind before st lies in a block of the kind (blocks are checked
    # to hold only their token and none is skipped), and each announced block starts a separate run.
    assert k < hits.size, "an announced block has no token left"
    return int(hits[k])


def _text(begin: int, length: int) -> np.ndarray:
    """[3, length] positions of a text run: begin, begin + 1, ... on all three rows."""
    return np.broadcast_to(np.arange(begin, begin + length, dtype=np.int64), (3, length))


def _row_positions(tokens: np.ndarray, row: int, vision_start: int, grids: tuple[_Grids, _Grids],
                   merge: int) -> np.ndarray:
    """[3, len(tokens)] positions of one row's unmasked tokens (rules 1 to 4)."""
    n = tokens.size
    if n == 0:
        raise ValueError(f"attention_mask row {row} has no 1: a row needs at least one token")
    starts = np.flatnonzero(tokens == vision_start)
    if starts.size and starts[-1] == n - 1:
        raise ValueError(f"input_ids row {row} ends with vision_start_token_id={vision_start}: "
                         f"the image or video token that must follow it is missing")
    announced = tokens[starts + 1]
    remaining = [int((announced == g.token_id).sum()) for g in grids]
    hits = [np.flatnonzero(tokens == g.token_id) for g in grids]
    placed = [0, 0]  # tokens inside blocks, per kind
    pieces: list[np.ndarray] = []
    st, next_pos = 0, 0
    for _ in range(sum(remaining)):
        ed = [_next_index(hits[k], st, remaining[k], n) for k in (0, 1)]
        k = 0 if ed[0] < ed[1] else 1
        remaining[k] -= 1
        (t, h, w), interval = grids[k].take(row)
        h, w = h // merge, w // merge
        begin, size = ed[k], t * h * w
        if begin + size > n or not (tokens[begin:begin + size] == grids[k].token_id).all():
            raise ValueError(f"input_ids row {row}: the {grids[k].kind} block at unmasked index {begin} must be "
                             f"{size} {grids[k].kind} tokens (id {grids[k].token_id}) for grid t={t}, "
                             f"h={h * merge}, w={w * merge} with spatial_merge_size={merge}")
        pieces.append(_text(next_pos, begin - st))
        pieces.append(_block_positions(t, h, w, interval, next_pos + begin - st))
        next_pos = int(pieces[-1].max()) + 1
        placed[k] += size
        st = begin + size
    pieces.append(_text(next_pos, n - st))
    for k, g in enumerate(grids):
        stray = hits[k].size - placed[k]
        if stray:
            raise ValueError(f"input_ids row {row} has {stray} {g.kind} tokens (id {g.token_id}) outside the "
                             f"blocks that vision_start_token_id={vision_start} announces")
    return np.concatenate(pieces, axis=1)


def _text_only(ids: np.ndarray, mask: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rule 7: transformers' branch for a batch without grids."""
    batch, seq = ids.shape
    if mask is None:
        positions = np.broadcast_to(np.arange(seq, dtype=np.int64), (3, batch, seq)).copy()
        return positions, np.zeros((batch, 1), dtype=np.int64)
    count = np.cumsum(mask, axis=1, dtype=np.int64) - 1
    count[~mask] = 1
    deltas = count.max(axis=1, keepdims=True) + 1 - seq
    return np.broadcast_to(count, (3, batch, seq)).copy(), deltas


def mrope_positions(input_ids: Any, *, family: str, image_grid_thw: Any = None, video_grid_thw: Any = None,
                    attention_mask: Any = None, spatial_merge_size: int = 2,
                    image_token_id: int = QWEN_IMAGE_TOKEN_ID, video_token_id: int = QWEN_VIDEO_TOKEN_ID,
                    vision_start_token_id: int = QWEN_VISION_START_TOKEN_ID, second_per_grid_ts: Any = None,
                    tokens_per_second: Optional[float] = None) -> tuple[np.ndarray, np.ndarray]:
    """M-RoPE positions of a prompt batch, as transformers' ``get_rope_index`` (rules in the module doc).

    Parameters
    ----------
    input_ids : array of int, [batch, seq]
        Token ids, as the processor returns them (each image or video already expanded to its
        ``t * h * w / spatial_merge_size**2`` tokens). numpy arrays, lists, torch CPU tensors.
    family : {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}
        The model family (config ``model_type``); Qwen3-VL-MoE uses "qwen3_vl".
    image_grid_thw, video_grid_thw : array of int, [num_images, 3] and [num_videos, 3], optional
        Patch grids (t, h, w) before the spatial merge, in the order the blocks appear in the batch
        (row 0 first). Every value >= 1; h and w multiples of ``spatial_merge_size``.
    attention_mask : array of 0/1 (int or bool), [batch, seq], optional
        1 for tokens, 0 for padding (left or right, or anywhere). Padding gets position 1.
    spatial_merge_size : int, default 2
        ``vision_config.spatial_merge_size``.
    image_token_id, video_token_id, vision_start_token_id : int
        The config's special token ids (defaults: the Qwen tokenizers', 151655, 151656, 151652);
        pairwise distinct.
    second_per_grid_ts : array of float, [num_videos], optional (Qwen2.5-VL only)
        Seconds per temporal patch of each video (the processor's ``temporal_patch_size / fps``);
        1.0 for every video when not given. Finite and >= 0.
    tokens_per_second : float, optional (Qwen2.5-VL only)
        ``vision_config.tokens_per_second``; default 2, the released checkpoints' value. Finite, >= 0.

    Returns
    -------
    positions : int64 ndarray [3, batch, seq]
        Rows temporal, height, width.
    deltas : int64 ndarray [batch, 1]
        ``max(positions[:, b]) + 1 - seq``; decoding continues at ``seq + n + deltas[b]``
        (transformers' ``mrope_position_deltas``; see ``mrope_decode_positions``).

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype (float token ids, a non-str family, ...).
    ValueError
        Wrong shapes, unknown family, grids with values < 1 or h, w not multiples of the merge size,
        a block that does not match its grid, vision tokens no grid covers, grids left unused, an
        all-padding row with grids, arguments given for another family, more grid rows than
        input_ids has tokens, positions reaching 2^31 (a row longer than 2^31 tokens, Qwen2.5-VL
        time indices beyond 2^31). The message names the argument (and the row) and the rule.

    Allocates the outputs; reads its inputs only; thread safe. Time and memory are linear in the
    size of input_ids and the grids' row counts: a grid's blocks are built one at a time, each after
    its tokens are found in input_ids (Qwen3-VL's per-frame split included).
    """
    family = _check_family(family)
    ids = _check_ids(input_ids)
    mask = _check_mask(attention_mask, ids.shape)
    merge = _int_arg(spatial_merge_size, "spatial_merge_size", 1)
    special = {name: _int_arg(value, name, 0) for name, value in (
        ("image_token_id", image_token_id), ("video_token_id", video_token_id),
        ("vision_start_token_id", vision_start_token_id))}
    if len(set(special.values())) != 3:
        raise ValueError(f"image_token_id, video_token_id and vision_start_token_id must differ, got "
                         f"{_show(list(special.values()))}")
    images = _check_grid(image_grid_thw, "image_grid_thw", merge, ids.size)
    videos = _check_grid(video_grid_thw, "video_grid_thw", merge, ids.size)
    intervals = _video_intervals(family, videos, second_per_grid_ts, tokens_per_second)
    if image_grid_thw is None and video_grid_thw is None:
        _refuse_vision_tokens(ids, mask, special)
        return _text_only(ids, mask)
    image_grids = _Grids("image", "image_grid_thw", images, [np.float32(1)] * len(images), special["image_token_id"])
    # Qwen3-VL: one block per temporal patch (frame), each of t = 1
    video_grids = _Grids("video", "video_grid_thw" + (" (split per frame)" if family == "qwen3_vl" else ""),
                         videos, intervals, special["video_token_id"], per_frame=family == "qwen3_vl")
    batch, seq = ids.shape
    positions = np.ones((3, batch, seq), dtype=np.int64)
    deltas = np.empty((batch, 1), dtype=np.int64)
    for b in range(batch):
        keep = np.ones(seq, dtype=bool) if mask is None else mask[b]
        row = _row_positions(ids[b][keep], b, special["vision_start_token_id"], (image_grids, video_grids), merge)
        last = int(row.max())
        if last >= _POSITION_LIMIT:
            raise ValueError(f"input_ids row {b} reaches position {last}: positions are in [0, 2^31)")
        positions[:, b, keep] = row
        deltas[b, 0] = last + 1 - seq
    for grids in (image_grids, video_grids):
        if grids.used != grids.blocks:
            raise ValueError(f"{grids.name} describes {grids.blocks} {grids.kind} blocks but input_ids hold "
                             f"{grids.used}")
    return positions, deltas


def _refuse_vision_tokens(ids: np.ndarray, mask: Optional[np.ndarray], special: dict) -> None:
    """Without grids, image and video tokens cannot be placed: refuse them (padding excepted)."""
    for kind, grid_name in (("image", "image_grid_thw"), ("video", "video_grid_thw")):
        hit = ids == special[f"{kind}_token_id"]
        if mask is not None:
            hit &= mask
        if hit.any():
            b, s = (int(i) for i in np.argwhere(hit)[0])
            raise ValueError(f"input_ids[{b}, {s}] is an {kind} token (id {special[f'{kind}_token_id']}) but "
                             f"{grid_name} is None")


def mrope_decode_positions(deltas: Any, start: int, count: int = 1) -> np.ndarray:
    """M-RoPE positions of ``count`` decoded tokens, the first at cache position ``start``.

    Text tokens after the prompt have equal temporal, height and width positions:
    ``positions[:, b, k] = start + k + deltas[b]`` (transformers: ``cache_position[0] + rope_deltas``).
    Right after a prompt of padded length ``seq``, ``start = seq``.

    Parameters
    ----------
    deltas : array of int, [batch, 1]
        The ``deltas`` ``mrope_positions`` returned.
    start : int >= 0
        Cache position of the first token: the number of tokens (padding included) already cached.
    count : int >= 0, default 1
        Number of consecutive tokens; every position ``start + deltas[b] + k`` must lie in
        [0, 2^31).

    Returns
    -------
    int64 ndarray [3, batch, count]

    Raises
    ------
    TypeError
        deltas not integers, start or count not ints.
    ValueError
        deltas not of shape [batch, 1], start or count negative, a position outside [0, 2^31)
        (rotary's positions; this also bounds the output to ``3 * batch * count`` int64 with
        ``count <= 2^31``), checked before anything is allocated.
    """
    arr = _int_array(deltas, "deltas")
    if arr.ndim != 2 or arr.shape[1] != 1:
        raise ValueError(f"deltas must have shape [batch, 1], got shape {arr.shape}")
    start = _int_arg(start, "start", 0)
    count = _int_arg(count, "count", 0)
    first = [start + int(d) for d in arr[:, 0].tolist()]
    for b, p in enumerate(first):
        if count and not (0 <= p and p + count <= _POSITION_LIMIT):  # checked before anything is allocated
            raise ValueError(f"deltas[{b}]={_show(p - start)} with start={start} and count={count} gives positions "
                             f"{p} .. {p + count - 1}, outside [0, 2^31)")
    row = np.asarray(first, dtype=np.int64)[:, None] + np.arange(count, dtype=np.int64)
    return np.broadcast_to(row, (3,) + row.shape).copy()
