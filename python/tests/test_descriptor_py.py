"""The per-pair descriptor from Python: M-RoPE positions [streams, batch, seq], fractional positions,
the caller's cos/sin, the descriptor's fields and keywords, per-layer-type and vision configs; each
against a formula written here, and every bad argument refused before a write."""
import pickle

import numpy as np
import pytest
import torch

import rotary
from rotary import Rope

SECTIONS = [16, 24, 24]  # Qwen2-VL's mrope_section (head_dim 128)


def mrope(**kw):
    return Rope(128, base=1000000.0, stream_layout="sections", sections=SECTIONS, **kw)


def rotate(x, inv_freq, stream_of, positions, offset=0, pairing="half"):
    """Independent formula: pair j of token (b, s) turns by positions[stream_of[j], b, s] * inv_freq[j]
    (float64); positions [S, batch or 1, seq]; rotated channels from `offset` on."""
    x = np.asarray(x, dtype=np.float64)
    b, s = x.shape[0], x.shape[1]
    p = np.broadcast_to(np.asarray(positions, dtype=np.float64), (positions.shape[0], b, s))
    pairs = len(inv_freq)
    angle = p[np.asarray(stream_of), :, :].transpose(1, 2, 0) * np.asarray(inv_freq)  # [b, s, pairs]
    c, sn = np.cos(angle)[:, :, None, :], np.sin(angle)[:, :, None, :]
    out = x.copy()
    if pairing == "half":
        lo, hi = offset + np.arange(pairs), offset + pairs + np.arange(pairs)
    else:
        lo, hi = offset + 2 * np.arange(pairs), offset + 2 * np.arange(pairs) + 1
    a, bb = x[..., lo], x[..., hi]
    out[..., lo] = a * c - bb * sn
    out[..., hi] = a * sn + bb * c
    return out


def expected_streams():
    return np.repeat(np.arange(3), SECTIONS)


# ---- the descriptor's fields -----------------------------------------------------------------------

def test_mrope_descriptor_fields():
    r = mrope()
    assert r.streams == 3
    assert r.layout == "half"
    assert r.rotary_offset == 0
    assert r.blocks == 1
    assert r.stream_layout == "sections"
    assert r.sections == SECTIONS
    assert r.pair_stream.dtype == np.int32
    np.testing.assert_array_equal(r.pair_stream, expected_streams())


def test_text_rope_descriptor_fields():
    r = Rope(64, pairing="interleaved")
    assert (r.streams, r.layout, r.rotary_offset, r.stream_layout) == (1, "interleaved", 0, "single")
    np.testing.assert_array_equal(r.pair_stream, np.zeros(32, dtype=np.int32))


def test_blocks_give_block_half_layout():
    r = Rope(64, blocks=2, stream_layout="axial", sections=[16, 16], base=100.0)
    assert r.layout == "block_half" and r.blocks == 2 and r.streams == 2
    np.testing.assert_array_equal(r.pair_stream, np.repeat([0, 1], 16))


def test_new_keywords_pickle():
    r = Rope(128, rotary_dim=64, rotary_offset=64, stream_layout="sections", sections=[8, 12, 12])
    back = pickle.loads(pickle.dumps(r))
    assert (back.rotary_offset, back.sections, back.stream_layout) == (64, [8, 12, 12], "sections")
    np.testing.assert_array_equal(back.pair_stream, r.pair_stream)


def test_proportional_schedule_keyword():
    r = Rope(64, schedule="proportional", partial_rotary_factor=0.25)
    f = r.inv_freq
    assert np.count_nonzero(f) == 8 and np.all(f[8:] == 0)


def test_bad_keywords_are_named():
    with pytest.raises(ValueError, match="stream_layout='diagonal'"):
        Rope(128, stream_layout="diagonal", sections=SECTIONS)
    with pytest.raises(TypeError, match=r"sections\[1\] must be an int"):
        Rope(128, stream_layout="sections", sections=[16, "24", 24])
    with pytest.raises(TypeError, match="sections must be a list of ints"):
        Rope(128, stream_layout="sections", sections="16,24,24")
    with pytest.raises(ValueError, match="sections"):
        Rope(128, stream_layout="sections", sections=[16, 24, 23])
    with pytest.raises(ValueError, match="rotary_offset"):
        Rope(128, rotary_dim=64, rotary_offset=65)
    with pytest.raises(TypeError, match="rotary_offset must be an int"):
        Rope(128, rotary_offset=1.5)


# ---- M-RoPE apply ----------------------------------------------------------------------------------

@pytest.mark.parametrize("broadcast", [False, True])
def test_mrope_apply_matches_formula(rng, broadcast):
    r = mrope()
    q = rng.standard_normal((2, 7, 3, 128))
    pos = rng.integers(0, 5000, (3, 1 if broadcast else 2, 7))
    want = rotate(q, r.inv_freq, expected_streams(), pos)
    np.testing.assert_allclose(r.apply(q, positions=pos, angles="on_the_fly"), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.apply(q, positions=pos), want, rtol=0, atol=1e-6)  # float32 table


def test_mrope_apply_torch_q_and_k(rng):
    r = mrope()
    q = torch.randn(2, 5, 4, 128, dtype=torch.float64)
    k = torch.randn(2, 5, 2, 128, dtype=torch.float64)
    pos = torch.as_tensor(rng.integers(0, 300, (3, 2, 5)))
    gq, gk = r.apply(q, k, positions=pos, angles="on_the_fly")
    np.testing.assert_allclose(gq.numpy(), rotate(q.numpy(), r.inv_freq, expected_streams(), pos.numpy()), atol=1e-12)
    np.testing.assert_allclose(gk.numpy(), rotate(k.numpy(), r.inv_freq, expected_streams(), pos.numpy()), atol=1e-12)


def test_one_stream_serves_every_stream(rng):
    r = mrope()
    q = rng.standard_normal((2, 6, 2, 128)).astype(np.float32)
    text = rng.integers(0, 1000, (2, 6))
    np.testing.assert_array_equal(r.apply(q, positions=text), r.apply(q, positions=np.stack([text] * 3)))
    np.testing.assert_array_equal(r.apply(q, offset=9), r.apply(q, positions=np.arange(9, 15)))


def test_mrope_bhsd_float32_within_bound(rng):
    r = mrope()
    q = rng.standard_normal((1, 4, 9, 128)).astype(np.float32)  # bhsd
    pos = rng.integers(0, 100000, (3, 1, 9))
    got = r.apply(q, positions=pos, layout="bhsd")
    want = rotate(q.transpose(0, 2, 1, 3), r.inv_freq, expected_streams(), pos).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, want, atol=1e-5)


# ---- fractional positions --------------------------------------------------------------------------

def test_fractional_positions_match_formula(rng):
    r = Rope(64)
    q = rng.standard_normal((2, 5, 2, 64))
    pos = rng.uniform(0, 1000, (2, 5))
    got = r.apply(q, positions=pos)  # fractional: exact angles, never a table
    np.testing.assert_allclose(got, rotate(q, r.inv_freq, np.zeros(32, int), pos[None]), atol=1e-11)
    got_t = r.apply(torch.as_tensor(q), positions=torch.as_tensor(pos, dtype=torch.float32))
    want_t = rotate(q, r.inv_freq, np.zeros(32, int), pos.astype(np.float32)[None])
    np.testing.assert_allclose(got_t.numpy(), want_t, atol=1e-11)


def test_whole_float_positions_equal_integers(rng):
    r = mrope()
    q = rng.standard_normal((1, 4, 2, 128)).astype(np.float32)
    pos = rng.integers(0, 1000, (3, 1, 4))
    np.testing.assert_array_equal(r.apply(q, positions=pos.astype(np.float32)), r.apply(q, positions=pos))
    np.testing.assert_array_equal(r.apply(q, positions=pos.astype(np.float64), angles="hf-float32"),
                                  r.apply(q, positions=pos, angles="hf-float32"))


# ---- the caller's cos and sin ----------------------------------------------------------------------

def hf_cos_sin(rope, positions):
    """transformers' rotary_emb output: [batch, seq, rotary_dim] in rotate_half form (float64)."""
    freqs = np.asarray(positions, dtype=np.float64)[..., None] * rope.inv_freq
    emb = np.concatenate([freqs, freqs], -1)
    return np.cos(emb) * rope.attention_factor, np.sin(emb) * rope.attention_factor


def test_caller_cos_sin_per_token_halves(rng):
    r = Rope(64, base=500000.0)
    q = rng.standard_normal((2, 6, 4, 64))
    k = rng.standard_normal((2, 6, 1, 64))
    pos = rng.integers(0, 4000, (2, 6))
    cos, sin = hf_cos_sin(r, pos)
    gq, gk = r.apply(q, k, cos=cos, sin=sin)
    wq, wk = r.apply(q, k, positions=pos, angles="on_the_fly")
    np.testing.assert_allclose(gq, wq, atol=1e-12)
    np.testing.assert_allclose(gk, wk, atol=1e-12)
    # torch, float32 cos/sin of a batch of 1 broadcast over the batch
    c1, s1 = hf_cos_sin(r, np.arange(6)[None])
    got = r.apply(torch.as_tensor(q), cos=torch.as_tensor(c1, dtype=torch.float32),
                  sin=torch.as_tensor(s1, dtype=torch.float32))
    np.testing.assert_allclose(got.numpy(), r.apply(q), atol=1e-6)


def test_caller_cos_sin_per_position_pairs_and_cache(rng):
    r = Rope(64, pairing="interleaved")
    q = rng.standard_normal((2, 5, 2, 64))
    pos = rng.integers(0, 50, (2, 5))
    table = np.arange(64)[:, None] * r.inv_freq  # flash-attn's [rows, rotary_dim/2]
    want = r.apply(q, positions=pos, angles="on_the_fly")
    got = r.apply(q, positions=pos, cos=np.cos(table), sin=np.sin(table))
    np.testing.assert_allclose(got, want, atol=1e-12)
    cache = np.concatenate([np.cos(table), np.sin(table)], -1)  # vLLM's cos_sin_cache
    np.testing.assert_allclose(r.apply(q, positions=pos, cos_sin_cache=cache), want, atol=1e-12)
    repeated_cos, repeated_sin = np.repeat(np.cos(table), 2, -1), np.repeat(np.sin(table), 2, -1)
    got = r.apply(q, positions=pos, cos=repeated_cos, sin=repeated_sin, cos_sin_columns="repeated")
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_caller_cos_sin_errors_leave_q_untouched(rng):
    r = Rope(64)
    q = rng.standard_normal((1, 4, 2, 64))
    keep = q.copy()
    cos, sin = hf_cos_sin(r, np.arange(4)[None])
    cases = [
        (dict(cos=cos), ValueError, "cos is given without sin"),
        (dict(cos=cos[..., :48], sin=sin[..., :48]), ValueError, "width=48"),
        (dict(cos=cos, sin=sin[..., :32]), ValueError, "same shape"),
        (dict(cos=cos, sin=sin, cos_sin_columns="rows"), ValueError, "cos_sin_columns='rows'"),
        (dict(cos=cos, sin=sin, angles="on_the_fly"), ValueError, "angles='on_the_fly'"),
        (dict(cos_sin_columns="pairs"), ValueError, "cos_sin_columns is set"),
        (dict(cos=cos.tolist(), sin=sin), TypeError, "cos must be a numpy.ndarray or torch.Tensor"),
        (dict(cos=cos[0, 0], sin=sin[0, 0]), ValueError, "cos must have 3 dimensions"),
        (dict(cos=cos.astype(np.int64), sin=sin), TypeError, "cos dtype"),
        (dict(cos_sin_cache=np.zeros((4, 32))), ValueError, "cos_sin_cache width=32 must be rotary_dim=64"),
        (dict(cos_sin_cache=np.zeros((8, 64)), positions=np.array([0, 1, 2, 8])), ValueError, "beyond the 8 rows"),
    ]
    for kw, kind, needle in cases:
        with pytest.raises(kind, match=needle):
            r.apply(q, inplace=True, **kw)
        np.testing.assert_array_equal(q, keep)


# ---- positions: validation -------------------------------------------------------------------------

def test_positions_errors_leave_q_untouched(rng):
    r = mrope()
    q = rng.standard_normal((2, 3, 1, 128)).astype(np.float32)
    keep = q.copy()
    cases = [
        (np.zeros((2, 2, 3), np.int64), ValueError, "positions has 2 streams but the schedule reads 3"),
        (np.zeros((3, 2, 4), np.int64), ValueError, "positions has 8 entries per stream"),
        (np.zeros((0, 2, 3), np.int64), ValueError, "positions has 0 streams"),
        (np.zeros((1, 3, 2, 3), np.int64), ValueError, "at most 3 dimensions"),
        (np.full((3, 2, 3), -0.5), ValueError, r"positions\[0\]\[0\]=-0.5 must be in \[0, 2\^31\)"),
        (np.full((3, 1, 3), np.nan), ValueError, "must be in"),
        (np.full((3, 1, 3), 2.0 ** 31), ValueError, "must be in"),
        (np.full((3, 1, 3), 0.5), ValueError, "angles='hf-float32' needs whole positions"),
        (np.array([["a", "b", "c"]]), TypeError, "positions must hold integers or real numbers"),
        (np.ones((3, 1, 3), np.complex128), TypeError, "complex"),
        ([[0, 1], [2]], TypeError, "positions must be an array"),
    ]
    for i, (pos, kind, needle) in enumerate(cases):
        angles = "hf-float32" if i == 7 else "table"
        with pytest.raises(kind, match=needle):
            r.apply(q, positions=pos, inplace=True, angles=angles)
        np.testing.assert_array_equal(q, keep)


def test_table_refuses_fractional_positions():
    with pytest.raises(TypeError, match="positions must hold integers"):
        Rope(64).table(np.array([0.5]))


# ---- configs: layer types and vision towers -----------------------------------------------------------

GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 1152, "num_attention_heads": 4, "head_dim": 256,
          "num_key_value_heads": 1, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "num_hidden_layers": 6,
          "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}

QWEN2_VL = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
            "rope_theta": 1000000.0, "max_position_embeddings": 32768,
            "rope_scaling": {"type": "mrope", "mrope_section": SECTIONS},
            "vision_config": {"embed_dim": 1280, "num_heads": 16, "hidden_size": 3584}}


def test_layer_types_and_layer_type(tmp_path):
    assert rotary.layer_types(GEMMA3) == ["sliding_attention", "full_attention"]
    full = Rope.from_hf_config(GEMMA3)
    assert (full.layer_type, full.schedule, full.layer_types) == ("full_attention", "linear",
                                                                   ["sliding_attention", "full_attention"])
    local = Rope.from_hf_config(GEMMA3, layer_type="sliding_attention")
    assert (local.layer_type, local.schedule, local.base) == ("sliding_attention", "default", 10000.0)
    assert local.rope_layers == [True] * 5 + [False]
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(GEMMA3))
    assert rotary.layer_types(path) == ["sliding_attention", "full_attention"]
    assert Rope.from_hf_config(path, layer_type="sliding_attention").base == 10000.0
    with pytest.raises(ValueError, match="chunked"):
        Rope.from_hf_config(GEMMA3, layer_type="chunked")
    with pytest.raises(TypeError, match="layer_type must be a str"):
        Rope.from_hf_config(GEMMA3, layer_type=3)
    with pytest.raises(TypeError, match="path_or_dict must be a path or a dict"):
        rotary.layer_types(3)


def test_mrope_config_and_vision_tower(rng):
    text = Rope.from_hf_config(QWEN2_VL)
    assert (text.streams, text.stream_layout, text.sections) == (3, "sections", SECTIONS)
    np.testing.assert_array_equal(text.pair_stream, expected_streams())
    q = rng.standard_normal((1, 4, 2, 128))
    pos = rng.integers(0, 100, (3, 1, 4))
    np.testing.assert_allclose(text.apply(q, positions=pos, angles="on_the_fly"),
                               rotate(q, text.inv_freq, expected_streams(), pos), atol=1e-12)
    vision = Rope.from_hf_config(QWEN2_VL, vision=True)
    assert vision.vision and vision.streams == 2 and vision.head_dim == 80
    with pytest.raises(TypeError, match="vision must be a bool"):
        Rope.from_hf_config(QWEN2_VL, vision="yes")


def test_apply_rope_mrope_and_caller_angles_gradients(rng):
    from rotary.torch import apply_rope
    r = mrope()
    q = torch.randn(1, 4, 2, 128, dtype=torch.float64, requires_grad=True)
    pos = torch.as_tensor(rng.integers(0, 500, (3, 1, 4)))
    out = apply_rope(r, q, positions=pos)
    np.testing.assert_allclose(out.detach().numpy(),
                               rotate(q.detach().numpy(), r.inv_freq, expected_streams(), pos.numpy()), atol=1e-6)
    assert torch.autograd.gradcheck(lambda x: apply_rope(r, x, positions=pos), (q,))
    text = Rope(16)
    x = torch.randn(1, 3, 1, 16, dtype=torch.float64, requires_grad=True)
    cos, sin = (torch.as_tensor(a) for a in hf_cos_sin(text, np.arange(3)[None]))
    assert torch.autograd.gradcheck(lambda y: apply_rope(text, y, cos=cos, sin=sin), (x,))
    np.testing.assert_allclose(apply_rope(text, x, cos=cos, sin=sin).detach().numpy(),
                               text.apply(x.detach(), angles="on_the_fly").numpy(), atol=1e-12)


def test_mrope_helpers_feed_apply():
    assert rotary.mrope_positions is rotary.mrope.mrope_positions
