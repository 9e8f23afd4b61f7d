"""Positions checked by shape, not by count; `undo` (the true inverse) against `inverse` (the
transpose); messages that name what the user gave (hardening, round 2)."""
import numpy as np
import pytest
import torch

from rotary import Rope


def _q(batch=2, seq=3, heads=1, head_dim=8, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, seq, heads, head_dim)).astype(np.float32)


def _rows(positions, batch, seq):
    """The positions each token (b, s) should get, from a documented [batch, seq], [1, seq], [seq] or
    flat [batch * seq] array."""
    p = np.asarray(positions).reshape(-1, seq)
    return np.broadcast_to(p, (batch, seq))


def _one_by_one(rope, q, rows):
    """q rotated token by token at the positions in rows[b][s]: the written-out expectation."""
    out = np.empty_like(q)
    for b in range(q.shape[0]):
        for s in range(q.shape[1]):
            out[b, s] = rope.apply(q[b:b + 1, s:s + 1], offset=int(rows[b][s]))[0, 0]
    return out


# ---- positions by shape -------------------------------------------------------------------------

@pytest.mark.parametrize("make", [np.array, torch.tensor, lambda a: a.tolist()], ids=["numpy", "torch", "lists"])
def test_undocumented_position_shapes_are_refused(make):
    # batch 2, seq 3: each of these holds 6 entries, which the count check took as [batch, seq].
    rope, q = Rope(8), _q()
    before = q.copy()
    for shape, needle in [((3, 2), "positions shape [3, 2] must be [batch=2, seq=3] or [1, seq=3] (one row for "
                                   "every batch row): it looks transposed"),
                          ((6, 1), "positions shape [6, 1] must be [batch=2, seq=3]"),
                          ((1, 6), "positions shape [1, 6] must be [batch=2, seq=3]")]:
        positions = make(np.arange(100, 106).reshape(shape))
        with pytest.raises(ValueError) as e:
            rope.apply(q, positions=positions, inplace=True)
        assert needle in str(e.value)
        np.testing.assert_array_equal(q, before)  # nothing written


def test_mrope_positions_transposed_per_stream_are_refused():
    rope = Rope(8, stream_layout="sections", sections=[1, 1, 2])
    for make in (np.array, torch.tensor, lambda a: a.tolist(), lambda a: tuple(map(tuple, a.tolist()))):
        with pytest.raises(ValueError, match=r"positions shape \[3, 3, 2\] must be \[3, batch=2, seq=3\] or "
                                             r"\[3, 1, seq=3\].*looks transposed"):
            rope.apply(_q(), positions=make(np.arange(18).reshape(3, 3, 2)))


@pytest.mark.parametrize("shape", [(2, 3), (1, 3), (3,), (6,)])
def test_documented_position_shapes_rotate_each_token_at_its_position(shape):
    rope, q = Rope(8, base=500.0), _q()
    positions = np.arange(100, 100 + int(np.prod(shape))).reshape(shape)
    want = _one_by_one(rope, q, _rows(positions, 2, 3))
    for make in (np.array, torch.tensor, lambda a: a.tolist()):
        got = rope.apply(q, positions=make(positions))
        np.testing.assert_array_equal(got, want)


def test_three_dimensional_positions_as_nested_lists_and_tuples():
    # Nested lists used to raise AttributeError (positions.shape on a list).
    rope = Rope(8, stream_layout="sections", sections=[1, 1, 2])
    ids = np.arange(100, 118).reshape(3, 2, 3)
    want = rope.apply(_q(), positions=ids)
    np.testing.assert_array_equal(rope.apply(_q(), positions=ids.tolist()), want)
    np.testing.assert_array_equal(rope.apply(_q(), positions=tuple(tuple(map(tuple, s)) for s in ids.tolist())), want)


def test_an_empty_batch_with_seq_positions_is_a_no_op():
    # [seq] positions serve every batch row, also when there are none; this was refused with
    # "positions has 3 entries but batch*seq=0 (or seq=3 ...)".
    rope = Rope(8)
    for positions in ([5, 6, 7], np.array([[5, 6, 7]]), torch.tensor([5, 6, 7])):
        assert rope.apply(np.zeros((0, 3, 1, 8), np.float32), positions=positions).shape == (0, 3, 1, 8)


def test_large_integer_positions_are_named_in_full():
    rope = Rope(8)
    for positions in ([0, 2 ** 62 + 1], np.array([0, 2 ** 62 + 1]), torch.tensor([0, 2 ** 62 + 1])):
        with pytest.raises(ValueError, match=r"positions\[1\]=4611686018427387905 must be in \[0, 2\^31\)"):
            rope.apply(_q(1, 2), positions=positions)


# ---- undo: the true inverse ---------------------------------------------------------------------

def test_undo_takes_back_forward_where_inverse_scales_by_the_factor_squared():
    rope = Rope(64, schedule="yarn", factor=16.0, original_max_position=4096)
    g = rope.attention_factor
    assert g > 1.2
    q = _q(1, 5, 3, 64)
    rotated = rope.apply(q, offset=3000)
    back = rope.apply(rotated, offset=3000, undo=True)
    np.testing.assert_allclose(back, q, rtol=0, atol=8 * 2.0 ** -23 * (np.abs(q).max() + 1))
    transposed = rope.apply(rotated, offset=3000, inverse=True)
    # Per pair the transpose returns g^2 times the input (to rounding): not an undo.
    big = np.abs(q) > 0.1
    np.testing.assert_allclose(transposed[big] / q[big], g * g, rtol=1e-4)


def test_undo_under_xpos_divides_the_scale_of_queries_and_of_keys():
    rope = Rope(32, xpos_scale_base=512, xpos_center=100)
    q, k = _q(1, 4, 2, 32, seed=1), _q(1, 4, 1, 32, seed=2)
    rq, rk = rope.apply(q, k, offset=2000)
    bq, bk = rope.apply(rq, rk, offset=2000, undo=True)
    np.testing.assert_allclose(bq, q, atol=1e-5)
    np.testing.assert_allclose(bk, k, atol=1e-5)
    # Keys alone (beside a q with 0 heads) are undone as keys too.
    none = np.zeros((1, 4, 0, 32), np.float32)
    _, alone = rope.apply(none, rk, offset=2000, undo=True)
    np.testing.assert_array_equal(alone, bk)
    # torch tensors: the same bits.
    tq, tk = rope.apply(torch.from_numpy(rq), torch.from_numpy(rk), offset=2000, undo=True)
    np.testing.assert_array_equal(tq.numpy(), bq)
    np.testing.assert_array_equal(tk.numpy(), bk)


def test_undo_without_factor_or_xpos_is_the_inverse_bit_for_bit():
    rope, q = Rope(48, rotary_dim=40, base=5e5), _q(1, 9, 2, 48)
    for angles in ("exact", "on_the_fly", "hf-float32"):
        np.testing.assert_array_equal(rope.apply(q, offset=1000, undo=True, angles=angles),
                                      rope.apply(q, offset=1000, inverse=True, angles=angles))


def test_undo_refusals_name_the_rule():
    yarn = Rope(32, schedule="yarn", factor=4.0, original_max_position=64)
    q = _q(1, 2, 1, 32)
    with pytest.raises(ValueError, match="undo=True with angles='hf-float32' needs attention_factor 1"):
        yarn.apply(q, undo=True, angles="hf-float32")
    with pytest.raises(ValueError, match="inverse=True and undo=True cannot both be given"):
        yarn.apply(q, undo=True, inverse=True)
    cos = np.ones((1, 2, 16), np.float32)
    with pytest.raises(ValueError, match="undo cannot take the caller's cos/sin"):
        Rope(32).apply(q, undo=True, cos=cos, sin=np.zeros_like(cos))


# ---- out= messages ---------------------------------------------------------------------------------

def test_read_only_out_is_named_as_an_output_not_as_inplace():
    q = _q()
    out = np.zeros_like(q)
    out.flags.writeable = False
    with pytest.raises(ValueError) as e:
        Rope(8).apply(q, out=out)
    assert "q_out is read-only (out= names arrays to write the results into)" in str(e.value)
    assert "inplace" not in str(e.value)
    grad = torch.zeros(2, 3, 1, 8, requires_grad=True)
    with pytest.raises(ValueError) as e:
        Rope(8).apply(torch.from_numpy(q), out=grad)
    assert "q_out requires grad and would be written" in str(e.value)
    assert "inplace" not in str(e.value)
