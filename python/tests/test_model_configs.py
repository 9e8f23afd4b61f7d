"""What resolving a model's config.json finds besides the frequencies: which layers use RoPE, and a
model whose code turns pairs the other way; both survive pickling."""
import copy
import pickle

import numpy as np

from rotary import Rope

NANOCHAT = {"model_type": "nanochat", "hidden_size": 256, "num_attention_heads": 2,
            "max_position_embeddings": 2048}


def nanochat_formula(x, inv_freq, positions):
    """models/nanochat/modeling_nanochat.py written out in float64: cos/sin = cat(freqs, freqs),
    rotate_half(x) = cat(x2, -x1), y = x * cos + rotate_half(x) * sin."""
    angle = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.concatenate([np.cos(angle), np.cos(angle)], -1)[None, :, None, :]
    sin = np.concatenate([np.sin(angle), np.sin(angle)], -1)[None, :, None, :]
    half = x.shape[-1] // 2
    x = x.astype(np.float64)
    rotated = np.concatenate([x[..., half:], -x[..., :half]], -1)
    return x * cos + rotated * sin


def test_a_model_turning_pairs_by_minus_angle_is_applied_as_its_code_does(rng):
    rope = Rope.from_hf_config(NANOCHAT)
    assert rope.rotates_backward
    assert any("-angle" in note for note in rope.notes)
    q = rng.standard_normal((1, 6, 2, 128)).astype(np.float32)
    positions = np.arange(6) + 1000
    expected = nanochat_formula(q, rope.inv_freq, positions)
    got = rope.apply(q, offset=1000)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)
    # inverse=True undoes the model's rotation.
    np.testing.assert_allclose(rope.apply(got, offset=1000, inverse=True), q, rtol=0, atol=2e-6)
    assert not Rope(128).rotates_backward and Rope(128).rope_layers is None


def test_llama4_layers_without_rope_are_listed():
    rope = Rope.from_preset("llama-4-scout-17b-16e")
    assert rope.pairing == "interleaved"          # view_as_complex in models/llama4/modeling_llama4.py
    assert len(rope.rope_layers) == 48
    # The published no_rope_layers: every fourth layer has no RoPE.
    assert rope.rope_layers == [(i + 1) % 4 != 0 for i in range(48)]
    assert any("temperature" in note or "floor_scale" in note for note in rope.notes)


def test_what_resolving_found_survives_pickle_and_deepcopy(rng):
    for rope in (Rope.from_hf_config(NANOCHAT), Rope.from_preset("llama-4-scout-17b-16e")):
        q = rng.standard_normal((1, 3, 2, rope.head_dim)).astype(np.float32)
        for other in (pickle.loads(pickle.dumps(rope)), copy.deepcopy(rope)):
            assert other.rope_layers == rope.rope_layers
            assert other.rotates_backward == rope.rotates_backward
            assert other.notes == rope.notes
            np.testing.assert_array_equal(other.apply(q, offset=5), rope.apply(q, offset=5))
