"""rotary's Python package against the seeds' formulations written here in torch, autograd,
zero-copy semantics, a Llama-style attention layer, plots and bad arguments."""
import math

import numpy as np
import pytest
import torch

import rotary
from rotary import Rope
from rotary.torch import RotaryEmbedding, apply_rope

F32_PAIR = 2.0 ** -23   # DESIGN.md §3, per pair, times attention_factor * (|a| + |b|)


def angles(rope, positions):
    """[tokens, r/2] angles in float64 (positions here stay below 2^21: float64 is exact enough)."""
    p = torch.as_tensor(np.asarray(positions, dtype=np.float64)).reshape(-1, 1)
    return p * torch.as_tensor(rope.inv_freq).reshape(1, -1)


def rotate_half_form(x, rope, positions):
    """Hugging Face: x * cos + rotate_half(x) * sin on [b, s, h, d] (half pairing)."""
    r, b, s = rope.rotary_dim, x.shape[0], x.shape[1]
    a = angles(rope, positions).reshape(b, s, 1, -1)
    cos = torch.cat([a.cos(), a.cos()], -1) * rope.attention_factor
    sin = torch.cat([a.sin(), a.sin()], -1) * rope.attention_factor
    rot, tail = x[..., :r], x[..., r:]
    half = torch.cat([-rot[..., r // 2:], rot[..., : r // 2]], -1)
    return torch.cat([rot * cos + half * sin, tail], -1)


def complex_form(x, rope, positions):
    """Meta LLaMA / Mistral: view pairs (x[2i], x[2i+1]) as complex, multiply by e^{i p θ}."""
    r, b, s = rope.rotary_dim, x.shape[0], x.shape[1]
    a = angles(rope, positions).reshape(b, s, 1, -1)
    z = torch.view_as_complex(x[..., :r].reshape(*x.shape[:-1], r // 2, 2).contiguous())
    w = z * torch.polar(torch.full_like(a, rope.attention_factor), a)
    return torch.cat([torch.view_as_real(w).reshape(*x.shape[:-1], r), x[..., r:]], -1)


def matrix_form(x, rope, positions):
    """RoFormer: block-diagonal rotation matrices, both pairings, applied as a dense matrix."""
    r, b, s = rope.rotary_dim, x.shape[0], x.shape[1]
    a = angles(rope, positions).reshape(b * s, -1)
    out = x.clone()
    for t in range(b * s):
        m = torch.zeros(r, r, dtype=torch.float64)
        for i in range(r // 2):
            ia, ib = (2 * i, 2 * i + 1) if rope.pairing == "interleaved" else (i, i + r // 2)
            c, sn = math.cos(a[t, i]), math.sin(a[t, i])
            m[ia, ia], m[ia, ib], m[ib, ia], m[ib, ib] = c, -sn, sn, c
        bi, si = divmod(t, s)
        out[bi, si, :, :r] = (x[bi, si, :, :r] @ m.T) * rope.attention_factor
    return out


def check_pairs(got, x, want, rope, bound):
    """Per pair: |got - want| <= bound * g * (|a| + |b|), plus a tiny absolute slack for f64 oracles."""
    got, x, want = got.double(), x.double(), want.double()
    r = rope.rotary_dim
    if rope.pairing == "interleaved":
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        scale = torch.stack([a.abs() + b.abs()] * 2, -1).reshape(*x.shape[:-1], r)
    else:
        s = x[..., : r // 2].abs() + x[..., r // 2: r].abs()
        scale = torch.cat([s, s], -1)
    err = (got[..., :r] - want[..., :r]).abs()
    assert torch.all(err <= bound * rope.attention_factor * scale + 1e-12), float((err / (scale + 1e-30)).max())
    assert torch.equal(got[..., r:], want[..., r:])  # untouched tail


ROPES = [
    lambda p: Rope(64, pairing=p),
    lambda p: Rope(80, rotary_dim=32, pairing=p),  # partial rotary
    lambda p: Rope(128, base=1e6, pairing=p, schedule="yarn", factor=4.0, original_max_position=32768),
]


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("make", ROPES)
@pytest.mark.parametrize("angles_mode", ["table", "on_the_fly"])
def test_formulations_f32_and_f64(pairing, make, angles_mode, rng):
    rope = make(pairing)
    b, s, h = 2, 5, 3
    positions = rng.integers(0, 1 << 20, size=(b, s))
    # float64 inputs: with a table, cos/sin are the float32 table values; on the fly the bound is the
    # oracle's own (its float64 angle p*θ is off by up to ~2^-33 rad for p < 2^20).
    f64_bound = F32_PAIR if angles_mode == "table" else 2.0 ** -30
    for dtype, bound in ((torch.float32, F32_PAIR), (torch.float64, f64_bound)):
        x = torch.as_tensor(rng.standard_normal((b, s, h, rope.head_dim))).to(dtype)
        got = rope.apply(x, positions=positions, angles=angles_mode)
        forms = [matrix_form, rotate_half_form if pairing == "half" else complex_form]
        for form in forms:
            check_pairs(got, x, form(x.double(), rope, positions), rope, bound)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_is_the_f32_result_rounded_once(dtype, rng):
    rope = Rope(64, pairing="interleaved", schedule="linear", factor=2.0)
    x = torch.as_tensor(rng.standard_normal((2, 7, 4, 64)), dtype=torch.float32).to(dtype)
    got = rope.apply(x, offset=1000)
    want = rope.apply(x.float(), offset=1000).to(dtype)  # torch rounds to nearest even
    assert torch.equal(got, want)


def test_layouts_offsets_and_numpy(rng):
    rope = Rope(32)
    x = rng.standard_normal((2, 3, 6, 32)).astype(np.float32)  # [b, h, s, d]
    got = rope.apply(x, layout="bhsd", offset=77)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    want = rope.apply(np.ascontiguousarray(x.transpose(0, 2, 1, 3)), offset=77).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(got, want)
    per_token = rope.apply(np.ascontiguousarray(x.transpose(0, 2, 1, 3)), positions=np.arange(77, 83)[None].repeat(2, 0))
    np.testing.assert_array_equal(per_token, want.transpose(0, 2, 1, 3))


def test_zero_copy_in_place_and_strided_views(rng):
    rope = Rope(64)
    q = torch.randn(1, 4, 8, 64)
    ptr = q.data_ptr()
    before = q.clone()
    out = rope.apply(q, inplace=True, offset=3)
    assert out is q and q.data_ptr() == ptr and not torch.equal(q, before)
    # A transposed (non-contiguous) view is rotated through its strides, in place, without a copy.
    base = torch.randn(1, 8, 4, 64)
    view = base.transpose(1, 2)  # [b, s, h, d] view of [b, h, s, d] memory
    assert not view.is_contiguous()
    expected = rope.apply(view.contiguous())
    rope.apply(view, inplace=True)
    assert torch.equal(base.transpose(1, 2), expected)
    # numpy in place writes the caller's array
    a = rng.standard_normal((1, 2, 2, 64)).astype(np.float32)
    a0 = a.copy()
    rope.apply(a, inplace=True, offset=9)
    assert not np.array_equal(a, a0)


def test_gradcheck_and_inverse_gradients():
    rope = Rope(16, rotary_dim=12, pairing="interleaved", schedule="yarn", factor=4.0, original_max_position=64)
    q = torch.randn(1, 3, 2, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 1, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: apply_rope(rope, a, b, offset=5), (q, k))
    q32 = torch.randn(2, 4, 3, 32, requires_grad=True)
    r32 = Rope(32)
    out = apply_rope(r32, q32, offset=100)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    assert torch.equal(q32.grad, r32.apply(upstream, offset=100, inverse=True))


def _hf_llama_layer(q, k, v, cos, sin):
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
    return w @ v


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "gpt-oss-20b"])  # llama3 and yarn
def test_rotary_embedding_in_llama_attention(preset):
    rope = Rope.from_preset(preset)
    torch.manual_seed(0)
    b, hq, hk, s, d = 1, 8, 2, 6, rope.head_dim
    q, k, v = torch.randn(b, hq, s, d), torch.randn(b, hk, s, d), torch.randn(b, hk, s, d)
    position_ids = torch.arange(4000, 4000 + s).reshape(1, s)
    a = angles(rope, position_ids.numpy()).reshape(1, 1, s, -1)
    cos = (torch.cat([a, a], -1).cos() * rope.attention_factor).float()
    sin = (torch.cat([a, a], -1).sin() * rope.attention_factor).float()
    want = _hf_llama_layer(q, k, v, cos, sin)
    module = RotaryEmbedding(rope, layout="bhsd")
    rq, rk = module(q, k, position_ids)
    kk = rk.repeat_interleave(hq // hk, dim=1)
    vv = v.repeat_interleave(hq // hk, dim=1)
    got = torch.softmax(rq @ kk.transpose(-1, -2) / math.sqrt(d), -1) @ vv
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_from_hf_config_dict_and_properties():
    config = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072, "rope_theta": 500000.0,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    rope = Rope.from_hf_config(config)
    np.testing.assert_array_equal(rope.inv_freq, Rope.from_preset("llama-3.1-8b").inv_freq)
    assert rope.inv_freq.dtype == np.float64 and rope.schedule == "llama3"
    cos, sin = rope.table([0, 1, 131071])
    assert cos.shape == (3, 64) and cos.dtype == np.float32 and cos[0, 0] == 1.0 and sin[0, 0] == 0.0
    assert "llama-3.1-8b" in rotary.preset_names()
    qwen = Rope.from_preset("qwen2.5-7b-instruct")  # the model card's YaRN block: factor 4, original 32768
    assert qwen.schedule == "yarn" and any("explicit factor 4" in n for n in qwen.notes), qwen.notes
    assert abs(qwen.attention_factor - (0.1 * math.log(4.0) + 1.0)) < 1e-15


def test_permute_for_pairing_gqa_scores(rng):
    hq, hk, d, hidden, s = 8, 2, 16, 12, 5
    wq, wk = rng.standard_normal((hq * d, hidden)), rng.standard_normal((hk * d, hidden))
    x = rng.standard_normal((s, hidden))
    def scores(wq_, wk_, pairing):
        rope = Rope(d, pairing=pairing)
        q = (x @ wq_.T).reshape(1, s, hq, d)
        k = (x @ wk_.T).reshape(1, s, hk, d)
        q, k = rope.apply(q, k, offset=300)
        k = np.repeat(k, hq // hk, axis=2)
        return np.einsum("bshd,bthd->hst", q, k)
    a = scores(wq, wk, "interleaved")
    bq = rotary.permute_for_pairing(wq, hq, to="half")
    bk = rotary.permute_for_pairing(torch.as_tensor(wk), hk, to="half").numpy()
    np.testing.assert_allclose(scores(bq, bk, "half"), a, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(rotary.permute_for_pairing(bq, hq, to="interleaved"), wq)


def test_plot_data_and_files(tmp_path):
    from rotary import plot
    d, angle = plot.angle_difference(1.0, 64)
    assert plot.first_drop(angle) == 7  # θ = 1 wraps at distance 7
    mono = Rope(128, schedule="monotone", max_length=4096)
    for theta in mono.inv_freq:
        _, a = plot.angle_difference(theta, 4095)
        assert plot.first_drop(a) is None
    r, bound = plot.decay_bound(Rope(128).inv_freq, 2000)
    assert bound[0] > bound[-200:].mean()
    # plot (5): same yardstick for both pipelines; rotary stays within a float32 rounding at any
    # position, transformers' float32 angles stray by more than 0.01 rad at 2^24
    rope = Rope.from_preset("llama-3.1-8b")
    positions = np.array([1, 4097, 131071, 1 << 24])
    err32, err_rotary = plot.angle_errors(rope, positions)
    assert np.all(err_rotary <= 2.0 ** -23), err_rotary
    assert err32[-1] > 1e-2 and err32[0] < 1e-6, err32
    assert abs(plot.exact_angle_mod_2pi(710, 1.0) - (710 - 226 * math.pi)) < 1e-12  # 710 = 226 pi + 6e-5
    assert abs(plot.exact_angle_mod_2pi(355, 1.0) - (355 - 114 * math.pi)) < 1e-12  # 113 pi + 3e-5 wraps to -pi + 3e-5
    assert plot.main(["--preset", "llama-3.1-8b", "--out", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 6  # five analysis figures and the precision doctor
    for name in files:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000


def test_bad_arguments_raise_and_leave_data_untouched():
    rope = Rope(64)
    with pytest.raises(ValueError, match="rotary_dim=63 must be even"):
        Rope(64, rotary_dim=63)
    with pytest.raises(ValueError, match="rotary_dim=65 must be even and <= head_dim=65"):
        Rope(65)
    with pytest.raises(TypeError, match="q dtype must be float32"):
        rope.apply(torch.zeros(1, 1, 1, 64, dtype=torch.int32))
    with pytest.raises(TypeError, match="q must be a numpy.ndarray or torch.Tensor"):
        rope.apply([1.0, 2.0])
    q = torch.randn(1, 4, 2, 64)
    q0 = q.clone()
    with pytest.raises(ValueError, match="k shape .* disagrees with q shape"):
        rope.apply(q, torch.randn(1, 3, 2, 64), inplace=True)
    with pytest.raises(ValueError, match="positions has 3 entries but batch\\*seq=4"):
        rope.apply(q, positions=[1, 2, 3], inplace=True)
    with pytest.raises(ValueError, match="q.head_dim=32 differs"):
        rope.apply(torch.randn(1, 4, 2, 32), inplace=True)
    with pytest.raises(ValueError, match="layout='sbhd'"):
        rope.apply(q, layout="sbhd", inplace=True)
    with pytest.raises(ValueError, match="must have 4 dimensions"):
        rope.apply(torch.randn(4, 64))
    with pytest.raises(TypeError, match="positions must hold integers or real numbers"):
        rope.apply(q, positions=np.zeros(4, dtype=np.complex64))
    with pytest.raises(ValueError, match="preset 'nope' is unknown"):
        Rope.from_preset("nope")
    with pytest.raises(TypeError, match="base must be a number, got str"):
        Rope(64, base="x")
    with pytest.raises(TypeError, match="rotary_dim must be an int, got float"):
        Rope(64, rotary_dim=32.0)
    with pytest.raises(TypeError, match="pairing must be a str"):
        Rope(64, pairing=1)
    with pytest.raises(ValueError, match="pairing='neox' must be interleaved or half"):
        Rope(64, pairing="neox")
    with pytest.raises(TypeError, match="unknown schedule argument 'factr'"):
        Rope(64, schedule="linear", factr=2.0)
    assert torch.equal(q, q0)


def test_table_angles_at_any_position_without_a_huge_cache():
    """angles="table" at positions up to 2^31 - 1 equals on-the-fly angles and never allocates a
    table spanning [0, position]: run under a 4 GiB address-space limit in a fresh interpreter."""
    import subprocess
    import sys
    code = (
        "import resource, numpy as np, rotary\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "r = rotary.Rope(128, base=5e5)\n"
        "q = np.random.default_rng(1).standard_normal((2, 3, 4, 128)).astype(np.float32)\n"
        "pos = np.array([[0, 2**31 - 1, 10**7], [131071, 2**31 - 2, 5]])\n"
        "a = r.apply(q, positions=pos)\n"
        "b = r.apply(q, positions=pos, angles='on_the_fly')\n"
        "assert np.array_equal(a, b), float(np.abs(a - b).max())\n"
        "c = r.apply(q[:, :1], offset=2**31 - 1)\n"
        "assert np.array_equal(c, r.apply(q[:, :1], offset=2**31 - 1, angles='on_the_fly'))\n"
        "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
