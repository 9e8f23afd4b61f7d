#!/usr/bin/python3
"""rotary vs the Hugging Face eager formula, timed in one process.

HF eager: q * cos + rotate_half(q) * sin, with cos/sin precomputed ("cached") and computed per call
as transformers' LlamaRotaryEmbedding does ("per call"). Shapes: Llama-3.1-8B prefill q
[1, 4096, 32, 128] and decode [1, 1, 32, 128] at position 131071; f32 and bf16; 1 and 2 threads.
Medians over repetitions, interleaved. Run: PYTHONPATH=build/python /usr/bin/python3 bench/compare_torch.py
"""
import statistics
import sys
import time

import torch

import rotary


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_cos_sin(inv_freq, positions, dtype):
    # transformers: float32 freqs = inv_freq @ positions, emb = cat(freqs, freqs), cos/sin, cast
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[None, :, None, :], emb.sin().to(dtype)[None, :, None, :]


def median_time(fn, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    rope = rotary.Rope.from_preset("llama-3.1-8b")
    inv_freq = torch.as_tensor(rope.inv_freq, dtype=torch.float32)
    rows = []
    for case, seq, first, reps in (("prefill", 4096, 0, 15), ("decode", 1, 131071, 100)):
        positions = torch.arange(first, first + seq)
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.randn(1, seq, 32, 128).to(dtype)
            cos, sin = hf_cos_sin(inv_freq, positions, dtype)
            rope.apply(q, offset=first)  # warm the table cache
            for threads in (1, 2):
                torch.set_num_threads(threads)
                funcs = {
                    "rotary": lambda: rope.apply(q, offset=first, threads=threads),
                    "rotary in place": lambda: rope.apply(q, offset=first, threads=threads, inplace=True),
                    "hf cached": lambda: q * cos + rotate_half(q) * sin,
                    "hf per call": lambda: (lambda c, s: q * c + rotate_half(q) * s)(*hf_cos_sin(inv_freq, positions, dtype)),
                }
                for f in funcs.values():  # warm-up
                    f()
                samples = {k: [] for k in funcs}
                for _ in range(reps):  # interleaved
                    for name, f in funcs.items():
                        samples[name].append(median_time(f, 1))
                med = {k: statistics.median(v) for k, v in samples.items()}
                rows.append((case, str(dtype).replace("torch.", ""), threads, med))
    print("rotary vs Hugging Face eager RoPE (Llama-3.1-8B q, head_dim 128), medians, same process")
    print("times in microseconds; ratios are HF time / rotary time (out of place, and in place)")
    print(f"{'case':8} {'dtype':9} {'thr':>3} {'rotary':>9} {'in place':>9} {'hf cached':>10} {'hf/call':>9}"
          f" {'cached/rotary':>14} {'per-call/rotary':>16} {'cached/in-place':>16}")
    for case, dtype, threads, m in rows:
        print(f"{case:8} {dtype:9} {threads:>3} {m['rotary']*1e6:>9.1f} {m['rotary in place']*1e6:>9.1f}"
              f" {m['hf cached']*1e6:>10.1f} {m['hf per call']*1e6:>9.1f} {m['hf cached']/m['rotary']:>14.2f}"
              f" {m['hf per call']/m['rotary']:>16.2f} {m['hf cached']/m['rotary in place']:>16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
