"""rotary.torch's fused operations (issue 25): ``rope_store``, ``qk_norm_rope``, ``rerotate_cache``.

Each is checked bit for bit against its composition: rotary's own primitives (``apply_rope``,
``Rope.rerotate``) plus a scatter, a quantiser and an RMSNorm written out here from their
definitions in rotary/fused.hpp; caches pre-filled with a poison pattern (untouched slots keep it,
skipped slots are not written, nothing is written when an argument is bad). ``qk_norm_rope`` is also
checked against transformers' own modules (Qwen3, Gemma 3, OLMo 2, Llama 4) within their dtype's
rounding. Every operator compiles with ``torch.compile(fullgraph=True)``.

The quantiser is written out: torch's own casts are no reference (``.to(torch.float8_e5m2)`` turns an
overflow into inf, where the caches saturate; torch's rounding of float32 to fp8 is not documented).
Here a value is mapped to the nearest of the 256 codes' values (decoded by torch, which is exact),
ties to the even code, after saturating to the largest finite value.
"""
import math

import numpy as np
import pytest
import torch

from rotary import Rope
from rotary.torch import apply_rope, qk_norm_rope, rerotate_cache, rope_store, slots_from_page_table

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
QUANTISED = FP8 + (torch.int8,)
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---- The reference quantiser, scatter and norm -----------------------------------------------------

def _fp8_table(dtype):
    """The positive finite values of an fp8 dtype, ascending, with their codes (0 .. max code)."""
    codes = torch.arange(128, dtype=torch.uint8)
    values = codes.view(dtype).float()
    finite = torch.isfinite(values)
    return values[finite], codes[finite]


def quantise(x, dtype, scale=None, mode="divide"):
    """x (float32 values) as codes of `dtype`: scale applied in float32 (x / s or x * s; s one value or
    one per head, x [..., heads, dim]), then nearest with ties to even, saturating; NaN kept (int8: 0)."""
    x = x.float()
    if scale is not None:
        s = scale.float().reshape(-1, 1) if scale.numel() > 1 else scale.float().reshape(())
        x = x / s if mode == "divide" else x * s
    if dtype == torch.int8:
        return torch.nan_to_num(x, nan=0.0).clamp(-127, 127).round().to(torch.int8)  # round: half to even
    values, codes = _fp8_table(dtype)
    a = x.abs().clamp(max=float(values[-1]))  # saturate (inf too); NaN stays NaN
    hi = torch.searchsorted(values, a.nan_to_num(0.0).contiguous()).clamp(max=len(values) - 1)
    lo = (hi - 1).clamp(min=0)
    below, above = a - values[lo], values[hi] - a
    pick_hi = (above < below) | ((above == below) & (codes[hi] % 2 == 0))
    code = torch.where(pick_hi, codes[hi], codes[lo])
    code = torch.where(a == values[hi], codes[hi], code)
    nan_code = 0x7F if dtype == torch.float8_e4m3fn else 0x7E  # fused.hpp's NaN codes (sign kept)
    code = torch.where(torch.isnan(a), torch.full_like(code, nan_code), code)
    code = code | (torch.signbit(x).to(torch.uint8) << 7)
    return code.view(dtype)


def dequantise(code, scale=None, mode="divide"):
    x = code.float()
    if scale is None:
        return x
    s = scale.float().reshape(-1, 1) if scale.numel() > 1 else scale.float().reshape(())
    return x * s if mode == "divide" else x / s


def store(value, cache_dtype, scale=None, mode="divide"):
    """What a cache holds for a value in the data's dtype: quantised, or rounded once to the cache's dtype."""
    if cache_dtype in QUANTISED:
        return quantise(value.float(), cache_dtype, scale, mode)
    return value.to(cache_dtype)


def cache_rows(cache, kv_layout):
    """The cache as [slots, heads, dim] (a view when possible: NHD; HND is [blocks, heads, bs, dim])."""
    if cache.ndim == 3:
        return cache
    if kv_layout == "HND":
        cache = cache.transpose(1, 2)
    return cache.reshape(-1, cache.shape[2], cache.shape[3])


def scatter(cache, rows, slots, kv_layout):
    """The reference scatter: cache[slot] = rows[t] for every token with slot >= 0; returns a new cache."""
    out = cache.clone()
    view = out.transpose(1, 2) if (out.ndim == 4 and kv_layout == "HND") else out
    bs = 1 if out.ndim == 3 else view.shape[1]
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        if out.ndim == 3:
            view[slot] = rows[t]
        else:
            view[slot // bs, slot % bs] = rows[t]
    return out


def bits(t):
    return t.view(BITS[t.element_size()])


def assert_same_bits(got, want, what):
    g, w = bits(got), bits(want)
    if torch.equal(g, w):
        return
    diff = (g != w).nonzero()
    first = tuple(diff[0].tolist())
    raise AssertionError(f"{what}: {len(diff)} values differ, first at {first}: got {got[first].float()}, want "
                         f"{want[first].float()}")


def poisoned(shape, dtype, seed):
    """A cache filled with a pattern no write produces by chance: random bytes (NaN patterns included)."""
    g = torch.Generator().manual_seed(seed)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8).view(dtype).reshape(shape)


def rms_norm(x, weight, eps, weight_offset=0.0, rounding="llama", scope="head"):
    """rotary's RMSNorm as fused.hpp defines it, rounded to x's dtype: the sum of squares in double in
    order (heads in order for all_heads), mean = fl32(sum / n), r = fl32(1 / sqrt(fl32(mean + eps)))
    (sqrt and division in double), y = fl32(x * r); llama: round(y) then round(fl32(round(y) * w_eff));
    gemma: round(fl32(y * w_eff)); w_eff = fl32(weight_offset + w)."""
    shape = x.shape
    if scope == "all_heads":
        x = x.reshape(*shape[:-2], shape[-2] * shape[-1])
    xd = x.double()
    total = (xd * xd).cumsum(-1)[..., -1:]  # sequential, in order
    mean = (total / x.shape[-1]).float()
    r = (1.0 / torch.sqrt((mean + torch.tensor(eps, dtype=torch.float32)).double())).float()
    y = x.float() * r
    if weight is None:
        return y.to(x.dtype).reshape(shape)
    w_eff = torch.tensor(weight_offset, dtype=torch.float32) + weight.float()
    if rounding == "llama":
        out = (y.to(x.dtype).float() * w_eff).to(x.dtype)
    else:
        out = (y * w_eff).to(x.dtype)
    return out.reshape(shape)


# ---- rope_store ------------------------------------------------------------------------------------

def make_store_case(rope, tokens, heads, kv_heads, dtype, cache_dtype, block_size, kv_layout, seed=0, head_dim_v=None,
                    pool=False):
    g = torch.Generator().manual_seed(seed)
    d = rope.head_dim
    dv = head_dim_v or d
    q = torch.randn(tokens, heads, d, generator=g).to(dtype)
    k = torch.randn(tokens, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(tokens, kv_heads, dv, generator=g).to(dtype)
    num_blocks = 2 * tokens // block_size + 2
    capacity = num_blocks * block_size
    # Shuffled slots over the whole cache (a shuffled block table), a padding token or two.
    slots = torch.randperm(capacity, generator=g)[:tokens]
    slots[tokens // 3] = -1
    if pool:
        shape_k, shape_v = (capacity, kv_heads, d), (capacity, kv_heads, dv)
    elif kv_layout == "NHD":
        shape_k, shape_v = (num_blocks, block_size, kv_heads, d), (num_blocks, block_size, kv_heads, dv)
    else:
        shape_k, shape_v = (num_blocks, kv_heads, block_size, d), (num_blocks, kv_heads, block_size, dv)
    k_cache, v_cache = poisoned(shape_k, cache_dtype, seed + 1), poisoned(shape_v, cache_dtype, seed + 2)
    positions = torch.randint(0, 1 << 17, (tokens,), generator=g)
    positions[0] = 0
    return q, k, v, k_cache, v_cache, slots, positions


def expected_store(rope, q, k, v, k_cache, v_cache, slots, positions, kv_layout, k_scale=None, v_scale=None,
                   mode="divide", offset=0):
    """The composition: apply_rope, then the reference quantiser and scatter."""
    if positions is None:
        q_rot, k_rot = apply_rope(rope, q, k, offset=offset)
    else:
        q_rot, k_rot = apply_rope(rope, q, k, positions=positions)
    k_rows = store(k_rot, k_cache.dtype, k_scale, mode)
    v_rows = None if v is None else store(v, v_cache.dtype, v_scale, mode)
    k_want = scatter(k_cache, k_rows, slots, kv_layout)
    v_want = None if v is None else scatter(v_cache, v_rows, slots, kv_layout)
    return q_rot, k_want, v_want


def run_store(rope, q, k, v, k_cache, v_cache, slots, **kw):
    q2, k2 = q.clone(), k.clone()
    kc, vc = k_cache.clone(), None if v_cache is None else v_cache.clone()
    out = rope_store(rope, q2, k2, v, kc, vc, slots, **kw)
    assert out is q2
    assert torch.equal(bits(k2), bits(k))  # k only read
    return q2, kc, vc


def test_what_the_rows_read_may_not_lie_in_what_they_write():
    """Slots inside the k cache, positions inside q (rotated in place), deltas inside the cache they
    move: a later token would read what an earlier one wrote (a slot sending keys elsewhere, a
    position turning by another angle). Each is refused naming both; nothing is written."""
    rope = Rope(64)
    q, k, v, k_cache, v_cache, slots, positions = make_store_case(rope, 5, 2, 2, torch.bfloat16, torch.bfloat16, 16,
                                                                  "NHD", seed=7)
    in_cache = k_cache.view(-1).view(torch.int64)[:slots.numel()]
    in_cache.copy_(slots)
    in_q = q.view(-1).view(torch.int64)[:positions.numel()]
    in_q.copy_(positions)
    before = [bits(t).clone() for t in (q, k, v, k_cache, v_cache)]
    with pytest.raises(ValueError, match="k_cache overlaps slots"):
        rope_store(rope, q, k, v, k_cache, v_cache, in_cache, positions=positions)
    with pytest.raises(ValueError, match=r"q \(in place\) overlaps positions"):
        rope_store(rope, q, k, v, k_cache, v_cache, slots, positions=in_q)
    deltas = k_cache.view(-1).view(torch.int64)[slots.numel():2 * slots.numel()]
    deltas.fill_(3)
    before[3] = bits(k_cache).clone()
    with pytest.raises(ValueError, match=r"cache \(in place\) overlaps delta"):
        rerotate_cache(rope, k_cache, slots, deltas)
    for got, want in zip((q, k, v, k_cache, v_cache), before):
        assert torch.equal(bits(got), want)
    # The same arrays apart from what is written are taken.
    rope_store(rope, q.clone(), k, v, k_cache.clone(), v_cache.clone(), in_cache.clone(), positions=in_q.clone())


# (rope, heads, kv_heads), tagged with the models they stand for; head_dims 64 .. 512.
STORE_ROPES = {
    "llama-3.1-8b d128 gqa4": (lambda: Rope.from_preset("llama-3.1-8b"), 8, 2),
    "qwen2 d128 gqa7": (lambda: Rope(128, base=1e6), 7, 1),
    "gptj partial d256 r64 interleaved": (lambda: Rope(256, rotary_dim=64, pairing="interleaved"), 4, 4),
    "phi-2 partial d80 r32": (lambda: Rope(80, rotary_dim=32), 2, 2),
    "d96 yarn": (lambda: Rope(96, schedule="yarn", factor=4.0, original_max_position=4096), 4, 1),
    "d192 mla-like": (lambda: Rope(192, rotary_dim=64, pairing="interleaved"), 2, 1),
    "d64 mqa16": (lambda: Rope(64), 16, 1),
    "gemma-4 d512": (lambda: Rope(512, base=1e6), 2, 1),
}
CACHE_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "e4m3": torch.float8_e4m3fn,
                "e5m2": torch.float8_e5m2, "i8": torch.int8}


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES.values(), ids=CACHE_DTYPES.keys())
@pytest.mark.parametrize("case", STORE_ROPES.values(), ids=STORE_ROPES.keys())
def test_rope_store_equals_apply_then_quantise_and_scatter(case, cache_dtype, kv_layout):
    make_rope, heads, kv_heads = case
    rope = make_rope()
    for dtype, block_size, seed in ((torch.bfloat16, 16, 0), (torch.float16, 1, 1), (torch.float32, 64, 2)):
        q, k, v, k_cache, v_cache, slots, positions = make_store_case(rope, 11, heads, kv_heads, dtype, cache_dtype,
                                                                      block_size, kv_layout, seed)
        scale = None
        if cache_dtype in QUANTISED:
            scale = torch.tensor([0.0625 if cache_dtype == torch.int8 else 0.75])
        got = run_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions, kv_layout=kv_layout,
                        k_scale=scale, v_scale=scale)
        want = expected_store(rope, q, k, v, k_cache, v_cache, slots, positions, kv_layout, scale, scale)
        assert_same_bits(got[0], want[0], f"q {dtype}")
        assert_same_bits(got[1], want[1], f"k_cache {dtype} block_size {block_size}")
        assert_same_bits(got[2], want[2], f"v_cache {dtype} block_size {block_size}")


@pytest.mark.parametrize("mode", ["divide", "multiply"])
@pytest.mark.parametrize("cache_dtype", QUANTISED, ids=["e4m3", "e5m2", "i8"])
def test_rope_store_scales_per_tensor_and_per_head_divide_or_multiply(cache_dtype, mode):
    rope = Rope(64, pairing="interleaved")
    q, k, v, k_cache, v_cache, slots, positions = make_store_case(rope, 9, 4, 3, torch.bfloat16, cache_dtype, 16,
                                                                  "NHD", 5)
    k_scale = torch.tensor([0.3, 1.7, 0.01])  # per head: x / 0.3 and x * (1 / 0.3) differ in the last bit
    got = run_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions, k_scale=k_scale, v_scale=0.3,
                    scale_mode=mode)
    want = expected_store(rope, q, k, v, k_cache, v_cache, slots, positions, "NHD", k_scale, torch.tensor([0.3]),
                          mode)
    for name, g, w in zip(("q", "k_cache", "v_cache"), got, want):
        assert_same_bits(g, w, name)


@pytest.mark.parametrize("cache_dtype", QUANTISED, ids=["e4m3", "e5m2", "i8"])
def test_cache_codes_at_the_range_ends_saturate_round_to_even_and_keep_nan(cache_dtype):
    rope = Rope(16)
    big = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0, torch.int8: 127.0}[cache_dtype]
    tiny = {torch.float8_e4m3fn: 2.0 ** -9, torch.float8_e5m2: 2.0 ** -16, torch.int8: 0.5}[cache_dtype]
    special = torch.tensor([big, -big, big * 1.03, -big * 1.2, 1e30, -float("inf"), float("inf"), float("nan"),
                            tiny, -tiny, tiny * 0.5, tiny * 1.5, tiny * 0.49, 0.0, -0.0, 1.5])
    v = special.reshape(1, 1, 16).to(torch.float32)
    k = v.clone()  # position 0: the rotation leaves k as it is
    q = torch.zeros(1, 1, 16)
    k_cache, v_cache = poisoned((2, 4, 1, 16), cache_dtype, 3), poisoned((2, 4, 1, 16), cache_dtype, 4)
    slots = torch.tensor([5])
    got = run_store(rope, q, k, v, k_cache, v_cache, slots, positions=torch.tensor([0]))
    want = expected_store(rope, q, k, v, k_cache, v_cache, slots, torch.tensor([0]), "NHD")
    rows = cache_rows(got[2], "NHD")[5, 0]
    if cache_dtype != torch.int8:
        assert torch.isnan(rows.float()[7]) and float(rows.float()[2]) == big and float(rows.float()[5]) == -big
    want_rows = cache_rows(want[2], "NHD")[5, 0]
    assert torch.equal(bits(rows)[~torch.isnan(rows.float())], bits(want_rows)[~torch.isnan(rows.float())])
    assert torch.isnan(rows.float()).equal(torch.isnan(want_rows.float()))
    assert_same_bits(got[1], want[1], "k_cache")


def test_token_pool_contiguous_batch_cache_and_sequential_positions():
    rope = Rope(64, base=5e5)
    # SGLang's token pool [slots, kv_heads, dim] (blocks of one slot), positions from an offset.
    q, k, v, k_cache, v_cache, slots, _ = make_store_case(rope, 6, 4, 2, torch.bfloat16, torch.bfloat16, 1, "NHD", 7,
                                                          pool=True)
    got = run_store(rope, q, k, v, k_cache, v_cache, slots, offset=1000)
    want = expected_store(rope, q, k, v, k_cache, v_cache, slots, None, "NHD", offset=1000)
    for name, g, w in zip(("q", "k_cache", "v_cache"), got, want):
        assert_same_bits(g, w, name)
    # A contiguous [batch, max_seq, heads, dim] cache (transformers, ONNX Runtime): block = batch row,
    # slot = b * max_seq + s.
    k_cache, v_cache = poisoned((3, 32, 2, 64), torch.bfloat16, 1), poisoned((3, 32, 2, 64), torch.bfloat16, 2)
    slots = torch.tensor([0 * 32 + 7, 1 * 32 + 7, 2 * 32 + 7, 0 * 32 + 8, 1 * 32 + 8, 2 * 32 + 8])
    positions = torch.tensor([7, 7, 7, 8, 8, 8])
    got = run_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions)
    want = expected_store(rope, q, k, v, k_cache, v_cache, slots, positions, "NHD")
    for name, g, w in zip(("q", "k_cache", "v_cache"), got, want):
        assert_same_bits(g, w, name)


def test_mrope_streams_v_width_and_no_v():
    rope = Rope(128, base=1e6, stream_layout="sections", sections=[16, 24, 24])  # Qwen2-VL
    q, k, v, k_cache, v_cache, slots, _ = make_store_case(rope, 8, 4, 2, torch.bfloat16, torch.float8_e4m3fn, 16,
                                                          "HND", 8, head_dim_v=96)
    positions = torch.randint(0, 5000, (3, 8))
    got = run_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions, kv_layout="HND", k_scale=0.5,
                    v_scale=2.0)
    want = expected_store(rope, q, k, v, k_cache, v_cache, slots, positions, "HND", torch.tensor([0.5]),
                          torch.tensor([2.0]))
    for name, g, w in zip(("q", "k_cache", "v_cache"), got, want):
        assert_same_bits(g, w, name)
    got = run_store(rope, q, k, None, k_cache, None, slots, positions=positions, kv_layout="HND", k_scale=0.5)
    assert_same_bits(got[1], want[1], "k_cache without v")


XPOS_OFFSET_BACKWARD = {
    "xpos": lambda: Rope(64, xpos_scale_base=512),  # queries and keys scaled oppositely
    "rotated slice at an offset": lambda: Rope(128, rotary_dim=64, rotary_offset=64),  # nope-first heads
    "nanochat turns backward": lambda: Rope.from_hf_config(  # rotates_backward: pairs by -angle
        {"model_type": "nanochat", "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2,
         "max_position_embeddings": 2048, "rope_theta": 10000.0}),
}


@pytest.mark.parametrize("make_rope", XPOS_OFFSET_BACKWARD.values(), ids=XPOS_OFFSET_BACKWARD.keys())
def test_rope_store_and_qk_norm_rope_take_every_descriptor(make_rope):
    rope = make_rope()
    q, k, v, k_cache, v_cache, slots, _ = make_store_case(rope, 6, 2, 2, torch.bfloat16, torch.bfloat16, 16, "NHD",
                                                          17)
    positions = torch.tensor([0, 9, 100, 511, 1500, 3])
    got = run_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions)
    want = expected_store(rope, q, k, v, k_cache, v_cache, slots, positions, "NHD")
    for name, g, w in zip(("q", "k_cache", "v_cache"), got, want):
        assert_same_bits(g, w, name)
    qw = torch.ones(rope.head_dim).bfloat16() * 1.5
    q2, k2 = qk_norm_rope(rope, q.clone(), k.clone(), qw, None, eps=1e-6, positions=positions)
    q_want, k_want = apply_rope(rope, rms_norm(q, qw, 1e-6), rms_norm(k, None, 1e-6), positions=positions)
    assert_same_bits(q2, q_want, "q")
    assert_same_bits(k2, k_want, "k")


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=["f32 table", "bf16 table"])
def test_the_engines_cos_sin_cache_instead_of_rotarys_angles(cache_dtype):
    # vLLM's fusion pass hands the layer's cos_sin_cache [max_pos, rotary_dim] (cos half, sin half).
    rope = Rope(128, rotary_dim=64)  # partial: the table covers the rotated 64 channels
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))
    freqs = torch.outer(torch.arange(8192, dtype=torch.float), inv_freq)
    table = torch.cat((freqs.cos(), freqs.sin()), -1).to(cache_dtype)
    q, k, v, k_cache, v_cache, slots, _ = make_store_case(rope, 9, 4, 2, torch.bfloat16, torch.float8_e5m2, 16, "NHD",
                                                          18)
    positions = torch.tensor([0, 1, 8191, 4096, 17, 3, 2, 1000, 5], dtype=torch.int32)
    got = run_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions, cos_sin_cache=table)
    q_rot, k_rot = apply_rope(rope, q, k, positions=positions, cos_sin_cache=table)
    assert_same_bits(got[0], q_rot, "q")
    assert_same_bits(got[1], scatter(k_cache, store(k_rot, k_cache.dtype), slots, "NHD"), "k_cache")
    assert_same_bits(got[2], scatter(v_cache, store(v, v_cache.dtype), slots, "NHD"), "v_cache")
    qw = torch.rand(128).bfloat16() + 0.5
    q2, k2 = qk_norm_rope(rope, q.clone(), k.clone(), qw, qw, eps=1e-6, positions=positions, cos_sin_cache=table)
    q_want, k_want = apply_rope(rope, rms_norm(q, qw, 1e-6), rms_norm(k, qw, 1e-6), positions=positions,
                                cos_sin_cache=table)
    assert_same_bits(q2, q_want, "q normed")
    assert_same_bits(k2, k_want, "k normed")
    with pytest.raises(ValueError, match=r"^cos_sin_cache shape \(8192, 128\) must be \[rows, rotary_dim=64\]"):
        _untouched(rope_store, dict(rope=rope, q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, slots=slots,
                                    positions=positions, cos_sin_cache=torch.zeros(8192, 128)))
    with pytest.raises(ValueError, match=r"positions\[2\]=8192 is beyond the 8192 rows of cos_sin_cache"):
        _untouched(rope_store, dict(rope=rope, q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, slots=slots,
                                    positions=positions + 1, cos_sin_cache=table))


def test_transformers_float32_angles_as_apply_rope_takes_them():
    rope = Rope(128, base=1e6)  # Qwen2/Qwen3: one pair's float32 power differs from torch's (see Rope.apply)
    q, k, v, k_cache, v_cache, slots, positions = make_store_case(rope, 9, 4, 2, torch.bfloat16, torch.bfloat16, 16,
                                                                  "NHD", 20)
    got = run_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions, angles="hf-float32")
    q_rot, k_rot = apply_rope(rope, q, k, positions=positions, angles="hf-float32")
    assert_same_bits(got[0], q_rot, "q")
    assert_same_bits(got[1], scatter(k_cache, k_rot, slots, "NHD"), "k_cache")
    exact = run_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions)
    assert not torch.equal(exact[0], got[0])  # positions up to 2^17: float32 angles drift
    qw = torch.rand(128).bfloat16() + 0.5
    q2, k2 = qk_norm_rope(rope, q.clone(), k.clone(), qw, qw, eps=1e-6, positions=positions, angles="hf-float32")
    q_want, k_want = apply_rope(rope, rms_norm(q, qw, 1e-6), rms_norm(k, qw, 1e-6), positions=positions,
                                angles="hf-float32")
    assert_same_bits(q2, q_want, "q normed")
    assert_same_bits(k2, k_want, "k normed")
    with pytest.raises(ValueError, match="^angles='fast' must be 'exact' or 'hf-float32'"):
        rope_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions, angles="fast")


def test_rope_store_writes_through_views_of_a_fused_qkv_tensor():
    rope = Rope.from_preset("llama-3.1-8b")
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(5, (8 + 2 + 2) * 128, generator=g).bfloat16()
    original = qkv.clone()
    q, k, v = (t.unflatten(-1, (-1, 128)) for t in qkv.split([8 * 128, 2 * 128, 2 * 128], dim=-1))
    k_cache, v_cache = poisoned((4, 16, 2, 128), torch.bfloat16, 1), poisoned((4, 16, 2, 128), torch.bfloat16, 2)
    slots, positions = torch.tensor([9, 3, 60, 33, 0]), torch.tensor([100, 101, 102, 103, 104])
    want = expected_store(rope, q.clone(), k.clone(), v.clone(), k_cache, v_cache, slots, positions, "NHD")
    rope_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions)
    assert_same_bits(q, want[0], "q")
    assert_same_bits(k_cache, want[1], "k_cache")
    assert_same_bits(v_cache, want[2], "v_cache")
    assert torch.equal(qkv[:, 8 * 128:], original[:, 8 * 128:])  # k and v only read


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
def test_rope_store_takes_engines_flat_heads_q_out_and_k_out(cache_dtype):
    # vLLM's q, k, v: [tokens, heads * head_size] slices of one qkv projection; q_out in q's dtype
    # (q left alone) and k_out (the rotated k beside the cache write), against the 3-D in-place call.
    rope = Rope(128, base=1e6)
    g = torch.Generator().manual_seed(21)
    qkv = torch.randn(7, (8 + 2 + 2) * 128, generator=g).bfloat16()
    q, k, v = qkv.split([8 * 128, 2 * 128, 2 * 128], dim=-1)  # strided 2-D views
    k_cache, v_cache = poisoned((4, 16, 2, 128), cache_dtype, 5), poisoned((4, 16, 2, 128), cache_dtype, 6)
    slots, positions = torch.tensor([9, 3, -1, 60, 33, 0, 17]), torch.tensor([100, 7, 102, 4095, 103, 0, 65536])
    scale = 0.5 if cache_dtype == torch.float8_e4m3fn else None
    want_q, want_k = q.reshape(7, 8, 128).clone(), k.reshape(7, 2, 128).clone()
    want_kc, want_vc = k_cache.clone(), v_cache.clone()
    rope_store(rope, want_q, want_k, v.reshape(7, 2, 128), want_kc, want_vc, slots, positions=positions,
               k_scale=scale, v_scale=scale)
    want_k = apply_rope(rope, k.reshape(7, 2, 128), positions=positions)
    original = qkv.clone()
    q_out, k_out = torch.empty(7, 8 * 128, dtype=torch.bfloat16), torch.empty(7, 2 * 128, dtype=torch.bfloat16)
    kc, vc = k_cache.clone(), v_cache.clone()
    got = rope_store(rope, q, k, v, kc, vc, slots, positions=positions, k_scale=scale, v_scale=scale, q_out=q_out,
                     k_out=k_out)
    assert got is q_out and torch.equal(qkv, original)  # q, k and v only read
    assert_same_bits(q_out.view(7, 8, 128), want_q, "q_out")
    assert_same_bits(k_out.view(7, 2, 128), want_k, "k_out")
    assert_same_bits(kc, want_kc, "k_cache")
    assert_same_bits(vc, want_vc, "v_cache")
    # In place through the flat views: q and k (k_out=k) rotated in qkv's own memory.
    kc, vc = k_cache.clone(), v_cache.clone()
    assert rope_store(rope, q, k, v, kc, vc, slots, positions=positions, k_scale=scale, v_scale=scale, k_out=k) is q
    assert_same_bits(q.reshape(7, 8, 128), want_q, "q in place")
    assert_same_bits(k.reshape(7, 2, 128), want_k, "k in place")
    assert_same_bits(kc, want_kc, "k_cache in place")
    assert torch.equal(qkv[:, 10 * 128:], original[:, 10 * 128:])  # v only read
    # The plain call (the eager fast path): q rotated in qkv's memory, k only read.
    qkv.copy_(original)
    kc, vc = k_cache.clone(), v_cache.clone()
    assert rope_store(rope, q, k, v, kc, vc, slots, positions=positions, k_scale=scale, v_scale=scale) is q
    assert_same_bits(q.reshape(7, 8, 128), want_q, "q, plain call")
    assert torch.equal(qkv[:, 8 * 128:], original[:, 8 * 128:])
    assert_same_bits(kc, want_kc, "k_cache, plain call")
    assert_same_bits(vc, want_vc, "v_cache, plain call")


def test_qk_norm_rope_takes_engines_flat_heads():
    rope = Rope(64, base=1e6)
    g = torch.Generator().manual_seed(22)
    qkv = torch.randn(5, (4 + 2 + 2) * 64, generator=g).bfloat16()
    qw, kw = torch.randn(64, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()
    positions = torch.tensor([3, 0, 70000, 9, 4])
    want_q, want_k = (t.unflatten(-1, (-1, 64)).clone() for t in qkv.split([4 * 64, 2 * 64, 2 * 64], dim=-1)[:2])
    qk_norm_rope(rope, want_q, want_k, qw, kw, eps=1e-6, positions=positions)
    q, k, _ = qkv.split([4 * 64, 2 * 64, 2 * 64], dim=-1)
    got = qk_norm_rope(rope, q, k, qw, kw, eps=1e-6, positions=positions)
    assert got[0] is q and got[1] is k
    assert_same_bits(q.reshape(5, 4, 64), want_q, "q")
    assert_same_bits(k.reshape(5, 2, 64), want_k, "k")


@pytest.mark.parametrize("q_dtype", [torch.float8_e4m3fn, torch.int8], ids=["e4m3", "i8"])
def test_rope_store_quantised_q_out_leaves_q_alone(q_dtype):
    rope = Rope(128, base=1e6)
    q, k, v, k_cache, v_cache, slots, positions = make_store_case(rope, 7, 4, 2, torch.bfloat16, torch.float8_e4m3fn,
                                                                  16, "NHD", 15)
    q_scale = torch.tensor([0.5, 0.02, 1.0, 3.0])  # per head
    q2 = q.clone()
    q_out = torch.zeros(q.shape, dtype=q_dtype)
    kc, vc = k_cache.clone(), v_cache.clone()
    got = rope_store(rope, q2, k, v, kc, vc, slots, positions=positions, k_scale=0.5, v_scale=0.5, q_out=q_out,
                     q_scale=q_scale, scale_mode="multiply")
    assert got is q_out and torch.equal(q2, q)
    want = expected_store(rope, q, k, v, k_cache, v_cache, slots, positions, "NHD", torch.tensor([0.5]),
                          torch.tensor([0.5]), "multiply")
    assert_same_bits(q_out, quantise(want[0].float(), q_dtype, q_scale, "multiply"), "q_out")
    assert_same_bits(kc, want[1], "k_cache")
    assert_same_bits(vc, want[2], "v_cache")


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
def test_mla_row_kv_c_beside_the_rotated_k_pe(cache_dtype):
    # DeepSeek-V3: one shared latent head, kv_c (512, not rotated) and k_pe (64, interleaved, YaRN) in
    # one cache row [num_blocks, block_size, 576]; 16 query heads of q_pe here.
    rope = Rope(64, pairing="interleaved", schedule="yarn", factor=40.0, original_max_position=4096, mscale=1.0,
                mscale_all_dim=1.0)
    g = torch.Generator().manual_seed(16)
    tokens = 7
    q_pe = torch.randn(tokens, 16, 64, generator=g).bfloat16()
    k_pe = torch.randn(tokens, 1, 64, generator=g).bfloat16()
    kv_c = torch.randn(tokens, 1, 512, generator=g).bfloat16()
    rows = poisoned((4, 64, 576), cache_dtype, 9)
    slots = torch.tensor([200, 3, 64, -1, 255, 0, 130])
    positions = torch.tensor([0, 1, 163839, 70000, 5, 2, 4096])
    scale = torch.tensor([0.5]) if cache_dtype == torch.float8_e4m3fn else None
    got = rows.clone()
    view = got.unsqueeze(2)  # [num_blocks, block_size, 1, 576]
    q2 = q_pe.clone()
    rope_store(rope, q2, k_pe, None, view[..., 512:], None, slots, positions=positions, k_scale=scale,
               k_pass=kv_c, k_pass_cache=view[..., :512], k_pass_scale=scale)
    q_want, k_want = apply_rope(rope, q_pe, k_pe, positions=positions)
    row_values = torch.cat((store(kv_c, cache_dtype, scale), store(k_want, cache_dtype, scale)), -1)
    want = scatter(rows.unsqueeze(2), row_values, slots, "NHD").squeeze(2)
    assert_same_bits(q2, q_want, "q_pe")
    assert_same_bits(got, want, "MLA rows")


def test_slots_from_flashinfer_page_table_address_the_pages():
    # Two requests on shuffled pages of 4 slots: request 0 holds pages [5, 2], request 1 pages [7, 0, 3].
    kv_indices = torch.tensor([5, 2, 7, 0, 3], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    batch_indices = torch.tensor([0, 0, 1, 1, 1, -1], dtype=torch.int32)
    positions = torch.tensor([6, 7, 3, 4, 9, 0], dtype=torch.int32)
    slots = slots_from_page_table(kv_indices, kv_indptr, batch_indices, positions, 4)
    want = []
    for r, p in zip(batch_indices.tolist(), positions.tolist()):  # FlashInfer's pos_enc.cuh addressing
        want.append(-1 if r < 0 else int(kv_indices[kv_indptr[r] + p // 4]) * 4 + p % 4)
    assert slots.dtype == torch.int64 and slots.tolist() == want == [10, 11, 31, 0, 13, -1]
    with pytest.raises(ValueError, match=r"position_in_request\[4\]=12 needs page 3 of request 1, which has 3 pages"):
        slots_from_page_table(kv_indices, kv_indptr, batch_indices, torch.tensor([6, 7, 3, 4, 12, 0]), 4)
    with pytest.raises(ValueError, match="block_size=0 must be >= 1"):
        slots_from_page_table(kv_indices, kv_indptr, batch_indices, positions, 0)
    with pytest.raises(TypeError, match="^kv_indptr must be an integer tensor"):
        slots_from_page_table(kv_indices, kv_indptr.float(), batch_indices, positions, 4)


def test_rope_store_takes_batch_seq_tensors_and_threads_share_a_rope():
    import threading
    rope = Rope.from_preset("llama-3.1-8b")
    # [batch, seq, heads, head_dim] (a prefill of 2 sequences), slots b * seq + s order, offset positions.
    g = torch.Generator().manual_seed(19)
    q, k, v = (torch.randn(2, 5, h, 128, generator=g).bfloat16() for h in (8, 2, 2))
    slots = torch.randperm(64, generator=g)[:10]
    k_cache, v_cache = poisoned((4, 16, 2, 128), torch.int8, 1), poisoned((4, 16, 2, 128), torch.int8, 2)
    got = run_store(rope, q, k, v, k_cache, v_cache, slots, offset=300, k_scale=0.02, v_scale=0.03)
    q_rot, k_rot = apply_rope(rope, q, k, offset=300)
    assert_same_bits(got[0], q_rot, "q")
    k_rows = store(k_rot.reshape(10, 2, 128), torch.int8, torch.tensor([0.02]))
    v_rows = store(v.reshape(10, 2, 128), torch.int8, torch.tensor([0.03]))
    assert_same_bits(got[1], scatter(k_cache, k_rows, slots, "NHD"), "k_cache")
    assert_same_bits(got[2], scatter(v_cache, v_rows, slots, "NHD"), "v_cache")
    # Eight threads, one Rope, their own caches (the kernel runs with the GIL released): the same bits.
    results = [None] * 8

    def work(i):
        results[i] = run_store(rope, q, k, v, k_cache, v_cache, slots, offset=300, k_scale=0.02, v_scale=0.03)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(r, got))


def test_meta_tensors_alone_give_shapes_only():
    rope = Rope(64)
    meta = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, dtype=dtype, device="meta")  # noqa: E731
    rope_store(rope, meta(3, 4, 64), meta(3, 2, 64), meta(3, 2, 64), meta(2, 4, 2, 64, dtype=torch.float8_e4m3fn),
               meta(2, 4, 2, 64, dtype=torch.float8_e4m3fn), meta(3, dtype=torch.int64), k_scale=0.5)
    qk_norm_rope(rope, meta(3, 4, 64), meta(3, 2, 64), meta(64), meta(64), eps=1e-6)
    rerotate_cache(rope, meta(2, 4, 2, 64), meta(3, dtype=torch.int64), meta(3, dtype=torch.int64))


# ---- rope_store: bad input, nothing written --------------------------------------------------------

def _store_args(**change):
    rope = Rope(64)
    q, k, v, k_cache, v_cache, slots, positions = make_store_case(rope, 6, 4, 2, torch.bfloat16, torch.float8_e4m3fn,
                                                                  4, "NHD", 11)
    args = dict(rope=rope, q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, slots=slots, positions=positions,
                k_scale=0.5, v_scale=0.5)
    args.update(change)
    return args


STORE_BAD_TYPES = {
    "rope": (dict(rope="llama"), "^rope must be a rotary.Rope, got str"),
    "q": (dict(q=[1.0]), "^q must be a torch.Tensor, got list"),
    "slots float": (dict(slots=torch.zeros(6)), "^slots must be an int64 or int32 tensor, got dtype torch.float32"),
    "cache dtype": (dict(k_cache=torch.zeros(3, 4, 2, 64, dtype=torch.int16)), "^k_cache dtype must be"),
    "kv_layout": (dict(kv_layout=1), "^kv_layout must be a str, got int"),
    "k_scale": (dict(k_scale="0.5"), "^k_scale must be a number, got str"),
    "offset": (dict(offset=1.5, positions=None), "^offset must be an int, got float"),
    "q int": (dict(q=torch.zeros(6, 4, 64, dtype=torch.int32)), "^q dtype must be float32"),
    "q_out f16": (dict(q_out=torch.zeros(6, 4, 64, dtype=torch.float16)),
                  r"^q_out dtype must be q's \(torch.bfloat16: q rotated out of place\) or float8_e4m3fn"),
    "k_out f32": (dict(k_out=torch.zeros(6, 2, 64)), r"^k_out dtype must be k's \(torch.bfloat16\), got torch.float32"),
    "k_out list": (dict(k_out=[0.0]), "^k_out must be a torch.Tensor or None, got list"),
    # bytes where a str is asked for (the extension's string arguments would take them)
    "scale_mode bytes": (dict(scale_mode=b"divide"), "^scale_mode must be a str, got bytes"),
    "kv_layout array": (dict(kv_layout=np.array("NHD")), "^kv_layout must be a str, got ndarray"),
    "numerics bytes": (dict(numerics=b"exact"), "^numerics must be a str, got bytes"),
    "check_duplicate_slots int": (dict(check_duplicate_slots=1), "^check_duplicate_slots must be a bool, got int"),
}

STORE_BAD_VALUES = {
    "duplicate slot": (dict(slots=torch.tensor([3, 7, 3, -1, 0, 1])), r"slots\[2\]=3 repeats slots\[0\]"),
    # the CPU checks every call's slots: the device's opt-in check changes nothing here
    "duplicate slot, check asked": (dict(slots=torch.tensor([3, 7, 3, -1, 0, 1]), check_duplicate_slots=True),
                                    r"slots\[2\]=3 repeats slots\[0\]"),
    "slot beyond": (dict(slots=torch.tensor([3, 7, 20, -1, 0, 1])),
                    r"slots\[2\]=20 is beyond k_cache's capacity 20 \(num_blocks=5 \* block_size=4\)"),
    "slots count": (dict(slots=torch.tensor([3, 7])), "slots has 2 entries"),
    "scale zero": (dict(k_scale=0.0), r"k_scale\[0\]=0 must be finite and > 0"),
    "scale count": (dict(v_scale=torch.tensor([1.0, 2.0, 3.0])), "v_scale count=3 must be 1"),
    "scale on bf16": (dict(k_cache=torch.zeros(16, 4, 2, 64, dtype=torch.bfloat16)), "k_scale is set but the dtype "
                                                                                     "is bf16"),
    "cache heads": (dict(k_cache=torch.zeros(16, 4, 3, 64, dtype=torch.float8_e4m3fn)), "k_cache.heads=3"),
    "cache head_dim": (dict(v_cache=torch.zeros(16, 4, 2, 32, dtype=torch.float8_e4m3fn)), "v_cache.head_dim=32"),
    "v without v_cache": (dict(v_cache=None), "v is set but v_cache is not"),
    "kv_layout": (dict(kv_layout="NDH"), "^kv_layout='NDH' must be 'NHD' or 'HND'"),
    "scale_mode": (dict(scale_mode="times"), "^scale_mode='times' must be 'divide' or 'multiply'"),
    "position": (dict(positions=torch.tensor([0, 1, 2, -3, 4, 5])), r"positions\[3\]=-3"),
    "offset with positions": (dict(offset=4), "^offset=4 is for sequential positions only"),
    "q 2-D width": (dict(q=torch.zeros(6, 250, dtype=torch.bfloat16)),
                    r"^q width=250 must be a multiple of head_dim=64 \(\[tokens, heads \* head_dim\]\)"),
    "q 1-D": (dict(q=torch.zeros(6, dtype=torch.bfloat16)), "^q must have 3 dimensions"),
    "k 1-D with a flat v": (dict(k=torch.zeros(6, dtype=torch.bfloat16), v=torch.zeros(6, 128, dtype=torch.bfloat16)),
                            "^k must have 3 dimensions"),
    "v 2-D width": (dict(v=torch.zeros(6, 129, dtype=torch.bfloat16)),
                    "^v width=129 must be a multiple of k's heads=2"),
    "q_scale with a bf16 q_out": (dict(q_out=torch.zeros(6, 4, 64, dtype=torch.bfloat16), q_scale=0.5),
                                  "^q_scale is given without a quantised q_out"),
    "k_out shape": (dict(k_out=torch.zeros(6, 3, 64, dtype=torch.bfloat16)), r"^k_out shape .* differs from k shape"),
    "q head_dim": (dict(q=torch.zeros(6, 4, 32, dtype=torch.bfloat16)), "head_dim=32"),
    "meta": (dict(v=torch.zeros(6, 2, 64, dtype=torch.bfloat16, device="meta")), "^v is on meta but"),
    "requires grad": (dict(q=torch.zeros(6, 4, 64, requires_grad=True)), "^q requires grad"),
    "q_scale without q_out": (dict(q_scale=0.5), "^q_scale is given without a quantised q_out"),
    "q_out shape": (dict(q_out=torch.zeros(6, 4, 32, dtype=torch.float8_e4m3fn)), "q_out shape"),
}


def _untouched(fn, args, mode=False):
    from torch.utils.flop_counter import FlopCounterMode
    tensors = {n: t for n, t in args.items() if isinstance(t, torch.Tensor) and t.device.type != "meta"}
    before = {n: bits(t.detach()).clone() for n, t in tensors.items()}
    try:
        if mode:
            with FlopCounterMode(display=False):  # through the operator
                fn(**args)
        else:
            fn(**args)
    finally:
        for n, t in tensors.items():
            assert torch.equal(bits(t.detach()), before[n]), f"{n} was written"


def _scales_as(args, scales):
    """The call's float scales as float32 tensors (scales="tensor": a call the eager fast path takes,
    so a bad value raises there first, then on the general path, which names it)."""
    if scales == "tensor":
        for name in ("k_scale", "v_scale"):
            if type(args.get(name)) is float:
                args[name] = torch.tensor([args[name]])
    return args


@pytest.mark.parametrize("scales", ["float", "tensor"])
@pytest.mark.parametrize("through_operator", [False, True], ids=["direct", "operator"])
@pytest.mark.parametrize("case", STORE_BAD_TYPES.values(), ids=STORE_BAD_TYPES.keys())
def test_rope_store_wrong_kinds_raise_type_error_naming_the_argument(case, through_operator, scales):
    change, message = case
    with pytest.raises(TypeError, match=message):
        _untouched(rope_store, _scales_as(_store_args(**change), scales), through_operator)


@pytest.mark.parametrize("scales", ["float", "tensor"])
@pytest.mark.parametrize("through_operator", [False, True], ids=["direct", "operator"])
@pytest.mark.parametrize("case", STORE_BAD_VALUES.values(), ids=STORE_BAD_VALUES.keys())
def test_rope_store_bad_values_raise_value_error_and_write_nothing(case, through_operator, scales):
    change, message = case
    with pytest.raises(ValueError, match=message):
        _untouched(rope_store, _scales_as(_store_args(**change), scales), through_operator)


# ---- the eager fast path -----------------------------------------------------------------------------

def _refuse_the_general_path(monkeypatch):
    import rotary.torch.fused as fused

    def refuse(*args, **kwargs):
        raise AssertionError("the call took the general path")
    monkeypatch.setattr(fused, "_rope_store_kernel", refuse)
    monkeypatch.setattr(fused, "_qk_norm_rope_kernel", refuse)


def test_engine_shaped_eager_calls_take_the_fast_path(monkeypatch):
    """What an engine passes each step (packed q, k, v; a paged NHD cache or a token pool; int64 or int32
    slots; tensor scales; per-token positions or none) goes straight to the extension, and gives the
    composition's bits."""
    rope = Rope.from_preset("llama-3.1-8b")
    cases = []
    for tokens, cache_dtype, pool, slot_dtype in ((1, torch.bfloat16, False, torch.int64),
                                                  (7, torch.float8_e4m3fn, False, torch.int32),
                                                  (5, torch.bfloat16, True, torch.int64)):
        q, k, v, kc, vc, slots, positions = make_store_case(rope, tokens, 8, 2, torch.bfloat16, cache_dtype, 4, "NHD",
                                                            tokens, pool=pool)
        scale = torch.tensor([0.25]) if cache_dtype in QUANTISED else None
        kv = "NHD"
        cases.append((q, k, v, kc, vc, slots.to(slot_dtype), positions, scale, kv))
    wants = [expected_store(rope, q, k, v, kc, vc, slots.long(), positions, kv, scale, scale)
             for q, k, v, kc, vc, slots, positions, scale, kv in cases]
    norm_rope = Rope(128, base=1e6)
    nq, nk, qw, kw, npos = make_norm_case(norm_rope, 8, 2, torch.bfloat16, "head", 5)
    norm_want = apply_rope(norm_rope, rms_norm(nq, qw, 1e-6), rms_norm(nk, kw, 1e-6), positions=npos)
    _refuse_the_general_path(monkeypatch)
    for (q, k, v, kc, vc, slots, positions, scale, kv), (q_want, k_want, v_want) in zip(cases, wants):
        q2, kc2, vc2 = run_store(rope, q, k, v, kc, vc, slots, positions=positions, k_scale=scale, v_scale=scale)
        assert_same_bits(q2, q_want, "q")
        assert_same_bits(kc2, k_want, "k_cache")
        assert_same_bits(vc2, v_want, "v_cache")
    q2, k2 = nq.clone(), nk.clone()
    qk_norm_rope(norm_rope, q2, k2, qw, kw, eps=1e-6, positions=npos)
    assert_same_bits(q2, norm_want[0], "q")
    assert_same_bits(k2, norm_want[1], "k")
    q3, k3 = nq.clone(), nk.clone()  # a model's weights: Parameters (requiring grad, only read)
    qk_norm_rope(norm_rope, q3, k3, torch.nn.Parameter(qw.clone()), torch.nn.Parameter(kw.clone()), eps=1e-6,
                 positions=npos)
    assert_same_bits(q3, norm_want[0], "q")
    assert_same_bits(k3, norm_want[1], "k")


FAST_PATH_DECLINES = {
    # name: what changes a fast-path call into one the extension does not take as it is
    # strided views over memory whose neighbours are valid too (a skip, position 0): read as if
    # contiguous they would give other bits, not an error
    "strided slots": lambda a: dict(slots=torch.stack([a["slots"], torch.full_like(a["slots"], -1)], 1)[:, 0]),
    "float scales": lambda a: dict(k_scale=0.25, v_scale=0.25),
    "float64 scale tensor": lambda a: dict(k_scale=torch.tensor([0.25], dtype=torch.float64)),
    "strided positions": lambda a: dict(positions=torch.stack([a["positions"], 0 * a["positions"]], 1)[:, 0]),
    "HND": lambda a: dict(k_cache=a["k_cache"].transpose(1, 2).contiguous(),
                          v_cache=a["v_cache"].transpose(1, 2).contiguous(), kv_layout="HND"),
}


@pytest.mark.parametrize("change", FAST_PATH_DECLINES.values(), ids=FAST_PATH_DECLINES.keys())
def test_calls_the_fast_path_declines_give_its_bits(change):
    """A call the eager fast path does not take as it is (the extension refuses it before writing)
    goes the general path, which converts it: the same bits as the fast path's call."""
    rope = Rope(64)
    q, k, v, kc, vc, slots, positions = make_store_case(rope, 6, 4, 2, torch.bfloat16, torch.float8_e4m3fn, 4, "NHD", 3)
    base = dict(slots=slots, positions=positions, k_scale=torch.tensor([0.25]), v_scale=torch.tensor([0.25]),
                k_cache=kc, v_cache=vc)
    want = run_store(rope, q, k, v, kc, vc, slots, positions=positions, k_scale=base["k_scale"],
                     v_scale=base["v_scale"])
    args = dict(base, **change(base))
    q2, kc2, vc2 = run_store(rope, q, k, v, args.pop("k_cache"), args.pop("v_cache"), args.pop("slots"), **args)
    if args.get("kv_layout") == "HND":  # back to NHD order
        kc2, vc2 = kc2.transpose(1, 2), vc2.transpose(1, 2)
    assert_same_bits(q2, want[0], "q")
    assert_same_bits(kc2.contiguous(), want[1], "k_cache")
    assert_same_bits(vc2.contiguous(), want[2], "v_cache")
    w = (1 + 0.1 * torch.randn(64, generator=torch.Generator().manual_seed(4))).to(torch.bfloat16)
    qw = torch.stack([w, w], 1)[:, 0]  # a strided weight
    assert not qw.is_contiguous()
    q2, k2, q3, k3 = q.clone(), k.clone(), q.clone(), k.clone()
    qk_norm_rope(rope, q2, k2, qw, None, eps=1e-6, positions=positions)
    qk_norm_rope(rope, q3, k3, qw.contiguous(), None, eps=1e-6, positions=positions)
    assert_same_bits(q2, q3, "q")
    assert_same_bits(k2, k3, "k")


# ---- qk_norm_rope: the composition -----------------------------------------------------------------

NORM_CASES = {
    # name: (rope, heads, kv_heads, weight_offset, rounding, scope, order, with weights)
    "qwen3 d128": (lambda: Rope(128, base=1e6), 8, 2, 0.0, "llama", "head", "norm_rope", True),
    "gemma3 d256 1+w": (lambda: Rope(256, base=1e6), 4, 2, 1.0, "gemma", "head", "norm_rope", True),
    "olmo2 all heads": (lambda: Rope(64, base=5e5), 4, 4, 0.0, "gemma", "all_heads", "norm_rope", True),
    "llama4 l2 after rope": (lambda: Rope(128, base=5e5, pairing="interleaved"), 8, 1, 0.0, "gemma", "head",
                             "rope_norm", False),
    "partial d80 r32 llama weights after rope": (lambda: Rope(80, rotary_dim=32), 2, 1, 0.0, "llama", "head",
                                                 "rope_norm", True),
    "gemma-4 d512": (lambda: Rope(512, base=1e6), 2, 1, 1.0, "gemma", "head", "norm_rope", True),
}


def make_norm_case(rope, heads, kv_heads, dtype, scope, seed, weight_dtype=None):
    g = torch.Generator().manual_seed(seed)
    d = rope.head_dim
    q = (3 * torch.randn(9, heads, d, generator=g)).to(dtype)
    k = (3 * torch.randn(9, kv_heads, d, generator=g)).to(dtype)
    n_q, n_k = (heads * d, kv_heads * d) if scope == "all_heads" else (d, d)
    wd = weight_dtype or dtype
    q_weight = (1 + 0.3 * torch.randn(n_q, generator=g)).to(wd)
    k_weight = (1 + 0.3 * torch.randn(n_k, generator=g)).to(wd)
    positions = torch.tensor([0, 1, 2, 255, 256, 4095, 70000, 1 << 20, 3])
    return q, k, q_weight, k_weight, positions


@pytest.mark.parametrize("weight_dtype", ["data", "f32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("case", NORM_CASES.values(), ids=NORM_CASES.keys())
def test_qk_norm_rope_equals_the_norm_then_apply_rope_bit_for_bit(case, dtype, weight_dtype):
    make_rope, heads, kv_heads, weight_offset, rounding, scope, order, weighted = case
    rope = make_rope()
    q, k, qw, kw, positions = make_norm_case(rope, heads, kv_heads, dtype, scope, 4,
                                             None if weight_dtype == "data" else torch.float32)
    if not weighted:
        qw = kw = None
    eps = 1e-6
    if order == "norm_rope":
        want = apply_rope(rope, rms_norm(q, qw, eps, weight_offset, rounding, scope),
                          rms_norm(k, kw, eps, weight_offset, rounding, scope), positions=positions)
    else:
        q_rot, k_rot = apply_rope(rope, q, k, positions=positions)
        want = (rms_norm(q_rot, qw, eps, weight_offset, rounding, scope),
                rms_norm(k_rot, kw, eps, weight_offset, rounding, scope))
    q2, k2 = q.clone(), k.clone()
    out = qk_norm_rope(rope, q2, k2, qw, kw, eps=eps, positions=positions, weight_offset=weight_offset, order=order,
                       scope=scope, rounding=rounding)
    assert out[0] is q2 and out[1] is k2
    assert_same_bits(q2, want[0], "q")
    assert_same_bits(k2, want[1], "k")


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
def test_qk_norm_rope_with_v_norm_and_cache_write_equals_norm_rope_then_store(cache_dtype):
    # Gemma 4's global layers: 1 + w norms of q and k, a weightless norm of v, head_dim 512.
    rope = Rope(512, base=1e6)
    q, k, qw, kw, positions = make_norm_case(rope, 2, 1, torch.bfloat16, "head", 10, torch.float32)
    v = (3 * torch.randn(9, 1, 512, generator=torch.Generator().manual_seed(2))).bfloat16()
    eps, kw_args = 1e-6, dict(weight_offset=1.0, rounding="gemma")
    q_want, k_want = apply_rope(rope, rms_norm(q, qw, eps, 1.0, "gemma"), rms_norm(k, kw, eps, 1.0, "gemma"),
                                positions=positions)
    v_want = rms_norm(v, None, eps, rounding="gemma")
    # Without a cache: q, k and v normed in place.
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    qk_norm_rope(rope, q2, k2, qw, kw, eps=eps, positions=positions, v=v2, v_norm=True, **kw_args)
    assert_same_bits(q2, q_want, "q")
    assert_same_bits(k2, k_want, "k")
    assert_same_bits(v2, v_want, "v")
    # With caches (HND, shuffled slots, one skipped): k also written, v's norm to v_cache only.
    k_cache, v_cache = poisoned((3, 1, 8, 512), cache_dtype, 5), poisoned((3, 1, 8, 512), cache_dtype, 6)
    slots = torch.tensor([17, 3, -1, 0, 22, 9, 8, 1, 16])
    scale = torch.tensor([0.25]) if cache_dtype == torch.float8_e4m3fn else None
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    kc, vc = k_cache.clone(), v_cache.clone()
    qk_norm_rope(rope, q2, k2, qw, kw, eps=eps, positions=positions, v=v2, v_norm=True, k_cache=kc, v_cache=vc,
                 slots=slots, kv_layout="HND", k_scale=scale, v_scale=scale, **kw_args)
    assert_same_bits(q2, q_want, "q")
    assert_same_bits(k2, k_want, "k")
    assert_same_bits(v2, v, "v (not written with a cache)")
    assert_same_bits(kc, scatter(k_cache, store(k_want, cache_dtype, scale), slots, "HND"), "k_cache")
    assert_same_bits(vc, scatter(v_cache, store(v_want, cache_dtype, scale), slots, "HND"), "v_cache")


# ---- qk_norm_rope against transformers' modules ----------------------------------------------------

def hf_cos_sin(rope, positions, dtype):
    """cos/sin [1, tokens, head_dim] in rotate_half form, from rotary's exact float32 table (so that only
    the norm and the rotation's arithmetic are compared), cast to the data's dtype as transformers does."""
    cos, sin = (torch.from_numpy(t) for t in rope.table(positions))
    return torch.cat((cos, cos), -1)[None].to(dtype), torch.cat((sin, sin), -1)[None].to(dtype)


def pair_scale(x, rotary_dim, interleaved):
    """|x1| + |x2| of the pair each channel of the rotated slice belongs to (the rotation's error unit)."""
    x = x.double()[..., :rotary_dim]
    if interleaved:
        s = x[..., 0::2].abs() + x[..., 1::2].abs()
        return s.repeat_interleave(2, -1)
    h = rotary_dim // 2
    s = x[..., :h].abs() + x[..., h:].abs()
    return torch.cat((s, s), -1)


UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}


def assert_within_rounding(got, want, normed, rotary_dim, interleaved, dtype, units, what):
    """|got - want| <= units * u * (|x1| + |x2|) over the rotated channels (x the normed pair), and
    <= units * u * |x| + one rounding elsewhere."""
    scale = pair_scale(normed, rotary_dim, interleaved)
    err = (got.double() - want.double()).abs()
    rot = err[..., :rotary_dim] / (scale * UNIT[dtype])
    tail = err[..., rotary_dim:] / (normed.double()[..., rotary_dim:].abs().clamp(min=1e-30) * UNIT[dtype])
    worst = max(float(rot.max()), float(tail.max()) if tail.numel() else 0.0)
    assert worst <= units, f"{what}: {worst:.2f} units of {UNIT[dtype]:g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_qwen3_q_norm_then_rope_as_transformers(dtype):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb
    rope = Rope(128, base=1e6)  # Qwen3-8B: head_dim 128, rope_theta 1e6, rms_norm_eps 1e-6
    q, k, qw, kw, positions = make_norm_case(rope, 8, 2, dtype, "head", 5)
    q_norm, k_norm = Qwen3RMSNorm(128, eps=1e-6).to(dtype), Qwen3RMSNorm(128, eps=1e-6).to(dtype)
    with torch.no_grad():
        q_norm.weight.copy_(qw), k_norm.weight.copy_(kw)
        cos, sin = hf_cos_sin(rope, positions, dtype)
        # transformers: q_norm(q.view(b, s, h, d)).transpose(1, 2), then apply_rotary_pos_emb.
        qn, kn = q_norm(q[None]), k_norm(k[None])
        want_q, want_k = apply_rotary_pos_emb(qn.transpose(1, 2), kn.transpose(1, 2), cos, sin)
    got_q, got_k = qk_norm_rope(rope, q.clone(), k.clone(), qw, kw, eps=1e-6, positions=positions)
    assert_within_rounding(got_q, want_q.transpose(1, 2)[0], qn[0], 128, False, dtype, 6, "q")
    assert_within_rounding(got_k, want_k.transpose(1, 2)[0], kn[0], 128, False, dtype, 6, "k")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_gemma3_one_plus_w_norm_then_rope_as_transformers(dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm, apply_rotary_pos_emb
    rope = Rope(256, base=1e6)  # Gemma-3 global layers: head_dim 256
    q, k, qw, kw, positions = make_norm_case(rope, 4, 2, dtype, "head", 6)
    qw, kw = qw - 1, kw - 1  # Gemma stores w, applies 1 + w
    q_norm, k_norm = Gemma3RMSNorm(256, eps=1e-6), Gemma3RMSNorm(256, eps=1e-6)  # float32 weights
    with torch.no_grad():
        q_norm.weight.copy_(qw.float()), k_norm.weight.copy_(kw.float())
        cos, sin = hf_cos_sin(rope, positions, dtype)
        qn, kn = q_norm(q[None]), k_norm(k[None])
        want_q, want_k = apply_rotary_pos_emb(qn.transpose(1, 2), kn.transpose(1, 2), cos, sin)
    got_q, got_k = qk_norm_rope(rope, q.clone(), k.clone(), qw.float(), kw.float(), eps=1e-6, positions=positions,
                                weight_offset=1.0, rounding="gemma")
    assert_within_rounding(got_q, want_q.transpose(1, 2)[0], qn[0], 256, False, dtype, 6, "q")
    assert_within_rounding(got_k, want_k.transpose(1, 2)[0], kn[0], 256, False, dtype, 6, "k")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_olmo2_norm_over_all_heads_then_rope_as_transformers(dtype):
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm, apply_rotary_pos_emb
    rope = Rope(64, base=5e5)
    heads, kv_heads = 4, 4
    q, k, qw, kw, positions = make_norm_case(rope, heads, kv_heads, dtype, "all_heads", 7)
    q_norm, k_norm = Olmo2RMSNorm(heads * 64, eps=1e-6).to(dtype), Olmo2RMSNorm(kv_heads * 64, eps=1e-6).to(dtype)
    with torch.no_grad():
        q_norm.weight.copy_(qw), k_norm.weight.copy_(kw)
        cos, sin = hf_cos_sin(rope, positions, dtype)
        # transformers: q_norm(q_proj(x)) over heads * head_dim, then the head split.
        qn = q_norm(q.reshape(1, 9, heads * 64)).view(1, 9, heads, 64)
        kn = k_norm(k.reshape(1, 9, kv_heads * 64)).view(1, 9, kv_heads, 64)
        want_q, want_k = apply_rotary_pos_emb(qn.transpose(1, 2), kn.transpose(1, 2), cos, sin)
    got_q, got_k = qk_norm_rope(rope, q.clone(), k.clone(), qw, kw, eps=1e-6, positions=positions, scope="all_heads",
                                rounding="gemma")
    assert_within_rounding(got_q, want_q.transpose(1, 2)[0], qn[0], 64, False, dtype, 6, "q")
    assert_within_rounding(got_k, want_k.transpose(1, 2)[0], kn[0], 64, False, dtype, 6, "k")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_llama4_rope_then_l2_norm_as_transformers(dtype):
    from transformers.models.llama4.modeling_llama4 import Llama4TextL2Norm, apply_rotary_emb
    rope = Rope(128, base=5e5, pairing="interleaved")  # Llama 4: complex (interleaved) pairs
    q, k, _, _, positions = make_norm_case(rope, 8, 1, dtype, "head", 8)
    norm = Llama4TextL2Norm(eps=1e-5)
    cos, sin = (torch.from_numpy(t) for t in rope.table(positions))
    freqs_cis = torch.complex(cos, sin)[None]  # [1, tokens, head_dim/2]
    with torch.no_grad():
        q_rot, k_rot = apply_rotary_emb(q[None], k[None], freqs_cis)  # float32 complex product, cast back
        want_q, want_k = norm(q_rot)[0], norm(k_rot)[0]
    got_q, got_k = qk_norm_rope(rope, q.clone(), k.clone(), None, None, eps=1e-5, positions=positions,
                                order="rope_norm", rounding="gemma")
    # The norm of rotated values: the rotation's rounding (in the data's dtype, once) scaled by the
    # norm, plus the norm's own rounding.
    assert_within_rounding(got_q, want_q, want_q, 128, True, dtype, 6, "q")
    assert_within_rounding(got_k, want_k, want_k, 128, True, dtype, 6, "k")


# ---- qk_norm_rope: bad input -----------------------------------------------------------------------

def _norm_args(**change):
    rope = Rope(64)
    q, k, qw, kw, positions = make_norm_case(rope, 4, 2, torch.bfloat16, "head", 9)
    args = dict(rope=rope, q=q, k=k, q_weight=qw, k_weight=kw, eps=1e-6, positions=positions)
    args.update(change)
    return args


NORM_BAD = {
    "eps kind": (TypeError, dict(eps="1e-6"), "^eps must be a number, got str"),
    "order": (ValueError, dict(order="rope_then_norm"), "^order='rope_then_norm' must be 'norm_rope' or 'rope_norm'"),
    "scope": (ValueError, dict(scope="all"), "^scope='all' must be 'head' or 'all_heads'"),
    "rounding": (ValueError, dict(rounding="f32"), "^rounding='f32' must be 'llama' or 'gemma'"),
    "eps negative": (ValueError, dict(eps=-1.0), "eps=-1 must be finite and >= 0"),
    "weight count": (ValueError, dict(q_weight=torch.ones(32, dtype=torch.bfloat16)), "q_weight.count=32"),
    "weight dtype": (ValueError, dict(k_weight=torch.ones(64, dtype=torch.float16)), "k_weight.dtype=f16"),
    "f64 data": (ValueError, dict(q=torch.zeros(9, 4, 64, dtype=torch.float64), k=None, k_weight=None),
                 "qk_norm_rope takes f32, f16 or bf16 data"),
    "positions count": (ValueError, dict(positions=torch.arange(4)), "positions"),
    "q_weight kind": (TypeError, dict(q_weight=[1.0]), "^q_weight must be a torch.Tensor or None, got list"),
    "v_norm kind": (TypeError, dict(v_norm=1), "^v_norm must be a bool, got int"),
    "cache without slots": (ValueError, dict(k_cache=torch.zeros(4, 8, 2, 64, dtype=torch.bfloat16)),
                            "^k_cache is given without slots"),
    "slots without cache": (ValueError, dict(slots=torch.arange(9)), "^slots is given without k_cache"),
    "duplicate slot": (ValueError, dict(k_cache=torch.zeros(4, 8, 2, 64, dtype=torch.bfloat16),
                                        slots=torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 0])), r"slots\[8\]=0 repeats"),
    "v without norm or cache": (ValueError, dict(v=torch.zeros(9, 2, 64, dtype=torch.bfloat16)),
                                "^v is given but neither v_norm=True nor k_cache"),
    # checked without a cache too (the extension reads them only with one)
    "scale_mode without cache": (ValueError, dict(scale_mode="bogus"), "^scale_mode='bogus' must be 'divide' or"),
    "k_scale without cache": (ValueError, dict(k_scale=torch.ones(2, 2)), "^k_scale must have 0 or 1 dimension"),
    "v_scale kind without cache": (TypeError, dict(v_scale=torch.ones(2, dtype=torch.int32)),
                                   "^v_scale must be a float or a floating-point tensor"),
    "order bytes": (TypeError, dict(order=b"norm_rope"), "^order must be a str, got bytes"),
    "numerics bytes": (TypeError, dict(numerics=b"exact"), "^numerics must be a str, got bytes"),
}


@pytest.mark.parametrize("through_operator", [False, True], ids=["direct", "operator"])
@pytest.mark.parametrize("case", NORM_BAD.values(), ids=NORM_BAD.keys())
def test_qk_norm_rope_bad_input_is_named_and_writes_nothing(case, through_operator):
    error, change, message = case
    with pytest.raises(error, match=message):
        _untouched(qk_norm_rope, _norm_args(**change), through_operator)


# ---- rerotate_cache ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES.values(), ids=CACHE_DTYPES.keys())
def test_rerotate_cache_equals_gather_dequantise_rerotate_quantise_scatter(cache_dtype, kv_layout):
    rope = Rope(128, schedule="yarn", factor=4.0, original_max_position=8192)  # a factor the keys carry once
    assert rope.attention_factor != 1.0
    _, _, _, k_cache, _, slots, _ = make_store_case(rope, 10, 1, 2, torch.bfloat16, cache_dtype, 16, kv_layout, 12)
    # Keys without NaN (a NaN's payload is no rotation's to keep); the poison's role is played by the
    # slots not moved, compared by bits.
    k_cache = (torch.randn(k_cache.shape, generator=torch.Generator().manual_seed(1)) * 3).to(cache_dtype)
    scale = torch.tensor([0.5, 0.25]) if cache_dtype in QUANTISED else None
    delta = torch.randint(-5000, 5000, (10,))
    got = k_cache.clone()
    rerotate_cache(rope, got, slots, delta, kv_layout=kv_layout, k_scale=scale)
    rows = cache_rows(k_cache, kv_layout)
    moved = []
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            moved.append(torch.zeros_like(rows[0]))
            continue
        x = rows[slot]
        x = dequantise(x, scale) if cache_dtype in QUANTISED else x
        # One token at a time, its own delta; the result does not depend on the keys' position (the
        # turn is delta * inv_freq), which only has to keep position + delta in range.
        x = rope.rerotate(x[None, None], int(delta[t]), positions=[[1 << 20]])[0, 0]
        moved.append(store(x, cache_dtype, scale))
    want = scatter(k_cache, torch.stack(moved), slots, kv_layout)
    assert_same_bits(got, want, "k_cache")


@pytest.mark.parametrize("model", ["llama-3.1-8b", "yarn"])
def test_rerotate_cache_by_a_constant_delta_is_within_three_roundings_of_a_fresh_rotation(model):
    # YaRN's attention factor (0.1 ln 4 + 1 = 1.139) is in the stored keys once: the move must not apply
    # it again (that would be 14% off, not three roundings).
    rope = Rope.from_preset(model) if model != "yarn" else Rope(128, schedule="yarn", factor=4.0,
                                                                original_max_position=4096)
    assert model != "yarn" or abs(rope.attention_factor - (0.1 * math.log(4.0) + 1.0)) < 1e-12
    g = torch.Generator().manual_seed(2)
    keys = torch.randn(6, 8, 128, generator=g)
    positions = torch.tensor([3, 5, 1000, 4096, 100000, 7])
    slots = torch.tensor([4, 0, 9, 2, 15, 11])
    k_cache = torch.zeros(16, 8, 128)
    rope_store(rope, torch.zeros(6, 0, 128), keys, None, k_cache, None, slots, positions=positions)
    rerotate_cache(rope, k_cache, slots, -3)
    fresh = apply_rope(rope, torch.zeros(6, 0, 128), keys, positions=positions - 3)[1]
    moved = k_cache[slots]
    # Stored once, moved once, against one fresh rotation: each within the contract 2^-23 (|a| + |b|)
    # per pair of its result, so within three of them of each other.
    half = 64
    pair = (fresh[..., :half].abs() + fresh[..., half:].abs()).repeat(1, 1, 2)
    worst = float(((moved - fresh).abs() / (pair * 2.0 ** -23)).max())
    assert worst <= 3, worst


@pytest.mark.parametrize("numerics", ["exact", "hf-float32"])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
def test_rerotate_cache_raw_keys_rotated_once_as_apply(cache_dtype, numerics):
    rope = Rope(64, pairing="interleaved", schedule="yarn", factor=2.0, original_max_position=4096)
    g = torch.Generator().manual_seed(4)
    k_cache = torch.randn(4, 8, 2, 64, generator=g).to(cache_dtype)
    slots = torch.tensor([31, 2, -1, 17])
    positions = torch.tensor([9000, 3, 0, 40])
    scale = torch.tensor([0.125]) if cache_dtype in FP8 else None
    got = k_cache.clone()
    rerotate_cache(rope, got, slots, None, positions=positions, k_scale=scale, numerics=numerics)
    rows = cache_rows(k_cache, "NHD")
    live = slots >= 0
    raw = dequantise(rows[slots[live]], scale) if scale is not None else rows[slots[live]]
    rotated = apply_rope(rope, torch.zeros(int(live.sum()), 0, 64, dtype=raw.dtype), raw,
                         positions=positions[live], numerics=numerics)[1]
    moved = torch.zeros(4, 2, 64, dtype=cache_dtype)
    moved[live] = store(rotated, cache_dtype, scale)
    assert_same_bits(got, scatter(k_cache, moved, slots, "NHD"), "k_cache")


RERO_BAD = {
    "slot twice": (ValueError, dict(slots=torch.tensor([1, 1])), r"slots\[1\]=1 repeats slots\[0\]"),
    "slot beyond": (ValueError, dict(slots=torch.tensor([1, 32])), r"slots\[1\]=32 is beyond"),
    "delta count": (ValueError, dict(delta=torch.tensor([1, 2, 3])), r"^delta shape \(3,\) must be \[slots=2\]"),
    "delta range": (ValueError, dict(delta=torch.tensor([1, 1 << 31])), r"delta\[1\]=2147483648"),
    "delta kind": (TypeError, dict(delta=1.5), "^delta must be an int, got float"),
    "positions with delta": (ValueError, dict(positions=torch.tensor([0, 1])), "^positions is for raw keys"),
    "raw without positions": (ValueError, dict(delta=None), "^delta=None rotates raw keys to positions"),
    "numerics with delta": (ValueError, dict(numerics="hf-float32"), "^numerics='hf-float32' is for raw keys"),
    "numerics word": (ValueError, dict(numerics="fast"), "^numerics='fast' must be 'exact' or 'hf-float32'"),
    "scale zero": (ValueError, dict(k_scale=0.0), r"k_scale\[0\]=0 must be finite and > 0"),
    "xpos": (ValueError, dict(rope=Rope(64, xpos_scale_base=512)), "xPos"),
    "head_dim": (ValueError, dict(rope=Rope(32)), "head_dim"),
}


@pytest.mark.parametrize("through_operator", [False, True], ids=["direct", "operator"])
@pytest.mark.parametrize("case", RERO_BAD.values(), ids=RERO_BAD.keys())
def test_rerotate_cache_bad_input_is_named_and_writes_nothing(case, through_operator):
    error, change, message = case
    args = dict(rope=Rope(64), k_cache=torch.randn(4, 8, 2, 64).to(torch.float8_e4m3fn), slots=torch.tensor([3, 7]),
                delta=torch.tensor([5, -5]), k_scale=0.5)
    args.update(change)
    with pytest.raises(error, match=message):
        _untouched(rerotate_cache, args, through_operator)


# ---- torch.library: opcheck and torch.compile ------------------------------------------------------

def test_opcheck_of_the_three_operators():
    # opcheck compares tensors with arithmetic torch lacks for float8 on the CPU: model-dtype caches here
    # (the quantised ones are the same operator; the compile test below runs them).
    rope = Rope(64, pairing="interleaved")
    q, k, v, k_cache, v_cache, slots, positions = make_store_case(rope, 6, 4, 2, torch.bfloat16, torch.bfloat16,
                                                                  4, "NHD", 13)
    torch.library.opcheck(torch.ops.rotary.rope_store.default,
                          (q, k, v, k_cache, v_cache, slots, rope._handle, positions, 0, "NHD", None, None,
                           "divide", None, None, None, None, None, None, "exact"))
    torch.library.opcheck(torch.ops.rotary.rope_store.default,  # q out of place, k_out, the duplicate check
                          (q, k, v, k_cache, v_cache, slots, rope._handle, positions, 0, "NHD", None, None,
                           "divide", torch.empty_like(q), None, None, None, None, None, "exact", True,
                           torch.empty_like(k)))
    qn, kn, qw, kw, pn = make_norm_case(rope, 4, 2, torch.bfloat16, "head", 13)
    torch.library.opcheck(torch.ops.rotary.qk_norm_rope.default,
                          (qn, kn, qw, kw, rope._handle, 1e-6, pn, 0, 0.0, "norm_rope", "head", "llama", None,
                           False, None, None, None, "NHD", None, None, "divide", None, "exact"))
    torch.library.opcheck(torch.ops.rotary.qk_norm_rope.default,  # q and k out of place
                          (qn, kn, qw, kw, rope._handle, 1e-6, pn, 0, 0.0, "norm_rope", "head", "llama", None,
                           False, None, None, None, "NHD", None, None, "divide", None, "exact", False,
                           torch.empty_like(qn), torch.empty_like(kn)))
    vn = torch.randn(9, 2, 64).bfloat16()
    pn = pn % 4096  # rows of the cos_sin_cache below
    torch.library.opcheck(torch.ops.rotary.qk_norm_rope.default,
                          (qn, kn, qw, kw, rope._handle, 1e-6, pn, 0, 1.0, "norm_rope", "head", "gemma", vn,
                           True, k_cache.bfloat16(), v_cache.bfloat16(), torch.randperm(20)[:9], "NHD", None, None,
                           "divide", torch.randn(4096, 64), "exact"))
    k_cache = torch.randn(k_cache.shape).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.rotary.rerotate_cache.default,
                          (k_cache, slots, rope._handle, torch.arange(6) - 3, None, "NHD", None, "divide"))


def decode_layer(rope, qkv, positions, slots, k_cache, v_cache, q_weight, k_weight):
    """An attention layer's prologue as an engine compiles it: split, QK-norm + RoPE, cache write."""
    q, k, v = (t.unflatten(-1, (-1, 64)) for t in qkv.split([4 * 64, 2 * 64, 2 * 64], dim=-1))
    q, k = qk_norm_rope(rope, q, k, q_weight, k_weight, eps=1e-6, positions=positions)
    rope_store(rope, q, k, v, k_cache, v_cache, slots, positions=torch.zeros_like(positions), k_scale=0.5,
               v_scale=0.5)
    rerotate_cache(rope, k_cache, slots, 1, k_scale=0.5)
    return q.float().sum(-1)


def flat_decode_layer(rope, qkv, positions, slots, k_cache, v_cache, k_out):
    """The same prologue on engines' flat [tokens, heads * d] slices, k_out beside the cache write and
    the device's duplicate check asked for (the CPU always checks)."""
    q, k, v = qkv.split([4 * 64, 2 * 64, 2 * 64], dim=-1)
    rope_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions, k_scale=0.5, v_scale=0.5, k_out=k_out,
               check_duplicate_slots=True)
    return q.float().sum(-1)


def compiled_against_eager(layer, backend, rope, positions, slots, state, extra, names):
    """``layer(rope, state[0], positions, slots, *state[1:], *extra)`` traced as one graph without a
    break, compiled with fullgraph and run on copies of ``state``: the tensors it writes and its result
    equal eager's, bit for bit. Returns the traced graph's code and eager's final state."""
    def call(st):
        return (rope, st[0], positions, slots, *st[1:], *extra)

    explained = torch._dynamo.explain(layer)(*call([t.clone() for t in state]))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    eager_state, compiled_state = [t.clone() for t in state], [t.clone() for t in state]
    want = layer(*call(eager_state))
    got = compiled(*call(compiled_state))
    for name, a, b in zip(names, eager_state, compiled_state):
        assert_same_bits(b, a, name)
    torch.testing.assert_close(got, want)
    return explained.graphs[0].code, eager_state


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_flat_slices_and_k_out_compile_with_fullgraph_and_equal_eager(backend):
    rope = Rope(64, base=1e6)
    g = torch.Generator().manual_seed(15)
    qkv = torch.randn(5, 8 * 64, generator=g).bfloat16()
    positions, slots = torch.tensor([3, 9, 100, 4000, 0]), torch.tensor([12, 0, -1, 31, 5])
    k_cache, v_cache = poisoned((4, 8, 2, 64), torch.float8_e4m3fn, 1), poisoned((4, 8, 2, 64), torch.float8_e5m2, 2)
    _, eager_state = compiled_against_eager(flat_decode_layer, backend, rope, positions, slots,
                                            [qkv, k_cache, v_cache, torch.zeros(5, 2 * 64).bfloat16()], (),
                                            ("qkv", "k_cache", "v_cache", "k_out"))
    assert not torch.equal(eager_state[3], torch.zeros(5, 2 * 64).bfloat16())  # k_out was written


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_operators_compile_with_fullgraph_and_equal_eager(backend):
    rope = Rope(64, base=1e6)
    g = torch.Generator().manual_seed(14)
    qkv = torch.randn(5, 8 * 64, generator=g).bfloat16()
    positions, slots = torch.tensor([3, 9, 100, 4000, 0]), torch.tensor([12, 0, -1, 31, 5])
    k_cache, v_cache = poisoned((4, 8, 2, 64), torch.float8_e4m3fn, 1), poisoned((4, 8, 2, 64), torch.float8_e5m2, 2)
    qw, kw = torch.rand(64, generator=g).bfloat16() + 0.5, torch.rand(64, generator=g).bfloat16() + 0.5
    code, eager_state = compiled_against_eager(decode_layer, backend, rope, positions, slots, [qkv, k_cache, v_cache],
                                               (qw, kw), ("qkv", "k_cache", "v_cache"))
    assert all(f"torch.ops.rotary.{op}" in code for op in ("qk_norm_rope", "rope_store", "rerotate_cache"))
    assert not torch.equal(bits(eager_state[1]), bits(k_cache))  # the caches were written


@pytest.mark.parametrize("with_cache", [False, True], ids=["no cache", "cache"])
def test_qk_norm_rope_q_out_and_k_out_equal_the_in_place_call(with_cache):
    rope = Rope(64, base=1e6)
    g = torch.Generator().manual_seed(23)
    q, k, v = (torch.randn(5, h, 64, generator=g).bfloat16() for h in (4, 2, 2))
    qw, kw = torch.randn(64, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()
    positions, slots = torch.tensor([3, 0, 70000, 9, 4]), torch.tensor([7, 1, -1, 30, 12])
    k_cache = poisoned((4, 8, 2, 64), torch.bfloat16, 3)
    v_cache = poisoned((4, 8, 2, 64), torch.bfloat16, 4)
    cache = dict(v=v, k_cache=k_cache.clone(), v_cache=v_cache.clone(), slots=slots) if with_cache else {}
    want_q, want_k = q.clone(), k.clone()
    qk_norm_rope(rope, want_q, want_k, qw, kw, eps=1e-6, positions=positions, **cache)
    got = dict(v=v, k_cache=k_cache.clone(), v_cache=v_cache.clone(), slots=slots) if with_cache else {}
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    before = q.clone(), k.clone()
    result = qk_norm_rope(rope, q, k, qw, kw, eps=1e-6, positions=positions, q_out=q_out, k_out=k_out, **got)
    assert result[0] is q_out and result[1] is k_out
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])  # only read
    assert_same_bits(q_out, want_q, "q_out")
    assert_same_bits(k_out, want_k, "k_out")
    if with_cache:
        assert_same_bits(got["k_cache"], cache["k_cache"], "k_cache")
        assert_same_bits(got["v_cache"], cache["v_cache"], "v_cache")
    with pytest.raises(TypeError, match=r"^k_out dtype must be k's \(torch.bfloat16\), got torch.float32"):
        qk_norm_rope(rope, q, k, qw, kw, eps=1e-6, positions=positions, k_out=torch.empty(5, 2, 64))
