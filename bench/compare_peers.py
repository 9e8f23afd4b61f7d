"""rotary against the peers installable from PyPI, on the CPU or a CUDA device, timed in one process.

Peers: Hugging Face transformers' eager formula ``q * cos + rotate_half(q) * sin`` with cos/sin
cached (as a model computes them once per forward), ``torch.compile`` of that formula, and ONNX
Runtime's two RotaryEmbedding operators (``com.microsoft`` and ONNX opset 23), each with its cos/sin
cache. Shapes: Llama-3.1-8B q, head_dim 128: prefill ``[1, 4096, 32, 128]`` from position 0 and
decode ``[1, 1, 32, 128]`` at position 131071; f32 and bf16 (ONNX Runtime's CPU operators take
f32 only); 1 and 2 threads. Each time is a median over interleaved repetitions and is reported as a
ratio to a copy of the same bytes (``dst.copy_(q)``) in the same process.

With ``--device cuda``: the same rotation on a CUDA device, q ``[1, seq, 32, 128]`` and k
``[1, seq, 8, 128]`` together (Llama-3.1-8B's 32 query and 8 key/value heads), bf16 and f32, against
transformers' ``apply_rotary_pos_emb`` (eager, and under ``torch.compile``) and every peer importable
here: FlashInfer (``apply_llama31_rope_pos_ids``, angles on the fly, and
``apply_rope_with_cos_sin_cache``, a float32 cache), flash-attn's ``apply_rotary_emb`` (one call
for q, one for k) and Liger-Kernel's ``liger_rotary_pos_emb`` (in place); a peer that is not
installed, or refuses the case, is skipped with the reason printed. rotary runs through
``rotary.torch`` (its table, exact angles on the fly, and in place). Times are CUDA-event medians
per call over interleaved repetitions, each repetition's calls queued behind a short device sleep
(so the host's launch of the first call is not timed as device time), and are reported as a ratio
to ``dst.copy_(src)`` of the same bytes (q and k: one copy). Prefill cycles through input sets
holding 4x the L2, so every call reads cold memory; decode (1 token at 131071) and batched decode
(64 sequences of one token each, positions drawn up to 131071, as one [1, 64, heads, 128] batch:
flash-attn, which takes one offset per sequence, sits it out) also replay a CUDA graph of 100 calls
(per-call time), beside the eager time of one call. ``err``: the relative L2 error of q and k
against a float64 rotation with float64 angles. The lines after the table hold rotary's rows to
the GPU targets of issue 23 (prefill within 1.10x of the copy; a decode call within 1.3 us and a
batched one within 1.6 us in a graph; an eager in-place decode call within 6 us) and list the peers
faster than rotary. Without a CUDA device it exits with a one-line message.

Run: ``python bench/compare_peers.py [--json] [--reps N] [--device cuda]`` with rotary importable
(the venv ``make test`` builds, or PYTHONPATH=build/python).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
import torch

import rotary

HEADS, HEAD_DIM = 32, 128
CASES = (("prefill", 4096, 0), ("decode", 1, 131071))
# --device cuda: also a batched decode step, 64 sequences of one token each (first None: drawn positions).
CUDA_CASES = CASES + (("batched_decode", 64, None),)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(q, cos, sin):
    return q * cos + rotate_half(q) * sin


def hf_cos_sin(inv_freq, positions, dtype):
    """transformers' float32 pipeline: freqs = positions x inv_freq, cat(freqs, freqs), cos, sin, cast."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[None, :, None, :], emb.sin().to(dtype)[None, :, None, :]


def ort_sessions(inv_freq, first, seq, threads):
    """The two ONNX Runtime RotaryEmbedding operators on [1, seq, heads * head_dim] float32, with
    cos/sin caches [max_position, head_dim / 2] and position ids; None when onnx or onnxruntime is
    missing."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return {}
    max_position = first + seq
    freqs = np.arange(max_position, dtype=np.float32)[:, None] * inv_freq.numpy()[None, :]
    cos_cache, sin_cache = np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
    hidden = HEADS * HEAD_DIM
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])
    pos = helper.make_tensor_value_info("pos", TensorProto.INT64, [1, seq])
    cos = helper.make_tensor_value_info("cos", TensorProto.FLOAT, list(cos_cache.shape))
    sin = helper.make_tensor_value_info("sin", TensorProto.FLOAT, list(sin_cache.shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])
    models = {
        "ort com.microsoft": helper.make_model(
            helper.make_graph([helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"],
                                                domain="com.microsoft", interleaved=0, num_heads=HEADS)],
                              "rope", [x, pos, cos, sin], [y]),
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=9),
        "ort opset 23": helper.make_model(
            helper.make_graph([helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"],
                                                interleaved=0, num_heads=HEADS)],
                              "rope", [x, cos, sin, pos], [y]),
            opset_imports=[helper.make_opsetid("", 23)], ir_version=11),
    }
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    sessions = {}
    for name, model in models.items():
        try:
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # an operator this onnxruntime does not have
            print(f"{name}: unavailable ({str(error).splitlines()[0][:100]})", file=sys.stderr)
            continue
        sessions[name] = (session, {"cos": cos_cache, "sin": sin_cache,
                                    "pos": np.arange(first, first + seq, dtype=np.int64)[None, :]})
    return sessions


def measure(funcs, reps):
    """Median seconds of each function, repetitions interleaved (after one warm-up each)."""
    for f in funcs.values():
        f()
    samples = {name: [] for name in funcs}
    for _ in range(reps):
        for name, f in funcs.items():
            start = time.perf_counter()
            f()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    parser.add_argument("--reps", type=int, default=15, help="timed repetitions (CPU decode: 10x)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (default): the CPU peers; cuda: the GPU peers on the current CUDA device")
    args = parser.parse_args(argv)
    if args.reps < 3:
        raise SystemExit("compare_peers: --reps must be at least 3")
    if args.device == "cuda":
        return cuda_main(args)
    rope = rotary.Rope.from_preset("llama-3.1-8b")
    inv_freq = torch.as_tensor(rope.inv_freq, dtype=torch.float32)
    # One graph per shape, dtype and thread count: room for all of them, so none is recompiled.
    torch._dynamo.config.cache_size_limit = 64
    compiled = None if args.no_compile else torch.compile(hf_rope, dynamic=False)
    rows = []
    for case, seq, first in CASES:
        reps = args.reps * (10 if seq == 1 else 1)
        positions = torch.arange(first, first + seq)
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.randn(1, seq, HEADS, HEAD_DIM).to(dtype)
            work = q.clone()
            dst = torch.empty_like(q)
            cos, sin = hf_cos_sin(inv_freq, positions, dtype)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                funcs = {
                    "copy": lambda: dst.copy_(q),
                    "rotary": lambda: rope.apply(q, offset=first, threads=threads),
                    "rotary in place": lambda: rope.apply(work, offset=first, threads=threads, inplace=True),
                    "rotary out=": lambda: rope.apply(q, offset=first, threads=threads, out=dst),
                    "hf eager": lambda: hf_rope(q, cos, sin),
                }
                if compiled is not None:
                    funcs["hf torch.compile"] = lambda: compiled(q, cos, sin)
                if dtype == torch.float32:
                    x = q.reshape(1, seq, HEADS * HEAD_DIM).numpy()
                    for name, (session, feeds) in ort_sessions(inv_freq, first, seq, threads).items():
                        funcs[name] = lambda s=session, f=feeds: s.run(None, {"x": x, **f})
                med = measure(funcs, reps)
                for name, seconds in med.items():
                    if name == "copy":
                        continue
                    rows.append({"case": case, "dtype": str(dtype).replace("torch.", ""), "threads": threads,
                                 "impl": name, "median_us": seconds * 1e6, "copy_us": med["copy"] * 1e6,
                                 "ratio_to_copy": seconds / med["copy"],
                                 "rotary_speedup": seconds / med["rotary"]})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("RoPE on Llama-3.1-8B q (head_dim 128), CPU, medians of interleaved repetitions, same process;")
    print("ratio: time / a copy of the same bytes; x rotary: time / rotary's out-of-place time")
    print(f"{'case':8} {'dtype':9} {'thr':>3} {'implementation':18} {'median_us':>10} {'/copy':>7} {'x rotary':>9}")
    for r in rows:
        print(f"{r['case']:8} {r['dtype']:9} {r['threads']:>3} {r['impl']:18} {r['median_us']:>10.1f}"
              f" {r['ratio_to_copy']:>7.2f} {r['rotary_speedup']:>9.2f}")
    return 0


# ---- --device cuda -----------------------------------------------------------------------------

GPU = "cuda"  # the device of every tensor below (the current CUDA device)
KV_HEADS = 8
CUDA_DTYPES = (torch.bfloat16, torch.float32)
L2_MULTIPLE = 4  # prefill: the input sets cycled through hold this many L2s
DECODE_TOKENS = 64  # cases of at most this many tokens are decode-sized: cache resident, also graph-timed
DECODE_SLOTS = 16  # decode: cache-resident input sets, never the same one twice in a row
DECODE_CALLS = 100  # decode calls per timed repetition (eager) and per graph
LEAD_IN_CYCLES = 100_000  # the device sleep before each timed repetition, ~50 us


class Unavailable(Exception):
    """A peer that cannot run here: not installed, or refusing the case (the message says why)."""


def first_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:150] if text else ''}"


class Pool:
    """Input sets of q and k, each one flat buffer (q, then k), as many copy destinations, and one
    more set (``check``) that the accuracy check restores and rotates."""

    def __init__(self, seq, dtype, count):
        self.seq, self.count = seq, count
        nq, nk = seq * HEADS * HEAD_DIM, seq * KV_HEADS * HEAD_DIM
        self.flat = [torch.randn(nq + nk, device=GPU).to(dtype) for _ in range(count + 1)]
        self.dst = [torch.empty_like(f) for f in self.flat[:count]]
        self.q = [f[:nq].view(1, seq, HEADS, HEAD_DIM) for f in self.flat]
        self.k = [f[nq:].view(1, seq, KV_HEADS, HEAD_DIM) for f in self.flat]
        self.check = count
        self.pristine = self.flat[count].clone()

    def restore_check(self):
        self.flat[self.check].copy_(self.pristine)


def rotary_impls(rope, pool, first, positions):
    """rotary's torch operators: out of place with its exact table, exact angles on the fly, and
    in place; positions from ``first`` on (sequential), or per token (``first`` None: the
    ``positions`` tensor, exact angles computed on the device)."""
    try:
        import rotary.torch as rt
    except ImportError as error:
        raise Unavailable(f"rotary.torch does not import ({first_line(error)})")
    where = {"offset": first} if first is not None else {"positions": positions[None]}
    try:
        rt.apply_rope(rope, pool.q[0], pool.k[0], **where)
    except Exception as error:  # a build whose torch operators take CPU tensors only
        raise Unavailable(f"no CUDA kernel behind rotary.torch here ({first_line(error)})")
    return {
        "rotary": lambda i: rt.apply_rope(rope, pool.q[i], pool.k[i], **where),
        "rotary on_the_fly": lambda i: rt.apply_rope(rope, pool.q[i], pool.k[i], numerics="on_the_fly", **where),
        "rotary in place": lambda i: rt.apply_rope_(rope, pool.q[i], pool.k[i], **where),
    }


def hf_impls(pool, cos, sin, compile_it):
    """transformers' apply_rotary_pos_emb on [batch, seq, heads, head_dim] (unsqueeze_dim=2), with
    its float32-pipeline cos/sin cached; and under torch.compile."""
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError as error:
        raise Unavailable(f"transformers does not import ({first_line(error)})")
    impls = {"hf eager": lambda i: apply_rotary_pos_emb(pool.q[i], pool.k[i], cos, sin, unsqueeze_dim=2)}
    if compile_it:
        compiled = torch.compile(apply_rotary_pos_emb, dynamic=False)
        impls["hf torch.compile"] = lambda i: compiled(pool.q[i], pool.k[i], cos, sin, unsqueeze_dim=2)
    return impls


def flashinfer_impls(pool, positions, cos_sin_cache):
    """FlashInfer: Llama 3.1 angles on the fly from position ids, and a float32 cos/sin cache (vLLM's
    layout: cos in the first half of each row, sin in the second)."""
    try:
        import flashinfer
    except ImportError as error:
        raise Unavailable(f"flashinfer does not import ({first_line(error)})")
    seq = pool.seq
    return {
        "flashinfer llama31": lambda i: flashinfer.apply_llama31_rope_pos_ids(
            pool.q[i].view(seq, HEADS, HEAD_DIM), pool.k[i].view(seq, KV_HEADS, HEAD_DIM), positions,
            rope_scale=8.0, rope_theta=500000.0, low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192),
        "flashinfer cos_sin_cache": lambda i: flashinfer.apply_rope_with_cos_sin_cache(
            positions, pool.q[i].view(seq, HEADS * HEAD_DIM), pool.k[i].view(seq, KV_HEADS * HEAD_DIM), HEAD_DIM,
            cos_sin_cache, is_neox=True),
    }


def flash_attn_impls(pool, cos_half, sin_half, first):
    """flash-attn's apply_rotary_emb (Triton), one call for q and one for k; cos/sin [rows, 64] in
    the tensors' dtype, from position 0 (seqlen_offsets = the first position)."""
    if first is None:
        raise Unavailable("flash_attn takes one run of consecutive positions per sequence (seqlen_offsets), "
                          "not a position per token")
    try:
        from flash_attn.layers.rotary import apply_rotary_emb
    except ImportError as error:
        raise Unavailable(f"flash_attn does not import ({first_line(error)})")
    return {"flash_attn": lambda i: (apply_rotary_emb(pool.q[i], cos_half, sin_half, seqlen_offsets=first),
                                     apply_rotary_emb(pool.k[i], cos_half, sin_half, seqlen_offsets=first))}


def liger_impls(pool, cos, sin):
    """Liger-Kernel's liger_rotary_pos_emb: takes q and k as [batch, heads, seq, head_dim] (here views
    of the [batch, seq, heads, head_dim] tensors, which its kernel then rotates in place)."""
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError as error:
        raise Unavailable(f"liger_kernel does not import ({first_line(error)})")
    return {"liger (in place)": lambda i: liger_rotary_pos_emb(pool.q[i].transpose(1, 2), pool.k[i].transpose(1, 2),
                                                               cos, sin)}


def as_bshd(t, heads):
    """An implementation's output as [1, seq, heads, head_dim] ([batch, heads, seq, head_dim] and
    packed [tokens, heads(*head_dim)] outputs viewed back)."""
    if t.dim() == 4 and t.shape[2] != heads:
        t = t.transpose(1, 2)
    return t.reshape(1, -1, heads, HEAD_DIM)


def relative_error(pool, result, reference):
    """||out - ref|| / ||ref|| over q and k; out is the call's result, or the check set (in place)."""
    if result is None:
        result = (pool.q[pool.check], pool.k[pool.check])
    num = den = 0.0
    for out, ref, heads in zip(result, reference, (HEADS, KV_HEADS)):
        num += float((as_bshd(out, heads).double() - ref).square().sum())
        den += float(ref.square().sum())
    return math.sqrt(num / den)


def float64_reference(pool, inv_freq64, positions):
    """q and k of the check set rotated in float64, with float64 angles (exact to ~1e-12 here)."""
    angles = positions.double()[:, None] * inv_freq64
    cos = torch.cat((angles.cos(), angles.cos()), -1)[None, :, None, :]
    sin = torch.cat((angles.sin(), angles.sin()), -1)[None, :, None, :]
    return tuple(x.double() * cos + rotate_half(x.double()) * sin
                 for x in (pool.q[pool.check], pool.k[pool.check]))


def cuda_inputs(inv_freq32, positions, dtype):
    """The peers' angle inputs, each in the form its library takes, from transformers' float32
    pipeline (positions x inv_freq in float32): cos/sin [1, seq, 128] in dtype (transformers,
    Liger), cos/sin [rows, 64] in dtype (flash-attn), a float32 cos|sin cache [rows, 128]
    (FlashInfer), rows up to the largest position, and the int64 position ids [seq]."""
    freqs = positions.float()[:, None] * inv_freq32[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    table = torch.arange(int(positions.max()) + 1, device=GPU).float()[:, None] * inv_freq32[None, :]
    return {"positions": positions, "cos": emb.cos().to(dtype)[None], "sin": emb.sin().to(dtype)[None],
            "cos_half": table.cos().to(dtype), "sin_half": table.sin().to(dtype),
            "cos_sin_cache": torch.cat((table.cos(), table.sin()), dim=-1).contiguous()}


def cuda_impls(rope, pool, first, positions, dtype, inv_freq32, compile_it):
    """Every implementation that runs here, and the reason for each that does not."""
    a = cuda_inputs(inv_freq32, positions, dtype)
    builders = {
        "rotary": lambda: rotary_impls(rope, pool, first, positions),
        "transformers": lambda: hf_impls(pool, a["cos"], a["sin"], compile_it),
        "flashinfer": lambda: flashinfer_impls(pool, a["positions"], a["cos_sin_cache"]),
        "flash_attn": lambda: flash_attn_impls(pool, a["cos_half"], a["sin_half"], first),
        "liger": lambda: liger_impls(pool, a["cos"], a["sin"]),
    }
    impls = {"copy": lambda i: pool.dst[i].copy_(pool.flat[i])}
    skipped = {}
    for peer, build in builders.items():
        try:
            found = build()
        except Unavailable as why:
            skipped[peer] = str(why)
            continue
        for name, fn in found.items():
            try:  # the first call compiles (torch.compile, Triton, FlashInfer's JIT) and checks the case
                fn(0)
                torch.cuda.synchronize()
            except Exception as error:
                skipped[name] = f"refused the case ({first_line(error)})"
                continue
            impls[name] = fn
    return impls, skipped


def time_eager(fn, calls, slots, events):
    """Device microseconds per call of ``calls`` calls cycling through ``slots`` input sets, queued
    behind a device sleep (the host's launch of the first call is not device time); a call whose
    host side is slower than its kernel is timed at the host's pace, as it runs."""
    start, end = events
    torch.cuda._sleep(LEAD_IN_CYCLES)
    start.record()
    for i in range(calls):
        fn(i % slots)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def capture_graph(fn, calls, slots):
    """A CUDA graph of ``calls`` calls cycling through the input sets (warmed up on a side stream
    first, as torch.cuda.graph asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(i % slots)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % slots)
    return graph


def measure_cuda(impls, pool, reps, decode):
    """Median microseconds per call of each implementation, eager and (decode) under graph
    replay, the repetitions interleaved across implementations after one warm-up each."""
    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
    calls = DECODE_CALLS if decode else 2 * pool.count
    graphs, graph_skipped = {}, {}
    if decode:
        for name, fn in impls.items():
            try:
                graphs[name] = capture_graph(fn, calls, pool.count)
            except Exception as error:
                graph_skipped[name] = first_line(error)
    eager = {name: [] for name in impls}
    replay = {name: [] for name in graphs}
    for rep in range(reps + 1):
        for name, fn in impls.items():
            t = time_eager(fn, calls, pool.count, events)
            if rep:
                eager[name].append(t)
            if name in graphs:
                t = time_eager(lambda _: graphs[name].replay(), 1, 1, events) / calls
                if rep:
                    replay[name].append(t)
    return ({n: statistics.median(v) for n, v in eager.items()},
            {n: statistics.median(v) for n, v in replay.items()}, graph_skipped)


def case_positions(seq, first):
    """A case's int64 positions on the device: first .. first + seq - 1, or (first None) drawn up to
    131071, one per sequence of a batched decode step."""
    if first is not None:
        return torch.arange(first, first + seq, device=GPU)
    generator = torch.Generator().manual_seed(64)
    return torch.randint(0, 131072, (seq,), generator=generator).to(GPU)


def cuda_case_rows(rope, case, seq, first, dtype, args, inv_freq64):
    """One case in one dtype: each implementation's row, and what was skipped."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    nbytes = seq * (HEADS + KV_HEADS) * HEAD_DIM * torch.tensor([], dtype=dtype).element_size()
    decode = seq <= DECODE_TOKENS
    count = DECODE_SLOTS if decode else max(3, -(-L2_MULTIPLE * l2 // nbytes))
    pool = Pool(seq, dtype, count)
    positions = case_positions(seq, first)
    impls, skipped = cuda_impls(rope, pool, first, positions, dtype, inv_freq64.float(), not args.no_compile)
    reference = float64_reference(pool, inv_freq64, positions)
    errors = {}
    for name, fn in impls.items():
        if name != "copy":
            pool.restore_check()
            errors[name] = relative_error(pool, fn(pool.check), reference)
    del reference
    eager, graph, graph_skipped = measure_cuda(impls, pool, args.reps, decode)
    for name, why in graph_skipped.items():
        skipped[f"{name} (graph)"] = why
    rows = []
    for name, us in eager.items():
        if name == "copy":
            continue
        row = {"device": "cuda", "case": case, "dtype": row_dtype(dtype), "impl": name,
               "median_us": us, "copy_us": eager["copy"], "ratio_to_copy": us / eager["copy"],
               "rotary_speedup": us / eager["rotary"] if "rotary" in eager else None,
               "graph_us": graph.get(name), "copy_graph_us": graph.get("copy"), "rel_err": errors[name]}
        rows.append(row)
    return rows, {f"{case} {row_dtype(dtype)} {name}": why for name, why in skipped.items()}


def row_dtype(dtype):
    return str(dtype).replace("torch.", "")


def target_lines(rows):
    """Issue 23's GPU targets for rotary's rows: prefill within 1.10x of the copy (its table,
    exact angles on the fly, in place); a decode call within 1.3 us and a batched decode call within
    1.6 us in a replayed graph; an eager decode call in place (rotary.torch.apply_rope_) within
    6 us; and no peer faster than rotary on any case (peers that write in place against rotary in
    place, the others against rotary out of place)."""
    lines = []
    by_case = {}
    for r in rows:
        by_case.setdefault((r["case"], r["dtype"]), {})[r["impl"]] = r
    yes = lambda ok: "yes" if ok else "NO"  # noqa: E731
    for (case, dtype), impls in by_case.items():
        if "rotary" not in impls:
            continue
        checks = []
        if case == "prefill":
            for name in ("rotary", "rotary on_the_fly", "rotary in place"):
                ratio = impls[name]["ratio_to_copy"]
                checks.append(f"{name} {ratio:.2f}x copy (<= 1.10: {yes(ratio <= 1.10)})")
        else:
            limit = 1.3 if case == "decode" else 1.6
            for name in ("rotary", "rotary in place"):
                graph_us = impls[name]["graph_us"]
                if graph_us is not None:
                    checks.append(f"{name} {graph_us:.2f} us in a graph (<= {limit}: {yes(graph_us <= limit)})")
            if case == "decode":
                us = impls["rotary in place"]["median_us"]
                checks.append(f"rotary in place eager {us:.2f} us (<= 6: {yes(us <= 6)})")
        faster = []
        for name, r in impls.items():
            if name.startswith("rotary"):
                continue
            mine = impls["rotary in place" if "in place" in name else "rotary"]
            if r["median_us"] < mine["median_us"]:
                faster.append(f"{name} {r['median_us']:.2f} us < {mine['impl']} {mine['median_us']:.2f} us")
        checks.append("peers faster: " + ("; ".join(faster) if faster else "none"))
        lines.append(f"target {case} {dtype}: " + ", ".join(checks))
    return lines


def print_cuda_rows(rows, skipped, device_name, reps):
    print(f"RoPE on Llama-3.1-8B q [1, seq, 32, 128] + k [1, seq, 8, 128], {device_name}; CUDA-event medians of "
          f"{reps} interleaved repetitions, per call; /copy: time / dst.copy_(src) of the same bytes; graph_us: "
          f"per call in a replayed CUDA graph of {DECODE_CALLS} calls (decode); x rotary: time / rotary's; "
          "err: relative L2 error against float64")
    print(f"{'case':14} {'dtype':9} {'implementation':26} {'median_us':>10} {'/copy':>7} {'graph_us':>9} "
          f"{'x rotary':>9} {'err':>9}")
    for r in rows:
        graph = f"{r['graph_us']:>9.2f}" if r["graph_us"] is not None else f"{'-':>9}"
        speedup = f"{r['rotary_speedup']:>9.2f}" if r["rotary_speedup"] is not None else f"{'-':>9}"
        print(f"{r['case']:14} {r['dtype']:9} {r['impl']:26} {r['median_us']:>10.2f} {r['ratio_to_copy']:>7.2f} "
              f"{graph} {speedup} {r['rel_err']:>9.2e}")
    for line in target_lines(rows):
        print(line)
    for what, why in skipped.items():
        print(f"skipped: {what}: {why}")


def cuda_main(args):
    if not torch.cuda.is_available():
        raise SystemExit(f"compare_peers: --device cuda: no CUDA device (torch {torch.__version__}, built for CUDA "
                         f"{torch.version.cuda}: torch.cuda.is_available() is False)")
    if not hasattr(torch.cuda, "_sleep"):
        raise SystemExit(f"compare_peers: --device cuda: torch {torch.__version__} has no torch.cuda._sleep")
    torch.manual_seed(0)
    torch._dynamo.config.cache_size_limit = 64
    rope = rotary.Rope.from_preset("llama-3.1-8b")
    inv_freq64 = torch.as_tensor(np.asarray(rope.inv_freq, dtype=np.float64), device=GPU)
    rows, skipped = [], {}
    for case, seq, first in CUDA_CASES:
        for dtype in CUDA_DTYPES:
            case_rows, case_skipped = cuda_case_rows(rope, case, seq, first, dtype, args, inv_freq64)
            rows += case_rows
            skipped.update(case_skipped)
    if args.json:
        for what, why in skipped.items():
            print(f"skipped: {what}: {why}", file=sys.stderr)
        print(json.dumps(rows, indent=1))
        return 0
    print_cuda_rows(rows, skipped, torch.cuda.get_device_name(0), args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
