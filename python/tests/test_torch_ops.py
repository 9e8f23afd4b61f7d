"""rotary.torch's operators (torch.ops.rotary.rope / rope_): opcheck, float64 gradients, the eager
path against the operator's, torch.compile without a graph break and equal to eager, modules that
deep-copy, pickle and torch.save, threads sharing a Rope and a compiled module, bad input; and the
eager overhead of a decode call, printed (``pytest -s``)."""
import copy
import gc
import pickle
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import rotary
from rotary import Rope
from rotary.torch import RotaryEmbedding, apply_rope, apply_rope_

OP, OP_ = torch.ops.rotary.rope.default, torch.ops.rotary.rope_.default


def op_args(rope, positions=None, offset=0, layout="bshd", inverse=False, angles="exact", cos=None, sin=None,
            cache=None, columns=None):
    """The operators' arguments after q and k."""
    return (rope._handle, positions, offset, layout, inverse, angles, cos, sin, cache, columns)


def mrope():
    return Rope(32, base=1e6, stream_layout="sections", sections=[4, 6, 6])  # Qwen2-VL's layout, scaled down


def hf_cos_sin(rope, positions):
    """transformers' cos/sin [batch, seq, rotary_dim] (rotate_half form), float64."""
    angle = positions[..., None].double() * torch.as_tensor(rope.inv_freq)
    emb = torch.cat([angle, angle], -1)
    return emb.cos() * rope.attention_factor, emb.sin() * rope.attention_factor


# ---- opcheck ---------------------------------------------------------------------------------------

def _opcheck_cases():
    g = torch.Generator().manual_seed(7)
    text, m = Rope(16, schedule="yarn", factor=4.0, original_max_position=64), mrope()
    cases = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        q = torch.randn(2, 3, 4, 16, generator=g).to(dtype)
        k = torch.randn(2, 3, 2, 16, generator=g).to(dtype)
        name = str(dtype).split(".")[1]
        cases[f"{name} q+k positions"] = (text, q, k, op_args(text, torch.tensor([[1, 5, 9], [0, 2, 70000]])))
        cases[f"{name} q alone, offset, inverse"] = (text, q, None, op_args(text, offset=7, inverse=True))
    q = torch.randn(2, 4, 3, 32, generator=g)
    k = torch.randn(2, 2, 3, 32, generator=g)
    cases["bhsd, M-RoPE [3, batch, seq] int32"] = (
        m, q, k, op_args(m, torch.randint(0, 999, (3, 2, 3), generator=g, dtype=torch.int32), layout="bhsd"))
    cases["on the fly, fractional [seq]"] = (text, q[..., :16], None,
                                             op_args(text, torch.tensor([0.5, 2.25, 9.0]), layout="bhsd",
                                                     angles="on_the_fly"))
    cos, sin = hf_cos_sin(text, torch.tensor([[3, 4, 5]]))
    cases["caller cos/sin"] = (text, q[..., :16].transpose(1, 2), None, op_args(text, cos=cos, sin=sin))
    return cases


OPCHECK_CASES = _opcheck_cases()


@pytest.mark.parametrize("case", OPCHECK_CASES.values(), ids=OPCHECK_CASES.keys())
def test_opcheck_out_of_place(case):
    rope, q, k, args = case
    torch.library.opcheck(OP, (q, k) + args)
    # With gradients: the autograd registration is checked as well.
    torch.library.opcheck(OP, (q.clone().requires_grad_(), None if k is None else k.clone().requires_grad_()) + args)


@pytest.mark.parametrize("case", OPCHECK_CASES.values(), ids=OPCHECK_CASES.keys())
def test_opcheck_in_place(case):
    rope, q, k, args = case
    torch.library.opcheck(OP_, (q.clone(), None if k is None else k.clone()) + args)
    q2, k2 = q.clone(), None if k is None else k.clone()
    OP_(q2, k2, *args)
    want = rope.apply(q, k, positions=args[1], offset=args[2], layout=args[3], inverse=args[4], angles=args[5],
                      cos=args[6], sin=args[7])
    for got, expected in zip((q2, k2), (want,) if k is None else want):
        assert torch.equal(got, expected)


# ---- gradients -------------------------------------------------------------------------------------

def test_gradcheck_and_gradgradcheck_in_float64():
    text, m = Rope(16, rotary_dim=12, pairing="interleaved", base=500.0), mrope()
    q = torch.randn(2, 3, 2, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 1, 16, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([[0, 7, 1 << 20], [5, 6, 70000]])  # within the cached table: quick calls
    f = lambda a, b: apply_rope(text, a, b, positions=positions)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k))
    assert torch.autograd.gradgradcheck(f, (q, k))
    # [batch, heads, seq, head_dim] views, inverse, M-RoPE streams, fractional positions, caller cos/sin.
    qm = torch.randn(1, 3, 2, 32, dtype=torch.float64).transpose(1, 2).requires_grad_()  # [b, h, s, d] view
    pm = torch.tensor([[[1, 2, 3]], [[4, 5, 6]], [[7, 8, 9.5]]])
    assert torch.autograd.gradcheck(lambda a: apply_rope(m, a, positions=pm, layout="bhsd", inverse=True), (qm,))
    cos, sin = hf_cos_sin(Rope(16), torch.tensor([[3, 4, 5], [9, 9, 9]]))
    assert torch.autograd.gradcheck(lambda a: apply_rope(Rope(16), a, cos=cos, sin=sin), (q,))


def test_backward_is_the_inverse_rotation_of_the_gradient():
    rope = Rope.from_preset("llama-3.1-8b")
    q = torch.randn(2, 5, 4, 128, requires_grad=True)
    k = torch.randn(2, 5, 2, 128, requires_grad=True)
    positions = torch.randint(0, 100000, (2, 5))
    gq, gk = torch.randn(2, 5, 4, 128), torch.randn(2, 5, 2, 128)
    oq, ok = apply_rope(rope, q, k, positions=positions)
    torch.autograd.backward((oq, ok), (gq, gk))
    want_q, want_k = rope.apply(gq, gk, positions=positions, inverse=True)
    assert torch.equal(q.grad, want_q) and torch.equal(k.grad, want_k)
    # An unused output's gradient is zeros: k alone.
    q.grad = None
    apply_rope(rope, q, k, positions=positions)[1].sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))


def test_saved_positions_changed_in_place_are_caught():
    q = torch.randn(1, 3, 2, 16, requires_grad=True)
    positions = torch.tensor([[1, 2, 3]])
    out = apply_rope(Rope(16), q, positions=positions)
    positions += 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


# ---- eager: the direct path and the operator agree -------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_direct_call_and_operator_give_identical_results(dtype):
    rope = Rope(128, base=5e5, schedule="yarn", factor=32.0, original_max_position=4096)
    q = torch.randn(3, 4, 8, 128).to(dtype)
    k = torch.randn(3, 4, 2, 128).to(dtype)
    positions = torch.randint(0, 2 ** 31 - 1, (3, 4))
    direct = apply_rope(rope, q, k, positions=positions)  # no grad: Rope.apply itself
    assert all(torch.equal(a, b) for a, b in zip(direct, rope.apply(q, k, positions=positions)))
    via_op = OP(q, k, *op_args(rope, positions))
    recorded = apply_rope(rope, q.clone().requires_grad_(), k, positions=positions)
    for a, b, c in zip(direct, via_op, recorded):
        assert torch.equal(a, b) and torch.equal(a, c.detach())
    q2, k2 = q.clone(), k.clone()
    assert apply_rope_(rope, q2, k2, positions=positions) == (q2, k2)
    q3, k3 = q.clone(), k.clone()
    OP_(q3, k3, *op_args(rope, positions))
    for a, b, c in zip(direct, (q2, k2), (q3, k3)):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_eager_calls_go_through_the_operator_only_when_recorded(monkeypatch):
    rope, q = Rope(16), torch.randn(1, 2, 2, 16)
    kernel_runs = []
    resolve = rotary.torch._rope_of_handle  # the operators' kernels resolve the handle; Rope.apply does not

    def counting(handle):
        kernel_runs.append(handle)
        return resolve(handle)

    monkeypatch.setattr(rotary.torch, "_rope_of_handle", counting)

    def through_operator(fn):
        kernel_runs.clear()
        fn()
        return bool(kernel_runs)

    assert not through_operator(lambda: apply_rope(rope, q))
    assert not through_operator(lambda: apply_rope_(rope, q))
    assert through_operator(lambda: apply_rope(rope, q.clone().requires_grad_()))  # autograd records it
    with torch.no_grad():
        assert not through_operator(lambda: apply_rope(rope, q.clone().requires_grad_()))
    with FlopCounterMode(display=False):  # a dispatch mode sees the operator
        assert through_operator(lambda: apply_rope(rope, q)) and through_operator(lambda: apply_rope_(rope, q))


def test_a_device_without_a_kernel_gets_a_clear_error():
    # The kernel a CUDA tensor dispatches to (the CUDA kernel in a build with rotary's CUDA kernels,
    # else the operators' fallback), run here on meta tensors since no GPU is at hand.
    q, k = torch.empty(1, 2, 2, 16, device="meta"), torch.empty(1, 2, 2, 16)
    keys = torch._C.DispatchKeySet("CUDA")
    for op, name in ((OP, "rope"), (OP_, "rope_")):
        cuda_kernel = torch.library.get_kernel(op, "CUDA")
        with pytest.raises(ValueError, match=rf"^q is on meta, but rotary::{name} has a kernel for CPU (and CUDA )?tensors only"):
            cuda_kernel.call_boxed(keys, q, None, *op_args(Rope(16)))
        positions = torch.zeros(2, dtype=torch.int64, device="meta")
        with pytest.raises(ValueError, match=r"^positions is on meta"):
            cuda_kernel.call_boxed(keys, k, None, *op_args(Rope(16), positions=positions))
    # apply_rope sends a tensor off the CPU to the operator: meta tensors get the fake kernel's shapes.
    out = apply_rope(Rope(16), q, q[:, :, :1])
    assert [t.device.type for t in out] == ["meta", "meta"] and out[1].shape == (1, 2, 1, 16)


# Every tensor argument of a call, on the CPU, for the meta test below: positions with (cos, sin)
# per position (rows indexed by positions), or cos_sin_cache (vLLM's [rows, rotary_dim]).
def _cpu_call_tensors(rope, with_cache):
    g = torch.Generator().manual_seed(3)
    tensors = dict(q=torch.randn(1, 3, 2, 16, generator=g), k=torch.randn(1, 3, 1, 16, generator=g),
                   positions=torch.tensor([0, 2, 5]))
    angle = torch.arange(8, dtype=torch.float64)[:, None] * torch.as_tensor(rope.inv_freq)
    if with_cache:
        tensors["cos_sin_cache"] = torch.cat([angle.cos(), angle.sin()], -1).float()
    else:
        tensors["cos"], tensors["sin"] = angle.cos().float(), angle.sin().float()
    return tensors


# How a call with one meta tensor among CPU ones reaches rotary: apply_rope/apply_rope_ (their
# eager path for plain CPU q and k, the operator otherwise), apply_rope recorded by autograd, the
# raw operators, Rope.apply.
META_CALLS = {
    "apply_rope": lambda rope, t: apply_rope(rope, t["q"], t["k"], positions=t["positions"], cos=t.get("cos"),
                                             sin=t.get("sin"), cos_sin_cache=t.get("cos_sin_cache")),
    "apply_rope autograd": lambda rope, t: apply_rope(rope, t["q"].requires_grad_(t["q"].is_floating_point()),
                                                      t["k"], positions=t["positions"], cos=t.get("cos"),
                                                      sin=t.get("sin"), cos_sin_cache=t.get("cos_sin_cache")),
    "apply_rope_": lambda rope, t: apply_rope_(rope, t["q"], t["k"], positions=t["positions"], cos=t.get("cos"),
                                               sin=t.get("sin"), cos_sin_cache=t.get("cos_sin_cache")),
    "rotary::rope": lambda rope, t: OP(t["q"], t["k"], *op_args(rope, t["positions"], cos=t.get("cos"),
                                                                sin=t.get("sin"), cache=t.get("cos_sin_cache"))),
    "rotary::rope_": lambda rope, t: OP_(t["q"], t["k"], *op_args(rope, t["positions"], cos=t.get("cos"),
                                                                  sin=t.get("sin"), cache=t.get("cos_sin_cache"))),
    "Rope.apply": lambda rope, t: rope.apply(t["q"], t["k"], positions=t["positions"], cos=t.get("cos"),
                                             sin=t.get("sin"), cos_sin_cache=t.get("cos_sin_cache")),
    "Rope.apply in place": lambda rope, t: rope.apply(t["q"], t["k"], positions=t["positions"], cos=t.get("cos"),
                                                      sin=t.get("sin"), cos_sin_cache=t.get("cos_sin_cache"),
                                                      inplace=True),
}


@pytest.mark.parametrize("call", META_CALLS.values(), ids=META_CALLS.keys())
@pytest.mark.parametrize("name", ["q", "k", "positions", "cos", "sin", "cos_sin_cache"])
def test_a_meta_tensor_among_cpu_tensors_is_refused_naming_it(call, name):
    # The dispatcher sends a call with any meta tensor to the fake kernel, which gave uninitialised
    # CPU memory out of place and left q and k unrotated in place, without an error.
    rope = Rope(16)
    tensors = _cpu_call_tensors(rope, with_cache=name == "cos_sin_cache")
    want = call(rope, {n: t.clone() for n, t in tensors.items()})  # all on the CPU: it rotates
    assert isinstance(want, (torch.Tensor, tuple, list)) or want is None
    tensors[name] = torch.empty_like(tensors[name], device="meta")
    before = {n: t.clone() for n, t in tensors.items() if not t.is_meta}
    with pytest.raises(ValueError, match=rf"^{name} (is on meta|cannot be borrowed through DLPack: .* meta)"):
        call(rope, tensors)
    for n, t in before.items():  # nothing written
        assert torch.equal(tensors[n].detach(), t), n


def test_meta_tensors_alone_give_shapes_and_outputs_on_meta_are_refused():
    rope, q = Rope(16), torch.randn(1, 3, 2, 16)
    meta = {n: torch.empty_like(t, device="meta") for n, t in _cpu_call_tensors(rope, False).items()}
    out = apply_rope(rope, meta["q"], meta["k"], positions=meta["positions"], cos=meta["cos"], sin=meta["sin"])
    assert [(t.device.type, t.shape) for t in out] == [("meta", (1, 3, 2, 16)), ("meta", (1, 3, 1, 16))]
    assert OP_(meta["q"], meta["k"], *op_args(rope, meta["positions"])) is None
    for out in (torch.empty(1, 3, 2, 16, device="meta"),):
        with pytest.raises(ValueError, match=r"^q_out .*meta"):
            rope.apply(q, out=out)
    with pytest.raises(ValueError, match=r"^k .*meta"):
        rope.rerotate(torch.empty(1, 3, 2, 16, device="meta"), 1)
    with pytest.raises(ValueError, match=r"^positions is on meta"):
        rope.rerotate(q.clone(), 1, positions=torch.zeros(3, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match=r"^positions is on meta"):
        rope.table(torch.zeros(3, dtype=torch.int64, device="meta"))


def test_plain_tensors_are_borrowed_without_their_python_dlpack_method(monkeypatch):
    # Tensor.__dlpack__ runs Python checks costing ~3 us a tensor: plain tensors take torch's exporter
    # (to_dlpack) instead; subclasses such as Parameter still go through __dlpack__.
    rope, q = Rope(16), torch.randn(1, 2, 2, 16)
    want = rope.apply(q, offset=9)

    def refuse(self, *args, **kwargs):
        raise BufferError("__dlpack__ called")

    monkeypatch.setattr(torch.Tensor, "__dlpack__", refuse)
    assert torch.equal(rope.apply(q, offset=9), want) and torch.equal(apply_rope(rope, q, offset=9), want)
    with pytest.raises(ValueError, match="q cannot be borrowed through DLPack: .*__dlpack__ called"):
        rope.apply(torch.nn.Parameter(q, requires_grad=False), offset=9)


# ---- torch.compile ---------------------------------------------------------------------------------

class Attention(torch.nn.Module):
    """A Llama-style attention block: q/k/v projections, RoPE, scaled_dot_product_attention (GQA)."""

    def __init__(self, rope, hidden=64, heads=4, kv_heads=2):
        super().__init__()
        self.rope, self.heads, self.kv_heads, self.head_dim = rope, heads, kv_heads, hidden // heads
        self.q_proj = torch.nn.Linear(hidden, heads * self.head_dim)
        self.k_proj = torch.nn.Linear(hidden, kv_heads * self.head_dim)
        self.v_proj = torch.nn.Linear(hidden, kv_heads * self.head_dim)
        self.o_proj = torch.nn.Linear(heads * self.head_dim, hidden)

    def forward(self, x, positions):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(self.rope, q, k, positions=positions)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v, is_causal=True,
                                             enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


def test_attention_block_compiles_without_graph_break_and_matches_eager():
    torch.manual_seed(0)
    block = Attention(Rope(16, base=1e6, schedule="yarn", factor=4.0, original_max_position=64))
    x = torch.randn(2, 7, 64)
    positions = torch.arange(7).expand(2, 7) + 1000
    explained = torch._dynamo.explain(block)(x, positions)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert "torch.ops.rotary.rope" in explained.graphs[0].code
    compiled = torch.compile(block, fullgraph=True)  # fullgraph: a graph break would raise
    with torch.no_grad():
        want, got = block(x, positions), compiled(x, positions)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    print(f"\ncompiled attention block vs eager: max |difference| {float((got - want).abs().max()):.3g}")
    # Training: the backward graph holds the inverse rotation; gradients match eager.
    compiled(x, positions).square().sum().backward()
    got_grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    block(x, positions).square().sum().backward()
    for got_grad, p in zip(got_grads, block.parameters()):
        torch.testing.assert_close(got_grad, p.grad, rtol=1e-5, atol=1e-5)


def test_compiled_positions_of_every_shape_and_dtype_equal_eager():
    from torch._dynamo.testing import CompileCounterWithBackend
    text, m = Rope(32, base=1e6), mrope()
    counter = CompileCounterWithBackend("aot_eager")

    @torch.compile(fullgraph=True, backend=counter)
    def rotate(rope, q, k, positions):
        return apply_rope(rope, q * 1, k, positions=positions, layout="bhsd")

    q, k = torch.randn(2, 4, 5, 32), torch.randn(2, 2, 5, 32)
    cases = [(text, torch.arange(5) + 3), (text, torch.randint(0, 2 ** 31 - 1, (2, 5))),
             (text, torch.arange(5)[None] * 1000), (text, torch.arange(5, dtype=torch.int32).expand(2, 5)),
             (text, torch.tensor([0.5, 1.5, 2.5, 1e6, 3.25])),
             (m, torch.randint(0, 500, (3, 2, 5))), (m, torch.randint(0, 500, (3, 1, 5), dtype=torch.int32))]
    for rope, positions in cases:
        got, want = rotate(rope, q, k, positions), apply_rope(rope, q, k, positions=positions, layout="bhsd")
        assert all(torch.equal(a, b) for a, b in zip(got, want)), positions
    assert counter.frame_count <= len(cases)


def test_decode_steps_do_not_recompile_for_each_offset():
    from torch._dynamo.testing import CompileCounterWithBackend
    rope = Rope.from_preset("llama-3.1-8b")
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(lambda q, k, offset: apply_rope(rope, q, k, offset=offset), fullgraph=True,
                         backend=counter)
    q, k = torch.randn(1, 1, 8, 128), torch.randn(1, 1, 2, 128)
    for offset in range(100, 110):
        got, want = step(q, k, offset), rope.apply(q, k, offset=offset)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert counter.frame_count <= 2  # the first offset, then one graph with the offset symbolic


def test_in_place_on_a_fused_qkv_view_compiles_and_matches_eager():
    rope = Rope(16, pairing="interleaved")

    def attend(qkv, positions):
        q, k, v = qkv[..., :32].unflatten(-1, (2, 16)), qkv[..., 32:48].unflatten(-1, (1, 16)), qkv[..., 48:]
        apply_rope_(rope, q, k, positions=positions)  # writes qkv through the views
        return qkv.sum(-1), v

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    qkv, positions = torch.randn(2, 5, 64), torch.randint(0, 9000, (1, 5))
    a, b = qkv.clone(), qkv.clone()
    want, got = attend(a, positions), compiled(b, positions)
    assert torch.equal(a, b) and not torch.equal(a, qkv)
    assert all(torch.equal(x, y) for x, y in zip(want, got))


@pytest.fixture(scope="module")
def compiled_embedding():
    """A model holding a RotaryEmbedding, and its torch.compile (inductor, fullgraph)."""
    model = torch.nn.Sequential()
    model.rotary = RotaryEmbedding(Rope.from_preset("llama-3.1-8b"), layout="bhsd")
    return model.rotary, torch.compile(model.rotary, fullgraph=True)


def test_rotary_embedding_compiles(compiled_embedding):
    module, compiled = compiled_embedding
    q, k = torch.randn(1, 4, 6, 128), torch.randn(1, 2, 6, 128)
    position_ids = torch.tensor([[0, 1, 8191, 8192, 131071, 2 ** 31 - 1]])
    got, want = compiled(q, k, position_ids), module(q, k, position_ids)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ---- copies ----------------------------------------------------------------------------------------

class Model(torch.nn.Module):
    def __init__(self, rope):
        super().__init__()
        self.proj = torch.nn.Linear(128, 2 * 128)
        self.rotary = RotaryEmbedding(rope, layout="bhsd")

    def forward(self, x, position_ids):
        q, k = self.proj(x).unflatten(-1, (2, 1, 128)).unbind(2)
        return self.rotary(q.transpose(1, 2), k.transpose(1, 2), position_ids)


ROPES = {
    "yarn preset with notes": lambda: Rope.from_preset("qwen2.5-7b-instruct"),
    "dynamic at seq_len": lambda: Rope.from_hf_config(
        {"hidden_size": 1024, "num_attention_heads": 8, "max_position_embeddings": 4096, "rope_theta": 1e6,
         "model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, seq_len=9000),
    "M-RoPE by hand": lambda: Rope(128, rotary_dim=96, base=1e6, stream_layout="sections", sections=[8, 20, 20]),
}


@pytest.mark.parametrize("make", ROPES.values(), ids=ROPES.keys())
def test_models_holding_rotary_modules_copy_pickle_and_save(make, tmp_path):
    model = Model(make())
    x = torch.randn(2, 3, 128)
    positions = torch.tensor([[5, 4000, 9000], [0, 1, 2 ** 30]])
    if model.rotary.rope.streams == 3:
        positions = torch.stack([positions, positions + 7, positions // 2])
    want = model(x, positions)
    torch.save(model, tmp_path / "model.pt")
    copies = [copy.deepcopy(model), pickle.loads(pickle.dumps(model)),
              torch.load(tmp_path / "model.pt", weights_only=False)]
    handles = {model.rotary.rope._handle}
    for other in copies:
        rope = other.rotary.rope
        assert rope is not model.rotary.rope and rope._handle not in handles
        handles.add(rope._handle)
        assert np.array_equal(rope.inv_freq, model.rotary.rope.inv_freq)
        assert rope.attention_factor == model.rotary.rope.attention_factor and rope.notes == model.rotary.rope.notes
        got = other(x, positions)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # A copy lives on without the original; its gradients go through the operator under its own handle.
    del model
    gc.collect()
    x.requires_grad_()
    sum(t.sum() for t in copies[0](x, positions)).backward()
    assert x.grad is not None


def test_handles_name_one_live_rope_each():
    a, b = Rope(16), Rope(16)
    assert a._handle != b._handle and rotary._rope_of_handle(a._handle) is a
    assert copy.copy(a)._handle not in (a._handle, b._handle)
    dead = Rope(16)._handle  # the Rope is gone at once: the registry holds it weakly
    gc.collect()
    with pytest.raises(ValueError, match=rf"rope handle={dead} names no live rotary.Rope"):
        OP(torch.randn(1, 1, 1, 16), None, dead, None, 0, "bshd", False, "table", None, None, None, None)
    assert "_handle" not in a.__getstate__()
    # The autograd graph keeps its Rope alive until the backward pass has run.
    q = torch.randn(1, 2, 1, 16, requires_grad=True)
    out = apply_rope(Rope(16), q, offset=3)
    gc.collect()
    out.backward(torch.ones_like(out))
    assert torch.equal(q.grad, Rope(16).apply(torch.ones_like(out), offset=3, inverse=True))


# ---- threads ---------------------------------------------------------------------------------------

def test_threads_share_a_rope_and_a_compiled_module(compiled_embedding):
    module, compiled = compiled_embedding
    rope = module.rope
    g = torch.Generator().manual_seed(3)
    jobs = []
    for i in range(12):
        s = 1 + i % 4
        q, k = torch.randn(2, 4, s, 128, generator=g), torch.randn(2, 2, s, 128, generator=g)
        # Positions far apart: the shared table grows while other threads read it.
        position_ids = torch.randint(0, 1 << (12 + i), (2, s), generator=g)
        jobs.append((q, k, position_ids, module(q, k, position_ids)))
    # Every shape compiled here, one at a time; in the threads the compiled module only runs. Its
    # calls are serialised (torch._dynamo's guard evaluation and recompilation are not thread-safe:
    # concurrent calls can report guards failing and recompile until fullgraph gives up), while
    # the direct, autograd and in-place calls on the shared Rope run concurrently.
    for q, k, position_ids, want in jobs:
        got = compiled(q, k, position_ids)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    compiled_lock = threading.Lock()
    errors = []

    def run_compiled(q, k, position_ids):
        with compiled_lock:
            return compiled(q, k, position_ids)

    def work(worker):
        try:
            for round_ in range(6):
                for q, k, position_ids, want in jobs[worker::3]:
                    got = run_compiled(q, k, position_ids) if round_ % 2 else apply_rope(
                        rope, q, k, positions=position_ids, layout="bhsd")
                    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
                    q2 = q.clone().requires_grad_()
                    out = apply_rope(rope, q2, positions=position_ids, layout="bhsd")
                    out.backward(want[0])
                    assert torch.equal(q2.grad, rope.apply(want[0], positions=position_ids, layout="bhsd",
                                                           inverse=True))
                    q3 = q.clone()
                    apply_rope_(rope, q3, positions=position_ids, layout="bhsd")
                    assert torch.equal(q3, want[0])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# ---- bad input -------------------------------------------------------------------------------------

BAD_TYPES = {
    "rope": (dict(rope="llama"), "rope must be a rotary.Rope, got str"),
    "q": (dict(q=[[1.0]]), "q must be a torch.Tensor, got list"),
    "k": (dict(k=np.zeros((1, 3, 2, 16), np.float32)), "k must be a torch.Tensor, got ndarray"),
    "offset": (dict(offset="5"), "offset must be an int, got str"),
    "offset bool": (dict(offset=True), "offset must be an int, got bool"),
    "layout": (dict(layout=1), "layout must be a str, got int"),
    "inverse": (dict(inverse=1), "inverse must be a bool, got int"),
    "angles": (dict(angles=None), "angles must be a str, got NoneType"),
    "cos": (dict(cos=[[1.0]], sin=[[0.0]]), "cos must be a numpy.ndarray or torch.Tensor, got list"),
    "positions": (dict(positions=["a", "b", "c"]), "positions must hold integers or real numbers"),
    "cos_sin_columns": (dict(cos=torch.ones(3, 8), sin=torch.zeros(3, 8), cos_sin_columns=2),
                        "cos_sin_columns must be a str, got int"),
}

BAD_VALUES = {
    "layout": (dict(layout="sbhd"), "layout='sbhd' must be 'bshd', 'bhsd' or 'thd'"),
    "angles": (dict(angles="fast"), "angles='fast' must be 'exact', 'on_the_fly' or 'hf-float32'"),
    "positions range": (dict(positions=torch.tensor([0, 1, -5])), r"positions\[2\]=-5 must be in \[0, 2\^31\)"),
    "positions count": (dict(positions=torch.tensor([0, 1])), "positions"),
    "positions dims": (dict(positions=torch.zeros(1, 1, 1, 3, dtype=torch.int64)), "positions must have at most 3"),
    "offset range": (dict(offset=2 ** 31), r"offset=2147483648 (with seq=3 )?must keep positions in \[0, 2\^31\)"),
    "offset beyond int64": (dict(offset=2 ** 63), r"offset=9223372036854775808 must keep positions in"),
    "head_dim": (dict(q=torch.randn(1, 3, 2, 8)), "head_dim=8"),
    "q dims": (dict(q=torch.randn(2, 16)), "q must have 4 dimensions"),
    "k shape": (dict(k=torch.randn(2, 3, 2, 16)), "k"),
    "cos width": (dict(cos=torch.ones(1, 3, 5), sin=torch.ones(1, 3, 5)), "cos/sin width=5 must be 16"),
    "cos_sin_columns": (dict(cos=torch.ones(3, 8), sin=torch.zeros(3, 8), cos_sin_columns="rows"),
                        "cos_sin_columns='rows' must be"),
}


# How a call reaches the kernel: Rope.apply directly, the operator under autograd (apply_rope only:
# apply_rope_ refuses tensors that require grad), the operator under a dispatch mode.
CALLS = {
    "apply_rope direct": (apply_rope, "direct"), "apply_rope autograd": (apply_rope, "autograd"),
    "apply_rope dispatch mode": (apply_rope, "mode"),
    "apply_rope_ direct": (apply_rope_, "direct"), "apply_rope_ dispatch mode": (apply_rope_, "mode"),
}


def _call(fn, path, **change):
    args = dict(rope=Rope(16), q=torch.randn(1, 3, 2, 16), k=torch.randn(1, 3, 1, 16))
    args.update({name: v.clone() if isinstance(v, torch.Tensor) else v for name, v in change.items()})
    if path == "autograd" and isinstance(args["q"], torch.Tensor):
        args["q"].requires_grad_()
    rope, q, k = args.pop("rope"), args.pop("q"), args.pop("k")
    tensors = [t for t in (q, k) if isinstance(t, torch.Tensor)]
    originals = [t.detach().clone() for t in tensors]
    try:
        if path == "mode":
            with FlopCounterMode(display=False):
                fn(rope, q, k, **args)
        else:
            fn(rope, q, k, **args)
    finally:  # untouched, whatever was refused
        for t, original in zip(tensors, originals):
            assert torch.equal(t.detach(), original)


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("case", BAD_TYPES.values(), ids=BAD_TYPES.keys())
def test_wrong_kinds_raise_type_error_naming_the_argument(case, call):
    change, message = case
    with pytest.raises(TypeError, match=message):
        _call(*call, **change)


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("case", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_raise_value_error_naming_the_argument(case, call):
    change, message = case
    with pytest.raises(ValueError, match=message):
        _call(*call, **change)


def test_bad_values_inside_compiled_code_raise_value_error_and_leave_tensors_untouched():
    rope = Rope(16)
    rotate = torch.compile(lambda q, p: apply_rope(rope, q, positions=p), fullgraph=True, backend="aot_eager")
    rotate_ = torch.compile(lambda q, p: apply_rope_(rope, q, positions=p), fullgraph=True, backend="aot_eager")
    for fn in (rotate, rotate_):
        q = torch.randn(1, 3, 2, 16)
        original = q.clone()
        with pytest.raises(ValueError, match=r"positions\[1\]=-1 must be in \[0, 2\^31\)"):
            fn(q, torch.tensor([0, -1, 2]))
        with pytest.raises(ValueError, match="head_dim=8"):
            fn(q[..., :8], torch.tensor([0, 1, 2]))
        assert torch.equal(q, original)
    # A wrong kind found while tracing: without fullgraph, Dynamo runs the frame eagerly and the
    # TypeError reaches the caller as it is.
    lenient = torch.compile(lambda q: apply_rope(rope, q, layout=3), backend="aot_eager")
    with pytest.raises(TypeError, match="layout must be a str, got int"):
        lenient(torch.randn(1, 3, 2, 16))


def test_in_place_refuses_tensors_that_require_grad_and_names_apply_rope():
    rope = Rope(16)
    q, k = torch.randn(1, 3, 2, 16, requires_grad=True), torch.randn(1, 3, 1, 16)
    originals = q.detach().clone(), k.clone()
    for fn in (lambda: apply_rope_(rope, q, k), lambda: apply_rope_(rope, k, q.detach() * 1 + q),
               lambda: OP_(q, k, *op_args(rope))):
        with pytest.raises(ValueError, match=r"requires grad, .* use rotary.torch.apply_rope"):
            fn()
    with torch.no_grad():
        with pytest.raises(ValueError, match="q requires grad"):
            apply_rope_(rope, q, k)
    with pytest.raises(ValueError, match=r"q requires grad and would be written in place.*rotary.torch.apply_rope"):
        rope.apply(q, k, inplace=True)
    assert torch.equal(q.detach(), originals[0]) and torch.equal(k, originals[1])


def test_rotary_embedding_refuses_bad_arguments():
    with pytest.raises(TypeError, match="rope must be a rotary.Rope, got dict"):
        RotaryEmbedding({"head_dim": 16})
    with pytest.raises(TypeError, match="layout must be a str, got NoneType"):
        RotaryEmbedding(Rope(16), layout=None)
    with pytest.raises(ValueError, match="layout='sbhd' must be 'bshd', 'bhsd' or 'thd'"):
        RotaryEmbedding(Rope(16), layout="sbhd")


# ---- eager overhead --------------------------------------------------------------------------------

def _per_call_us(fns, calls=1000, rounds=15):
    """{name: (median, best)} over `rounds` rounds of the mean time of `calls` calls, in microseconds;
    the functions take turns within each round, so that load from elsewhere hits them alike."""
    for fn in fns.values():
        for _ in range(100):
            fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter_ns() - start) / calls / 1000)
    return {name: (float(np.median(t)), min(t)) for name, t in times.items()}


def test_eager_overhead_per_decode_call_is_printed():
    # A decode step of Llama-3-8B's attention: q [1, 1, 32, 128], k [1, 1, 8, 128], float32. No
    # absolute time is asserted (shared CI machines): the numbers are for the record.
    rope = Rope.from_preset("llama-3.1-8b")
    q, k = torch.randn(1, 1, 32, 128), torch.randn(1, 1, 8, 128)
    position_ids = torch.tensor([[4321]])
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    assert all(torch.equal(a, b) for a, b in zip(apply_rope(rope, q, k, offset=4321), rope.apply(q, k, offset=4321)))
    rows = {
        "q.clone()": lambda: q.clone(),
        "q.clone(), k.clone() (an out-of-place call's allocations)": lambda: (q.clone(), k.clone()),
        "Rope.apply(q, k, offset=, out=(q_out, k_out))": lambda: rope.apply(q, k, offset=4321, out=(q_out, k_out)),
        "Rope.apply(q, k, offset=)": lambda: rope.apply(q, k, offset=4321),
        "apply_rope(rope, q, k, offset=)": lambda: apply_rope(rope, q, k, offset=4321),
        "apply_rope_(rope, q, k, offset=)": lambda: apply_rope_(rope, q, k, offset=4321),
        "Rope.apply(q, k, positions=)": lambda: rope.apply(q, k, positions=position_ids),
        "apply_rope(rope, q, k, positions=)": lambda: apply_rope(rope, q, k, positions=position_ids),
        "torch.ops.rotary.rope (dispatcher)": lambda: OP(q, k, *op_args(rope, offset=4321)),
    }
    times = _per_call_us(rows)
    print("\neager decode call, q [1,1,32,128] + k [1,1,8,128] float32, us per call (median, best of 15 rounds):")
    for name, (median, best) in times.items():
        print(f"  {name:58s} {median:7.2f} {best:7.2f}")
    for name in ("apply_rope(rope, q, k, offset=)", "apply_rope(rope, q, k, positions=)"):
        raw = name.replace("apply_rope(rope, ", "Rope.apply(")
        print(f"  {name} over {raw}: {times[name][0] - times[raw][0]:+.2f} (median) "
              f"{times[name][1] - times[raw][1]:+.2f} (best)")
