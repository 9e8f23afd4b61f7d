"""Rope.rerotate and Rope.switch: against apply at the moved positions (or the other schedule),
many successive shifts, every bad input."""
import os

import numpy as np
import pytest

import rotary

torch = pytest.importorskip("torch")

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "conformance", "configs")
PHI35 = os.path.join(CONFIGS, "microsoft--Phi-3.5-mini-instruct.json")

U = 2.0 ** -23      # apply's bound: |result - exact| <= 2^-23 g (|a| + |b|) per pair (float32)
BF16 = 2.0 ** -8    # one bfloat16 rounding, relative
SQRT2 = np.sqrt(2.0)
LIMIT = 2 ** 31


def ropes(pairing):
    return {
        "default": rotary.Rope(64, pairing=pairing),
        "linear": rotary.Rope(64, pairing=pairing, schedule="linear", factor=4.0),
        "yarn": rotary.Rope(64, pairing=pairing, schedule="yarn", factor=16.0, original_max_position=4096),
        "llama3": rotary.Rope(64, base=500000.0, pairing=pairing, schedule="llama3", factor=8.0,
                              low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192),
        "mrope": rotary.Rope(32, base=1e6, pairing=pairing, stream_layout="sections", sections=[4, 6, 6]),
    }


def pair_channels(rope):
    """Channels (a, b) of each pair, rotary_offset 0."""
    p = rope.rotary_dim // 2
    j = np.arange(p)
    return (2 * j, 2 * j + 1) if rope.pairing == "interleaved" else (j, j + p)


def positions_for(streams, deltas):
    """[streams, 1, seq] positions across the range, each keeping p + delta in [0, 2^31)."""
    base = [0, 1, 7, 4095, 4096, 131071, 1 << 20, 1000003, LIMIT - 1]
    rows = []
    for s in range(streams):
        d = deltas[0] if len(deltas) == 1 else deltas[s]
        row = [min(max(base[(i + s) % len(base)], max(0, -d)), LIMIT - 1 - max(0, d)) for i in range(len(base))]
        rows.append(row)
    return np.array(rows, dtype=np.int64)[:, None, :]


def as_float64(t):
    return t.double().numpy() if isinstance(t, torch.Tensor) else t.astype(np.float64)


def keys(rope, seq, dtype, seed):
    k0 = np.random.default_rng(seed).uniform(-4, 4, size=(1, seq, 2, rope.head_dim)).astype(np.float32)
    if dtype == "bf16":
        return torch.from_numpy(k0).to(torch.bfloat16)
    return k0


def pos_arg(rope, pos):
    return pos if rope.streams > 1 else pos[0]


def check_moved(rope, got, ref, stored, k0, bf):
    """|got - ref| per element within 2^-23 ((|a1| + |b1|) + (√2 + 1) g (|a0| + |b0|)) plus, for bf16,
    2^-8 (N1 + |got| + |ref|): one rotation of the stored keys (a1, b1), their own error turned
    (two components within apply's bound: √2 of it), the reference's; N1 = |(a1, b1)|."""
    a, b = pair_channels(rope)
    got, ref, k1, k0 = (as_float64(x) for x in (got, ref, stored, k0))
    s1 = (np.abs(k1[..., a]) + np.abs(k1[..., b]))
    s0 = (np.abs(k0[..., a]) + np.abs(k0[..., b]))
    n1 = np.hypot(k1[..., a], k1[..., b])
    worst = 0.0
    for ch in (a, b):
        bound = (U * (s1 + (SQRT2 + 1) * rope.attention_factor * s0)
                 + bf * (n1 + np.abs(got[..., ch]) + np.abs(ref[..., ch])))
        err = np.abs(got[..., ch] - ref[..., ch])
        assert np.all(err <= bound + 1e-300), (np.max(err / (bound + 1e-300)), np.argmax(err - bound))
        worst = max(worst, float(np.max(err / (bound + 1e-300))))
    return worst


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_rerotate_equals_apply_at_moved_positions(pairing, dtype):
    named = ropes(pairing)
    named["longrope"] = rotary.Rope.from_hf_config(PHI35, seq_len=131072)
    assert named["yarn"].attention_factor != 1.0
    for name, rope in named.items():
        delta_sets = [[1], [1000], [-3], [-4096], [1 << 30]]
        if rope.streams > 1:
            delta_sets += [[5, -2, 100000], [-7, 0, 3]]
        for deltas in delta_sets:
            pos = positions_for(rope.streams, deltas)
            k0 = keys(rope, pos.shape[-1], dtype, 3)
            stored = rope.apply(k0, positions=pos_arg(rope, pos))
            delta = deltas[0] if len(deltas) == 1 else deltas
            got = rope.rerotate(stored, delta, positions=pos_arg(rope, pos))
            moved = pos + np.array(deltas if len(deltas) > 1 else deltas * rope.streams)[:, None, None]
            ref = rope.apply(k0, positions=pos_arg(rope, moved))
            check_moved(rope, got, ref, stored, k0, BF16 if dtype == "bf16" else 0.0)


def test_rerotate_layouts_inplace_and_packed():
    rope = rotary.Rope(64, schedule="yarn", factor=4.0, original_max_position=4096)
    k0 = keys(rope, 5, "f32", 4)
    stored = rope.apply(k0, offset=10)
    # bhsd: the same keys transposed, moved in place: the very object comes back.
    t = torch.from_numpy(np.ascontiguousarray(stored.transpose(0, 2, 1, 3)))
    same = rope.rerotate(t, 7, offset=10, layout="bhsd", inplace=True)
    assert same is t
    np.testing.assert_array_equal(t.numpy().transpose(0, 2, 1, 3), rope.rerotate(stored, 7, offset=10))
    # Packed [tokens, heads, head_dim].
    np.testing.assert_array_equal(rope.rerotate(stored[0], 7, positions=np.arange(10, 15)),
                                  rope.rerotate(stored, 7, offset=10)[0])
    # The attention factor is not applied again: a zero shift is the identity.
    np.testing.assert_array_equal(rope.rerotate(stored, 0, offset=10), stored)


def test_thousand_unit_shifts_stay_within_the_rounding_of_the_step():
    """Each shift's product roundings walk like sqrt(n) times one (<= 2^-23 √2 N each); the float32
    cos/sin of the step (c, s), the same each time, are ε_j = |(c, s) - (cos θ_j, sin θ_j)| from the
    exact turn and that adds up linearly: bound (4 sqrt(n) + 1) 2^-23 √2 N + n ε_j N, the norm with
    n |hypot(c, s) - 1| for n ε_j."""
    rope = rotary.Rope(64, schedule="yarn", factor=16.0, original_max_position=4096)
    n, pos = 1000, np.array([0, 4096, 1 << 24, LIMIT - 1001])
    k0 = keys(rope, 4, "f32", 5)
    k = rope.apply(k0, positions=pos)
    for i in range(n):
        rope.rerotate(k, 1, positions=pos + i, inplace=True)
    ref = rope.apply(k0, positions=pos + n).astype(np.float64)
    c, s = (x[0].astype(np.float64) for x in rope.table([1]))
    eps = np.hypot(c - np.cos(rope.inv_freq), s - np.sin(rope.inv_freq))
    eta = np.abs(np.hypot(c, s) - 1.0)
    a, b = pair_channels(rope)
    n_ref = np.hypot(ref[..., a], ref[..., b])
    walk = (4 * np.sqrt(n) + 1) * U * SQRT2 * n_ref
    err = np.maximum(np.abs(k[..., a] - ref[..., a]), np.abs(k[..., b] - ref[..., b]))
    assert np.all(err <= walk + n * eps * n_ref)
    assert np.all(np.abs(np.hypot(k[..., a].astype(np.float64), k[..., b]) - n_ref) <= walk + n * eta * n_ref)


def check_switch(a, b, pos, dtype="f32"):
    """switch(apply(k, p, A), A -> B) against apply(k, p, B): 2^-23 (m r (|a1| + |b1|) + (√2 r gA + gB)
    (|a0| + |b0|)), r = gB/gA, m = 1 when r == 1 (one rounding a pair), else 2."""
    k0 = keys(a, len(pos), dtype, 6)
    stored = a.apply(k0, positions=pos)
    got = a.switch(stored, b, positions=pos)
    ref = b.apply(k0, positions=pos)
    r = b.attention_factor / a.attention_factor
    m = 1.0 if r == 1.0 else 2.0 + 1e-6
    ca, cb = pair_channels(a)
    got, ref, k1, k0 = (as_float64(x) for x in (got, ref, stored, k0))
    s1 = np.abs(k1[..., ca]) + np.abs(k1[..., cb])
    s0 = np.abs(k0[..., ca]) + np.abs(k0[..., cb])
    bound = U * (m * r * s1 + (SQRT2 * r * a.attention_factor + b.attention_factor) * s0) + 2.0 ** -45 * s1
    for ch in (ca, cb):
        assert np.all(np.abs(got[..., ch] - ref[..., ch]) <= bound)


def test_switch_longrope_short_to_long():
    short = rotary.Rope.from_hf_config(PHI35, seq_len=1000)
    long = rotary.Rope.from_hf_config(PHI35, seq_len=8000)
    assert not np.array_equal(short.inv_freq, long.inv_freq)
    assert short.attention_factor == long.attention_factor
    check_switch(short, long, [0, 1, 4095, 4096, 8191, 131071])


def test_switch_dynamic_ntk_base_changes():
    def at(n):
        return rotary.Rope(64, schedule="dynamic", factor=2.0, original_max_position=4096, seq_len=n)
    check_switch(at(4096), at(8192), [0, 5, 4095, 8191])
    check_switch(at(8192), at(65536), [0, 8191, 65535, 1 << 24])
    check_switch(at(65536), at(4096), [0, 100, 65535])


def test_switch_different_attention_factors():
    a = rotary.Rope(64, pairing="interleaved", schedule="yarn", factor=16.0, original_max_position=4096)
    b = rotary.Rope(64, pairing="interleaved", schedule="yarn", factor=4.0, original_max_position=4096)
    assert a.attention_factor != b.attention_factor
    check_switch(a, b, [0, 3, 4096, 65535, 1 << 22])
    check_switch(b, a, [0, 3, 4096, 65535, 1 << 22])


def test_a_0d_integer_delta_is_one_delta_as_rerotate_cache_takes_it():
    rope = rotary.Rope(64)
    stored = rope.apply(keys(rope, 4, "f32", 5), offset=3)
    want = rope.rerotate(stored, 7, offset=3)
    assert not np.array_equal(want, stored)
    for delta in (np.array(7), np.array(7, np.int32), torch.tensor(7), torch.tensor(7, dtype=torch.int32)):
        np.testing.assert_array_equal(rope.rerotate(stored, delta, offset=3), want)
    before = stored.copy()
    for delta, kind in ((np.array(7.0), "float64"), (np.array(True), "bool"), (torch.tensor(7.0), "float32")):
        with pytest.raises(TypeError, match=f"delta must be an int .*got a 0-d array of {kind}"):
            rope.rerotate(stored, delta, offset=3, inplace=True)
    np.testing.assert_array_equal(stored, before)


def test_bad_input_names_the_value_and_leaves_keys_untouched():
    rope = rotary.Rope(64)
    k = rope.apply(keys(rope, 4, "f32", 7), positions=[9, 5, 9, 12])
    before = k.copy()
    with pytest.raises(ValueError, match=r"positions\[1\]=5 \+ delta=-9 leaves \[0, 2\^31\)"):
        rope.rerotate(k, -9, positions=[9, 5, 9, 12], inplace=True)
    with pytest.raises(ValueError, match=r"position 2147483645 of token 3 \(offset=2147483642\) \+ delta=3 leaves"):
        rope.rerotate(k, 3, offset=LIMIT - 6, inplace=True)
    with pytest.raises(ValueError, match=r"delta=2147483648 must be in \(-2\^31, 2\^31\)"):
        rope.rerotate(k, LIMIT, inplace=True)
    with pytest.raises(ValueError, match=r"delta=.* must be in \(-2\^31, 2\^31\)"):
        rope.rerotate(k, 10 ** 30, inplace=True)
    with pytest.raises(ValueError, match=r"delta has 2 values; give 1 \(every stream\) or one per stream "
                                         r"\(streams=1\)"):
        rope.rerotate(k, [1, 2], inplace=True)
    with pytest.raises(TypeError, match="delta must be an int or a sequence of ints"):
        rope.rerotate(k, True, inplace=True)
    with pytest.raises(TypeError, match=r"delta\[1\] must be an int, got bool"):
        rope.rerotate(k, [1, True], inplace=True)
    with pytest.raises(TypeError, match="delta must be an int or a sequence of ints"):
        rope.rerotate(k, 1.5, inplace=True)
    with pytest.raises(TypeError, match="k must be a numpy.ndarray or torch.Tensor"):
        rope.rerotate(k.tolist(), 1)
    mrope = ropes("half")["mrope"]
    mk = np.ones((1, 4, 2, 32), np.float32)
    mpos = np.array([[0, 1, 2, 3], [10, 11, 12, 13], [7, 6, 5, 4]])[:, None, :]
    with pytest.raises(ValueError, match=r"positions\[2\]\[3\]=4 \+ delta\[2\]=-5 leaves"):
        mrope.rerotate(mk, [0, 0, -5], positions=mpos, inplace=True)
    with pytest.raises(ValueError, match=r"delta has 2 values.*streams=3"):
        mrope.rerotate(mk, [0, 1], positions=mpos, inplace=True)
    np.testing.assert_array_equal(mk, 1.0)
    # switch: incompatible Ropes name the field.
    with pytest.raises(ValueError, match="schedules differ in head_dim: from 64, to 128"):
        rope.switch(k, rotary.Rope(128), inplace=True)
    with pytest.raises(ValueError, match="schedules differ in pairing: from half, to interleaved"):
        rope.switch(k, rotary.Rope(64, pairing="interleaved"), inplace=True)
    with pytest.raises(ValueError, match="schedules differ in rotary_dim: from 64, to 32"):
        rope.switch(k, rotary.Rope(64, rotary_dim=32), inplace=True)
    with pytest.raises(ValueError, match="schedules differ in rotary_offset: from 0, to 32"):
        rotary.Rope(64, rotary_dim=32).switch(k, rotary.Rope(64, rotary_dim=32, rotary_offset=32), inplace=True)
    with pytest.raises(ValueError, match="schedules differ in streams: from 1, to 3"):
        rotary.Rope(32).switch(mk, mrope, inplace=True)
    with pytest.raises(TypeError, match="to must be a rotary.Rope, got str"):
        rope.switch(k, "yarn")
    np.testing.assert_array_equal(k, before)
