"""xPos from Python: Rope(xpos_scale_base=..., xpos_center=...) against the formula written out in
float64 (Sun et al. 2022), the torch operators' gradients, rerotate of xPos keys, keys rotated alone,
the doctor's xpos_range hazard, and every bad keyword."""
import pickle

import numpy as np
import pytest

import rotary
import rotary.torch  # noqa: F401  (the operators)

torch = pytest.importorskip("torch")

U = 2.0 ** -23


def formula(x, positions, base, gamma, center, key, interleaved=False):
    """x [batch, seq, heads, r] float64; pair j of a query at p turns by p * base^(-2j/r) and scales by
    zeta_j^((p - c)/gamma), a key's by zeta_j^(-(p - c)/gamma), zeta_j = (2j + 0.4 r)/(1.4 r)."""
    r = x.shape[-1]
    j = np.arange(r // 2)
    zeta = (2 * j + 0.4 * r) / (1.4 * r)
    p = np.asarray(positions, dtype=np.float64)[:, None]              # [seq, 1]
    t = (p - center) / gamma
    sigma = zeta[None, :] ** (-t if key else t)                        # [seq, pairs]
    phi = p * base ** (-2.0 * j / r)[None, :]
    c, s = (sigma * np.cos(phi))[None, :, None, :], (sigma * np.sin(phi))[None, :, None, :]
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., : r // 2], x[..., r // 2:])
    out = np.empty_like(x)
    ra, rb = a * c - b * s, a * s + b * c
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : r // 2], out[..., r // 2:] = ra, rb
    return out, (np.abs(a) + np.abs(b)) * (sigma[None, :, None, :])


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("gamma,center", [(512.0, 0.0), (64.0, 3000.5)])
def test_apply_matches_the_formula(pairing, gamma, center):
    rope = rotary.Rope(64, pairing=pairing, xpos_scale_base=gamma, xpos_center=center)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 5, 4, 64)).astype(np.float32)
    k = rng.standard_normal((2, 5, 2, 64)).astype(np.float32)
    positions = np.array([0, 17, 2999, 3001, int(center + 0.9 * rotary_reach(gamma))], dtype=np.int64)
    qo, ko = rope.apply(q, k, positions=positions)
    for x, out, key in ((q, qo, False), (k, ko, True)):
        want, scale = formula(x.astype(np.float64), positions, 10000.0, gamma, center, key, pairing == "interleaved")
        a_err = np.abs(out.astype(np.float64) - want)
        pairs = np.concatenate([scale, scale], axis=-1) if pairing == "half" else np.repeat(scale, 2, axis=-1)
        assert np.all(a_err <= 2 * U * pairs + 1e-300), (key, float(np.max(a_err / pairs)))


def rotary_reach(gamma):
    return 80.0 * gamma / abs(np.log(2.0 / 7.0))


def test_scores_depend_only_on_distance():
    rope = rotary.Rope(32, xpos_scale_base=128.0, xpos_center=500.0)
    rng = np.random.default_rng(4)
    q0 = rng.standard_normal((1, 1, 1, 32)).astype(np.float64)
    k0 = rng.standard_normal((1, 1, 1, 32)).astype(np.float64)
    scores = []
    for shift in (0, 300, 900):
        q, _ = rope.apply(q0, np.zeros((1, 1, 0, 32)), positions=np.array([shift + 40]))
        _, k = rope.apply(np.zeros((1, 1, 0, 32)), k0, positions=np.array([shift + 10]))
        scores.append(float(np.sum(q * k)))
    # Rope's cached table holds float32 cos/sin (f64 data widens them): float32-level agreement.
    assert np.allclose(scores, scores[0], rtol=2e-6, atol=0)
    # The decay: the same pair of vectors 600 positions apart scores differently.
    q, _ = rope.apply(q0, np.zeros((1, 1, 0, 32)), positions=np.array([640]))
    _, k = rope.apply(np.zeros((1, 1, 0, 32)), k0, positions=np.array([10]))
    assert not np.isclose(float(np.sum(q * k)), scores[0], rtol=1e-3)


def test_attributes_and_repr():
    rope = rotary.Rope(64, xpos_scale_base=512.0, xpos_center=7.5)
    assert (rope.xpos_scale_base, rope.xpos_center) == (512.0, 7.5)
    assert repr(rope).endswith("xpos_scale_base=512.0, xpos_center=7.5)")
    assert repr(pickle.loads(pickle.dumps(rope))) == repr(rope)
    plain = rotary.Rope(64)
    assert plain.xpos_scale_base is None and "xpos" not in repr(plain)


def test_keys_alone_beside_an_empty_query_equal_keys_beside_queries():
    rope = rotary.Rope(64, xpos_scale_base=256.0)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 3, 2, 64)).astype(np.float32)
    k = rng.standard_normal((1, 3, 2, 64)).astype(np.float32)
    _, k_with_q = rope.apply(q, k, offset=100)
    _, k_alone = rope.apply(np.zeros((1, 3, 0, 64), np.float32), k, offset=100)
    np.testing.assert_array_equal(k_alone, k_with_q)
    as_query = rope.apply(k, offset=100)  # passed as q: scaled as a query, not the same
    assert not np.array_equal(as_query, k_with_q)


def test_torch_gradients_are_the_transpose():
    rope = rotary.Rope(16, xpos_scale_base=32.0, xpos_center=10.0)
    q = torch.randn(1, 4, 2, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 4, 1, 16, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([0, 5, 30, 60])
    assert torch.autograd.gradcheck(lambda a, b: rotary.torch.apply_rope(rope, a, b, positions=positions), (q, k))


def test_torch_matches_numpy_bit_for_bit():
    rope = rotary.Rope(64, xpos_scale_base=512.0, xpos_center=1000.0)
    q = torch.randn(2, 7, 4, 64)
    k = torch.randn(2, 7, 2, 64)
    tq, tk = rotary.torch.apply_rope(rope, q, k, offset=4000)
    nq, nk = rope.apply(q.numpy(), k.numpy(), offset=4000)
    assert np.array_equal(tq.numpy(), nq) and np.array_equal(tk.numpy(), nk)


def test_rerotate_moves_the_scale_with_the_keys():
    rope = rotary.Rope(64, xpos_scale_base=256.0, xpos_center=2000.0)
    k = np.random.default_rng(6).standard_normal((1, 6, 2, 64)).astype(np.float32)
    positions = np.arange(3000, 3006)
    _, stored = rope.apply(np.zeros((1, 6, 0, 64), np.float32), k, positions=positions)
    moved = rope.rerotate(stored, -2500, positions=positions)
    _, fresh = rope.apply(np.zeros((1, 6, 0, 64), np.float32), k, positions=positions - 2500)
    scale = np.abs(fresh).max()
    assert np.max(np.abs(moved - fresh)) <= 8 * U * scale


def test_doctor_reports_the_reach():
    reach = rotary_reach(64.0)
    report = rotary.doctor(rotary.Rope(64, xpos_scale_base=64.0), context=20000)
    (hazard,) = [h for h in report["hazards"] if h["kind"] == "xpos_range"]
    assert hazard["position"] == int(np.floor(reach)) + 1
    assert "no one centre serves 20000 positions" in hazard["detail"]
    centred = rotary.doctor(rotary.Rope(64, xpos_scale_base=64.0, xpos_center=2000.0), context=4000)
    assert all(h["kind"] != "xpos_range" for h in centred["hazards"])
    with pytest.raises(ValueError, match="layer_type is for a config"):
        rotary.doctor(rotary.Rope(64), context=10, layer_type="full_attention")


@pytest.mark.parametrize("kwargs,needle", [
    (dict(xpos_center=3.0), "xpos_center is set but xpos_scale_base is not"),
    (dict(xpos_scale_base=0.0), "xpos_scale_base=0 must be > 0"),
    (dict(xpos_scale_base=float("nan")), "xpos_scale_base=nan must be finite"),
    (dict(xpos_scale_base=512.0, xpos_center=float("inf")), "xpos_center=inf must be finite"),
])
def test_bad_keywords_name_the_value(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        rotary.Rope(64, **kwargs)


def test_positions_beyond_the_reach_are_refused_before_any_write():
    rope = rotary.Rope(32, xpos_scale_base=64.0)
    q = np.ones((1, 2, 1, 32), np.float32)
    before = q.copy()
    with pytest.raises(ValueError, match=r"positions\[1\]=5000 is beyond xPos's reach.*xpos_center=2500"):
        rope.apply(q, positions=np.array([0, 5000]), inplace=True)
    np.testing.assert_array_equal(q, before)
    with pytest.raises(ValueError, match="cannot serve an xPos schedule"):
        rotary.torch.apply_rope(rope, torch.ones(1, 2, 1, 32), None,
                                cos=torch.ones(1, 2, 32), sin=torch.zeros(1, 2, 32))
