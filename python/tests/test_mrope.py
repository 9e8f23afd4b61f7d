"""rotary.mrope: M-RoPE positions for Qwen2-VL, Qwen2.5-VL and Qwen3-VL prompts (transformers'
get_rope_index), checked against examples written out by hand from the rules and against a slow
token-by-token oracle written from the same rules; every refusal with its message."""
import numpy as np
import pytest

from rotary.mrope import MROPE_FAMILIES, mrope_decode_positions, mrope_positions

IMG, VID, VS, VE = 151655, 151656, 151652, 151653  # the Qwen tokenizers' ids (the defaults)
TXT = 42  # any text token


def _rows(*rows):
    """[3, n] expected positions from three literal lists."""
    return np.array(rows, dtype=np.int64)


# ---- the slow oracle: one token at a time, from the rules (module docstring of rotary.mrope) ----

def _time_index(family, i, interval):
    if family == "qwen2_5_vl":
        return int(np.float32(i) * interval)  # float32 product, truncated
    return i


def _oracle_row(tokens, family, images, videos, merge):
    """Positions of one row's tokens (no padding), consuming grids from the front of the lists
    images and videos (lists of (t, h, w, interval))."""
    out = [[], [], []]
    next_pos, i = 0, 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in (IMG, VID):
            t, h, w, interval = (images if tok == IMG else videos).pop(0)
            block_max = next_pos
            for f in range(t):
                for r in range(h // merge):
                    for c in range(w // merge):
                        assert tokens[i] == tok
                        p = (next_pos + _time_index(family, f, interval), next_pos + r, next_pos + c)
                        for axis in range(3):
                            out[axis].append(p[axis])
                        block_max = max(block_max, *p)
                        i += 1
            next_pos = block_max + 1
        else:
            for axis in range(3):
                out[axis].append(next_pos)
            next_pos += 1
            i += 1
    return out


def _oracle(ids, mask, family, image_grid, video_grid, merge=2, seconds=None, tps=2):
    images = [(t, h, w, np.float32(1)) for t, h, w in image_grid]
    videos = []
    for k, (t, h, w) in enumerate(video_grid):
        if family == "qwen3_vl":
            videos += [(1, h, w, np.float32(1))] * t
        else:
            s = 1.0 if seconds is None else seconds[k]
            videos.append((t, h, w, np.float32(tps) * np.float32(s)))
    batch, seq = len(ids), len(ids[0])
    positions = np.ones((3, batch, seq), dtype=np.int64)
    deltas = np.zeros((batch, 1), dtype=np.int64)
    for b in range(batch):
        keep = [s for s in range(seq) if mask is None or mask[b][s] == 1]
        row = _oracle_row([ids[b][s] for s in keep], family, images, videos, merge)
        for j, s in enumerate(keep):
            for axis in range(3):
                positions[axis, b, s] = row[axis][j]
        deltas[b, 0] = max(max(r) for r in row) + 1 - seq
    assert not images and not videos
    return positions, deltas


def _random_prompts(rng, family, batch, merge):
    """Well-formed prompts: text, then blocks <vision_start> tokens <vision_end> (Qwen3-VL: one per
    video frame, after timestamp text), padded left or right at random."""
    rows, images, videos = [], [], []
    for _ in range(batch):
        toks = []
        for _ in range(rng.integers(0, 4)):
            toks += [int(x) for x in rng.integers(0, 1000, rng.integers(0, 4))]
            t, h, w = int(rng.integers(1, 4)), merge * int(rng.integers(1, 4)), merge * int(rng.integers(1, 4))
            if rng.random() < 0.5:
                t = 1 if rng.random() < 0.7 else t
                images.append((t, h, w))
                toks += [VS] + [IMG] * (t * h * w // merge ** 2) + [VE]
            elif family == "qwen3_vl":
                videos.append((t, h, w))
                for _ in range(t):
                    toks += [7, 8, VS] + [VID] * (h * w // merge ** 2) + [VE]
            else:
                videos.append((t, h, w))
                toks += [VS] + [VID] * (t * h * w // merge ** 2) + [VE]
        toks += [int(x) for x in rng.integers(0, 1000, rng.integers(0 if toks else 1, 4))]
        rows.append(toks)
    seq = max(len(r) for r in rows) + int(rng.integers(0, 3))
    ids = np.zeros((batch, seq), dtype=np.int64)
    mask = np.zeros((batch, seq), dtype=np.int64)
    for b, r in enumerate(rows):
        off = 0 if rng.random() < 0.5 else seq - len(r)
        ids[b, off:off + len(r)] = r
        mask[b, off:off + len(r)] = 1
    return ids, mask, images, videos


def _grid(rows):
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


@pytest.mark.parametrize("family", MROPE_FAMILIES)
def test_random_prompts_match_the_oracle(family):
    rng = np.random.default_rng(2024)
    for case in range(150):
        merge = int(rng.integers(1, 3))
        ids, mask, images, videos = _random_prompts(rng, family, int(rng.integers(1, 4)), merge)
        masked = case % 3 != 0
        kw, seconds, tps = {}, None, 2
        if family == "qwen2_5_vl":
            seconds = [float(rng.choice([0.5, 1 / 3, 0.7, 1.0, 1.25, 2.0, 0.0])) for _ in videos]
            tps = int(rng.integers(1, 30))
            kw = dict(second_per_grid_ts=seconds, tokens_per_second=tps)
        got = mrope_positions(ids, family=family, image_grid_thw=_grid(images), video_grid_thw=_grid(videos),
                              attention_mask=mask if masked else None, spatial_merge_size=merge, **kw)
        want = _oracle(ids.tolist(), mask.tolist() if masked else None, family, images, videos, merge, seconds, tps)
        for name, g, w in zip(("positions", "deltas"), got, want):
            assert g.dtype == np.int64, name
            np.testing.assert_array_equal(g, w, err_msg=f"{family} case {case} {name}: {ids.tolist()}")


# ---- examples written out by hand ----

def test_docstring_example_qwen2_5_vl_video_then_text():
    # transformers' get_rope_index docstring (Qwen2.5-VL): a video of 3 temporal patches of 2 x 2
    # merged tokens, fps 1 and temporal_patch_size 2 (2 s per patch), 25 tokens per second: the
    # time index grows by 50 per patch, and the text after it starts at the largest position + 1.
    ids = np.array([[VS] + [VID] * 12 + [TXT] * 5])
    positions, deltas = mrope_positions(ids, family="qwen2_5_vl", video_grid_thw=[[3, 4, 4]],
                                        second_per_grid_ts=[2.0], tokens_per_second=25)
    # vision_start at 0, so the video starts at 1 (the docstring's example starts at 0)
    want = _rows([0, 1, 1, 1, 1, 51, 51, 51, 51, 101, 101, 101, 101, 102, 103, 104, 105, 106],
                 [0, 1, 1, 2, 2, 1, 1, 2, 2, 1, 1, 2, 2, 102, 103, 104, 105, 106],
                 [0, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 102, 103, 104, 105, 106])
    np.testing.assert_array_equal(positions[:, 0], want)
    assert positions.shape == (3, 1, 18) and positions.dtype == np.int64
    np.testing.assert_array_equal(deltas, [[107 - 18]])


def test_qwen2_vl_video_time_index_is_the_patch_number():
    ids = np.array([[VS] + [VID] * 12 + [TXT] * 2])
    positions, deltas = mrope_positions(ids, family="qwen2_vl", video_grid_thw=[[3, 4, 4]])
    want = _rows([0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 5],
                 [0, 1, 1, 2, 2, 1, 1, 2, 2, 1, 1, 2, 2, 4, 5],
                 [0, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 4, 5])
    np.testing.assert_array_equal(positions[:, 0], want)
    np.testing.assert_array_equal(deltas, [[6 - 15]])


def test_text_after_an_image_starts_at_its_largest_position_plus_one():
    # image of 4 x 6 patches, merged 2 x 2 -> 2 x 3 tokens; the text after it continues at
    # 2 + 2 + 1 = 5, not at its token index 8
    ids = np.array([[TXT, VS] + [IMG] * 6 + [VE, TXT]])
    for family in MROPE_FAMILIES:
        positions, deltas = mrope_positions(ids, family=family, image_grid_thw=[[1, 4, 6]])
        want = _rows([0, 1, 2, 2, 2, 2, 2, 2, 5, 6],
                     [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],
                     [0, 1, 2, 3, 4, 2, 3, 4, 5, 6])
        np.testing.assert_array_equal(positions[:, 0], want, err_msg=family)
        np.testing.assert_array_equal(deltas, [[7 - 10]], err_msg=family)


def test_left_and_right_padding_get_position_1_and_deltas_against_the_padded_length():
    row = [TXT, VS] + [IMG] * 4 + [VE, TXT]
    ids = np.array([[0, 0] + row, row + [0, 0]])
    mask = np.array([[0, 0] + [1] * 8, [1] * 8 + [0, 0]])
    positions, deltas = mrope_positions(ids, family="qwen2_vl", image_grid_thw=[[1, 4, 4], [1, 4, 4]],
                                        attention_mask=mask)
    unpadded = _rows([0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5], [0, 1, 2, 3, 2, 3, 4, 5])
    np.testing.assert_array_equal(positions[:, 0], np.concatenate([np.ones((3, 2), np.int64), unpadded], axis=1))
    np.testing.assert_array_equal(positions[:, 1], np.concatenate([unpadded, np.ones((3, 2), np.int64)], axis=1))
    np.testing.assert_array_equal(deltas, [[6 - 10], [6 - 10]])
    # a bool mask means the same
    np.testing.assert_array_equal(mrope_positions(ids, family="qwen2_vl", image_grid_thw=[[1, 4, 4]] * 2,
                                                  attention_mask=mask.astype(bool))[0], positions)


def test_images_and_videos_mixed_take_their_grids_in_order_across_the_batch():
    # row 0: image A (1 x 2 x 2 tokens), text, video B (2 x 1 x 2); row 1: image C (1 x 1 x 1)
    row0 = [VS] + [IMG] * 4 + [VE, TXT, VS] + [VID] * 4 + [VE]
    row1 = [TXT, VS, IMG, VE] + [TXT] * 9
    ids = np.array([row0, row1])
    positions, deltas = mrope_positions(ids, family="qwen2_vl", image_grid_thw=[[1, 4, 4], [1, 2, 2]],
                                        video_grid_thw=[[2, 2, 4]])
    want0 = _rows([0, 1, 1, 1, 1, 3, 4, 5, 6, 6, 7, 7, 8],
                  [0, 1, 1, 2, 2, 3, 4, 5, 6, 6, 6, 6, 8],
                  [0, 1, 2, 1, 2, 3, 4, 5, 6, 7, 6, 7, 8])
    want1 = np.broadcast_to(np.arange(13), (3, 13))  # a 1 x 1 image: one position like a text token
    np.testing.assert_array_equal(positions[:, 0], want0)
    np.testing.assert_array_equal(positions[:, 1], want1)
    np.testing.assert_array_equal(deltas, [[9 - 13], [13 - 13]])


def test_qwen2_5_vl_time_index_is_patch_times_seconds_times_tokens_per_second_truncated():
    ids = np.array([[VS] + [VID] * 4 + [VE]])  # 4 temporal patches of 1 x 1 token
    grid = [[4, 2, 2]]

    def times(**kw):
        return mrope_positions(ids, family="qwen2_5_vl", video_grid_thw=grid, **kw)[0][0, 0, 1:5].tolist()

    assert times() == [1, 3, 5, 7]  # defaults: 1.0 s per patch, 2 tokens per second
    assert times(second_per_grid_ts=[0.5]) == [1, 2, 3, 4]
    assert times(second_per_grid_ts=[1.25]) == [1, 3, 6, 8]  # 0, 2.5, 5, 7.5 truncated
    assert times(second_per_grid_ts=[1.25], tokens_per_second=4) == [1, 6, 11, 16]
    assert times(second_per_grid_ts=[0.0]) == [1, 1, 1, 1]
    # Qwen2-VL ignores time scaling: the patch number
    assert mrope_positions(ids, family="qwen2_vl", video_grid_thw=grid)[0][0, 0, 1:5].tolist() == [1, 2, 3, 4]
    # a still image keeps the patch number even in Qwen2.5-VL (no seconds apply to it)
    img = np.array([[VS] + [IMG] * 3 + [VE]])
    assert mrope_positions(img, family="qwen2_5_vl", image_grid_thw=[[3, 2, 2]])[0][0, 0, 1:4].tolist() == [1, 2, 3]


def test_qwen2_5_vl_time_product_in_float32_in_the_order_of_transformers_5():
    # 30 * float32(3 * 0.7) = 62.99999... -> 62 (4.49's (30 * 0.7) * 3 gives 63)
    ids = np.array([[VS] + [VID] * 31 + [VE]])
    positions, _ = mrope_positions(ids, family="qwen2_5_vl", video_grid_thw=[[31, 2, 2]],
                                   second_per_grid_ts=np.array([0.7]), tokens_per_second=3)
    assert positions[0, 0, 31] == 1 + 62


def test_qwen3_vl_splits_videos_into_frames_with_time_index_0():
    # a video of 2 frames of 2 x 2 tokens: each frame its own block after its timestamp text
    frame = [VS] + [VID] * 4 + [VE]
    ids = np.array([[TXT, TXT] + frame + [TXT] + frame + [TXT]])
    positions, deltas = mrope_positions(ids, family="qwen3_vl", video_grid_thw=[[2, 4, 4]])
    want = _rows([0, 1, 2, 3, 3, 3, 3, 5, 6, 7, 8, 8, 8, 8, 10, 11],
                 [0, 1, 2, 3, 3, 4, 4, 5, 6, 7, 8, 8, 9, 9, 10, 11],
                 [0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 8, 9, 8, 9, 10, 11])
    np.testing.assert_array_equal(positions[:, 0], want)
    np.testing.assert_array_equal(deltas, [[12 - 16]])
    # the same tokens read as one Qwen2-VL video of 2 patches: only one block is announced per
    # vision_start, so Qwen2-VL wants both patches after a single vision_start
    with pytest.raises(ValueError, match="video block at unmasked index 3 must be 8 video tokens"):
        mrope_positions(ids, family="qwen2_vl", video_grid_thw=[[2, 4, 4]])


def test_qwen3_vl_one_vision_start_for_several_frames_is_refused():
    ids = np.array([[VS] + [VID] * 8 + [VE]])
    with pytest.raises(ValueError, match="row 0 has 4 video tokens .* outside the blocks"):
        mrope_positions(ids, family="qwen3_vl", video_grid_thw=[[2, 4, 4]])


def test_text_only_follows_transformers_text_branch():
    ids = np.full((2, 5), TXT)
    positions, deltas = mrope_positions(ids, family="qwen2_vl")
    np.testing.assert_array_equal(positions, np.broadcast_to(np.arange(5), (3, 2, 5)))
    np.testing.assert_array_equal(deltas, [[0], [0]])
    mask = np.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 1]])
    positions, deltas = mrope_positions(ids, family="qwen3_vl", attention_mask=mask)
    np.testing.assert_array_equal(positions[0], [[1, 1, 0, 1, 2], [1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(positions[1], positions[0])
    np.testing.assert_array_equal(positions[2], positions[0])
    # the maximum includes the padding's 1: a single real token gives 2 - 5, as in transformers
    np.testing.assert_array_equal(deltas, [[3 - 5], [2 - 5]])


def test_decode_positions_continue_after_the_prompt_from_deltas():
    rng = np.random.default_rng(5)
    ids, mask, images, videos = _random_prompts(rng, "qwen2_5_vl", 4, 2)
    positions, deltas = mrope_positions(ids, family="qwen2_5_vl", image_grid_thw=_grid(images),
                                        video_grid_thw=_grid(videos), attention_mask=mask,
                                        second_per_grid_ts=[1.5] * len(videos))
    seq = ids.shape[1]
    nxt = mrope_decode_positions(deltas, seq, 3)
    assert nxt.shape == (3, 4, 3) and nxt.dtype == np.int64
    for b in range(4):
        top = positions[:, b][:, mask[b] == 1].max()
        for axis in range(3):
            assert nxt[axis, b].tolist() == [top + 1, top + 2, top + 3]
    # one token at a time gives the same
    np.testing.assert_array_equal(mrope_decode_positions(deltas, seq + 2), nxt[:, :, 2:])
    assert mrope_decode_positions(deltas, seq, 0).shape == (3, 4, 0)
    np.testing.assert_array_equal(mrope_decode_positions(np.array([[-3]], dtype=np.int32), 10, 2), [[[7, 8]]] * 3)


def test_inputs_are_only_read():
    ids = np.array([[TXT, VS] + [IMG] * 4 + [VE]])
    grid = np.array([[1, 4, 4]])
    mask = np.ones_like(ids)
    for a in (ids, grid, mask):
        a.setflags(write=False)
    mrope_positions(ids, family="qwen2_vl", image_grid_thw=grid, attention_mask=mask)
    assert ids.tolist() == [[TXT, VS] + [IMG] * 4 + [VE]] and grid.tolist() == [[1, 4, 4]]


def test_lists_and_custom_token_ids():
    positions, _ = mrope_positions([[5, 1, 2, 2, 3]], family="qwen2_vl", image_grid_thw=[[1, 2, 4]],
                                   image_token_id=2, video_token_id=4, vision_start_token_id=1)
    np.testing.assert_array_equal(positions[:, 0], _rows([0, 1, 2, 2, 4], [0, 1, 2, 2, 4], [0, 1, 2, 3, 4]))


# ---- refusals: the type, the argument named, the rule ----

GOOD = np.array([[TXT, VS] + [IMG] * 4 + [VE]])


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(input_ids=np.array([[1.0, 2.0]])), TypeError, "input_ids must hold integers, got dtype float64"),
    (dict(input_ids=np.array([[True]])), TypeError, "input_ids must hold integers, got dtype bool"),
    (dict(input_ids=[[1, 2], [3]]), TypeError, "input_ids must be an array of integers"),
    (dict(input_ids=np.array([1, 2])), ValueError,
     "input_ids must be a non-empty 2-D array [batch, seq], got shape (2,)"),
    (dict(input_ids=np.zeros((1, 0), np.int64)), ValueError, "got shape (1, 0)"),
    (dict(family="qwen2"), ValueError, "family='qwen2' is not one of qwen2_vl, qwen2_5_vl, qwen3_vl"),
    (dict(family=None), TypeError, "family must be a str"),
    (dict(attention_mask=np.ones((1, 3))), TypeError,
     "attention_mask must hold 0 and 1 (integers or bools), got dtype float64"),
    (dict(attention_mask=np.ones((1, 6), np.int64)), ValueError,
     "attention_mask shape (1, 6) must equal input_ids shape (1, 7)"),
    (dict(attention_mask=np.array([[1, 1, 2, 1, 1, 1, 1]])), ValueError, "attention_mask[0, 2]=2 must be 0 or 1"),
    (dict(attention_mask=np.array([[0] * 7])), ValueError, "attention_mask row 0 has no 1"),
    (dict(image_grid_thw=[[1, 4]]), ValueError, "image_grid_thw must have shape [n, 3] (t, h, w), got shape (1, 2)"),
    (dict(image_grid_thw=[[1.0, 4.0, 4.0]]), TypeError, "image_grid_thw must hold integers, got dtype float64"),
    (dict(image_grid_thw=[[0, 4, 4]]), ValueError, "image_grid_thw[0]=[0, 4, 4] must be positive"),
    (dict(image_grid_thw=[[1, -4, 4]]), ValueError, "image_grid_thw[0]=[1, -4, 4] must be positive"),
    (dict(image_grid_thw=[[1, 4, 5]]), ValueError,
     "image_grid_thw[0]=[1, 4, 5]: h and w must be multiples of spatial_merge_size=2"),
    (dict(video_grid_thw=[[1, 3, 4]]), ValueError, "video_grid_thw[0]=[1, 3, 4]: h and w must be multiples"),
    (dict(spatial_merge_size=0), ValueError, "spatial_merge_size=0 must be in [1, 2^63)"),
    (dict(spatial_merge_size=True), TypeError, "spatial_merge_size must be an int, got bool"),
    (dict(spatial_merge_size=2.0), TypeError, "spatial_merge_size must be an int, got float"),
    (dict(image_token_id=-1), ValueError, "image_token_id=-1 must be in [0, 2^63)"),
    (dict(video_token_id=IMG), ValueError, "image_token_id, video_token_id and vision_start_token_id must differ"),
    (dict(image_grid_thw=[]), ValueError, "image_grid_thw must have shape [n, 3]"),
    (dict(image_grid_thw=np.zeros((0, 3), np.int64)), ValueError,
     "input_ids row 0 needs image block number 1 but image_grid_thw describes only 0"),
    (dict(image_grid_thw=[[1, 4, 4], [1, 2, 2]]), ValueError,
     "image_grid_thw describes 2 image blocks but input_ids hold 1"),
    (dict(image_grid_thw=[[1, 4, 6]]), ValueError,
     "row 0: the image block at unmasked index 2 must be 6 image tokens (id 151655) for grid t=1, h=4, w=6"),
    (dict(image_grid_thw=None), ValueError, "input_ids[0, 2] is an image token (id 151655) but image_grid_thw is None"),
    (dict(second_per_grid_ts=[1.0]), ValueError,
     "second_per_grid_ts=[1.0] applies only to family='qwen2_5_vl', not 'qwen2_vl'"),
    (dict(tokens_per_second=2), ValueError, "tokens_per_second=2 applies only to family='qwen2_5_vl'"),
    (dict(family="qwen2_5_vl", video_grid_thw=[[1, 2, 2]], second_per_grid_ts=[1.0, 2.0]), ValueError,
     "second_per_grid_ts has 2 entries but video_grid_thw has 1 rows"),
    (dict(family="qwen2_5_vl", second_per_grid_ts=[1.0]), ValueError,
     "second_per_grid_ts has 1 entries but video_grid_thw has 0 rows"),
    (dict(family="qwen2_5_vl", video_grid_thw=[[1, 2, 2]], second_per_grid_ts=[-0.5]), ValueError,
     "second_per_grid_ts[0]=-0.5 must be finite and >= 0"),
    (dict(family="qwen2_5_vl", video_grid_thw=[[1, 2, 2]], second_per_grid_ts=["a"]), TypeError,
     "second_per_grid_ts must be a 1-D array of numbers [num_videos]"),
    (dict(family="qwen2_5_vl", tokens_per_second=float("nan")), ValueError,
     "tokens_per_second=nan must be finite and >= 0"),
    (dict(family="qwen2_5_vl", tokens_per_second="2"), TypeError, "tokens_per_second must be a number, got str"),
    (dict(family="qwen2_5_vl", video_grid_thw=[[3, 2, 2]], second_per_grid_ts=[1e30]), ValueError,
     "second_per_grid_ts[0]=1e+30 with tokens_per_second=2 and t=3 gives time indices beyond 2^31 (positions are in "
     "[0, 2^31))"),
])
def test_bad_arguments_are_refused_with_the_argument_named(kwargs, error, needle):
    args = dict(input_ids=GOOD, family="qwen2_vl", image_grid_thw=[[1, 4, 4]])
    args.update(kwargs)
    with pytest.raises(error) as e:
        mrope_positions(args.pop("input_ids"), **args)
    assert needle in str(e.value)


@pytest.mark.parametrize("ids, grids, needle", [
    ([[TXT, VS]], dict(image_grid_thw=[[1, 1, 1]]), "input_ids row 0 ends with vision_start_token_id=151652"),
    ([[VS, IMG, VE, IMG]], dict(image_grid_thw=[[1, 1, 1]]),
     "input_ids row 0 has 1 image tokens (id 151655) outside the blocks that vision_start_token_id=151652 announces"),
    # transformers starts the announced block at the first image token, before the vision_start:
    # the image token after the vision_start is then left outside every block
    ([[IMG, VS, IMG, VE]], dict(image_grid_thw=[[1, 1, 1]]), "input_ids row 0 has 1 image tokens"),
    ([[VS, IMG, IMG, VE, VS, IMG]], dict(image_grid_thw=[[1, 1, 1]] * 3), "input_ids row 0 has 1 image tokens"),
    ([[VS, IMG, VE, VS, IMG]], dict(image_grid_thw=[[1, 1, 1], [1, 2, 1]]),
     "input_ids row 0: the image block at unmasked index 4 must be 2 image tokens (id 151655) for grid t=1, h=2, w=1"),
    ([[VS, IMG, IMG, VID, VE]], dict(image_grid_thw=[[1, 3, 1]]), "the image block at unmasked index 1 must be 3"),
    ([[TXT, VS, IMG, IMG]], dict(image_grid_thw=[[1, 2, 1]], video_grid_thw=[[1, 1, 1]]),
     "video_grid_thw describes 1 video blocks but input_ids hold 0"),
    ([[VS, IMG, VE], [VS, IMG, VE]], dict(image_grid_thw=[[1, 1, 1]]),
     "input_ids row 1 needs image block number 2 but image_grid_thw describes only 1"),
    ([[VS, VID, VE]], dict(image_grid_thw=[[1, 1, 1]]), "input_ids row 0 needs video block number 1 but video_grid_thw "
                                                         "describes only 0"),
])
def test_malformed_prompts_are_refused(ids, grids, needle):
    with pytest.raises(ValueError) as e:
        mrope_positions(np.array(ids), family="qwen2_vl", spatial_merge_size=1, **grids)
    assert needle in str(e.value)


def test_qwen3_vl_counts_frames_in_its_messages():
    frame = [VS] + [VID] * 4 + [VE]
    needle = r"video_grid_thw \(split per frame\) describes 3 video blocks but input_ids hold 2"
    with pytest.raises(ValueError, match=needle):
        mrope_positions(np.array([frame + frame]), family="qwen3_vl", video_grid_thw=[[3, 4, 4]])


def test_long_values_are_cut_in_messages():
    with pytest.raises(ValueError) as e:
        mrope_positions(GOOD, family="x" * 10000)
    assert len(str(e.value)) < 200 and "..." in str(e.value)
    with pytest.raises(TypeError) as e:
        mrope_positions(GOOD, family="qwen2_vl", image_grid_thw=[[1, 4, 4]], spatial_merge_size="\0" * 5000)
    assert len(str(e.value)) < 200 and "\\x00" in str(e.value)


@pytest.mark.parametrize("args, error, needle", [
    ((np.array([1, 2]), 0), ValueError, "deltas must have shape [batch, 1], got shape (2,)"),
    ((np.array([[1.5]]), 0), TypeError, "deltas must hold integers, got dtype float64"),
    ((np.array([[1]]), -1), ValueError, "start=-1 must be in [0, 2^63)"),
    ((np.array([[1]]), 2.0), TypeError, "start must be an int, got float"),
    ((np.array([[1]]), 0, -2), ValueError, "count=-2 must be in [0, 2^63)"),
    ((np.array([[2 ** 62]]), 2 ** 62, 1), ValueError,
     "deltas[0]=4611686018427387904 with start=4611686018427387904 and count=1 gives positions 9223372036854775808 .. "
     "9223372036854775808, outside [0, 2^31)"),
    ((np.array([[0]]), 2 ** 31 - 1, 2), ValueError,
     "deltas[0]=0 with start=2147483647 and count=2 gives positions 2147483647 .. 2147483648, outside [0, 2^31)"),
    ((np.array([[5], [-20]]), 10, 1), ValueError,
     "deltas[1]=-20 with start=10 and count=1 gives positions -10 .. -10, outside [0, 2^31)"),
    ((np.array([[0]]), 0, 2 ** 40), ValueError,  # 24 TiB of output: refused before allocating
     "deltas[0]=0 with start=0 and count=1099511627776 gives positions 0 .. 1099511627775, outside [0, 2^31)"),
])
def test_decode_refusals(args, error, needle):
    with pytest.raises(error) as e:
        mrope_decode_positions(*args)
    assert needle in str(e.value)


def test_decode_positions_reach_the_last_position_and_no_further():
    np.testing.assert_array_equal(mrope_decode_positions(np.array([[-1]]), 2 ** 31 - 1, 1), [[[2 ** 31 - 2]]] * 3)
    np.testing.assert_array_equal(mrope_decode_positions(np.array([[0]]), 2 ** 31 - 1), [[[2 ** 31 - 1]]] * 3)
    assert mrope_decode_positions(np.array([[-20]]), 10, 0).shape == (3, 1, 0)  # no position, none out of range


# ---- resources: work and memory follow the prompt, not the grids' numbers ----

@pytest.mark.parametrize("family", MROPE_FAMILIES)
def test_a_grid_of_millions_of_frames_is_refused_without_listing_them(family):
    # Qwen3-VL splits a video of t temporal patches into t one-frame blocks; they were listed (one
    # tuple and one float per frame) before the prompt was read: 5.6 GB for t = 2^26. A two-frame
    # prompt now fails at its third frame, in the memory of the prompt.
    import tracemalloc
    frame = [VS, VID, VE]  # one merged token per 2 x 2 frame
    ids = np.array([[TXT] + frame * 2 + [TXT]])
    needle = {"qwen3_vl": "video_grid_thw (split per frame) describes 4194304 video blocks but input_ids hold 2",
              "qwen2_vl": "the video block at unmasked index 2 must be 4194304 video tokens",
              "qwen2_5_vl": "the video block at unmasked index 2 must be 4194304 video tokens"}[family]
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as e:
            mrope_positions(ids, family=family, video_grid_thw=[[2 ** 22, 2, 2]])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert needle in str(e.value)
    assert peak < 1 << 20, f"{peak} bytes allocated to refuse a 2-frame prompt"


def test_more_grid_rows_than_tokens_are_refused_before_they_are_listed():
    ids = np.array([[TXT, VS, IMG, VE]])
    with pytest.raises(ValueError, match=r"^image_grid_thw has 1000000 rows but input_ids hold 4 tokens \(each row "
                                         r"is a block of one token at least\)"):
        mrope_positions(ids, family="qwen2_vl", image_grid_thw=np.ones((10 ** 6, 3), np.int64) * 2)
    with pytest.raises(ValueError, match=r"^image_grid_thw\[999999\]=\[1, 2, 3\]: h and w must be multiples"):
        mrope_positions(ids, family="qwen2_vl", image_grid_thw=np.array([[1, 2, 2]] * 999999 + [[1, 2, 3]]))


def test_positions_beyond_two_to_the_31_are_refused():
    # Qwen2.5-VL's time index is i * tokens_per_second * second_per_grid_t: 2 * (2^29 - 32) per
    # patch puts the third patch (i = 2) at 2^31 - 128, and the 200 text tokens before the block
    # carry it (2^31 + 73) and the text after it (2^31 + 74) past 2^31 - 1, the last position rotary
    # (or any int32 position) can rotate.
    ids = np.array([[TXT] * 200 + [VS] + [VID] * 3 + [VE]])
    grid = dict(video_grid_thw=[[3, 2, 2]], tokens_per_second=2)
    positions, _ = mrope_positions(ids, family="qwen2_5_vl", second_per_grid_ts=[2.0 ** 28], **grid)
    assert positions[0, 0, 203] == 201 + 2 * 2 ** 29  # the third patch at start + 2^30, within range
    with pytest.raises(ValueError, match=r"^input_ids row 0 reaches position 2147483722: positions are in "
                                         r"\[0, 2\^31\)"):
        mrope_positions(ids, family="qwen2_5_vl", second_per_grid_ts=[2.0 ** 29 - 32], **grid)
