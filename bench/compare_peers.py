"""rotary against the CPU peers installable from PyPI, timed in one process.

Peers: Hugging Face transformers' eager formula ``q * cos + rotate_half(q) * sin`` with cos/sin
cached (as a model computes them once per forward), ``torch.compile`` of that formula, and ONNX
Runtime's two RotaryEmbedding operators (``com.microsoft`` and ONNX opset 23), each with its cos/sin
cache. Shapes: Llama-3.1-8B q, head_dim 128: prefill ``[1, 4096, 32, 128]`` from position 0 and
decode ``[1, 1, 32, 128]`` at position 131071; f32 and bf16 (ONNX Runtime's CPU operators take
f32 only); 1 and 2 threads. Each time is a median over interleaved repetitions and is reported as a
ratio to a copy of the same bytes (``dst.copy_(q)``) in the same process.

Run: ``python bench/compare_peers.py [--json] [--reps N]`` with rotary importable (the venv
``make test`` builds, or PYTHONPATH=build/python).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

import rotary

HEADS, HEAD_DIM = 32, 128
CASES = (("prefill", 4096, 0), ("decode", 1, 131071))


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
    parser.add_argument("--reps", type=int, default=15, help="timed repetitions (decode: 10x)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)
    if args.reps < 3:
        raise SystemExit("compare_peers: --reps must be at least 3")
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


if __name__ == "__main__":
    sys.exit(main())
