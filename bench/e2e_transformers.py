"""End to end: a transformers Llama model patched with rotary against the same model unpatched.

The model: Llama-3.1-style (Llama-3.2-1B's shape), bf16, 16 layers, hidden 2048, 32 query and 8
key/value heads of 64, llama3 RoPE scaling (factor 32 from 8192, base 500000), random weights,
transformers' eager attention. Two copies of it share nothing but their initial weights; one is
patched by ``rotary.transformers.patch`` (exact angles, rotary's fused q+k kernel), the other keeps
transformers' formula. Measured, each side's repetitions interleaved with the other's:

- prefill: one forward pass over ``--prefill`` tokens (2048) with no cache;
- decode: ``generate`` from a 128-token prompt for ``--decode-tokens`` new tokens (greedy, no early
  stop), time per new token;
- the RoPE of one layer alone, prefill- and decode-shaped: transformers' ``apply_rotary_pos_emb``
  on the cos/sin its rotary module returns, against the patched path (the patched module's
  positions and the swapped ``apply_rotary_pos_emb``, i.e. rotary's kernel); and each rotary
  module's forward, once per forward pass.

Times are medians (CUDA events on a CUDA device, else ``time.perf_counter`` with a synchronise).
The float32 check: the patched model's logits against the unpatched one's on the same prompt, in
float32 (the rotations differ only in rounding: transformers' float32 angles against exact ones).

Usage (rotary built with its CUDA kernels, e.g. ``pip install .`` where nvcc is found):
    python bench/e2e_transformers.py [--json] [--reps 10] [--prefill 2048] [--decode-tokens 64]
``--device cpu --layers 2 --hidden 256 --prefill 64 --decode-tokens 4`` runs the same script small on
the CPU (a check of the script, not a measurement of record). Without a usable device: exit 2 with one
line.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time


def fail(message: str) -> "None":
    print(f"e2e_transformers: {message}", file=sys.stderr)
    raise SystemExit(2)


try:
    import torch
    import transformers
    from transformers.models.llama import modeling_llama
except ImportError as error:  # pragma: no cover - environment
    fail(f"needs torch and transformers ({type(error).__name__}: {error})")

import rotary
import rotary.transformers as rt

PROMPT = 128  # decode's prompt length


class Timer:
    """Median seconds of a callable: CUDA events around it on a CUDA device, else wall time."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.stop = torch.cuda.Event(enable_timing=True)

    def once(self, fn) -> float:
        if self.cuda:
            self.start.record()
            fn()
            self.stop.record()
            self.stop.synchronize()
            return self.start.elapsed_time(self.stop) / 1e3
        begin = time.perf_counter()
        fn()
        return time.perf_counter() - begin


def interleaved(timer: Timer, sides: dict, reps: int, warmup: int = 2) -> dict:
    """Median seconds of each side's callable, the sides alternating within every repetition."""
    samples = {name: [] for name in sides}
    for rep in range(warmup + reps):
        for name, fn in sides.items():
            t = timer.once(fn)
            if rep >= warmup:
                samples[name].append(t)
    return {name: statistics.median(v) for name, v in samples.items()}


def make_model(args, device: str, dtype: torch.dtype):
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
        head_dim=args.hidden // 32, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.to(device=device, dtype=dtype).eval()


def layer_rope_costs(plain, patched, timer: Timer, device: str, dtype: torch.dtype, args) -> dict:
    """Seconds of one layer's RoPE (q and k), prefill- and decode-shaped, each path alone; and of
    each rotary module's forward (once per forward pass)."""
    heads, kv_heads, head_dim = 32, 8, args.hidden // 32
    out = {}
    for shape, seq, first in (("prefill", args.prefill, 0), ("decode", 1, args.prefill + args.decode_tokens)):
        x = torch.randn(1, seq, args.hidden, device=device, dtype=dtype)
        position_ids = torch.arange(first, first + seq, device=device)[None]
        q = torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype)
        k = torch.randn(1, kv_heads, seq, head_dim, device=device, dtype=dtype)
        with torch.no_grad():
            cos, sin = plain.model.rotary_emb(x, position_ids)
            positions = patched.model.rotary_emb(x, position_ids)
            # The patched model's type runs rotary's function while a patched model exists; the
            # unpatched copy's layers keep transformers' (the patch tells the two apart by what the
            # rotary module returned), so both are timed through the module's current name.
            apply = modeling_llama.apply_rotary_pos_emb
            sides = {
                "transformers": lambda: apply(q, k, cos, sin),
                "rotary": lambda: apply(q, k, *positions),
                "transformers rotary_emb": lambda: plain.model.rotary_emb(x, position_ids),
                "rotary rotary_emb": lambda: patched.model.rotary_emb(x, position_ids),
            }
            medians = interleaved(timer, sides, args.reps * 10)
        out[shape] = {name: seconds * 1e6 for name, seconds in medians.items()}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a small check of the script)")
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions per side (default 10)")
    parser.add_argument("--prefill", type=int, default=2048, help="prefill tokens (default 2048)")
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens generated per decode run (default 64)")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.reps < 3:
        fail("--reps must be at least 3")
    if args.hidden % 32 != 0:
        fail("--hidden must be a multiple of the 32 heads")
    device = args.device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            fail(f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)")
        info = rotary.build_info()["cuda"]
        if not info.get("usable"):
            fail(f"rotary's CUDA kernels cannot run here: {info.get('why_not')}")
        dtype = torch.bfloat16
    else:
        dtype = torch.float32  # the CPU check: bf16 matmuls are slow there
    timer = Timer(device)

    plain = make_model(args, device, dtype)
    patched = rt.patch(copy.deepcopy(plain))
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, args.vocab, (1, args.prefill), generator=generator).to(device)
    prompt = ids[:, :min(PROMPT, args.prefill)]

    def prefill(model):
        with torch.no_grad():
            model(ids, use_cache=False)

    def decode(model):
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=args.decode_tokens, min_new_tokens=args.decode_tokens,
                           do_sample=False, pad_token_id=0)

    prefill_s = interleaved(timer, {"unpatched": lambda: prefill(plain), "patched": lambda: prefill(patched)},
                            args.reps)
    decode_s = interleaved(timer, {"unpatched": lambda: decode(plain), "patched": lambda: decode(patched)},
                           max(3, args.reps // 3), warmup=1)
    layers = layer_rope_costs(plain, patched, timer, device, dtype, args)

    # float32 logits of both on the prompt: the same model, rotations rounded differently.
    with torch.no_grad():
        plain32 = copy.deepcopy(plain).float()
        patched32 = rt.patch(copy.deepcopy(plain).float())
        want = plain32(prompt).logits
        got = patched32(prompt).logits
        logits_diff = float((got - want).abs().max())
        logits_scale = float(want.abs().max())
    del plain32, patched32

    result = {
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
        "model": {"layers": args.layers, "hidden": args.hidden, "heads": 32, "kv_heads": 8,
                  "head_dim": args.hidden // 32, "dtype": str(dtype).replace("torch.", ""),
                  "attention": "eager", "rope": "llama3 x32 from 8192, base 500000"},
        "prefill_tokens": args.prefill,
        "prefill_ms": {k: v * 1e3 for k, v in prefill_s.items()},
        "prefill_patched_over_unpatched": prefill_s["patched"] / prefill_s["unpatched"],
        "decode_tokens": args.decode_tokens,
        "decode_prompt_tokens": int(prompt.shape[1]),
        "decode_ms_per_token": {k: v * 1e3 / args.decode_tokens for k, v in decode_s.items()},
        "decode_patched_over_unpatched": decode_s["patched"] / decode_s["unpatched"],
        "rope_us": layers,
        "float32_logits_max_abs_diff": logits_diff,
        "float32_logits_max_abs": logits_scale,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "rotary": rotary.__version__},
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    m = result["model"]
    print(f"rotary.transformers.patch end to end on {result['device']}: Llama {m['layers']} layers, hidden "
          f"{m['hidden']}, {m['heads']}/{m['kv_heads']} heads of {m['head_dim']}, {m['dtype']}, eager attention, "
          f"random weights; medians of {args.reps} interleaved repetitions")
    p, d = result["prefill_ms"], result["decode_ms_per_token"]
    print(f"prefill {args.prefill} tokens: unpatched {p['unpatched']:.2f} ms, patched {p['patched']:.2f} ms "
          f"({result['prefill_patched_over_unpatched']:.3f}x)")
    print(f"decode (generate, {args.decode_tokens} tokens after {prompt.shape[1]}): unpatched {d['unpatched']:.3f} ms/token, "
          f"patched {d['patched']:.3f} ms/token ({result['decode_patched_over_unpatched']:.3f}x)")
    for shape, costs in layers.items():
        per_forward = m["layers"] * costs["rotary"] + costs["rotary rotary_emb"]
        per_forward_hf = m["layers"] * costs["transformers"] + costs["transformers rotary_emb"]
        print(f"RoPE per layer ({shape}): transformers {costs['transformers']:.1f} us, rotary {costs['rotary']:.1f} us; "
              f"rotary_emb per forward: transformers {costs['transformers rotary_emb']:.1f} us, rotary "
              f"{costs['rotary rotary_emb']:.1f} us; per forward pass: {per_forward_hf:.0f} us -> {per_forward:.0f} us")
    print(f"float32 logits, patched vs unpatched: max |diff| {logits_diff:.2e} (of max |logit| {logits_scale:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
