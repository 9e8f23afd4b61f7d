"""The engine-shaped entry points (issue 25): ``rotary.torch.rotary_embedding`` (vLLM's and SGLang's
operator) and ``rotary.torch.apply_rope_with_cos_sin_cache_inplace`` (FlashInfer's), against those
engines' documented semantics written out here in plain torch: the cos/sin rows gathered by position
from ``cos_sin_cache`` ``[max_pos, rotary_dim]`` (cos half, then sin half), pairs ``(x[j], x[j + r/2])``
for ``is_neox`` and ``(x[2j], x[2j+1])`` otherwise, the first rotary_dim channels of each head rotated
and the rest untouched (vLLM's ``RotaryEmbedding.forward_native``; nothing is imported from vLLM).

Bits:
- exactly the formula's, in every dtype, where no operation rounds (values of a few bits: the
  formula's roundings and rotary's then agree whatever their order);
- exactly rotary's documented rounding (``rotary.Rope.apply``: float32 arithmetic, the larger product
  fused, the smaller rounded first, one rounding to the data's dtype; float64 plain), emulated here;
  in float64 that is vLLM's formula itself, bit for bit;
- within the formula's own roundings elsewhere (``ROUNDING`` below, per dtype).
"""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import rotary
from rotary import _rotary
from rotary.torch import apply_rope_with_cos_sin_cache_inplace, rotary_embedding

OP = torch.ops.rotary.rotary_embedding.default
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
HAVE_GPU = torch.cuda.is_available() and _rotary.cuda
gpu = pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device and rotary built with CUDA kernels")

# Unit roundoff of each dtype: rotary's result and the formula's (each product, the sum, and for
# half-precision data the table cast to the data's dtype) are each within a few of them times
# (|x1| + |x2|) of the exact rotation, so they differ by at most ROUNDING_UNITS of them.
UNIT = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float64: 2.0 ** -53}
ROUNDING_UNITS = 6


# ---- The engines' semantics, written out ---------------------------------------------------------

def vllm_cos_sin_cache(max_position, rotary_dim, base=10000.0, dtype=torch.float32):
    """vLLM's ``RotaryEmbedding._compute_cos_sin_cache``: ``[max_position, rotary_dim]``, cos then sin."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


def pair_halves(x, rotary_dim, is_neox):
    """(x1, x2): the two members of every pair of the rotated slice ``x[..., :rotary_dim]``."""
    x_rot = x[..., :rotary_dim]
    if is_neox:
        return x_rot[..., : rotary_dim // 2], x_rot[..., rotary_dim // 2:]
    return x_rot[..., 0::2], x_rot[..., 1::2]


def join_halves(o1, o2, is_neox):
    return torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)


def forward_native(positions, query, key, head_size, cos_sin_cache, is_neox):
    """vLLM's ``RotaryEmbedding.forward_native``: out of place, in the data's dtype (the table cast to it)."""
    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions.long()).chunk(2, dim=-1)
    out = []
    for x in (query, key):
        if x is None:
            out.append(None)
            continue
        x3 = x.reshape(x.shape[0], -1, head_size)
        c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
        x1, x2 = pair_halves(x3, rotary_dim, is_neox)
        rotated = join_halves(x1 * c - x2 * s, x2 * c + x1 * s, is_neox)
        out.append(torch.cat((rotated, x3[..., rotary_dim:]), dim=-1).reshape(x.shape))
    return out


def fma_f32(x, y, z):
    """fmaf(x, y, z) on float32 tensors, correctly rounded: x*y is exact in float64, the sum rounded to
    odd in float64 (TwoSum gives its error), and a round-to-odd double rounds correctly to float
    (Boldo and Melquiond 2008)."""
    p = x.double() * y.double()
    zd = z.double()
    s = p + zd
    bb = s - p
    e = (p - (s - bb)) + (zd - bb)
    bits = s.view(torch.int64)
    step = (e != 0) & (bits % 2 == 0)
    toward = torch.where((e > 0) == (s > 0), 1, -1)
    return (bits + torch.where(step, toward, 0)).view(torch.float64).float()


def rotate_minus(x, m, w, n):
    """x*m - w*n as rotary documents it: the larger product (in magnitude) fused, the smaller rounded."""
    p, q = x * m, w * n
    fuse_xm = p.abs() >= q.abs()
    return fma_f32(torch.where(fuse_xm, x, -w), torch.where(fuse_xm, m, n), torch.where(fuse_xm, -q, p))


def rotary_contract(positions, query, key, head_size, cos_sin_cache, is_neox):
    """rotary's rounding, emulated: cos/sin widened to float32 (float64 for float64 data), each output
    ``rotate_minus`` in float32 then rounded once to the data's dtype; float64 plain arithmetic."""
    rotary_dim = cos_sin_cache.shape[-1]
    out = []
    for x in (query, key):
        if x is None:
            out.append(None)
            continue
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = cos_sin_cache.to(wide).index_select(0, positions.long()).chunk(2, dim=-1)
        c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
        x3 = x.reshape(x.shape[0], -1, head_size)
        a, b = (t.to(wide) for t in pair_halves(x3, rotary_dim, is_neox))
        if wide == torch.float64:
            o1, o2 = a * c - b * s, b * c + a * s
        else:
            o1, o2 = rotate_minus(a, c, b, s), rotate_minus(b, c, a, -s)
        rotated = join_halves(o1, o2, is_neox).to(x.dtype)
        out.append(torch.cat((rotated, x3[..., rotary_dim:]), dim=-1).reshape(x.shape))
    return out


# ---- Cases -----------------------------------------------------------------------------------------

# (heads, kv_heads, head_size, rotary_dim), tagged with the models they stand for.
SHAPES = {
    "llama 32/8 d128": (8, 2, 128, 128),       # Llama-3.1-8B (heads scaled down)
    "neox partial d80 r32": (4, 4, 80, 32),    # Pythia/GPT-NeoX partial rotary, an 80-wide head (Phi-2)
    "gptj d256 r64": (2, 1, 256, 64),          # GPT-J-6B: interleaved, rotary_dim 64 of 256
    "chatglm d128 r64": (4, 1, 128, 64),       # ChatGLM: half the head rotated
    "d64": (3, 3, 64, 64),
}
MAX_POSITION = 4096


def make_case(shape, dtype, positions_dtype=torch.int64, tokens=9, seed=0, cache_dtype=None):
    heads, kv_heads, head_size, rotary_dim = shape
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(tokens, heads * head_size, generator=g).to(dtype)
    key = torch.randn(tokens, kv_heads * head_size, generator=g).to(dtype)
    # Positions across the table: 0, 1, 2^k +- 1 and its last row.
    positions = torch.tensor([0, 1, 2, 255, 256, 257, 1023, 4094, MAX_POSITION - 1] * 2)[:tokens]
    cache = vllm_cos_sin_cache(MAX_POSITION, rotary_dim, dtype=cache_dtype or (torch.float32 if dtype == torch.float32
                                                                               else dtype))
    return positions.to(positions_dtype), query, key, head_size, cache


def exact_case(shape, dtype, tokens=7, seed=1):
    """Values of a few bits: every product and sum of the formula is exact in every dtype (3-bit data
    times 3-bit table values, sums within bfloat16's 8 bits), so no rounding order can matter."""
    heads, kv_heads, head_size, rotary_dim = shape
    g = torch.Generator().manual_seed(seed)
    query = (torch.randint(-7, 8, (tokens, heads * head_size), generator=g) / 4).to(dtype)
    key = (torch.randint(-7, 8, (tokens, kv_heads * head_size), generator=g) / 4).to(dtype)
    cache = (torch.randint(-4, 5, (64, rotary_dim), generator=g) / 4).to(dtype)
    positions = torch.randint(0, 64, (tokens,), generator=g)
    return positions, query, key, head_size, cache


def run(fn, positions, query, key, head_size, cache, is_neox, shape3=False):
    """Calls fn in place on copies (3-D [tokens, heads, head_size] views with shape3) and returns them."""
    q, k = query.clone(), None if key is None else key.clone()
    if shape3:
        q3, k3 = q.view(q.shape[0], -1, head_size), None if k is None else k.view(k.shape[0], -1, head_size)
        fn(positions, q3, k3, head_size, cache, is_neox)
    else:
        fn(positions, q, k, head_size, cache, is_neox)
    return q, k


def assert_equal_bits(got, want, what):
    if torch.equal(got, want):
        return
    diff = (got.double() - want.double()).abs()
    token, channel = divmod(int(diff.argmax()), got.shape[-1])
    raise AssertionError(f"{what}: {int((diff != 0).sum())} values differ; worst at token {token}, channel "
                         f"{channel}: got {float(got.flatten()[diff.argmax()])}, want "
                         f"{float(want.flatten()[diff.argmax()])}")


# ---- Semantics -------------------------------------------------------------------------------------

@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_equals_forward_native_bit_for_bit_where_nothing_rounds(dtype, shape, is_neox):
    positions, query, key, head_size, cache = exact_case(shape, dtype)
    want = forward_native(positions, query, key, head_size, cache, is_neox)
    got = run(rotary_embedding, positions, query, key, head_size, cache, is_neox)
    for name, g, w in zip(("query", "key"), got, want):
        assert_equal_bits(g, w, name)
    assert not torch.equal(got[0], query)  # it did rotate


@pytest.mark.parametrize("shape3", [False, True], ids=["2d", "3d"])
@pytest.mark.parametrize("positions_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_equals_the_documented_rounding_bit_for_bit(dtype, shape, is_neox, positions_dtype, shape3):
    positions, query, key, head_size, cache = make_case(shape, dtype, positions_dtype)
    want = rotary_contract(positions, query, key, head_size, cache, is_neox)
    got = run(rotary_embedding, positions, query, key, head_size, cache, is_neox, shape3=shape3)
    for name, g, w in zip(("query", "key"), got, want):
        assert_equal_bits(g, w, name)
    if dtype == torch.float64:  # plain float64 arithmetic: vLLM's formula itself
        for name, g, w in zip(("query", "key"), got, forward_native(positions, query, key, head_size, cache,
                                                                     is_neox)):
            assert_equal_bits(g, w, f"{name} (float64 forward_native)")


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_within_the_roundings_of_forward_native(dtype, shape, is_neox):
    positions, query, key, head_size, cache = make_case(shape, dtype, tokens=18, seed=3)
    want = forward_native(positions, query, key, head_size, cache, is_neox)
    got = run(rotary_embedding, positions, query, key, head_size, cache, is_neox)
    rotary_dim = cache.shape[-1]
    for name, x, g, w in zip(("query", "key"), (query, key), got, want):
        x1, x2 = pair_halves(x.reshape(x.shape[0], -1, head_size).double(), rotary_dim, is_neox)
        scale = (x1.abs() + x2.abs()).repeat(1, 1, 2) if is_neox else (x1.abs() + x2.abs()).repeat_interleave(2, -1)
        g3, w3 = (t.reshape(t.shape[0], -1, head_size).double() for t in (g, w))
        err = (g3[..., :rotary_dim] - w3[..., :rotary_dim]).abs() / (scale * UNIT[dtype])
        worst = float(err.max())
        assert worst <= ROUNDING_UNITS, f"{name}: {worst:.2f} units of {UNIT[dtype]:g} (|x1| + |x2|) from the formula"
        assert torch.equal(g3[..., rotary_dim:], w3[..., rotary_dim:])  # the tail, untouched


def test_float32_is_within_the_accuracy_contract_of_the_exact_rotation():
    # rotary's contract: |result - exact| <= 2^-23 (|x1| + |x2|) per pair (attention factor 1; the
    # cache's values taken as exact).
    for is_neox in (True, False):
        positions, query, key, head_size, cache = make_case(SHAPES["llama 32/8 d128"], torch.float32, tokens=9)
        got, _ = run(rotary_embedding, positions, query, key, head_size, cache, is_neox)
        exact = forward_native(positions, query.double(), None, head_size, cache.double(), is_neox)[0]
        x1, x2 = pair_halves(query.view(9, -1, head_size).double(), 128, is_neox)
        scale = (x1.abs() + x2.abs()).repeat(1, 1, 2) if is_neox else (x1.abs() + x2.abs()).repeat_interleave(2, -1)
        err = (got.view(9, -1, head_size).double() - exact.view(9, -1, head_size)).abs() / scale
        assert float(err.max()) <= 2.0 ** -23


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_key_none_rotates_query_alone(is_neox):
    positions, query, key, head_size, cache = make_case(SHAPES["chatglm d128 r64"], torch.bfloat16)
    got, _ = run(rotary_embedding, positions, query, None, head_size, cache, is_neox)
    want, _ = run(rotary_embedding, positions, query, key, head_size, cache, is_neox)
    assert torch.equal(got, want)


@pytest.mark.parametrize("shape4", [False, True], ids=["3d", "4d"])
def test_batch_and_seq_positions_as_vllm_kernel_takes_them(shape4):
    positions, query, key, head_size, cache = make_case(SHAPES["gptj d256 r64"], torch.bfloat16, tokens=8)
    want = run(rotary_embedding, positions, query, key, head_size, cache, False)
    q, k = query.view(2, 4, -1), key.view(2, 4, -1)  # [batch, seq, heads * head_size]
    if shape4:
        q, k = q.unflatten(-1, (-1, head_size)), k.unflatten(-1, (-1, head_size))
    q, k = q.clone(), k.clone()
    rotary_embedding(positions.view(2, 4), q, k, head_size, cache, False)
    assert torch.equal(q.reshape(8, -1), want[0]) and torch.equal(k.reshape(8, -1), want[1])


def test_slices_of_a_fused_qkv_tensor_are_rotated_in_place_and_v_untouched():
    heads, kv_heads, head_size, rotary_dim = 4, 2, 64, 64
    positions, _, _, _, cache = make_case((heads, kv_heads, head_size, rotary_dim), torch.float32, tokens=6)
    qkv = torch.randn(6, (heads + 2 * kv_heads) * head_size)
    original = qkv.clone()
    q, k, v = qkv.split([heads * head_size, kv_heads * head_size, kv_heads * head_size], dim=-1)
    rotary_embedding(positions, q, k, head_size, cache, True)
    want = rotary_contract(positions, original[:, :256], original[:, 256:384], head_size, cache, True)
    assert torch.equal(qkv[:, :256], want[0]) and torch.equal(qkv[:, 256:384], want[1])
    assert torch.equal(qkv[:, 384:], original[:, 384:])


def test_flashinfer_entry_point_is_the_same_rotation_and_wants_a_float32_cache():
    for is_neox in (True, False):
        positions, query, key, head_size, cache = make_case(SHAPES["neox partial d80 r32"], torch.bfloat16,
                                                            cache_dtype=torch.float32)
        got = run(apply_rope_with_cos_sin_cache_inplace, positions, query, key, head_size, cache, is_neox)
        want = run(rotary_embedding, positions, query, key, head_size, cache, is_neox)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # is_neox defaults to True, as FlashInfer's.
    q = query.clone()
    apply_rope_with_cos_sin_cache_inplace(positions, q, None, head_size, cache)
    assert torch.equal(q, run(rotary_embedding, positions, query, None, head_size, cache, True)[0])
    q = query.clone()
    with pytest.raises(ValueError, match="^cos_sin_cache should be float32"):
        apply_rope_with_cos_sin_cache_inplace(positions, q, None, head_size, cache.bfloat16())
    assert torch.equal(q, query)


def test_no_tokens_is_a_no_op():
    cache = vllm_cos_sin_cache(16, 64)
    q, k = torch.empty(0, 2 * 64), torch.empty(0, 64)
    rotary_embedding(torch.empty(0, dtype=torch.int64), q, k, 64, cache, True)


# ---- Bad input: named, nothing written -------------------------------------------------------------

def _args(**change):
    positions, query, key, head_size, cache = make_case(SHAPES["d64"], torch.float32, tokens=4)
    args = dict(positions=positions, query=query, key=key, head_size=head_size, cos_sin_cache=cache, is_neox=True)
    args.update(change)
    return args


BAD_TYPES = {
    "positions float": (dict(positions=torch.zeros(4)), "^positions must be an int64 or int32 tensor, got dtype "
                                                         "torch.float32"),
    "positions list": (dict(positions=[0, 1, 2, 3]), "^positions must be a torch.Tensor, got list"),
    "query numpy": (dict(query=torch.zeros(4, 192).numpy()), "^query must be a torch.Tensor, got ndarray"),
    "query int": (dict(query=torch.zeros(4, 192, dtype=torch.int32)), "^query dtype must be float32"),
    "key list": (dict(key=[1.0]), "^key must be a torch.Tensor or None, got list"),
    "key dtype": (dict(key=torch.zeros(4, 192, dtype=torch.float16)), "^key dtype torch.float16 differs from "
                                                                      "query dtype torch.float32"),
    "head_size float": (dict(head_size=64.0), "^head_size must be an int, got float"),
    "head_size bool": (dict(head_size=True), "^head_size must be an int, got bool"),
    "is_neox int": (dict(is_neox=1), "^is_neox must be a bool, got int"),
    "cos_sin_cache int": (dict(cos_sin_cache=torch.zeros(16, 64, dtype=torch.int64)), "^cos_sin_cache dtype must"),
    "cos_sin_cache none": (dict(cos_sin_cache=None), "^cos_sin_cache must be a torch.Tensor, got NoneType"),
}

BAD_VALUES = {
    "position beyond the cache": (dict(positions=torch.tensor([0, 1, 4096, 2])), "positions"),
    "negative position": (dict(positions=torch.tensor([0, -1, 2, 3], dtype=torch.int32)), "positions"),
    "positions count": (dict(positions=torch.tensor([0, 1, 2])),
                        r"^positions shape \(3,\) must be query's leading \[tokens=4\]"),
    "positions 2-D": (dict(positions=torch.zeros(1, 4, dtype=torch.int64)),
                      r"^query must have 3 dimensions \(\[batch, seq, heads \* head_size\]\) or 4"),
    "positions 3-D": (dict(positions=torch.zeros(1, 1, 4, dtype=torch.int64)), "^positions must have 1 dimension"),
    "head_size zero": (dict(head_size=0), "^head_size=0 must be positive"),
    "width not a multiple": (dict(head_size=80), "^query width=192 must be a multiple of head_size=80"),
    "3-D head_size": (dict(query=torch.zeros(4, 3, 32)), (r"^query shape \(4, 3, 32\) must be \[tokens, heads, "
                                                          r"head_size=64\]")),
    "query 1-D": (dict(query=torch.zeros(4)), "^query must have 2 dimensions"),
    "key tokens": (dict(key=torch.zeros(5, 64)), r"^key's tokens \(5,\) differ from query's \(4,\)"),
    "cache odd width": (dict(cos_sin_cache=torch.zeros(16, 31)), "^cos_sin_cache width=31 is the rotary_dim, which "
                                                                 "must be even, positive and <= head_size=64"),
    "cache too wide": (dict(cos_sin_cache=torch.zeros(16, 66)), "^cos_sin_cache width=66"),
    "cache 3-D": (dict(cos_sin_cache=torch.zeros(1, 16, 64)), "^cos_sin_cache must have 2 dimensions"),
    "meta among cpu": (dict(key=torch.zeros(4, 64, device="meta")), "^key is on meta but query is on cpu"),
    "requires grad": (dict(query=torch.zeros(4, 192, requires_grad=True)), "^query requires grad"),
}


def _call_and_check_untouched(fn, args, mode=False):
    tensors = {n: t for n, t in args.items() if isinstance(t, torch.Tensor) and t.device.type != "meta"}
    originals = {n: t.detach().clone() for n, t in tensors.items()}
    try:
        if mode:
            with FlopCounterMode(display=False):  # through the operator, as when traced
                fn(**args)
        else:
            fn(**args)
    finally:
        for n, t in tensors.items():
            assert torch.equal(t.detach(), originals[n]), f"{n} was written"


CALLS = {"rotary_embedding": (rotary_embedding, False), "operator": (rotary_embedding, True),
         "flashinfer": (apply_rope_with_cos_sin_cache_inplace, False)}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("case", BAD_TYPES.values(), ids=BAD_TYPES.keys())
def test_wrong_kinds_raise_type_error_naming_the_argument(case, call):
    change, message = case
    fn, mode = call
    if fn is apply_rope_with_cos_sin_cache_inplace and "cos_sin_cache" in change:
        message = "cos_sin_cache" if change["cos_sin_cache"] is None else "^cos_sin_cache should be float32"
        with pytest.raises((TypeError, ValueError), match=message):
            _call_and_check_untouched(fn, _args(**change), mode)
        return
    with pytest.raises(TypeError, match=message):
        _call_and_check_untouched(fn, _args(**change), mode)


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("case", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_raise_value_error_naming_the_argument(case, call):
    change, message = case
    fn, mode = call
    if fn is apply_rope_with_cos_sin_cache_inplace and change.get("cos_sin_cache") is not None:
        change = dict(change, cos_sin_cache=change["cos_sin_cache"].float())
    with pytest.raises(ValueError, match=message):
        _call_and_check_untouched(fn, _args(**change), mode)


def test_the_operator_called_directly_checks_its_arguments_too():
    args = _args(positions=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"^positions shape \(3,\) must be query's leading \[tokens=4\]"):
        _call_and_check_untouched(OP, args)


# ---- torch.library: opcheck, fake tensors, torch.compile -------------------------------------------

@pytest.mark.parametrize("key_none", [False, True], ids=["q+k", "q"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_opcheck(dtype, key_none):
    positions, query, key, head_size, cache = make_case(SHAPES["neox partial d80 r32"], dtype)
    torch.library.opcheck(OP, (positions, query, None if key_none else key, head_size, cache, False))
    torch.library.opcheck(OP, (positions.int(), query.view(9, -1, 80), None if key_none else key.view(9, -1, 80),
                               head_size, cache, True))


def test_fake_and_meta_tensors_give_shapes_only():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        positions, query, key = torch.zeros(3, dtype=torch.int64), torch.empty(3, 256), torch.empty(3, 128)
        rotary_embedding(positions, query, key, 128, torch.empty(64, 64), True)
    meta = dict(positions=torch.zeros(3, dtype=torch.int64, device="meta"), query=torch.empty(3, 256, device="meta"),
                key=None, head_size=128, cos_sin_cache=torch.empty(64, 64, device="meta"), is_neox=False)
    rotary_embedding(**meta)
    OP(*meta.values())


def attention_prologue(qkv, positions, cos_sin_cache):
    """What a vLLM attention layer does before attention: split the fused QKV output, rotate q and k in
    place, return the pieces (and a sum, so the graph computes on the rotated values)."""
    q, k, v = qkv.split([4 * 64, 2 * 64, 2 * 64], dim=-1)
    rotary_embedding(positions, q, k, 64, cos_sin_cache, True)
    return q.sum(-1) + k.sum(-1), q, k, v


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiles_with_fullgraph_and_no_graph_break_and_equals_eager(backend):
    cache = vllm_cos_sin_cache(MAX_POSITION, 64)
    qkv, positions = torch.randn(7, 8 * 64), torch.tensor([0, 5, 9, 4095, 17, 2, 1])
    explained = torch._dynamo.explain(attention_prologue)(qkv.clone(), positions, cache)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert "torch.ops.rotary.rotary_embedding" in explained.graphs[0].code
    compiled = torch.compile(attention_prologue, fullgraph=True, backend=backend)
    a, b = qkv.clone(), qkv.clone()
    want, got = attention_prologue(a, positions, cache), compiled(b, positions, cache)
    assert torch.equal(a, b) and not torch.equal(a, qkv)  # the caller's qkv written through the views
    for w, g in zip(want[1:], got[1:]):  # the rotated q and k bit for bit
        assert torch.equal(w, g)
    torch.testing.assert_close(got[0], want[0])  # a sum inductor may order its own way
    # A flashinfer-shaped call (3-D views, int32 positions, no key) under fullgraph as well.
    f = torch.compile(lambda p, q, c: apply_rope_with_cos_sin_cache_inplace(p, q, None, 64, c, False) or q,
                      fullgraph=True, backend=backend)
    q = torch.randn(7, 4, 64)
    got = f(positions.int(), q.clone(), cache)
    want, _ = run(rotary_embedding, positions, q, None, 64, cache, False)
    assert torch.equal(got, want)


def test_compiled_bad_position_raises_and_leaves_tensors_untouched():
    cache = vllm_cos_sin_cache(64, 64)
    compiled = torch.compile(attention_prologue, fullgraph=True, backend="aot_eager")
    qkv = torch.randn(3, 8 * 64)
    original = qkv.clone()
    with pytest.raises(ValueError, match="positions"):
        compiled(qkv, torch.tensor([0, 64, 1]), cache)
    assert torch.equal(qkv, original)


# ---- CUDA ------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_cuda_gives_the_cpu_bits(dtype, is_neox):
    for shape in SHAPES.values():
        positions, query, key, head_size, cache = make_case(shape, dtype, positions_dtype=torch.int32)
        want = run(rotary_embedding, positions, query, key, head_size, cache, is_neox)
        got = run(rotary_embedding, positions.cuda(), query.cuda(), key.cuda(), head_size, cache.cuda(), is_neox)
        torch.cuda.synchronize()
        rotary.torch.check_positions()
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@gpu
def test_cuda_graph_replays_the_rotation():
    positions, query, key, head_size, cache = (t.cuda() if isinstance(t, torch.Tensor) else t
                                               for t in make_case(SHAPES["d64"], torch.bfloat16))
    q, k = query.clone(), key.clone()
    rotary_embedding(positions, q, k, head_size, cache, True)  # warm-up: the device's error word
    q.copy_(query), k.copy_(key)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rotary_embedding(positions, q, k, head_size, cache, True)
    q.copy_(query), k.copy_(key)
    graph.replay()
    torch.cuda.synchronize()
    want = run(rotary_embedding, positions.cpu(), query.cpu(), key.cpu(), head_size, cache.cpu(), True)
    assert torch.equal(q.cpu(), want[0]) and torch.equal(k.cpu(), want[1])
