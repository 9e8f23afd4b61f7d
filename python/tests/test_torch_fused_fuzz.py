"""An adversarial, seeded, differential fuzz of rotary.torch's fused and engine entry points on CPU
tensors (``rope_store``, ``qk_norm_rope``, ``rerotate_cache``, ``rotary_embedding``,
``apply_rope_with_cos_sin_cache_inplace``), aimed at the Python boundary: memory layouts the
wrappers and the extension's borrowing might mishandle, and what a refused call leaves behind.

Every tensor of a call lives at a random place in a buffer filled with a poison pattern (random
bytes, NaN patterns included): permuted dimension order, step slices (channels too), padding,
storage offsets, size-1 dimensions with odd strides (0, 2^40), zero-size tensors, slices of one
fused QKV buffer, HND caches as transposed views, token pools, int32/int64/float positions and
slots that are strided or offset. Each accepted call is checked bit for bit, over every byte of
every storage it was given:

- ``rope_store``: against rotary's plain ``Rope.apply`` on contiguous copies, then the cache dtype's
  rounding (fp8/int8: torch's own cast after saturating; exact for the finite, in-range values drawn
  here) and a scatter into a copy of the cache; bytes outside the written views unchanged.
- ``qk_norm_rope``: against the same call on contiguous copies (bit for bit: the library's layouts
  must not change bits), and that call against a float64 norm + rotation within the dtype's rounding.
- ``rerotate_cache``: against gather, dequantise, ``Rope.rerotate`` (or ``Rope.apply`` for raw keys),
  quantise and scatter, per slot.
- ``rotary_embedding`` / FlashInfer's entry point: against ``Rope.apply`` with the caller's
  ``cos_sin_cache`` on contiguous copies (bit for bit), and a float64 formula within rounding.

Each refused call must raise ValueError or TypeError naming the argument, and leave every byte of
every storage it was given unchanged (validate before write).

The seed: ``ROTARY_FUZZ_SEED`` (default below); a failure prints the seed, the case number and
the case's parameters.
"""
import math
import os
import random
import re

import pytest
import torch

from rotary import Rope
from rotary.torch import (apply_rope_with_cos_sin_cache_inplace, qk_norm_rope, rerotate_cache, rope_store,
                          rotary_embedding)

SEED = int(os.environ.get("ROTARY_FUZZ_SEED", "25"))
QUANTISED = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
MODEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
UNIT = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float64: 2.0 ** -53}
MAX_FAILURES_SHOWN = 6

# Ropes small enough to be fast, each one kind of descriptor.
ROPES = {
    "d64 half": lambda: Rope(64),
    "d64 interleaved": lambda: Rope(64, pairing="interleaved", base=5e5),
    "d48 partial r16": lambda: Rope(48, rotary_dim=16),
    "d32 yarn": lambda: Rope(32, schedule="yarn", factor=4.0, original_max_position=4096),
    "d64 r32 at offset 32": lambda: Rope(64, rotary_dim=32, rotary_offset=32),
    "d64 mrope": lambda: Rope(64, base=1e6, stream_layout="sections", sections=[8, 12, 12]),
    "d32 xpos": lambda: Rope(32, xpos_scale_base=512),
}
_ROPE_CACHE = {}


def rope_of(name):
    if name not in _ROPE_CACHE:
        _ROPE_CACHE[name] = ROPES[name]()
    return _ROPE_CACHE[name]


# ---- Memory: poisoned buffers, random layouts, byte-exact expectations -------------------------------

def bits(t):
    return t.view(BITS[t.element_size()])


def poison(n, dtype, g):
    """n elements of random bytes (NaN and inf patterns included)."""
    size = torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8).view(dtype)


def storage_bytes(t):
    """Every byte of t's storage, as a uint8 tensor sharing it."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


class Spot:
    """Where a view lives: a fresh base tensor, the view's shape, strides (elements) and offset."""

    def __init__(self, base, shape, strides, offset):
        self.base, self.shape, self.strides, self.offset = base, tuple(shape), tuple(strides), offset

    def on(self, base):
        return base.as_strided(self.shape, self.strides, self.offset)

    def view(self):
        return self.on(self.base)

    def columns(self, start, heads, d, flat):
        """Columns [start, start + heads * d) of a 2-D spot: [rows, heads * d] (flat) or [rows, heads, d]."""
        s_row, s_col = self.strides
        if flat:
            return Spot(self.base, (self.shape[0], heads * d), (s_row, s_col), self.offset + start * s_col)
        return Spot(self.base, (self.shape[0], heads, d), (s_row, d * s_col, s_col), self.offset + start * s_col)


def place(rng, g, values):
    """A tensor equal to ``values`` (bit for bit) in a random layout inside a poisoned buffer (with a spare
    element at its end), and its Spot."""
    shape = tuple(values.shape)
    n = len(shape)
    perm = list(range(n))
    steps, pads = [1] * n, [0] * n
    if rng.random() < 0.4:
        rng.shuffle(perm)
    for d in range(n):
        if rng.random() < 0.25:
            steps[d] = rng.choice((2, 3))
        if rng.random() < 0.25:
            pads[d] = rng.choice((1, 3))
    offset = rng.choice((0, 0, 1, 3, 7))
    phys = [shape[d] * steps[d] + pads[d] for d in range(n)]
    stride, acc = [0] * n, 1
    for d in reversed(perm):
        stride[d] = acc
        acc *= max(phys[d], 1)
    strides = [stride[d] * steps[d] for d in range(n)]
    start = sum(rng.randint(0, pads[d]) * stride[d] for d in range(n))
    for d in range(n):
        if shape[d] == 1 and rng.random() < 0.3:
            strides[d] = rng.choice((0, 12345, 1 << 40))  # a size-1 dimension's stride is never used
    base = poison(offset + start + acc + 1, values.dtype, g)
    spot = Spot(base, shape, strides, offset + start)
    bits(spot.view()).copy_(bits(values))
    return spot.view(), spot


def place_index(rng, g, values):
    """An index tensor (slots, positions, delta) contiguous, strided or at an offset (empty ones too)."""
    kind = rng.choice(("contiguous", "contiguous", "strided", "offset"))
    if kind == "contiguous" or values.ndim != 1:
        return values.clone() if kind == "contiguous" else place(rng, g, values)[0]
    n = values.shape[0]
    if kind == "strided":
        buf = torch.zeros(2 * n + 1, dtype=values.dtype)
        buf[1::2] = values
        return buf[1::2]
    buf = torch.zeros(n + 5, dtype=values.dtype)
    buf[3:3 + n] = values
    return buf[3:3 + n]


class Ledger:
    """A snapshot of every byte of the storages of a call's tensors, and the writes the call should make
    (spot -> values): ``mismatches()`` names each storage whose bytes differ from before + the writes."""

    def __init__(self, *tensors):
        self.storages = {}
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                ptr = t.untyped_storage().data_ptr()
                if ptr not in self.storages:
                    s = storage_bytes(t)
                    self.storages[ptr] = (s, s.clone())
        self.writes = []

    def expect(self, spot, values, name):
        self.writes.append((spot, values, name))

    def mismatches(self):
        out = []
        expected = {ptr: before.clone() for ptr, (_, before) in self.storages.items()}
        names = {ptr: [] for ptr in self.storages}
        for spot, values, name in self.writes:
            ptr = spot.base.untyped_storage().data_ptr()
            typed = expected[ptr].view(BITS[spot.base.element_size()])
            bits(spot.on(typed)).copy_(bits(values.to(spot.base.dtype)))
            names[ptr].append(name)
        for ptr, (now, _) in self.storages.items():
            if not torch.equal(now, expected[ptr]):
                diff = (now != expected[ptr]).nonzero().flatten()
                out.append(f"storage of {'/'.join(names[ptr]) or 'an input'}: {diff.numel()} bytes differ, first at "
                           f"byte {int(diff[0])}")
        return out


def unchanged(*tensors):
    """A Ledger expecting no write at all."""
    return Ledger(*tensors)


# ---- Reference pieces ---------------------------------------------------------------------------------

def store_as(values, cache_dtype, scale=None, mode="divide"):
    """What a cache holds for values in the data's dtype: quantised (float32, scale applied, saturated,
    torch's nearest-even cast: exact for the finite values drawn here) or rounded to the cache's dtype."""
    if cache_dtype not in QUANTISED:
        return values.to(cache_dtype)
    x = values.float()
    if scale is not None and values.numel():
        s = scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(())
        x = x / s if mode == "divide" else x * s
    if cache_dtype == torch.int8:
        return torch.nan_to_num(x, nan=0.0).clamp(-127, 127).round().to(torch.int8)
    big = torch.finfo(cache_dtype).max
    return x.clamp(-big, big).to(cache_dtype)


def dequantise(codes, scale=None, mode="divide"):
    x = codes.float()
    if scale is None:
        return x
    s = scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(())
    return x * s if mode == "divide" else x / s


def scale_values(scale):
    """A scale argument as the float32 values the library reads (None: none)."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        return scale.detach().reshape(-1).to(torch.float32).contiguous()
    return torch.tensor([float(scale)], dtype=torch.float32)


def draw_scale(rng, g, heads):
    """None, a float, or a float tensor of 1 or ``heads`` values, any float dtype and layout."""
    kind = rng.choice(("none", "float", "tensor1", "scalar", "per head", "per head"))
    if kind == "none":
        return None
    if kind == "float":
        return rng.choice((0.5, 0.37, 1.5))
    if kind == "scalar":
        return torch.tensor(rng.choice((0.5, 0.37, 1.5)), dtype=rng.choice((torch.float32, torch.float64)))
    n = 1 if kind == "tensor1" else heads
    values = (0.25 + torch.rand(n, generator=g)).to(rng.choice((torch.float32, torch.float32, torch.float64)))
    return place(rng, g, values)[0] if rng.random() < 0.5 else values


def data(g, shape, dtype, scale=2.0):
    return (scale * torch.randn(shape, generator=g)).to(dtype)


def draw_positions(rng, g, tokens, streams, xpos=False):
    """(positions tensor or None, offset, canonical positions for Rope.apply); xPos: within its reach
    (|position| <= 32695 for xpos_scale_base 512)."""
    top = 30000 if xpos else (1 << 31) - 1
    kind = rng.random()
    if kind < 0.2:
        offset = rng.choice((0, 1, 1000, top - tokens))
        return None, offset, None
    shape = (streams, tokens) if (streams > 1 and rng.random() < 0.7) else (tokens,)
    values = torch.randint(0, min(1 << 17, top), shape, generator=g)
    if values.numel():
        flat = values.view(-1)
        flat[0] = 0
        if values.numel() > 2 and rng.random() < 0.3:
            flat[-1] = top
    dtype = rng.choice((torch.int64, torch.int32, torch.int64, torch.float64, torch.float32))
    if dtype == torch.float32:
        values = values % (1 << 24)  # exact in float32
    values = values.to(dtype)
    if dtype == torch.float64 and rng.random() < 0.5:
        values = values + 0.25  # fractional: the exact real angle
    return place_index(rng, g, values), 0, values.clone()


def draw_slots(rng, g, tokens, capacity):
    slots = torch.randperm(capacity, generator=g)[:tokens]
    if tokens:
        for i in range(tokens):
            if rng.random() < 0.2:
                slots[i] = -1 - rng.randint(0, 3)  # negative: skipped
    dtype = rng.choice((torch.int64, torch.int32))
    return place_index(rng, g, slots.to(dtype)), slots.clone()


def failures_report(name, failures, total):
    shown = "\n".join(failures[:MAX_FAILURES_SHOWN])
    return f"{name}: {len(failures)} of {total} cases failed (ROTARY_FUZZ_SEED={SEED}):\n{shown}"


def activation(rng, g, values, forms=("3d", "flat")):
    """values [tokens, heads, dim] as the call takes it: 3-D or flat [tokens, heads * dim], any layout.
    Returns (tensor, spot, reshape to the tensor's shape)."""
    form = rng.choice(forms)
    shaped = values if form == "3d" else values.reshape(values.shape[0], values.shape[1] * values.shape[2])
    t, spot = place(rng, g, shaped)
    return t, spot, (lambda x: x.reshape(shaped.shape))


# ---- rope_store -------------------------------------------------------------------------------------

def draw_cache(rng, g, slots_needed, heads, dim, dtype):
    """A poisoned cache in a random layout: (the tensor as passed, its kv_layout, the Spot of its NHD-order
    view [num_blocks, block_size, heads, dim], or [slots, heads, dim] for a token pool)."""
    kind = rng.choice(("NHD", "HND", "pool"))
    block = rng.choice((1, 2, 4, 16))
    if kind == "pool":
        capacity = slots_needed + rng.randint(0, 4)
        shape = (capacity, heads, dim)
    else:
        blocks = (slots_needed + block - 1) // block + rng.randint(0, 2)
        shape = (blocks, block, heads, dim)
    values = poison(math.prod(shape), dtype, g).reshape(shape)
    t, spot = place(rng, g, values)
    passed = t.transpose(1, 2) if kind == "HND" else t
    return passed, ("HND" if kind == "HND" else "NHD"), spot


def cache_rows(logical):
    """An NHD-order cache (or a pool) as [capacity, heads, dim] (a copy)."""
    return logical.reshape(-1, logical.shape[-2], logical.shape[-1]).clone()


def scattered(before, rows, slots):
    """before (NHD order) with rows[t] at every slot >= 0: a new tensor of before's shape."""
    out = cache_rows(before)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            out[s] = rows[t]
    return out.reshape(before.shape)


def rope_store_case(rng, g):
    name = rng.choice(list(ROPES))
    rope = rope_of(name)
    streams = 3 if "mrope" in name else 1
    d = rope.head_dim
    dtype = rng.choice(MODEL_DTYPES + (torch.float64,))
    if dtype == torch.float64:
        cache_dtype = torch.float64
    else:
        cache_dtype = rng.choice((dtype, torch.float32, torch.bfloat16) + QUANTISED)
    tokens = rng.choice((0, 1, 2, 3, 5, 8))
    heads, kv_heads = rng.choice((0, 1, 2, 3)), rng.choice((1, 2))
    with_v = rng.random() < 0.8
    fused = rng.random() < 0.3
    dv = rng.choice((d, d, 16, 24))  # (fused: v's columns narrower than q's and k's heads)
    four_d = not fused and tokens in (2, 8) and rng.random() < 0.2
    params = dict(rope=name, dtype=dtype, cache=cache_dtype, tokens=tokens, heads=heads, kv_heads=kv_heads, dv=dv,
                  v=with_v, fused=fused, four_d=four_d)
    q0, k0 = data(g, (tokens, heads, d), dtype), data(g, (tokens, kv_heads, d), dtype)
    v0 = data(g, (tokens, kv_heads, dv), dtype) if with_v else None
    spots = {}
    if fused:  # q, k, v: column slices of one [tokens, width] projection buffer
        width = (heads + kv_heads) * d + (kv_heads * dv if with_v else 0)
        buf, bspot = place(rng, g, torch.zeros(tokens, width, dtype=dtype))
        flat = rng.random() < 0.5
        parts, col = {}, 0
        for key, vals, h, w in (("q", q0, heads, d), ("k", k0, kv_heads, d), ("v", v0, kv_heads, dv)):
            if vals is None:
                continue
            sp = bspot.columns(col, h, w, flat)
            bits(sp.view()).copy_(bits(vals.reshape(sp.shape)))
            parts[key], spots[key] = sp.view(), sp
            col += h * w
        q, k, v = parts["q"], parts["k"], parts.get("v")
        reshape_q = (lambda x: x.reshape(tokens, heads * d)) if flat else (lambda x: x)
    elif four_d:
        b, s = 2, tokens // 2
        q, spots["q"] = place(rng, g, q0.reshape(b, s, heads, d))
        k, spots["k"] = place(rng, g, k0.reshape(b, s, kv_heads, d))
        v = None
        if with_v:
            v, spots["v"] = place(rng, g, v0.reshape(b, s, kv_heads, dv))
        reshape_q = lambda x: x.reshape(b, s, heads, d)  # noqa: E731
    else:
        q, spots["q"], reshape_q = activation(rng, g, q0)
        k, spots["k"], _ = activation(rng, g, k0)
        v = None
        if with_v:
            v, spots["v"], _ = activation(rng, g, v0, forms=("3d",) if kv_heads > 1 or rng.random() < 0.5 else
                                          ("3d", "flat"))
    capacity_needed = max(tokens, 1) + rng.randint(0, 6)
    k_cache, kv_layout, kc_spot = draw_cache(rng, g, capacity_needed, kv_heads, d, cache_dtype)
    v_cache = vc_spot = None
    if with_v:
        # v_cache: its own layout, same slot addressing (same block structure as k_cache's).
        shape_k = kc_spot.shape
        shape_v = shape_k[:-1] + (dv,)
        vals = poison(math.prod(shape_v), cache_dtype, g).reshape(shape_v)
        vt, vc_spot = place(rng, g, vals)
        v_cache = vt.transpose(1, 2) if kv_layout == "HND" else vt
    capacity = math.prod(kc_spot.shape[:-2])
    slots, slots0 = draw_slots(rng, g, tokens, capacity)
    if four_d:
        # [seq], shared by both rows (one stream serves every stream)
        positions, offset, pos0 = draw_positions(rng, g, tokens // 2, 1, "xpos" in name)
    else:
        positions, offset, pos0 = draw_positions(rng, g, tokens, streams, "xpos" in name)
    quantised = cache_dtype in QUANTISED
    mode = rng.choice(("divide", "multiply"))
    k_scale = draw_scale(rng, g, kv_heads) if quantised else None
    v_scale = draw_scale(rng, g, kv_heads) if quantised and with_v else None
    kwargs = dict(positions=positions, offset=offset, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale,
                  scale_mode=mode)
    # Outputs out of place.
    q_out = q_scale = k_out = None
    r = rng.random()
    if r < 0.15 and not four_d:
        q_out, spots["q_out"] = place(rng, g, poison(q.numel(), dtype, g).reshape(q.shape))
    elif r < 0.3 and dtype != torch.float64 and not four_d:
        q_out_dtype = rng.choice(QUANTISED)
        q_out, spots["q_out"] = place(rng, g, poison(q.numel(), q_out_dtype, g).reshape(q.shape))
        q_scale = draw_scale(rng, g, heads)
    r = rng.random()
    if r < 0.15 and not four_d:
        k_out, spots["k_out"] = place(rng, g, poison(k.numel(), dtype, g).reshape(k.shape))
    elif r < 0.25:
        k_out = k  # k rotated in place
    kwargs.update(q_out=q_out, q_scale=q_scale, k_out=k_out)
    # A part of the key stored beside the rotated one (MLA's kv_c): its own width, cache and scale.
    kp0 = kpc_spot = None
    if not four_d and rng.random() < 0.2:
        pass_dim = rng.choice((16, 40, d))
        kp0 = data(g, (tokens, kv_heads, pass_dim), dtype)
        kwargs["k_pass"], spots["k_pass"], _ = activation(rng, g, kp0, forms=("3d",))  # (no flat form)
        shape_p = kc_spot.shape[:-1] + (pass_dim,)
        kpt, kpc_spot = place(rng, g, poison(math.prod(shape_p), cache_dtype, g).reshape(shape_p))
        kwargs["k_pass_cache"] = kpt.transpose(1, 2) if kv_layout == "HND" else kpt
        kwargs["k_pass_scale"] = draw_scale(rng, g, kv_heads) if quantised else None
        params["k_pass"] = pass_dim
    # The engine's own table instead of rotary's angles (integer positions index its rows).
    table = None
    if streams == 1 and "xpos" not in name and dtype != torch.float64 and not four_d and rng.random() < 0.2:
        rows = rng.choice((1, 7, 50))
        pos0 = torch.randint(0, rows, (tokens,), generator=g).to(rng.choice((torch.int64, torch.int32)))
        offset = 0
        table = torch.rand(rows, rope.rotary_dim, generator=g).to(rng.choice((torch.float32, dtype))) * 2 - 1
        kwargs.update(positions=place_index(rng, g, pos0), offset=0,
                      cos_sin_cache=place(rng, g, table)[0] if rng.random() < 0.5 else table.clone())
        params["cos_sin_cache"] = (rows, table.dtype)
    numerics = "exact"
    if table is None and dtype != torch.float64 and (pos0 is None or not pos0.is_floating_point()) and \
            rng.random() < 0.15:
        numerics = kwargs["numerics"] = params["numerics"] = "hf-float32"  # transformers' float32 angles
    args = dict(rope=rope, q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, slots=slots, **kwargs)
    # The oracle: Rope.apply on contiguous copies, the cache dtype's rounding, a scatter.
    qa, ka = (q0, k0) if not four_d else (q0.reshape(2, tokens // 2, heads, d), k0.reshape(2, tokens // 2,
                                                                                             kv_heads, d))
    q_rot, k_rot = rope.apply(qa.clone(), ka.clone(), positions=pos0, offset=offset, cos_sin_cache=table,
                              numerics=numerics)
    q_rot, k_rot = q_rot.reshape(tokens, heads, d), k_rot.reshape(tokens, kv_heads, d)
    ledger = Ledger(*[t for t in args.values() if isinstance(t, torch.Tensor)])
    if q_out is None:
        ledger.expect(spots["q"], reshape_q(q_rot), "q")
    elif q_out.dtype in QUANTISED:
        ledger.expect(spots["q_out"], store_as(q_rot, q_out.dtype, scale_values(q_scale), mode).reshape(q_out.shape),
                      "q_out")
    else:
        ledger.expect(spots["q_out"], q_rot.reshape(q_out.shape), "q_out")
    if k_out is k:
        ledger.expect(spots["k"], k_rot.reshape(k.shape), "k")
    elif k_out is not None:
        ledger.expect(spots["k_out"], k_rot.reshape(k_out.shape), "k_out")
    kc_before = kc_spot.view().clone()
    ledger.expect(kc_spot, scattered(kc_before, store_as(k_rot, cache_dtype, scale_values(k_scale), mode), slots0),
                  "k_cache")
    if with_v:
        vc_before = vc_spot.view().clone()
        v_rows = store_as(v0.reshape(tokens, kv_heads, dv), cache_dtype, scale_values(v_scale), mode)
        ledger.expect(vc_spot, scattered(vc_before, v_rows, slots0), "v_cache")
    if kp0 is not None:
        kp_rows = store_as(kp0, cache_dtype, scale_values(kwargs["k_pass_scale"]), mode)
        ledger.expect(kpc_spot, scattered(kpc_spot.view().clone(), kp_rows, slots0), "k_pass_cache")
    return params, args, ledger, spots


def run_accepted(fn, args, ledger, returns):
    """Calls fn; a list of what is wrong (an exception, a wrong result, a byte written or not written)."""
    try:
        out = fn(**args)
    except Exception as e:  # noqa: BLE001 - every exception is a finding here
        return [f"raised {type(e).__name__}: {e}"]
    wrong = ledger.mismatches()
    if returns is not None and not returns(out):
        wrong.append("returned the wrong object")
    return wrong


def test_rope_store_layout_fuzz_equals_apply_then_scatter():
    rng, g = random.Random(SEED), torch.Generator().manual_seed(SEED)
    failures, total = [], 160
    for case in range(total):
        params, args, ledger, _ = rope_store_case(rng, g)
        want_back = args["q"] if args["q_out"] is None else args["q_out"]
        wrong = run_accepted(rope_store, args, ledger, lambda out, w=want_back: out is w)
        if wrong:
            failures.append(f"case {case} {params}: {'; '.join(wrong)}")
    assert not failures, failures_report("rope_store", failures, total)


# ---- rope_store: refused calls ----------------------------------------------------------------------

def _overlapping(first, second_shape, second_dtype, overlap_bytes=2):
    """A fresh pair: first's values in a byte buffer, then a tensor of second_shape/second_dtype starting
    overlap_bytes before first's end (so the two share bytes). Returns (first copy, second)."""
    nbytes_a = first.numel() * first.element_size()
    size_b = torch.empty(0, dtype=second_dtype).element_size()
    start = max(0, nbytes_a - overlap_bytes)
    start -= start % size_b
    nbytes_b = math.prod(second_shape) * size_b
    buf = torch.zeros(start + nbytes_b + nbytes_a, dtype=torch.uint8)
    a = buf[:nbytes_a].view(first.dtype).view(first.shape)
    a.copy_(first)
    b = buf[start:start + nbytes_b].view(second_dtype).view(second_shape)
    return a, b


def _store_mutations(rng, args, params):
    """(name, changes, exception types, message regex) refusals that apply to this case."""
    q, k, slots, kc = args["q"], args["k"], args["slots"], args["k_cache"]
    tokens = params["tokens"]
    if kc.ndim == 3:
        capacity = kc.shape[0]
    else:
        capacity = kc.shape[0] * (kc.shape[2] if args["kv_layout"] == "HND" else kc.shape[1])
    out = []
    if tokens >= 2:
        dup = slots.clone()
        dup[0], dup[1] = 3 % capacity, 3 % capacity
        out.append(("duplicate slot", dict(slots=dup), ValueError, r"slots\[1\]=\d+ repeats slots\[0\]"))
    if tokens >= 1:
        far = slots.to(torch.int64).clone()
        far[-1] = rng.choice((capacity, capacity + 7, (1 << 32) + 1, (1 << 62)))
        out.append(("slot beyond", dict(slots=far), ValueError, r"slots\[\d+\]=\d+ is beyond k_cache's capacity"))
        out.append(("slots 2-D", dict(slots=slots.reshape(1, -1)), ValueError, "slots"))
        pos = torch.arange(tokens) + 3
        pos[-1] = rng.choice((-1, 1 << 31, 1 << 32))
        out.append(("position out of range", dict(positions=pos, offset=0), ValueError, r"positions\[\d+\]"))
        out.append(("position nan", dict(positions=torch.full((tokens,), float("nan")), offset=0), ValueError,
                    "positions"))
        if params["heads"] > 0 and tokens >= 2:
            written_q = torch.zeros(1, *q.shape[1:], dtype=q.dtype).expand(q.shape)  # stride 0 over tokens
            out.append(("q expanded (written, stride 0)", dict(q=written_q, q_out=None, q_scale=None), ValueError,
                        r"\bq\b"))
    for bad in (torch.bool, torch.uint8, torch.int16, torch.float32):
        out.append((f"slots {bad}", dict(slots=slots.to(bad)), TypeError, "slots"))
    for bad in (torch.bool, torch.int16, torch.float16):
        out.append((f"positions {bad}", dict(positions=torch.zeros(tokens, dtype=bad), offset=0), TypeError,
                    "positions"))
    out.append(("slots count", dict(slots=torch.zeros(tokens + 1, dtype=torch.int64) - 1), ValueError,
                "slots has"))
    out.append(("positions count", dict(positions=torch.zeros(tokens + 2, dtype=torch.int64), offset=0), ValueError,
                "positions"))
    out.append(("slots on meta", dict(slots=torch.empty(tokens, dtype=torch.int64, device="meta")), ValueError,
                "slots is on meta"))
    out.append(("positions on meta", dict(positions=torch.empty(tokens, dtype=torch.int64, device="meta"), offset=0),
                ValueError, "positions is on meta"))
    out.append(("k_cache expanded (stride 0)", dict(k_cache=torch.zeros(1, *kc.shape[1:], dtype=kc.dtype).expand(
        2, *kc.shape[1:])), ValueError, "k_cache"))
    out.append(("k_cache int16", dict(k_cache=torch.zeros(kc.shape, dtype=torch.int16)), TypeError, "k_cache"))
    out.append(("kv_layout", dict(kv_layout="NDH"), ValueError, "kv_layout"))
    if kc.ndim == 4 and tokens:
        heads_dim = 1 if args["kv_layout"] == "HND" else 2
        wider = list(kc.shape)
        wider[heads_dim] += 1
        out.append(("k_cache heads", dict(k_cache=torch.zeros(wider, dtype=kc.dtype)), ValueError, "k_cache"))
    if args["k_cache"].dtype in QUANTISED:
        out.append(("k_scale zero", dict(k_scale=0.0), ValueError, "k_scale"))
        out.append(("k_scale nan tensor", dict(k_scale=torch.tensor([float("nan")])), ValueError, "k_scale"))
        out.append(("k_scale count", dict(k_scale=torch.ones(params["kv_heads"] + 2)), ValueError, "k_scale"))
        out.append(("k_scale 2-D", dict(k_scale=torch.ones(1, 1)), ValueError, "k_scale"))
        out.append(("k_scale int", dict(k_scale=torch.ones(1, dtype=torch.int32)), TypeError, "k_scale"))
    else:
        out.append(("k_scale on a float cache", dict(k_scale=0.5), ValueError, "k_scale"))
    if args["v"] is not None:
        out.append(("v without v_cache", dict(v_cache=None), ValueError, "v_cache"))
        vc = args["v_cache"]
        out.append(("v_cache expanded", dict(v_cache=torch.zeros(1, *vc.shape[1:], dtype=vc.dtype).expand(
            2, *vc.shape[1:])), ValueError, "v_cache"))
    if q.numel() > 0:
        # q_out sharing memory with q (one element shifted), and a k_cache over q's bytes.
        q_copy, shifted = _overlapping(q.contiguous(), q.shape, q.dtype, overlap_bytes=q.element_size() * (
            q.numel() - 1))
        out.append(("q_out over q", dict(q=q_copy, q_out=shifted, q_scale=None), ValueError, "q_out"))
        q_copy, kc_over = _overlapping(q.contiguous(), tuple(kc.shape), kc.dtype)
        out.append(("k_cache over q", dict(q=q_copy, k_cache=kc_over, kv_layout="NHD"), ValueError,
                    r"k_cache|\bq\b"))
        out.append(("q requires grad", dict(q=q.detach().clone().requires_grad_(), q_out=None, q_scale=None),
                    ValueError, r"\bq\b"))
    if k.numel() > 0:
        k_copy, q_over = _overlapping(k.contiguous(), tuple(q.shape), q.dtype)
        if q.numel() > 0:
            out.append(("q over k", dict(k=k_copy, q=q_over, q_out=None, q_scale=None), ValueError, r"\bq\b|\bk\b"))
        out.append(("k dtype", dict(k=k.to(torch.float16 if k.dtype != torch.float16 else torch.float32)),
                    (TypeError, ValueError), r"\bk\b"))
    if q.dtype != torch.float64:
        out.append(("q_out dtype", dict(q_out=torch.zeros(q.shape, dtype=torch.float64), q_scale=None), TypeError,
                    "q_out"))
    out.append(("q numpy", dict(q=q.detach().numpy() if q.dtype in (torch.float32, torch.float64) else [1.0]),
                TypeError, r"\bq\b"))
    return out


def _apply_change(args, change):
    new = dict(args)
    new.update(change)
    return new


def test_rope_store_refusals_name_the_argument_and_write_nothing():
    rng, g = random.Random(SEED + 1), torch.Generator().manual_seed(SEED + 1)
    failures, total = [], 0
    for case in range(40):
        params, args, _, _ = rope_store_case(rng, g)
        mutations = _store_mutations(rng, args, params)
        for name, change, errors, message in rng.sample(mutations, min(6, len(mutations))):
            total += 1
            call = _apply_change(args, change)
            ledger = unchanged(*[t for t in call.values() if isinstance(t, torch.Tensor)])
            problem = _expect_refusal(rope_store, call, errors, message)
            problem += ledger.mismatches()
            if problem:
                failures.append(f"case {case} {params} mutation '{name}': {'; '.join(problem)}")
    assert total > 150
    assert not failures, failures_report("rope_store refusals", failures, total)


def _expect_refusal(fn, call, errors, message):
    try:
        fn(**call)
    except (ValueError, TypeError) as e:
        if not isinstance(e, errors):
            return [f"raised {type(e).__name__} (want {errors}): {e}"]
        if not re.search(message, str(e)):
            return [f"message does not name the argument ({message!r}): {e}"]
        return []
    except Exception as e:  # noqa: BLE001 - the finding: not ValueError or TypeError
        return [f"raised {type(e).__name__}, not ValueError/TypeError: {e}"]
    return ["accepted"]


# ---- qk_norm_rope -----------------------------------------------------------------------------------

def norm_rope_float64(rope, x, weight, eps, weight_offset, scope, order, positions, offset):
    """The norm and the rotation in float64 (no rounding between): the within-rounding reference."""
    def norm(t):
        shape = t.shape
        if scope == "all_heads":
            t = t.reshape(*shape[:-2], shape[-2] * shape[-1])
        r = 1.0 / torch.sqrt((t * t).mean(-1, keepdim=True) + eps)
        y = t * r
        if weight is not None:
            y = y * (weight_offset + weight.double().reshape(-1))
        return y.reshape(shape)
    x = x.double()
    if order == "norm_rope":
        return rope.apply(norm(x), positions=positions, offset=offset)
    return norm(rope.apply(x, positions=positions, offset=offset))


def qk_norm_case(rng, g):
    name = rng.choice(list(ROPES))
    rope = rope_of(name)
    streams = 3 if "mrope" in name else 1
    d = rope.head_dim
    dtype = rng.choice(MODEL_DTYPES)
    tokens = rng.choice((0, 1, 2, 3, 5))
    heads, kv_heads = rng.choice((1, 2, 3)), rng.choice((1, 2))
    scope = rng.choice(("head", "head", "all_heads"))
    order = rng.choice(("norm_rope", "rope_norm"))
    rounding = rng.choice(("llama", "gemma"))
    weight_offset = rng.choice((0.0, 1.0))
    eps = rng.choice((1e-6, 1e-5, 0.0))
    with_k = rng.random() < 0.9
    cache = with_k and rng.random() < 0.4
    cache_dtype = rng.choice((dtype, torch.float32) + QUANTISED) if cache else None
    v_mode = rng.choice(("none", "norm", "store")) if (cache or rng.random() < 0.5) else "none"
    if v_mode == "store" and not cache:
        v_mode = "norm"
    params = dict(rope=name, dtype=dtype, tokens=tokens, heads=heads, kv_heads=kv_heads, scope=scope, order=order,
                  rounding=rounding, weight_offset=weight_offset, eps=eps, k=with_k, cache=cache_dtype, v=v_mode)
    q0 = data(g, (tokens, heads, d), dtype, 3.0)
    k0 = data(g, (tokens, kv_heads, d), dtype, 3.0) if with_k else None
    v0 = data(g, (tokens, kv_heads, d), dtype, 3.0) if v_mode != "none" else None

    def weight(h):
        kind = rng.choice(("none", "data", "f32", "expanded", "strided", "parameter"))
        n = h * d if scope == "all_heads" else d
        wd = dtype if rng.random() < 0.5 else torch.float32
        w = (1 + 0.3 * torch.randn(n, generator=g)).to(wd)
        if kind == "none":
            return None
        if kind == "expanded":  # stride 0: one value for every channel
            return w[:1].expand(n)
        if kind == "strided":
            return place(rng, g, w)[0]
        if kind == "parameter":
            return torch.nn.Parameter(w, requires_grad=rng.random() < 0.5)
        return w
    q_weight, k_weight = weight(heads), weight(kv_heads) if with_k else None
    spots = {}
    q, spots["q"], reshape_q = activation(rng, g, q0)
    k = reshape_k = None
    if with_k:
        k, spots["k"], reshape_k = activation(rng, g, k0)
    v = None
    if v0 is not None:
        v, spots["v"], reshape_v = activation(rng, g, v0, forms=("3d",))
    positions, offset, pos0 = draw_positions(rng, g, tokens, streams, "xpos" in name)
    kwargs = dict(eps=eps, positions=positions, offset=offset, weight_offset=weight_offset, order=order, scope=scope,
                  rounding=rounding)
    if v is not None:
        kwargs.update(v=v, v_norm=v_mode == "norm" or rng.random() < 0.5)
    canon_cache = {}
    if cache:
        capacity_needed = max(tokens, 1) + rng.randint(0, 4)
        k_cache, kv_layout, kc_spot = draw_cache(rng, g, capacity_needed, kv_heads, d, cache_dtype)
        spots["k_cache"] = kc_spot
        capacity = math.prod(kc_spot.shape[:-2])
        slots, slots0 = draw_slots(rng, g, tokens, capacity)
        kwargs.update(k_cache=k_cache, slots=slots, kv_layout=kv_layout, scale_mode=rng.choice(("divide",
                                                                                                 "multiply")))
        canon_cache.update(k_cache=kc_spot.view().clone(memory_format=torch.contiguous_format), slots=slots0)
        if cache_dtype in QUANTISED:
            kwargs["k_scale"] = draw_scale(rng, g, kv_heads)
        if v is not None:
            shape_v = kc_spot.shape
            vt, spots["v_cache"] = place(rng, g, poison(math.prod(shape_v), cache_dtype, g).reshape(shape_v))
            kwargs["v_cache"] = vt.transpose(1, 2) if kv_layout == "HND" else vt
            canon_cache["v_cache"] = spots["v_cache"].view().clone(memory_format=torch.contiguous_format)
            if cache_dtype in QUANTISED:
                kwargs["v_scale"] = draw_scale(rng, g, kv_heads)
    if rng.random() < 0.2:
        kwargs["q_out"], spots["q_out"] = place(rng, g, poison(q.numel(), dtype, g).reshape(q.shape))
    if with_k and rng.random() < 0.2:
        kwargs["k_out"], spots["k_out"] = place(rng, g, poison(k.numel(), dtype, g).reshape(k.shape))
    args = dict(rope=rope, q=q, k=k, q_weight=q_weight, k_weight=k_weight, **kwargs)
    # The same call on contiguous copies: NHD caches, contiguous weights, int64 slots, in place.
    canon = dict(args, q=q0.clone(), k=None if k0 is None else k0.clone(),
                 q_weight=None if q_weight is None else q_weight.detach().contiguous(),
                 k_weight=None if k_weight is None else k_weight.detach().contiguous(), q_out=None, k_out=None,
                 positions=None if pos0 is None else pos0.clone())
    if v is not None:
        canon["v"] = v0.clone()
    if cache:
        canon.update(k_cache=canon_cache["k_cache"], slots=canon_cache["slots"].to(torch.int64), kv_layout="NHD",
                     k_scale=scale_values(kwargs.get("k_scale")))
        if v is not None:
            canon.update(v_cache=canon_cache["v_cache"], v_scale=scale_values(kwargs.get("v_scale")))
    qk_norm_rope(**canon)
    ledger = Ledger(*[t for t in args.values() if isinstance(t, torch.Tensor)])
    ledger.expect(spots["q_out" if "q_out" in kwargs else "q"], reshape_q(canon["q"]), "q")
    if with_k:  # k normed and rotated in place (with a cache too), or into k_out
        if "k_out" in kwargs:
            ledger.expect(spots["k_out"], reshape_k(canon["k"]), "k_out")
        else:
            ledger.expect(spots["k"], reshape_k(canon["k"]), "k")
    if v is not None and kwargs.get("v_norm") and not cache:
        ledger.expect(spots["v"], reshape_v(canon["v"]), "v")
    if cache:
        ledger.expect(spots["k_cache"], canon["k_cache"], "k_cache")
        if v is not None:
            ledger.expect(spots["v_cache"], canon["v_cache"], "v_cache")
    # The canonical call against float64 within the dtype's rounding (norm, weight, rotation: a few
    # roundings of each head's largest value).
    ref = norm_rope_float64(rope, q0, q_weight if q_weight is None else q_weight.detach(), eps, weight_offset, scope,
                            order, pos0, offset)
    return params, args, ledger, (canon["q"], ref)


def test_qk_norm_rope_layout_fuzz_equals_the_contiguous_call():
    rng, g = random.Random(SEED + 2), torch.Generator().manual_seed(SEED + 2)
    failures, total = [], 120
    for case in range(total):
        params, args, ledger, (q_canon, q_ref) = qk_norm_case(rng, g)
        if q_canon.numel():
            err = (q_canon.double() - q_ref).abs()
            head_max = q_ref.abs().amax(-1, keepdim=True) + 1e-30
            worst = float((err / head_max).max()) / UNIT[params["dtype"]]
            if not worst <= 8:
                failures.append(f"case {case} {params}: the contiguous call is {worst:.1f} units of its dtype from "
                                "float64")
        want_back = (args.get("q_out", args["q"]), args.get("k_out", args["k"]))
        wrong = run_accepted(qk_norm_rope, args, ledger,
                             lambda out, w=want_back: out[0] is w[0] and out[1] is w[1])
        if wrong:
            failures.append(f"case {case} {params}: {'; '.join(wrong)}")
    assert not failures, failures_report("qk_norm_rope", failures, total)


def _norm_mutations(args, params):
    """(name, changes, exception types, message regex) refusals of qk_norm_rope that apply to this case."""
    q, k, tokens = args["q"], args["k"], params["tokens"]
    d = args["rope"].head_dim
    out = [
        ("eps negative", dict(eps=-1e-6), ValueError, "eps"),
        ("eps nan", dict(eps=float("nan")), ValueError, "eps"),
        ("q_weight count", dict(q_weight=torch.ones(d + 2)), ValueError, "q_weight"),
        ("q_weight int", dict(q_weight=torch.ones(d, dtype=torch.int32)), (TypeError, ValueError), "q_weight"),
        ("q_weight on meta", dict(q_weight=torch.ones(d, device="meta")), ValueError, "q_weight"),
        ("order word", dict(order="norm"), ValueError, "order"),
        ("positions count", dict(positions=torch.zeros(tokens + 1, dtype=torch.int64), offset=0), ValueError,
         "positions"),
        ("positions bool", dict(positions=torch.zeros(tokens, dtype=torch.bool), offset=0), TypeError, "positions"),
        ("q float64", dict(q=q.double(), k=None, k_weight=None, k_cache=None, v_cache=None, slots=None, v=None,
                           k_out=None, q_out=None, k_scale=None, v_scale=None), (ValueError, TypeError), r"\bq\b"),
    ]
    if tokens:
        out.append(("position beyond", dict(positions=torch.full((tokens,), 1 << 31), offset=0), ValueError,
                    "positions"))
    if tokens >= 2:
        written_q = torch.zeros(1, *q.shape[1:], dtype=q.dtype).expand(q.shape)
        out.append(("q expanded (written)", dict(q=written_q, q_out=None), ValueError, r"\bq\b"))
        if k is not None and args.get("k_out") is None:
            written_k = torch.zeros(1, *k.shape[1:], dtype=k.dtype).expand(k.shape)
            out.append(("k expanded (written)", dict(k=written_k), ValueError, r"\bk\b"))
    if q.numel() and args.get("q_out") is None:
        q_copy, shifted = _overlapping(q.contiguous(), q.shape, q.dtype, q.element_size() * (q.numel() - 1))
        out.append(("q_out over q", dict(q=q_copy, q_out=shifted), ValueError, "q_out"))
        out.append(("q requires grad", dict(q=q.detach().clone().requires_grad_()), ValueError, r"\bq\b"))
    slots = args.get("slots")
    if slots is not None:
        kc = args["k_cache"]
        if tokens >= 2:
            dup = slots.clone()
            dup[0], dup[1] = 0, 0
            out.append(("duplicate slot", dict(slots=dup), ValueError, r"slots\[1\]=0 repeats slots\[0\]"))
        if tokens:
            far = slots.to(torch.int64).clone()
            far[0] = 1 << 40
            out.append(("slot beyond", dict(slots=far), ValueError, r"slots\[0\]=\d+ is beyond"))
        out.append(("k_cache expanded", dict(k_cache=torch.zeros(1, *kc.shape[1:], dtype=kc.dtype).expand(
            2, *kc.shape[1:])), ValueError, "k_cache"))
        out.append(("slots float", dict(slots=slots.float()), TypeError, "slots"))
        if q.numel() and args.get("q_out") is None:
            q_copy, kc_over = _overlapping(q.contiguous(), tuple(kc.shape), kc.dtype)
            out.append(("k_cache over q", dict(q=q_copy, k_cache=kc_over, kv_layout="NHD"), ValueError,
                        r"k_cache|\bq\b"))
    return out


def test_qk_norm_rope_refusals_name_the_argument_and_write_nothing():
    rng, g = random.Random(SEED + 9), torch.Generator().manual_seed(SEED + 9)
    failures, total = [], 0
    for case in range(30):
        params, args, _, _ = qk_norm_case(rng, g)
        mutations = _norm_mutations(args, params)
        for name, change, errors, message in rng.sample(mutations, min(6, len(mutations))):
            total += 1
            call = _apply_change(args, change)
            ledger = unchanged(*[t for t in call.values() if isinstance(t, torch.Tensor)])
            problem = _expect_refusal(qk_norm_rope, call, errors, message) + ledger.mismatches()
            if problem:
                failures.append(f"case {case} {params} mutation '{name}': {'; '.join(problem)}")
    assert total > 150
    assert not failures, failures_report("qk_norm_rope refusals", failures, total)


# ---- rerotate_cache ---------------------------------------------------------------------------------

def test_rerotate_cache_layout_fuzz_equals_gather_rerotate_scatter():
    rng, g = random.Random(SEED + 3), torch.Generator().manual_seed(SEED + 3)
    failures, total = [], 70
    for case in range(total):
        name = rng.choice([n for n in ROPES if n != "d32 xpos"])
        rope = rope_of(name)
        streams = 3 if "mrope" in name else 1
        d = rope.head_dim
        cache_dtype = rng.choice((torch.float32, torch.bfloat16, torch.float16) + QUANTISED)
        kv_heads = rng.choice((1, 2, 3))
        n = rng.choice((0, 1, 2, 4, 6))
        raw = rng.random() < 0.3
        params = dict(rope=name, cache=cache_dtype, kv_heads=kv_heads, slots=n, raw=raw)
        shape_hint = max(n, 1) + rng.randint(0, 5)
        passed, kv_layout, spot = draw_cache(rng, g, shape_hint, kv_heads, d, cache_dtype)
        # Finite keys where the slots point (the rest stays poison, and must stay as it is).
        logical = spot.view()
        rows_now = cache_rows(logical)
        capacity = rows_now.shape[0]
        slots, slots0 = draw_slots(rng, g, n, capacity)
        keys = (2 * torch.randn(n, kv_heads, d, generator=g)).to(cache_dtype)
        for t, s in enumerate(slots0.tolist()):
            if s >= 0:
                rows_now[s] = keys[t]
        bits(logical).copy_(bits(rows_now.reshape(logical.shape)))
        before = cache_rows(logical)
        scale = draw_scale(rng, g, kv_heads) if cache_dtype in QUANTISED else None
        scale_v = scale_values(scale)
        kwargs = dict(kv_layout=kv_layout, k_scale=scale)
        if raw:
            positions, _, pos0 = draw_positions(rng, g, n, streams)
            if positions is None:
                positions = pos0 = torch.arange(n) + 11
            delta = None
            kwargs["positions"] = positions
            if not pos0.is_floating_point() and rng.random() < 0.3:
                kwargs["numerics"] = params["numerics"] = "hf-float32"
        else:
            kind = rng.choice(("int", "tensor", "tensor") + (("streams",) if streams > 1 else ()))
            if kind == "int":
                delta = rng.randint(-5000, 5000)
                per = torch.full((n,), delta, dtype=torch.int64)
            elif kind == "tensor":
                per = torch.randint(-5000, 5000, (n,), generator=g)
                delta = place_index(rng, g, per.to(rng.choice((torch.int64, torch.int32))))
            else:
                per = torch.randint(-5000, 5000, (streams, n), generator=g)
                delta = place(rng, g, per)[0]
            params["delta"] = kind
        ledger = Ledger(passed, slots, *(t for t in (delta, kwargs.get("positions")) if isinstance(t, torch.Tensor)))
        moved = before.clone()
        for t, s in enumerate(slots0.tolist()):
            if s < 0:
                continue
            x = dequantise(before[s], scale_v) if cache_dtype in QUANTISED else before[s]
            if raw:
                p = pos0[..., t:t + 1]
                y = rope.apply(x[None], positions=p, numerics=kwargs.get("numerics", "exact"))[0]
            else:
                dt = per[..., t].tolist()
                y = rope.rerotate(x[None, None], dt if isinstance(dt, int) else list(dt),
                                  positions=[[1 << 20]])[0, 0]
            moved[s] = store_as(y, cache_dtype, scale_v)
        ledger.expect(spot, moved.reshape(spot.shape), "k_cache")
        call = dict(rope=rope, k_cache=passed, slots=slots, delta=delta, **kwargs)
        wrong = run_accepted(rerotate_cache, call, ledger, lambda out, w=passed: out is w)
        if wrong:
            failures.append(f"case {case} {params}: {'; '.join(wrong)}")
    assert not failures, failures_report("rerotate_cache", failures, total)


def test_rerotate_cache_refusals_name_the_argument_and_write_nothing():
    rope = rope_of("d64 half")
    g = torch.Generator().manual_seed(SEED + 4)
    cache = (2 * torch.randn(4, 4, 2, 64, generator=g)).to(torch.bfloat16)
    slots = torch.tensor([3, 9, -1, 12])
    cases = {
        "delta 2-D of the wrong streams": (dict(delta=torch.zeros(2, 4, dtype=torch.int64)), "delta"),
        "delta on meta": (dict(delta=torch.zeros(4, dtype=torch.int64, device="meta")), "delta"),
        "delta float": (dict(delta=torch.zeros(4)), "delta"),
        "delta beyond int32": (dict(delta=1 << 40), "delta"),
        "delta bool": (dict(delta=True), "delta"),
        "slots float": (dict(slots=slots.float()), "slots"),
        "slots 2-D": (dict(slots=slots.reshape(2, 2)), "slots"),
        "slot beyond (int64 past int32)": (dict(slots=torch.tensor([3, 9, -1, (1 << 32) + 3])), "slots"),
        "raw positions count": (dict(delta=None, positions=torch.arange(3)), "positions"),
        "raw positions bool": (dict(delta=None, positions=torch.ones(4, dtype=torch.bool)), "positions"),
        "raw positions beyond": (dict(delta=None, positions=torch.tensor([0, 1, 2, 1 << 31])), "positions"),
        "k_cache expanded": (dict(k_cache=torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16).expand(4, 4, 2, 64)),
                             "k_cache"),
        "k_cache 2-D": (dict(k_cache=torch.zeros(16, 128, dtype=torch.bfloat16)), "k_cache"),
        "scale on bf16": (dict(k_scale=0.5), "k_scale"),
    }
    failures = []
    for name, (change, message) in cases.items():
        call = dict(rope=rope, k_cache=cache.clone(), slots=slots, delta=torch.tensor([5, -5, 7, 1]))
        call.update(change)
        ledger = unchanged(*[t for t in call.values() if isinstance(t, torch.Tensor)])
        problem = _expect_refusal(rerotate_cache, call, (ValueError, TypeError), message) + ledger.mismatches()
        if problem:
            failures.append(f"{name}: {'; '.join(problem)}")
    assert not failures, "\n".join(failures)


# ---- rotary_embedding / apply_rope_with_cos_sin_cache_inplace ----------------------------------------

def test_engine_entry_points_layout_fuzz_equal_apply_with_the_callers_table():
    rng, g = random.Random(SEED + 5), torch.Generator().manual_seed(SEED + 5)
    failures, total = [], 120
    for case in range(total):
        head_size = rng.choice((32, 64, 80))
        rotary_dim = rng.choice((head_size, 32, 16))
        is_neox = rng.random() < 0.5
        flashinfer = rng.random() < 0.3
        dtype = rng.choice(MODEL_DTYPES + (torch.float64,))
        cache_dtype = torch.float32 if flashinfer else rng.choice((torch.float32, dtype, torch.float64))
        tokens = rng.choice((0, 1, 2, 4, 7))
        heads, kv_heads = rng.choice((0, 1, 2, 3)), rng.choice((1, 2))
        with_key = rng.random() < 0.8
        batch_seq = tokens == 4 and rng.random() < 0.3
        fused = rng.random() < 0.3
        rows = rng.choice((1, 9, 40))
        params = dict(head_size=head_size, rotary_dim=rotary_dim, is_neox=is_neox, flashinfer=flashinfer,
                      dtype=dtype, table=cache_dtype, tokens=tokens, heads=heads, kv_heads=kv_heads, key=with_key,
                      batch_seq=batch_seq, fused=fused)
        q0 = data(g, (tokens, heads, head_size), dtype)
        k0 = data(g, (tokens, kv_heads, head_size), dtype) if with_key else None
        spots = {}
        if fused:
            width = (heads + kv_heads + kv_heads) * head_size
            buf, bspot = place(rng, g, data(g, (tokens, width), dtype))
            flat = rng.random() < 0.5
            spots["q"] = bspot.columns(0, heads, head_size, flat)
            spots["k"] = bspot.columns(heads * head_size, kv_heads, head_size, flat)
            bits(spots["q"].view()).copy_(bits(q0.reshape(spots["q"].shape)))
            if with_key:
                bits(spots["k"].view()).copy_(bits(k0.reshape(spots["k"].shape)))
            query = spots["q"].view()
            key = spots["k"].view() if with_key else None
        else:
            query, spots["q"], _ = activation(rng, g, q0)
            key = None
            if with_key:
                key, spots["k"], _ = activation(rng, g, k0)
        if batch_seq:
            query = query.reshape(2, 2, *query.shape[1:])
            key = None if key is None else key.reshape(2, 2, *key.shape[1:])
            spots["q"] = Spot(spots["q"].base, query.shape, query.stride(), query.storage_offset())
            if key is not None:
                spots["k"] = Spot(spots["k"].base, key.shape, key.stride(), key.storage_offset())
        table_vals = torch.cat(((torch.rand(rows, rotary_dim // 2, generator=g) * 2 - 1),
                                (torch.rand(rows, rotary_dim // 2, generator=g) * 2 - 1)), -1).to(cache_dtype)
        table_kind = rng.choice(("plain", "placed", "expanded"))
        if table_kind == "expanded":
            table = table_vals[:1].expand(rows, rotary_dim)
            table_vals = table.contiguous()
        elif table_kind == "placed":
            table = place(rng, g, table_vals)[0]
        else:
            table = table_vals.clone()
        pos0 = torch.randint(0, rows, (tokens,), generator=g)
        positions = place_index(rng, g, pos0.to(rng.choice((torch.int64, torch.int32))))
        extra = {}
        if batch_seq:
            positions = positions.reshape(2, 2)
        elif not flashinfer and rng.random() < 0.25:
            # M-RoPE (vLLM's MRotaryEmbedding): positions [3, tokens], each column of the table from its
            # stream's row; the oracle gathers that [tokens, rotary_dim] table itself.
            pairs = rotary_dim // 2
            t_sec = rng.randint(0, pairs)
            h_sec = rng.randint(0, pairs - t_sec)
            section = [t_sec, h_sec, pairs - t_sec - h_sec]
            interleaved = rng.random() < 0.5
            pos3 = torch.randint(0, rows, (3, tokens), generator=g)
            if rng.random() < 0.3:
                pos3 = pos0.expand(3, tokens).clone()  # text: the three streams equal
            positions = place(rng, g, pos3.to(rng.choice((torch.int64, torch.int32))))[0]
            j = torch.arange(pairs)
            if interleaved:
                stream = ((j % 3 == 1) & (j < 3 * section[1])).long() + 2 * ((j % 3 == 2) & (j < 3 * section[2])).long()
            else:
                stream = (j >= section[0]).long() + (j >= section[0] + section[1]).long()
            stream = torch.cat((stream, stream))
            if tokens:
                table_vals = table_vals.double()[pos3[stream], torch.arange(rotary_dim)[:, None]].t().to(cache_dtype)
                pos0 = torch.arange(tokens)
            extra = dict(mrope_section=section, mrope_interleaved=interleaved)
            params["mrope"] = (section, interleaved)
        ledger = Ledger(query, table, positions, *(() if key is None else (key,)))
        ref_rope = Rope(head_size, rotary_dim, pairing="half" if is_neox else "interleaved")
        q_want = ref_rope.apply(q0.clone(), positions=pos0, cos_sin_cache=table_vals)
        ledger.expect(spots["q"], q_want.reshape(spots["q"].shape), "query")
        if with_key:
            k_want = ref_rope.apply(k0.clone(), positions=pos0, cos_sin_cache=table_vals)
            ledger.expect(spots["k"], k_want.reshape(spots["k"].shape), "key")
        # The formula in float64, within the data's rounding (both sides' roundings of the pair).
        if q0.numel():
            cos, sin = table_vals.double()[pos0].chunk(2, -1)
            x = q0.double()[..., :rotary_dim]
            x1, x2 = (x[..., :rotary_dim // 2], x[..., rotary_dim // 2:]) if is_neox else (x[..., 0::2], x[..., 1::2])
            c, s = cos[:, None], sin[:, None]
            o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
            got = q_want.double()[..., :rotary_dim]
            g1, g2 = (got[..., :rotary_dim // 2], got[..., rotary_dim // 2:]) if is_neox else (got[..., 0::2],
                                                                                              got[..., 1::2])
            bound = 4 * UNIT[dtype] * (x1.abs() + x2.abs()) * (c.abs() + s.abs()) + 1e-300
            worst = float(torch.maximum((g1 - o1).abs() / bound, (g2 - o2).abs() / bound).max())
            if not worst <= 1 or not torch.equal(q_want[..., rotary_dim:], q0[..., rotary_dim:]):
                failures.append(f"case {case} {params}: Rope.apply with cos_sin_cache is {worst:.2f} bounds from the "
                                "float64 formula (or touched the pass-through channels)")
        fn = apply_rope_with_cos_sin_cache_inplace if flashinfer else rotary_embedding
        call = dict(positions=positions, query=query, key=key, head_size=head_size, cos_sin_cache=table,
                    is_neox=is_neox, **extra)
        wrong = run_accepted(fn, call, ledger, lambda out: out is None)
        if wrong:
            failures.append(f"case {case} {params}: {'; '.join(wrong)}")
    assert not failures, failures_report("rotary_embedding", failures, total)


def test_engine_entry_points_refusals_name_the_argument_and_write_nothing():
    g = torch.Generator().manual_seed(SEED + 6)
    table = torch.rand(16, 64, generator=g)
    positions = torch.tensor([0, 3, 15, 7])

    def fresh():
        return data(g, (4, 2 * 64), torch.float32), data(g, (4, 64), torch.float32)

    q, k = fresh()
    shared = data(g, (4, 3 * 64), torch.float32)
    cases = {
        "query expanded": (dict(query=torch.zeros(1, 128).expand(4, 128)), r"\bquery\b"),
        "key expanded": (dict(key=torch.zeros(1, 64).expand(4, 64)), r"\bkey\b"),
        "key overlaps query": (dict(query=shared[:, :128], key=shared[:, 64:128]), r"\bk\b|key"),
        "key is query": (dict(query=shared[:, :128], key=shared[:, :128]), r"\bk\b|key"),
        "table inside query": (dict(query=shared[:, :128], key=None, cos_sin_cache=shared[:1, 128:].expand(16, 64)),
                               "cos_sin_cache"),
        "position beyond the table": (dict(positions=torch.tensor([0, 3, 16, 7])), "positions"),
        "position int64 past int32": (dict(positions=torch.tensor([0, 3, (1 << 32) + 1, 7])), "positions"),
        "positions bool": (dict(positions=torch.ones(4, dtype=torch.bool)), "positions"),
        "positions float": (dict(positions=positions.float()), "positions"),
        "positions on meta": (dict(positions=torch.zeros(4, dtype=torch.int64, device="meta")), "positions"),
        "table on meta": (dict(cos_sin_cache=torch.zeros(16, 64, device="meta")), "cos_sin_cache"),
        "table int": (dict(cos_sin_cache=torch.zeros(16, 64, dtype=torch.int32)), "cos_sin_cache"),
        "table wider than the head": (dict(cos_sin_cache=torch.zeros(16, 66)), "cos_sin_cache"),
        "head_size huge": (dict(head_size=1 << 70), "head_size|query"),
    }
    failures = []
    for name, (change, message) in cases.items():
        for fn in (rotary_embedding, apply_rope_with_cos_sin_cache_inplace):
            q, k = fresh()
            call = dict(positions=positions, query=q, key=k, head_size=64, cos_sin_cache=table, is_neox=True)
            call.update(change)
            ledger = unchanged(*[t for t in call.values() if isinstance(t, torch.Tensor)])
            problem = _expect_refusal(fn, call, (ValueError, TypeError), message) + ledger.mismatches()
            if problem:
                failures.append(f"{fn.__name__} {name}: {'; '.join(problem)}")
    assert not failures, "\n".join(failures)


# ---- Aliasing and argument ranges: each a bug found by this fuzz ------------------------------------
#
# The rule: an output may be its own input exactly (in place); any other sharing of memory between
# outputs (caches included) and inputs is refused (ValueError naming them) before anything is written.
# Either a call is refused so, or its result equals the composition on the inputs as they were.

def _refused_or_right(fn, call, want, names):
    """fn(**call) either raises ValueError naming one of `names` with every storage unchanged, or leaves
    every tensor in `want` (tensor -> expected values) equal to them bit for bit."""
    ledger = unchanged(*[t for t in call.values() if isinstance(t, torch.Tensor)])
    try:
        fn(**call)
    except ValueError as e:
        assert re.search(names, str(e)), f"the message does not name {names}: {e}"
        assert not ledger.mismatches(), ledger.mismatches()
        return
    for tensor, values in want:
        assert torch.equal(bits(tensor), bits(values)), "accepted, and the result is not the composition's"


def _alias_case(tokens=6, seed=0):
    g = torch.Generator().manual_seed(SEED + 100 + seed)
    rope = rope_of("d64 half")
    q, k, v = (data(g, (tokens, 2, 64), torch.float32) for _ in range(3))
    positions = torch.arange(tokens) * 5 + 1
    slots = torch.arange(tokens).flip(0)  # a permutation: order matters when memory is shared
    q_rot, k_rot = rope.apply(q, k, positions=positions)
    return rope, q, k, v, positions, slots, q_rot, k_rot


@pytest.mark.parametrize("path", ["eager fast path", "eager general path", "operator"])
def test_fused_writes_move_the_version_counters(path):
    # As torch's own in-place ops: a graph that saved q or a cache then raises at backward instead of
    # using the overwritten values. (An HND cache is not the eager fast path's.)
    rope, q, k, v, positions, slots, _, _ = _alias_case()
    layout = "HND" if path == "eager general path" else "NHD"

    def cache():
        c = torch.zeros(6, 2, 64)
        return c, (c if layout == "NHD" else c.unsqueeze(0).transpose(1, 2))

    q = q.clone()
    (k_cache, kc), (v_cache, vc) = cache(), cache()
    before = (q._version, k_cache._version, v_cache._version)
    if path == "operator":
        torch.ops.rotary.rope_store(q, k, v, kc, vc, slots, rope._handle, positions, 0, layout, None, None, "divide",
                                    None, None, None, None, None, None, "exact")
    else:
        rope_store(rope, q, k, v, kc, vc, slots, positions=positions, kv_layout=layout)
    assert all(a > b for a, b in zip((q._version, k_cache._version, v_cache._version), before))
    k_normed, (k_cache, kc) = k.clone(), cache()
    before = (k_normed._version, k_cache._version)
    qk_norm_rope(rope, q, k_normed, None, None, eps=1e-6, positions=positions, k_cache=kc, slots=slots,
                 kv_layout=layout)
    assert k_normed._version > before[0] and k_cache._version > before[1]
    k_cache, kc = cache()
    before = k_cache._version
    rerotate_cache(rope, kc, slots, 3, kv_layout=layout)
    assert k_cache._version > before


def test_rope_store_reads_an_expanded_k():
    # rope_store only reads k (its rotated rows go to the cache): one k row for every token, expanded,
    # is taken and gives what the same rows written out give; k itself is left alone.
    rope, q, k, v, positions, slots, _, _ = _alias_case()
    k_expanded = k[:1].expand(k.shape)
    q_want, k_want = rope.apply(q.clone(), k_expanded.contiguous(), positions=positions)
    q_got, k_cache = q.clone(), torch.zeros(6, 2, 64)
    rope_store(rope, q_got, k_expanded, None, k_cache, None, slots, positions=positions)
    assert torch.equal(q_got, q_want) and torch.equal(k_cache[slots], k_want)
    assert torch.equal(k_expanded, k[:1].expand(k.shape))


def test_rope_store_k_cache_that_is_k_itself():
    rope, q, k, v, positions, slots, q_rot, k_rot = _alias_case()
    k_mem = k.clone()
    want = k_rot.clone()
    want[slots] = k_rot
    _refused_or_right(rope_store, dict(rope=rope, q=q.clone(), k=k_mem, v=None, k_cache=k_mem.unsqueeze(0),
                                       v_cache=None, slots=slots, positions=positions), [(k_mem, want)], "k_cache")


def test_rope_store_v_cache_that_is_v_itself():
    rope, q, k, v, positions, slots, q_rot, k_rot = _alias_case()
    v_mem = v.clone()
    want = v.clone()
    want[slots] = v
    _refused_or_right(rope_store, dict(rope=rope, q=q.clone(), k=k, v=v_mem, k_cache=torch.zeros(6, 2, 64),
                                       v_cache=v_mem.unsqueeze(0), slots=slots, positions=positions),
                      [(v_mem, want)], "v_cache")


def test_rope_store_v_that_is_q():
    rope, q, k, v, positions, slots, q_rot, k_rot = _alias_case()
    q_mem, v_cache = q.clone(), torch.zeros(6, 2, 64)
    want = torch.zeros(6, 2, 64)
    want[slots] = q
    _refused_or_right(rope_store, dict(rope=rope, q=q_mem, k=k, v=q_mem, k_cache=torch.zeros(6, 2, 64),
                                       v_cache=v_cache, slots=slots, positions=positions),
                      [(v_cache, want), (q_mem, q_rot)], r"\bv\b|\bq\b")


def test_rope_store_k_out_that_is_v():
    rope, q, k, v, positions, slots, q_rot, k_rot = _alias_case()
    v_mem, v_cache = v.clone(), torch.zeros(6, 2, 64)
    want = torch.zeros(6, 2, 64)
    want[slots] = v
    _refused_or_right(rope_store, dict(rope=rope, q=q.clone(), k=k, v=v_mem, k_cache=torch.zeros(6, 2, 64),
                                       v_cache=v_cache, slots=slots, positions=positions, k_out=v_mem),
                      [(v_cache, want), (v_mem, k_rot)], r"k_out|\bv\b")


def test_rope_store_k_pass_that_is_q():
    rope, q, k, v, positions, slots, q_rot, k_rot = _alias_case()
    q_mem, pass_cache = q.clone(), torch.zeros(6, 2, 64)
    want = torch.zeros(6, 2, 64)
    want[slots] = q
    _refused_or_right(rope_store, dict(rope=rope, q=q_mem, k=k, v=None, k_cache=torch.zeros(6, 2, 64), v_cache=None,
                                       slots=slots, positions=positions, k_pass=q_mem, k_pass_cache=pass_cache),
                      [(pass_cache, want), (q_mem, q_rot)], r"k_pass|\bq\b")


def test_qk_norm_rope_k_cache_that_is_k_itself():
    rope, q, k, v, positions, slots, _, _ = _alias_case()
    k_mem = k.clone()
    # k in place and the cache write to the same memory: no composition gives one answer; refused is right.
    call = dict(rope=rope, q=q.clone(), k=k_mem, q_weight=None, k_weight=None, eps=1e-6, positions=positions,
                k_cache=k_mem.unsqueeze(0), slots=slots)
    ledger = unchanged(*[t for t in call.values() if isinstance(t, torch.Tensor)])
    with pytest.raises(ValueError, match=r"k_cache|\bk\b"):
        qk_norm_rope(**call)
    assert not ledger.mismatches()


@pytest.mark.parametrize("share", ["v overlaps k", "v is k", "v is q"])
def test_qk_norm_rope_v_norm_in_place_sharing_q_or_k(share):
    rope, q, k, v, positions, slots, _, _ = _alias_case()
    buf = torch.cat((q, k[:, :1]), 1).clone()  # [tokens, 3, 64]
    if share == "v overlaps k":
        call = dict(q=q.clone(), k=buf[:, :2], v=buf[:, 1:])
    elif share == "v is k":
        call = dict(q=q.clone(), k=buf[:, :2], v=buf[:, :2])
    else:
        call = dict(q=buf[:, :2], k=k.clone(), v=buf[:, :2])
    # No composition gives one answer for two in-place writes to the same memory: refused is right.
    ledger = unchanged(*call.values())
    with pytest.raises(ValueError, match=r"\bv\b"):
        qk_norm_rope(rope, call["q"], call["k"], None, None, eps=1e-6, positions=positions, v=call["v"], v_norm=True)
    assert not ledger.mismatches()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_rerotate_cache_delta_0d_tensor_moves_every_slot_as_an_int(dtype):
    g = torch.Generator().manual_seed(SEED + 9)
    k_cache = data(g, (4, 4, 2, 64), torch.float32)
    want = rerotate_cache(rope_of("d64 half"), k_cache.clone(), torch.tensor([3, 9]), -3)
    got = rerotate_cache(rope_of("d64 half"), k_cache.clone(), torch.tensor([3, 9]), torch.tensor(-3, dtype=dtype))
    assert torch.equal(got, want) and not torch.equal(got, k_cache)


def test_rerotate_cache_delta_beyond_int64():
    k_cache = torch.zeros(4, 4, 2, 64)
    with pytest.raises(ValueError, match="delta"):
        rerotate_cache(rope_of("d64 half"), k_cache, torch.tensor([3, 9]), 1 << 70)


def test_rope_store_offset_beyond_int64():
    rope, q, k, v, positions, slots, _, _ = _alias_case()
    with pytest.raises((ValueError, TypeError), match="^offset"):
        rope_store(rope, q, k, None, torch.zeros(6, 2, 64), None, slots, offset=1 << 70)


def test_qk_norm_rope_eps_beyond_float():
    rope, q, k, v, positions, slots, _, _ = _alias_case()
    with pytest.raises((ValueError, TypeError), match="eps"):
        qk_norm_rope(rope, q, k, None, None, eps=1 << 2000)


@pytest.mark.parametrize("op", ["rope_store slots", "rope_store positions", "qk_norm_rope positions",
                                "rerotate_cache slots", "rope_store M-RoPE positions [3, 0]",
                                "rerotate_cache raw M-RoPE positions [3, 0]", "rope_store q_scale per head, 0 heads"])
def test_empty_strided_slots_and_positions_are_taken(op):
    rope = rope_of("d64 half")
    empty_strided = torch.zeros(3, dtype=torch.int64)[1:1:2].as_strided((0,), (2,))
    assert empty_strided.numel() == 0 and empty_strided.stride() == (2,)
    q, k = torch.zeros(0, 2, 64), torch.zeros(0, 2, 64)
    k_cache = torch.zeros(4, 2, 64)
    if op == "rope_store slots":
        rope_store(rope, q, k, None, k_cache, None, empty_strided)
    elif op == "rope_store positions":
        rope_store(rope, q, k, None, k_cache, None, torch.zeros(0, dtype=torch.int64), positions=empty_strided)
    elif op == "qk_norm_rope positions":
        qk_norm_rope(rope, q, k, None, None, eps=1e-6, positions=empty_strided)
    elif op == "rope_store M-RoPE positions [3, 0]":
        rope_store(rope_of("d64 mrope"), q, k, None, k_cache, None, torch.zeros(0, dtype=torch.int64),
                   positions=torch.zeros(3, 0, dtype=torch.int64))
    elif op == "rerotate_cache raw M-RoPE positions [3, 0]":
        rerotate_cache(rope_of("d64 mrope"), k_cache, torch.zeros(0, dtype=torch.int64), None,
                       positions=torch.zeros(3, 0, dtype=torch.int64))
    elif op == "rope_store q_scale per head, 0 heads":  # raises TypeError 'a scale must be ...', naming no scale
        rope_store(rope, torch.zeros(1, 0, 64), torch.zeros(1, 2, 64), None, k_cache, None, torch.tensor([1]),
                   q_out=torch.zeros(1, 0, 64, dtype=torch.float8_e4m3fn), q_scale=empty_strided.float())
    else:
        rerotate_cache(rope, k_cache, empty_strided, 3)
    assert torch.equal(k_cache, torch.zeros(4, 2, 64))


def test_fused_qkv_with_a_narrower_v_is_taken():
    rope = rope_of("d64 half")
    g = torch.Generator().manual_seed(SEED + 7)
    tokens, dv = 5, 24
    qkv = data(g, (tokens, 2 * 64 + 2 * 64 + 2 * dv), torch.float32)
    q, k, v = (t.unflatten(-1, (2, -1)) for t in qkv.split([128, 128, 2 * dv], dim=-1))
    positions, slots = torch.tensor([0, 5, 9, 100, 7]), torch.tensor([3, 0, 7, 1, 5])
    q_rot, k_rot = rope.apply(q.clone(), k.clone(), positions=positions)
    k_cache, v_cache = torch.zeros(8, 2, 64), torch.zeros(8, 2, dv)
    v_before = v.clone()
    rope_store(rope, q, k, v, k_cache, v_cache, slots, positions=positions)
    assert torch.equal(q, q_rot)
    assert torch.equal(k_cache[slots], k_rot) and torch.equal(v_cache[slots], v_before)


@pytest.mark.parametrize("which", ["query", "key"])
def test_engine_messages_say_query_and_key(which):
    table = torch.rand(16, 64)
    query, key = torch.zeros(4, 128), torch.zeros(4, 64)
    if which == "query":
        query = torch.zeros(1, 128).expand(4, 128)
    else:
        key = torch.zeros(1, 64).expand(4, 64)
    with pytest.raises(ValueError, match=rf"\b{which}\b"):
        rotary_embedding(torch.tensor([0, 3, 15, 7]), query, key, 64, table, True)


@pytest.mark.parametrize("positions", ["int64", "offset"])
def test_rope_store_float64_equals_apply_rope(positions):
    rope = rope_of("d64 half")
    g = torch.Generator().manual_seed(SEED + 8)
    q, k = data(g, (3, 2, 64), torch.float64), data(g, (3, 1, 64), torch.float64)
    kw = dict(positions=torch.tensor([3, 100, 7])) if positions == "int64" else dict(offset=100)
    q_want, k_want = rope.apply(q.clone(), k.clone(), **kw)
    q_got, k_cache = q.clone(), torch.zeros(3, 1, 64, dtype=torch.float64)
    rope_store(rope, q_got, k, None, k_cache, None, torch.tensor([2, 0, 1]), **kw)
    assert torch.equal(q_got, q_want), f"q: {float((q_got - q_want).abs().max()):.3g} off"
    assert torch.equal(k_cache[torch.tensor([2, 0, 1])], k_want)


def test_qk_norm_rope_names_k_not_k_out():
    rope = rope_of("d64 half")
    k = torch.zeros(1, 2, 64).expand(3, 2, 64)  # written in place, stride 0 over tokens
    with pytest.raises(ValueError, match=r"^k\b"):
        qk_norm_rope(rope, torch.zeros(3, 2, 64), k, None, None, eps=1e-6, k_cache=torch.zeros(8, 2, 64),
                     slots=torch.tensor([0, 1, 2]))
