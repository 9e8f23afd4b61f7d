"""rotary.torch's fused operators timed on a device against their unfused composition and against a
copy of the bytes they must move, in one run (issue 25's speed rows; CUDA: scripts/gpu-check runs it).

    python3 bench/fused_torch.py --device cuda [--reps 11] [--json]
    python3 bench/fused_torch.py --device cpu --reps 3          # the same rows on the CPU (a smoke run)

Llama-3.1-8B shapes (32 q heads, 8 kv heads, head_dim 128), bf16 activations, a paged NHD cache of
16-slot blocks addressed through a shuffled block table (bf16, or fp8 e4m3 with a per-tensor scale),
per-token positions. Rows:
- rope_store: ``rope_store`` against ``apply_rope_`` then the cache writes in torch (index_copy_ of k
  and v, cast to the cache dtype), and against a copy of the bytes it moves (q read and written, k and
  v read, their cache rows written);
- qk_norm_rope: ``qk_norm_rope`` against torch's RMSNorm (float32, weight, cast back) then
  ``apply_rope_``, and against a copy of q and k read and written;
- decode (1 token): each fused op against a plain ``apply_rope_`` of the same q and k.
Times are medians over repetitions, each repetition timing every side of a row in turn (CUDA events
on torch's current stream; on the CPU, perf_counter). Targets (issue 25, GPU): prefill faster than
unfused and at most 1.15x the copy; decode within 1.5x of the plain call.
"""
import argparse
import json
import statistics
import time

import torch

from rotary import Rope
from rotary.torch import apply_rope_, qk_norm_rope, rope_store

HEADS, KV_HEADS, D, BLOCK = 32, 8, 128, 16


def timer(device):
    if device.type == "cuda":
        def run(fn, iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3 / iters  # µs
    else:
        def run(fn, iters):
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - t0) * 1e6 / iters
    return run


def medians(sides, reps, iters, run):
    """Each side once per repetition, in turn; the median µs per call of each."""
    for fn in sides.values():  # warm-up (the first call on a device allocates its error word and table)
        fn()
    times = {name: [] for name in sides}
    for _ in range(reps):
        for name, fn in sides.items():
            times[name].append(run(fn, iters))
    return {name: statistics.median(t) for name, t in times.items()}


def case(tokens, cache_dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, HEADS, D, generator=g).to(torch.bfloat16)
    k = torch.randn(tokens, KV_HEADS, D, generator=g).to(torch.bfloat16)
    v = torch.randn(tokens, KV_HEADS, D, generator=g).to(torch.bfloat16)
    blocks = tokens // BLOCK + 8
    table = torch.randperm(blocks, generator=g)  # a shuffled block table
    slots = table[torch.arange(tokens) // BLOCK] * BLOCK + torch.arange(tokens) % BLOCK
    positions = torch.randint(0, 1 << 16, (tokens,), generator=g)
    k_cache = torch.zeros(blocks, BLOCK, KV_HEADS, D, dtype=cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    return [t.to(device) for t in (q, k, v, k_cache, v_cache, slots, positions)]


def rows(device, reps, iters_prefill, iters_decode):
    run = timer(device)
    rope = Rope.from_preset("llama-3.1-8b")
    out = []

    def time_row(sides, shape, moved, rope, q, k, positions):
        """The row's third side (prefill: a copy of the bytes it moves, read and written; decode: a plain
        apply_rope_ of its q and k), then the medians of all three."""
        if shape == "prefill":
            src = torch.empty(moved // 2, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            sides["copy"] = lambda: dst.copy_(src)
        else:
            sides["plain"] = lambda: apply_rope_(rope, q, k, positions=positions)
        return medians(sides, reps, iters_prefill if shape == "prefill" else iters_decode, run)
    for cache_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        scale = None if cache_dtype == torch.bfloat16 else torch.tensor([0.05], device=device)
        for shape, tokens in (("prefill", 4096), ("decode", 1)):
            q, k, v, kc, vc, slots, positions = case(tokens, cache_dtype, device)
            flat_k, flat_v = kc.view(-1, KV_HEADS, D), vc.view(-1, KV_HEADS, D)

            def unfused():
                apply_rope_(rope, q, k, positions=positions)
                kk, vv = (k, v) if scale is None else (k.float() / scale, v.float() / scale)
                # as bytes: torch has no index_copy_ of float8 on every device
                flat_k.view(torch.uint8).index_copy_(0, slots, kk.to(cache_dtype).view(torch.uint8))
                flat_v.view(torch.uint8).index_copy_(0, slots, vv.to(cache_dtype).view(torch.uint8))

            sides = {"fused": lambda: rope_store(rope, q, k, v, kc, vc, slots, positions=positions, k_scale=scale,
                                                 v_scale=scale),
                     "unfused": unfused}
            moved = 2 * q.nbytes + k.nbytes + v.nbytes + 2 * tokens * KV_HEADS * D * kc.element_size()
            out.append(dict(op="rope_store", shape=shape, cache=str(cache_dtype).replace("torch.", ""), bytes=moved,
                            **time_row(sides, shape, moved, rope, q, k, positions)))
    for shape, tokens in (("prefill", 4096), ("decode", 1)):
        q, k, _, _, _, _, positions = case(tokens, torch.bfloat16, device)
        # Weights of 1: every side runs in place call after call, and a weight != 1 would shrink or grow
        # q and k each time until they are subnormal or infinite (the CPU's subnormal arithmetic is
        # many times slower: the rows would time that). The kernels' work does not depend on the value.
        qw = torch.ones(D, device=device, dtype=torch.bfloat16)
        kw = torch.ones(D, device=device, dtype=torch.bfloat16)

        def rms(x, w):
            y = x.float()
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
            return (y.to(x.dtype) * w)

        def unfused():
            q.copy_(rms(q, qw))
            k.copy_(rms(k, kw))
            apply_rope_(rope, q, k, positions=positions)

        sides = {"fused": lambda: qk_norm_rope(rope, q, k, qw, kw, eps=1e-6, positions=positions), "unfused": unfused}
        moved = 2 * (q.nbytes + k.nbytes)
        out.append(dict(op="qk_norm_rope", shape=shape, cache="-", bytes=moved,
                        **time_row(sides, shape, moved, rope, q, k, positions)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    result = rows(device, a.reps, 20 if cuda else 1, 200)
    for r in result:
        r["fused/unfused"] = r["fused"] / r["unfused"]
        if "copy" in r:
            r["fused/copy"] = r["fused"] / r["copy"]
            r["meets"] = r["fused/unfused"] < 1 and r["fused/copy"] <= 1.15
        else:
            r["fused/plain"] = r["fused"] / r["plain"]
            r["meets"] = r["fused/plain"] <= 1.5
    if a.json:
        print(json.dumps(dict(device=torch.cuda.get_device_name(device) if cuda else "cpu", rows=result), indent=1))
        return
    print(f"rotary.torch fused operators on {torch.cuda.get_device_name(device) if cuda else 'the CPU'}: "
          f"Llama-3.1-8B bf16, medians of {a.reps} (µs per call)")
    print(f"{'op':13} {'shape':8} {'cache':14} {'fused':>10} {'unfused':>10} {'/unfused':>9} {'copy|plain':>11} "
          f"{'/copy|/plain':>13}  target")
    for r in result:
        other = r.get("copy", r.get("plain"))
        ratio = r.get("fused/copy", r.get("fused/plain"))
        print(f"{r['op']:13} {r['shape']:8} {r['cache']:14} {r['fused']:10.2f} {r['unfused']:10.2f} "
              f"{r['fused/unfused']:9.3f} {other:11.2f} {ratio:13.3f}  {'meets' if r['meets'] else 'NO'}")


if __name__ == "__main__":
    main()
