"""Layouts across the Python API: the one default ("bshd"), packed [tokens, heads, head_dim] input
("thd"), and torch position tensors read by the extension directly (any strides, int32/int64).

Oracle: the same call on the 4-D form of the same data (packed = one batch row), which the
reference-checked kernels already cover, and, for positions, the numpy path they replace."""
import inspect

import numpy as np
import pytest
import torch

import rotary
from rotary import Rope
from rotary.torch import RotaryEmbedding, apply_rope, apply_rope_


def mrope():
    return Rope(32, base=1e6, stream_layout="sections", sections=[4, 6, 6])


def test_the_default_layout_is_bshd_everywhere():
    defaults = {
        "Rope.apply": inspect.signature(Rope.apply).parameters["layout"].default,
        "apply_rope": inspect.signature(apply_rope).parameters["layout"].default,
        "apply_rope_": inspect.signature(apply_rope_).parameters["layout"].default,
        "RotaryEmbedding": inspect.signature(RotaryEmbedding.__init__).parameters["layout"].default,
    }
    assert set(defaults.values()) == {"bshd"}, defaults
    # and the default means [batch, seq, heads, head_dim]: seq is dimension 1
    rope = Rope(16)
    q = torch.randn(1, 5, 2, 16)
    want = rope.apply(q, positions=np.arange(5), layout="bshd")
    assert torch.equal(RotaryEmbedding(rope)(q, q.clone())[0], want)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("layout", ["thd", "bshd"])
def test_packed_tokens_rotate_as_one_batch_row(kind, dtype, inplace, layout):
    if kind == "numpy" and dtype == "bfloat16":
        pytest.skip("numpy has no bfloat16")
    rope = Rope(64, rotary_dim=48, base=5e5, pairing="interleaved")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(7, 4, 64, generator=g).to(getattr(torch, dtype))
    k = torch.randn(7, 2, 64, generator=g).to(getattr(torch, dtype))
    positions = torch.tensor([0, 1, 2, 0, 1, 70000, 2 ** 31 - 1])  # two packed sequences and a far token
    if kind == "numpy":
        q, k, positions = q.numpy(), k.numpy(), positions.numpy()
    want_q, want_k = rope.apply(q[None], k[None], positions=positions)
    a, b = (q.copy(), k.copy()) if kind == "numpy" else (q.clone(), k.clone())
    got_q, got_k = rope.apply(a, b, positions=positions, layout=layout, inplace=inplace)
    assert got_q.shape == q.shape and got_k.shape == k.shape
    assert (got_q is a) == inplace and (got_k is b) == inplace
    for got, want in ((got_q, want_q[0]), (got_k, want_k[0])):
        assert np.array_equal(np.asarray(got.float() if kind == "torch" else got),
                              np.asarray(want.float() if kind == "torch" else want))
    if not inplace:  # only read
        assert np.array_equal(np.asarray(a if kind == "numpy" else a.float()),
                              np.asarray(q if kind == "numpy" else q.float()))


def test_packed_default_positions_and_strided_views():
    rope = Rope(32)
    qkv = torch.randn(9, 3, 4, 32)  # fused [tokens, 3, heads, head_dim]: q and k are strided views
    q, k = qkv[:, 0], qkv[:, 1]
    want_q, want_k = rope.apply(q.contiguous()[None], k.contiguous()[None], offset=100)
    got_q, got_k = apply_rope(rope, q, k, offset=100, layout="thd")
    assert torch.equal(got_q, want_q[0]) and torch.equal(got_k, want_k[0])
    apply_rope_(rope, q, k, offset=100)  # in place into the fused tensor, 3-D under the default
    assert torch.equal(qkv[:, 0], want_q[0]) and torch.equal(qkv[:, 1], want_k[0])


def test_packed_mrope_positions_have_a_row_per_stream():
    rope = mrope()
    g = torch.Generator().manual_seed(5)
    q = torch.randn(6, 2, 32, generator=g)
    streams = torch.tensor([[0, 1, 2, 3, 3, 3], [0, 1, 2, 3, 4, 5], [0, 1, 2, 5, 4, 3]])  # [3, tokens]
    want = rope.apply(q[None], positions=streams[:, None, :])
    assert torch.equal(rope.apply(q, positions=streams), want[0])
    assert np.array_equal(rope.apply(q.numpy(), positions=streams.numpy().tolist()), want[0].numpy())
    # the streams matter: a permuted stream order gives other values
    assert not torch.equal(rope.apply(q, positions=streams[[2, 1, 0]]), want[0])


def test_packed_input_errors_name_the_argument_and_leave_data_untouched():
    rope = Rope(16)
    q, k = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    before = q.clone(), k.clone()
    with pytest.raises(ValueError, match="layout='bhsd' is for 4-D tensors: a 3-D q is packed"):
        rope.apply(q, k, layout="bhsd", inplace=True)
    with pytest.raises(ValueError, match=r"k must have 3 dimensions \(\[tokens, heads, head_dim\]\)"):
        rope.apply(q, k[None], inplace=True)
    with pytest.raises(ValueError, match=r"q must have 3 dimensions .* got 4"):
        rope.apply(q[None], layout="thd", inplace=True)
    with pytest.raises(ValueError, match="positions has 2 entries"):
        rope.apply(q, k, positions=[1, 2], inplace=True)
    with pytest.raises(TypeError, match="layout must be a str, got int"):
        rope.apply(q, layout=3, inplace=True)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])


# ---- torch position tensors, read by the extension (no numpy round trip) ---------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_torch_positions_of_any_strides_equal_the_numpy_path(dtype):
    rope = Rope(32, base=1e6)
    g = torch.Generator().manual_seed(11)
    q = torch.randn(3, 5, 2, 32, generator=g)
    base = torch.tensor([4, 9, 2 ** 31 - 1, 0, 77], dtype=dtype)
    cases = {
        "[seq]": base,
        "[1, seq]": base[None],
        "[batch, seq] expanded (stride 0)": base[None].expand(3, 5),
        "[batch, seq] transposed": torch.stack([base, base.flip(0), base]).t().contiguous().t(),
        "every other element": torch.stack([base, base], -1).reshape(-1)[::2],
    }
    for name, positions in cases.items():
        want = rope.apply(q, positions=positions.numpy().copy())
        assert torch.equal(rope.apply(q, positions=positions), want), name
        assert torch.equal(apply_rope(rope, q, positions=positions), want), name


def test_torch_mrope_positions_expanded_per_stream():
    rope = mrope()
    q = torch.randn(2, 4, 2, 32)
    streams = torch.tensor([[0, 1, 2, 3], [0, 1, 1, 9], [0, 2, 1, 4]])[:, None, :].expand(3, 2, 4)
    want = rope.apply(q, positions=streams.numpy().copy())
    assert torch.equal(rope.apply(q, positions=streams), want)


def test_torch_positions_errors_name_positions():
    rope = Rope(16)
    q = torch.randn(1, 3, 2, 16)
    before = q.clone()
    with pytest.raises(ValueError, match=r"positions\[2\]=-5 must be in \[0, 2\^31\)"):
        rope.apply(q, positions=torch.tensor([0, 1, -5], dtype=torch.int32), inplace=True)
    with pytest.raises(ValueError, match="positions must have at most 3 dimensions"):
        rope.apply(q, positions=torch.zeros(1, 1, 1, 3, dtype=torch.int64), inplace=True)
    with pytest.raises(ValueError, match="positions has 2 entries"):
        rope.apply(q, positions=torch.tensor([[0, 1]]), inplace=True)
    assert torch.equal(q, before)


# ---- angles=: one vocabulary ------------------------------------------------------------------------

def test_angles_words_are_the_same_everywhere():
    rope = Rope(32, base=5e5)
    q = torch.randn(1, 3, 2, 32)
    positions = torch.tensor([0, 7, 2 ** 31 - 1])
    for fn in (Rope.apply, apply_rope, apply_rope_):
        assert inspect.signature(fn).parameters["angles"].default == "exact", fn
    exact = rope.apply(q, positions=positions)
    assert torch.equal(rope.apply(q, positions=positions, angles="on_the_fly"), exact)
    assert torch.equal(rope.apply(q, positions=positions, angles="table"), exact)  # the former name
    cos, sin = rope.table(positions.numpy(), angles="exact")
    hf_cos, _ = rope.table(positions.numpy(), angles="hf-float32")
    assert not np.array_equal(cos, hf_cos)  # float32 angles drift at 2^31 - 1
    assert not torch.equal(rope.apply(q, positions=positions, angles="hf-float32"), exact)
    with pytest.raises(ValueError, match="angles='on_the_fly' computes apply's angles without a table"):
        rope.table([1], angles="on_the_fly")
    with pytest.raises(ValueError, match="angles='fast' must be 'exact', 'on_the_fly' or 'hf-float32'"):
        apply_rope(rope, q, angles="fast")


def test_caller_angle_errors_name_cos_and_sin():
    rope = Rope(16)
    q = torch.randn(2, 3, 2, 16)
    before = q.clone()
    with pytest.raises(ValueError, match=r"^cos/sin width=5 must be 16 \(rotary_dim=16, columns halves\)"):
        rope.apply(q, cos=torch.ones(1, 3, 5), sin=torch.ones(1, 3, 5), inplace=True)
    with pytest.raises(ValueError, match=r"^per-token cos/sin shape \[1, 4, 16\] must be \[batch=2 or 1, seq=3"):
        rope.apply(q, cos=torch.ones(1, 4, 16), sin=torch.ones(1, 4, 16), inplace=True)
    with pytest.raises(ValueError, match=r"positions\[1\]=9 is beyond the 4 rows of the per_position cos/sin"):
        rope.apply(q, positions=[0, 9, 1], cos=torch.ones(4, 8), sin=torch.ones(4, 8), inplace=True)
    assert torch.equal(q, before)
    with pytest.raises(ValueError) as info:
        rope.apply(q, cos=torch.ones(1, 3, 5), sin=torch.ones(1, 3, 5))
    assert "angles" not in str(info.value)  # the caller passed no argument of that name


# ---- out=: outputs the caller keeps ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_out_receives_the_rotation_and_is_returned(kind):
    rope = Rope(32, base=5e5, pairing="interleaved")
    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 5, 4, 32, generator=g), torch.randn(2, 5, 2, 32, generator=g)
    positions = torch.tensor([[0, 1, 2, 3, 4], [9, 99, 999, 9999, 2 ** 31 - 1]])
    if kind == "numpy":
        q, k, positions = q.numpy(), k.numpy(), positions.numpy()
    want_q, want_k = rope.apply(q, k, positions=positions)
    new = np.empty_like if kind == "numpy" else torch.empty_like
    q_out, k_out = new(q), new(k)
    for _ in range(2):  # reused
        got = rope.apply(q, k, positions=positions, out=(q_out, k_out))
        assert got[0] is q_out and got[1] is k_out
        assert np.array_equal(np.asarray(q_out), np.asarray(want_q)) and np.array_equal(np.asarray(k_out), np.asarray(want_k))
    # a strided output (a view into a bigger buffer) and q alone
    big = new(np.zeros((2, 5, 8, 32), dtype=np.float32)) if kind == "numpy" else torch.empty(2, 5, 8, 32)
    view = big[:, :, ::2]
    assert rope.apply(q, positions=positions, out=view) is view
    assert np.array_equal(np.asarray(view), np.asarray(want_q))


def test_out_errors_name_it_and_write_nothing():
    rope = Rope(16)
    q, k = torch.randn(1, 3, 2, 16), torch.randn(1, 3, 1, 16)
    q_out = torch.full_like(q, 7.0)
    cases = [
        (dict(out=q_out), ValueError, r"out must be a tuple \(q_out, k_out\), got 1 output"),
        (dict(out=(q_out, torch.full((1, 3, 2, 16), 7.0))), ValueError, r"k_out shape \[1, 3, 2, 16\] differs from k shape"),
        (dict(out=(q_out, torch.full_like(k, 7.0, dtype=torch.float64))), ValueError, "k_out"),
        (dict(out=(q_out, q[:, :, :1])), ValueError, "k_out overlaps input q"),
        (dict(out=(q_out, torch.full_like(k, 7.0)), inplace=True), ValueError, "out is given with inplace=True"),
        (dict(out=(q_out.numpy(), k.numpy())), TypeError, r"out \(q_out\) must be the same kind as q"),
        (dict(out=(q_out, [1.0])), TypeError, r"out \(k_out\) must be a numpy.ndarray or torch.Tensor"),
    ]
    for kwargs, kind, needle in cases:
        with pytest.raises(kind, match=needle):
            rope.apply(q, k, **kwargs)
        assert torch.all(q_out == 7.0), kwargs  # nothing written before the error
