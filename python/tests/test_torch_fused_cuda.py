"""rotary.torch's fused operations on CUDA tensors (issue 25): ``rope_store``, ``qk_norm_rope`` and
``rerotate_cache`` give the CPU's bits (NaNs compared as NaN), through the operators, a CUDA graph
and ``torch.compile(fullgraph=True)``; a slot beyond the cache is skipped on the device and reported
by ``check_positions``; every tensor of a call must be on one device.

The CPU side is checked against the composition of rotary's primitives in test_torch_fused.py; here
the device is checked against the CPU. Most tests need a CUDA device and rotary built with its CUDA
kernels (``rotary._rotary.cuda``); CI has neither and skips them (scripts/gpu-check runs them). The
tests at the top run everywhere.
"""
import pytest

torch = pytest.importorskip("torch")

from rotary import Rope, _rotary  # noqa: E402
from rotary.torch import check_positions, qk_norm_rope, rerotate_cache, rope_store  # noqa: E402
from rotary.torch import fused  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

HAVE_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not (HAVE_GPU and _rotary.cuda),
                         reason="needs a CUDA device and rotary built with CUDA kernels (ROTARY_CUDA=ON)")
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---- Without a GPU: the Python side of the device rule ---------------------------------------------

def test_one_device_names_the_tensor_on_another_device():
    with FakeTensorMode():
        q = torch.empty(3, 4, 64, device="cuda")
    k = torch.empty(3, 2, 64)
    if _rotary.cuda:
        with pytest.raises(ValueError, match=r"^k is on cpu but q is on cuda:0 \(rotary::rope_store takes every "
                                             r"tensor on one device\)$"):
            fused._one_device("rope_store", q=q, k=k)
    else:
        with pytest.raises(ValueError, match="^q is on cuda:0, but this rotary was built without CUDA kernels"):
            fused._one_device("rope_store", q=q, k=k)
    fused._one_device("rope_store", q=k, k=k, v=None)  # one device: nothing to say
    kinds = "CPU and CUDA tensors" if _rotary.cuda else "CPU tensors"
    with pytest.raises(ValueError, match=f"^v is on meta, but rotary::rope_store runs on {kinds} only$"):
        fused._one_device("rope_store", q=k, v=torch.empty(1, device="meta"))


# ---- On a device: the CPU's bits -------------------------------------------------------------------

def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(BITS[t.element_size()])


def assert_same(got, want, what):
    """Bit for bit, a NaN (any payload: a GPU makes canonical ones) equal to a NaN."""
    got = got.detach().cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if want.dtype.is_floating_point and want.element_size() > 1:
        nan = torch.isnan(want.float())
        assert torch.equal(torch.isnan(got.float()), nan), what
        assert torch.equal(bits(got)[~nan], bits(want)[~nan]), what
    else:  # fp8 and int8 codes: a NaN code is one code
        assert torch.equal(bits(got), bits(want)), what


def store_case(rope, tokens, heads, kv_heads, dtype, cache_dtype, block_size, seed):
    g = torch.Generator().manual_seed(seed)
    d = rope.head_dim
    q = torch.randn(tokens, heads, d, generator=g).to(dtype)
    k = torch.randn(tokens, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(tokens, kv_heads, d, generator=g).to(dtype)
    q.view(-1)[::97] = float("nan")
    num_blocks = 2 * tokens // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    slots[tokens // 3] = -1
    es = torch.empty(0, dtype=cache_dtype).element_size()
    k_cache = torch.randint(0, 256, (num_blocks, block_size, kv_heads, d * es), generator=g,
                            dtype=torch.uint8).view(cache_dtype)  # poison: random codes
    v_cache = k_cache.clone()
    positions = torch.randint(0, 1 << 17, (tokens,), generator=g)
    return q, k, v, k_cache, v_cache, slots, positions


def to(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("cache", ["same", torch.float8_e4m3fn, torch.float8_e5m2, torch.int8])
@pytest.mark.parametrize("positions_kind", ["per_token", "sequential"])
def test_rope_store_on_cuda_gives_the_cpu_bits(dtype, cache, positions_kind):
    rope = Rope.from_preset("llama-3.1-8b")
    cache_dtype = dtype if cache == "same" else cache
    q, k, v, k_cache, v_cache, slots, positions = store_case(rope, 37, 8, 2, dtype, cache_dtype, 16, seed=3)
    scale = None if cache == "same" else torch.tensor([0.05, 0.07])
    kw = dict(positions=positions) if positions_kind == "per_token" else dict(offset=4000)
    want = to("cpu", q.clone(), k_cache.clone(), v_cache.clone())
    rope_store(rope, want[0], k, v, want[1], want[2], slots, k_scale=scale, v_scale=scale, **kw)
    got = to("cuda", q, k_cache, v_cache)
    dk, dv, ds = to("cuda", k, v, slots)
    dkw = {n: t.cuda() for n, t in kw.items()} if positions_kind == "per_token" else kw
    d_scale = None if scale is None else scale.cuda()
    out = rope_store(rope, got[0], dk, dv, got[1], got[2], ds, k_scale=d_scale, v_scale=d_scale, **dkw)
    assert out is got[0]
    check_positions(0)
    for name, g_, w in zip(("q", "k_cache", "v_cache"), got, want):
        assert_same(g_, w, name)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("order", ["norm_rope", "rope_norm"])
@pytest.mark.parametrize("scope", ["head", "all_heads"])
def test_qk_norm_rope_on_cuda_gives_the_cpu_bits(dtype, order, scope):
    rope = Rope(128, base=1e6)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(19, 16, 128, generator=g).to(dtype)
    k = torch.randn(19, 4, 128, generator=g).to(dtype)
    qw = torch.randn(128 * (16 if scope == "all_heads" else 1), generator=g).to(dtype)
    kw_ = torch.randn(128 * (4 if scope == "all_heads" else 1), generator=g).to(dtype)
    positions = torch.randint(0, 1 << 16, (19,), generator=g)
    want_q, want_k = q.clone(), k.clone()
    qk_norm_rope(rope, want_q, want_k, qw, kw_, eps=1e-6, positions=positions, order=order, scope=scope)
    got_q, got_k = q.cuda(), k.cuda()
    qk_norm_rope(rope, got_q, got_k, qw.cuda(), kw_.cuda(), eps=1e-6, positions=positions.cuda(), order=order,
                 scope=scope)
    check_positions(0)
    assert_same(got_q, want_q, "q")
    assert_same(got_k, want_k, "k")


@gpu
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_rerotate_cache_on_cuda_gives_the_cpu_bits(cache_dtype):
    rope = Rope.from_preset("llama-3.1-8b")
    g = torch.Generator().manual_seed(7)
    cache = torch.randn(6, 16, 2, 128, generator=g).to(cache_dtype)
    slots = torch.randperm(96, generator=g)[:40]
    delta = torch.randint(-500, 500, (40,), generator=g)
    scale = None if cache_dtype == torch.bfloat16 else torch.tensor([0.05])
    want = cache.clone()
    rerotate_cache(rope, want, slots, delta, k_scale=scale)
    got = cache.cuda()
    rerotate_cache(rope, got, slots.cuda(), delta.cuda(), k_scale=None if scale is None else scale.cuda())
    check_positions(0)
    assert_same(got, want, "k_cache")


@gpu
def test_a_slot_beyond_the_cache_is_skipped_and_reported_on_check():
    rope = Rope(64)
    q, k = torch.randn(4, 2, 64, device="cuda"), torch.randn(4, 1, 64, device="cuda")
    cache = torch.zeros(2, 4, 1, 64, device="cuda")
    slots = torch.tensor([0, 1, 99, 2], device="cuda")  # capacity 8: slot 99 skipped on the device
    rope_store(rope, q, k, None, cache, None, slots)
    with pytest.raises(ValueError, match="slots: a slot was beyond its cache's capacity"):
        check_positions(0)
    check_positions(0)  # the word was cleared
    assert torch.count_nonzero(cache.view(8, 64).abs().sum(1)).item() == 3


@gpu
def test_a_slot_two_tokens_share_is_written_by_neither_and_reported_with_the_check():
    rope = Rope(64)
    q, k, v = torch.randn(300, 2, 64, device="cuda"), torch.randn(300, 1, 64, device="cuda"), \
        torch.randn(300, 1, 64, device="cuda")
    slots = torch.randperm(512, device="cuda")[:300]
    slots[290] = slots[3]  # shared by tokens 3 and 290 (more tokens than a block's threads)
    unique = slots.clone()
    unique[3] = unique[290] = -1
    want = [q.clone(), torch.zeros(32, 16, 1, 64, device="cuda"), torch.zeros(32, 16, 1, 64, device="cuda")]
    rope_store(rope, want[0], k, v, want[1], want[2], unique)
    got = [q.clone(), torch.zeros_like(want[1]), torch.zeros_like(want[2])]
    rope_store(rope, got[0], k, v, got[1], got[2], slots, check_duplicate_slots=True)
    with pytest.raises(ValueError, match="slots: a slot was listed twice"):
        check_positions(0)
    for g_, w in zip(got, want):
        assert torch.equal(g_.view(torch.int32), w.view(torch.int32))
    delta = torch.full((300,), 5, device="cuda")
    rerotate_cache(rope, want[1], unique, delta)
    rerotate_cache(rope, got[1], slots, delta, check_duplicate_slots=True)
    with pytest.raises(ValueError, match="slots: a slot was listed twice"):
        check_positions(0)
    assert torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))


@gpu
def test_mixed_devices_are_refused_and_nothing_written():
    rope = Rope(64)
    q, k = torch.randn(4, 2, 64, device="cuda"), torch.randn(4, 1, 64)
    cache = torch.zeros(2, 4, 1, 64, device="cuda")
    before = q.clone()
    with pytest.raises(ValueError, match="^k is on cpu but q is on cuda:0"):
        rope_store(rope, q, k, None, cache, None, torch.arange(4, device="cuda"))
    assert torch.equal(q, before) and torch.count_nonzero(cache).item() == 0


@gpu
def test_rope_store_in_a_cuda_graph_and_compiled_equal_eager():
    rope = Rope.from_preset("llama-3.1-8b")
    q, k, v, k_cache, v_cache, slots, positions = to("cuda", *store_case(rope, 8, 8, 2, torch.bfloat16,
                                                                          torch.bfloat16, 16, seed=9))
    want = [q.clone(), k_cache.clone(), v_cache.clone()]
    rope_store(rope, want[0], k, v, want[1], want[2], slots, positions=positions)
    # Warm-up on the device, then capture and replay.
    work = [q.clone(), k_cache.clone(), v_cache.clone()]
    rope_store(rope, work[0], k, v, work[1], work[2], slots, positions=positions)
    work = [q.clone(), k_cache.clone(), v_cache.clone()]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rope_store(rope, work[0], k, v, work[1], work[2], slots, positions=positions)
    graph.replay()
    torch.cuda.synchronize()
    for g_, w in zip(work, want):
        assert_same(g_, w.cpu(), "graph")

    def step(q, k, v, kc, vc, slots, positions):
        rope_store(rope, q, k, v, kc, vc, slots, positions=positions)
        return q

    compiled = torch.compile(step, fullgraph=True)
    work = [q.clone(), k_cache.clone(), v_cache.clone()]
    compiled(work[0], k, v, work[1], work[2], slots, positions)
    for g_, w in zip(work, want):
        assert_same(g_, w.cpu(), "compiled")


@gpu
def test_qk_norm_rope_and_rerotate_cache_in_a_cuda_graph_equal_the_cpu():
    rope = Rope(128, base=1e6)
    g = torch.Generator().manual_seed(31)
    q, k = torch.randn(12, 16, 128, generator=g).bfloat16(), torch.randn(12, 4, 128, generator=g).bfloat16()
    qw, kw_ = torch.randn(128, generator=g).bfloat16(), torch.randn(128, generator=g).bfloat16()
    positions = torch.randint(0, 1 << 16, (12,), generator=g)
    cache = torch.randn(4, 16, 4, 128, generator=g).bfloat16()
    slots, delta = torch.randperm(64, generator=g)[:12], torch.randint(-500, 500, (12,), generator=g)
    want = [q.clone(), k.clone(), cache.clone()]
    qk_norm_rope(rope, want[0], want[1], qw, kw_, eps=1e-6, positions=positions)
    rerotate_cache(rope, want[2], slots, delta)
    args = [t.cuda() for t in (qw, kw_, positions, slots, delta)]

    def step(work):
        qk_norm_rope(rope, work[0], work[1], args[0], args[1], eps=1e-6, positions=args[2])
        rerotate_cache(rope, work[2], args[3], args[4])

    step([t.cuda() for t in (q, k, cache)])  # warm-up on the device, then capture and replay
    work = [t.cuda() for t in (q, k, cache)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(work)
    graph.replay()
    torch.cuda.synchronize()
    check_positions(0)
    for g_, w, name in zip(work, want, ("q", "k", "k_cache")):
        assert_same(g_, w, name)


@gpu
def test_rope_store_flat_heads_q_out_and_k_out_on_cuda_give_the_cpu_bits():
    rope = Rope(128, base=1e6)
    g = torch.Generator().manual_seed(32)
    qkv = torch.randn(9, 12 * 128, generator=g).bfloat16()
    k_cache = torch.zeros(4, 16, 2, 128, dtype=torch.float8_e4m3fn)
    v_cache = torch.zeros_like(k_cache)
    slots, positions = torch.randperm(64, generator=g)[:9], torch.randint(0, 1 << 17, (9,), generator=g)

    def run(qkv, k_cache, v_cache, slots, positions):
        q, k, v = qkv.split([8 * 128, 2 * 128, 2 * 128], dim=-1)
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        rope_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions, k_scale=0.5, v_scale=0.5,
                   q_out=q_out, k_out=k_out)
        return q_out, k_out, k_cache, v_cache

    want = run(qkv, k_cache, v_cache, slots, positions)
    got = run(*(t.cuda() for t in (qkv, k_cache, v_cache, slots, positions)))
    check_positions(0)
    for g_, w, name in zip(got, want, ("q_out", "k_out", "k_cache", "v_cache")):
        assert_same(g_, w, name)


@gpu
def test_raw_keys_rotated_with_hf_float32_numerics_on_cuda_give_the_cpu_bits():
    rope = Rope(64, schedule="yarn", factor=2.0, original_max_position=4096)
    g = torch.Generator().manual_seed(33)
    cache = torch.randn(4, 8, 2, 64, generator=g).bfloat16()
    slots, positions = torch.tensor([31, 2, -1, 17]), torch.tensor([9000, 3, 0, 40])
    want = cache.clone()
    rerotate_cache(rope, want, slots, None, positions=positions, numerics="hf-float32")
    got = cache.cuda()
    rerotate_cache(rope, got, slots.cuda(), None, positions=positions.cuda(), numerics="hf-float32")
    check_positions(0)
    assert_same(got, want, "k_cache")


@gpu
def test_an_unusable_scale_tensor_on_cuda_writes_nothing_and_is_reported_on_check():
    rope = Rope(64)
    q, k = torch.randn(4, 2, 64, device="cuda"), torch.randn(4, 1, 64, device="cuda")
    cache = torch.zeros(2, 4, 1, 64, dtype=torch.float8_e4m3fn, device="cuda")
    before = q.clone()
    rope_store(rope, q, k, None, cache, None, torch.arange(4, device="cuda"),
               k_scale=torch.tensor([float("nan")], device="cuda"))
    with pytest.raises(ValueError, match=r"scales: a scale was not finite and > 0 \(nothing was written\)"):
        check_positions(0)
    assert torch.equal(q, before) and torch.count_nonzero(cache.view(torch.uint8)).item() == 0


@gpu
def test_an_unusable_raw_position_on_cuda_is_reported_and_its_keys_left():
    rope = Rope(64)
    g = torch.Generator().manual_seed(34)
    cache = torch.randn(4, 8, 2, 64, generator=g).bfloat16()
    slots, positions = torch.tensor([31, 2, 17]), torch.tensor([9000, -3, 40])
    want = cache.clone()
    rerotate_cache(rope, want, torch.tensor([31, -1, 17]), None, positions=torch.tensor([9000, 0, 40]))
    got = cache.cuda()
    rerotate_cache(rope, got, slots.cuda(), None, positions=positions.cuda())
    with pytest.raises(ValueError, match=r"positions: a per-token position was outside \[0, 2\^31\)"):
        check_positions(0)
    assert_same(got, want, "k_cache")
