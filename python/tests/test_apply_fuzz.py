"""An adversarial, seeded, differential fuzz of rotary's PLAIN entry points at the Python boundary:
``Rope.apply`` (numpy arrays and torch CPU tensors; out of place, ``inplace=True``, ``out=``),
``rotary.torch.apply_rope`` / ``apply_rope_`` (eager, autograd, and ``torch.ops.rotary.rope`` /
``rope_`` called directly), ``Rope.rerotate`` and ``Rope.switch``.

Every array of a call lives at a random place in a buffer of poison bytes (NaN patterns included):
permuted dimension order, step slices (channels too), padding, storage offsets, negative strides
(numpy), size-1 dimensions with odd strides, zero-size arrays; positions int64/int32/uint8/int16/
float32/float64 (fractional too), lists, strided or offset. Each accepted call is checked:

- bit for bit against the same call on contiguous copies (the library promises layout does not
  change bits), over every byte of every storage it was given (writes only where they belong);
- for a subset, against a float64 formula (pairs ``(x[i], x[i + r/2])`` or ``(x[2i], x[2i+1])``,
  angle ``position * inv_freq[i]``, times ``attention_factor``) within the dtype's rounding.

Each refused call must raise ValueError or TypeError naming the argument, every byte unchanged
(a table of broken arguments, each through every entry point, in random layouts). Sharing memory
(out= that is the input, q and k overlapping, cos/sin/positions inside an output) is either refused
so or right. The end of the file holds the bugs this fuzz found, each a test of its own.

The seed: ``ROTARY_FUZZ_SEED`` (default below); a failure prints the seed, case and parameters.
"""
import os
import random
import re

import numpy as np
import pytest
import torch

import rotary.torch  # noqa: F401  (registers torch.ops.rotary)
from rotary import Rope
from rotary.torch import apply_rope, apply_rope_

SEED = int(os.environ.get("ROTARY_FUZZ_SEED", "31"))
MAX_SHOWN = 6
UNIT = {"float32": 2.0 ** -24, "float64": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}

ROPES = {
    "d64 half": lambda: Rope(64),
    "d64 interleaved": lambda: Rope(64, pairing="interleaved", base=5e5),
    "d48 partial r16": lambda: Rope(48, rotary_dim=16),
    "d32 yarn": lambda: Rope(32, schedule="yarn", factor=4.0, original_max_position=4096),
    "d64 r32 at offset 32": lambda: Rope(64, rotary_dim=32, rotary_offset=32),
    "d64 mrope": lambda: Rope(64, base=1e6, stream_layout="sections", sections=[8, 12, 12]),
    "d32 xpos": lambda: Rope(32, xpos_scale_base=512),
}
_CACHE = {}


def rope_of(name):
    if name not in _CACHE:
        _CACHE[name] = ROPES[name]()
    return _CACHE[name]


NP_DTYPES = ("float32", "float64", "float16")
TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16")
TDT = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
       "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "uint8": torch.uint8}
TBITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---- Memory: poisoned buffers, random layouts, byte ledgers -----------------------------------------

def is_np(x):
    return isinstance(x, np.ndarray)


def raw_bits(x):
    """x's elements as unsigned/signed ints of the same size (any strides)."""
    if is_np(x):
        return x.view(f"u{x.dtype.itemsize}")
    return x.view(TBITS[x.element_size()])


def same_bits(a, b):
    if is_np(a) != is_np(b) or tuple(a.shape) != tuple(b.shape) or str(a.dtype) != str(b.dtype):
        return False
    if is_np(a):
        return np.array_equal(raw_bits(a), raw_bits(b))
    return torch.equal(raw_bits(a), raw_bits(b))


def base_bytes(x):
    """Every byte of the buffer x lives in (numpy: its base chain's root; torch: its storage)."""
    if is_np(x):
        root = x
        while getattr(root, "base", None) is not None:  # as_strided's views hide theirs behind a DummyArray
            root = root.base
        if isinstance(root, (bytearray, bytes, memoryview)):
            return np.frombuffer(root, dtype=np.uint8)
        if not root.flags.c_contiguous:  # an owner laid out in another order (np.concatenate keeps its inputs')
            root = root.transpose(np.argsort([-s for s in root.strides], kind="stable"))
        assert root.flags.c_contiguous, "a buffer the ledger cannot follow"
        return root.reshape(-1).view(np.uint8)
    return torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())


def addr(x):
    return x.__array_interface__["data"][0] if is_np(x) else x.untyped_storage().data_ptr()


def start_addr(x):
    return x.__array_interface__["data"][0] if is_np(x) else x.data_ptr()


def to_float(x):
    """float64 numpy copy of x's values."""
    if is_np(x):
        return x.astype(np.float64)
    return x.detach().double().numpy()


def contiguous(x):
    if x is None or not (is_np(x) or isinstance(x, torch.Tensor)):
        return x
    if is_np(x):
        return np.array(x, order="C", copy=True)
    return x.detach().clone(memory_format=torch.contiguous_format)


def place(rng, values, negative=True):
    """values (numpy or torch, bit for bit) in a random layout inside a poisoned buffer."""
    torch_kind = not is_np(values)
    shape = tuple(values.shape)
    n = len(shape)
    perm = list(range(n))
    steps, pads = [1] * n, [0] * n
    if rng.random() < 0.4:
        rng.shuffle(perm)
    for d in range(n):
        if rng.random() < 0.25:
            steps[d] = rng.choice((2, 3))
        if rng.random() < 0.2:
            pads[d] = rng.choice((1, 3))
    offset = rng.choice((0, 0, 1, 3, 7))
    phys = [shape[d] * steps[d] + pads[d] for d in range(n)]
    stride, acc = [0] * n, 1
    for d in reversed(perm):
        stride[d] = acc
        acc *= max(phys[d], 1)
    strides = [stride[d] * steps[d] for d in range(n)]
    start = offset + sum(rng.randint(0, pads[d]) * stride[d] for d in range(n))
    odd = [d for d in range(n) if shape[d] == 1 and rng.random() < 0.3]
    total = start + acc + 2
    itemsize = values.element_size() if torch_kind else values.dtype.itemsize
    poison = bytes(rng.getrandbits(8) for _ in range(total * itemsize)) if total * itemsize < 4096 else \
        np.random.default_rng(rng.getrandbits(32)).integers(0, 256, total * itemsize, dtype=np.uint8).tobytes()
    if torch_kind:
        base = torch.frombuffer(bytearray(poison), dtype=torch.uint8).view(values.dtype)
        for d in odd:
            strides[d] = rng.choice((0, 12345, 1 << 40))
        view = base.as_strided(shape, strides, start)
        raw_bits(view).copy_(raw_bits(values))
        return view
    shift = rng.choice((0, 0, 0, 1, 2, 3)) % itemsize  # misaligned elements (numpy allows them)
    base = np.frombuffer(bytearray(poison + bytes(itemsize)), dtype=np.uint8)[shift:shift + len(poison)]
    base = base.view(values.dtype)
    bstrides = [s * itemsize for s in strides]
    for d in odd:
        bstrides[d] = rng.choice((0, 12345 * itemsize, -itemsize))
    view = np.lib.stride_tricks.as_strided(base[start:], shape, bstrides, writeable=True)
    if negative:
        for d in range(n):
            if shape[d] > 1 and rng.random() < 0.2:
                view = np.flip(view, d)
    view[...] = values
    return view


class Ledger:
    """Every byte of the buffers of a call's arrays, and the writes it should make."""

    def __init__(self, *arrays):
        self.buffers = {}
        for x in arrays:
            if is_np(x) or (isinstance(x, torch.Tensor) and x.device.type == "cpu"):
                b = base_bytes(x)
                key = addr(b)
                if key not in self.buffers:
                    self.buffers[key] = (b, b.copy() if is_np(b) else b.clone())
        self.writes = []

    def expect(self, view, values, name):
        self.writes.append((view, values, name))

    def mismatches(self):
        want = {key: (before.copy() if is_np(before) else before.clone()) for key, (_, before) in self.buffers.items()}
        names = {key: [] for key in self.buffers}
        for view, values, name in self.writes:
            if view.size == 0 if is_np(view) else view.numel() == 0:
                continue
            key = addr(base_bytes(view))
            w = want[key]
            if is_np(view):
                off = start_addr(view) - addr(self.buffers[key][0])
                assert 0 <= off < w.size
                target = np.lib.stride_tricks.as_strided(w[off:off + view.dtype.itemsize].view(view.dtype), view.shape,
                                                         view.strides)
                target[...] = values
            else:
                typed = w.view(view.dtype)
                raw_bits(typed.as_strided(view.shape, view.stride(), view.storage_offset())).copy_(raw_bits(values))
            names[key].append(name)
        out = []
        for key, (now, _) in self.buffers.items():
            eq = np.array_equal(now, want[key]) if is_np(now) else torch.equal(now, want[key])
            if not eq:
                diff = np.flatnonzero(np.asarray(now) != np.asarray(want[key]))
                out.append(f"buffer of {'/'.join(names[key]) or 'an input'}: {diff.size} bytes differ, first at "
                           f"{diff[0]}")
        return out


def report(name, failures, total):
    head = f"{name}: {len(failures)} of {total} cases failed (ROTARY_FUZZ_SEED={SEED}):\n"
    return head + "\n".join(failures[:MAX_SHOWN])


# ---- Drawing a call ---------------------------------------------------------------------------------

def data(nrng, shape, dtype, kind):
    v = (2.0 * nrng.standard_normal(shape)).astype(np.float32)
    if kind == "np":
        return v.astype(dtype)
    return torch.from_numpy(v).to(TDT[dtype])


def as_kind(arr, kind):
    """numpy int/float array as numpy or torch (keeping its dtype)."""
    if kind == "np":
        return arr
    return torch.from_numpy(np.ascontiguousarray(arr))


def draw_positions(rng, nrng, kind, rope, batch, seq, packed, xpos, allow_float=True):
    """(positions or None, offset, canonical float64 positions [streams, batch, seq])."""
    S = rope.streams
    top = 30000 if xpos else (1 << 31) - 1
    if rng.random() < 0.25:
        offset = rng.choice((0, 1, 1000, max(top - seq, 0)))
        full = np.broadcast_to(offset + np.arange(seq, dtype=np.float64), (S, batch, seq))
        return None, offset, full
    if packed:
        forms = ("seq",) + (("streams",) if S > 1 else ())
    else:
        forms = ("seq", "batch seq", "flat") + (("streams", "streams 1") if S > 1 else ())
    form = rng.choice(forms)
    shape = {"seq": (seq,), "batch seq": (batch, seq), "flat": (batch * seq,), "streams": (S, batch, seq),
             "streams 1": (S, 1, seq)}[form]
    if packed and form == "streams":
        shape = (S, seq)
    dtype = rng.choice(("int64", "int32", "int64", "float64", "float32", "uint8", "int16") if allow_float
                       else ("int64", "int32", "uint8", "int16"))
    limit = {"uint8": 256, "int16": 1 << 15, "float32": 1 << 24}.get(dtype, min(1 << 17, top))
    values = nrng.integers(0, limit, shape, dtype=np.int64)
    if values.size and dtype in ("int64", "float64") and rng.random() < 0.3:
        values.reshape(-1)[-1] = top
    values = values.astype(dtype)
    if dtype in ("float64", "float32") and rng.random() < 0.5:
        values = (values + (0.25 if dtype == "float64" else 0.5)).astype(dtype)  # fractional: exact real angles
    canon = values.astype(np.float64)
    if form == "flat":
        canon = canon.reshape(batch, seq)
    if packed and form == "streams":
        canon = canon[:, None, :]
    full = np.broadcast_to(canon, (S, batch, seq)) if canon.ndim == 3 else np.broadcast_to(canon, (S, batch, seq))
    how = rng.choice(("plain", "plain", "strided", "placed", "list", "expanded"))
    if how == "expanded" and values.ndim >= 1 and values.shape[-1] > 0:
        values[...] = values.reshape(-1)[0]  # one value, read through stride 0
        full = np.full(full.shape, float(values.reshape(-1)[0]))
        one = values.reshape(-1)[:1].reshape((1,) * values.ndim)
        p = np.broadcast_to(one, values.shape) if kind == "np" else torch.from_numpy(one.copy()).expand(values.shape)
        return p, 0, full
    if kind == "torch" and dtype == "uint8" and rng.random() < 0.5:
        how = "plain"
    if how == "list":
        return values.tolist(), 0, full
    p = as_kind(values, kind)
    if how == "strided" and values.ndim == 1:
        if kind == "np":
            buf = np.zeros(2 * values.size + 1, dtype=values.dtype)
            buf[1::2] = values
            p = buf[1::2]
        else:
            buf = torch.zeros(2 * values.size + 1, dtype=p.dtype)
            buf[1::2] = p
            p = buf[1::2]
    elif how == "placed":
        p = place(rng, p)
    return p, 0, full


def canonical(x, order):
    """x as float64 [batch, seq, heads, dim] (thd: one batch row)."""
    a = to_float(x)
    if order == "thd" or a.ndim == 3:
        return a[None]
    return a.transpose(0, 2, 1, 3) if order == "bhsd" else a


def formula(rope, x, full, order, inverse=False, undo=False, is_key=False):
    """The float64 rotation of x's canonical values at canonical positions full [S, B, T]."""
    a = canonical(x, order).copy()
    r, off = rope.rotary_dim, rope.rotary_offset
    f, ps, af = rope.inv_freq, rope.pair_stream, rope.attention_factor
    B, T = a.shape[0], a.shape[1]
    pos = np.stack([full[ps[j]] for j in range(r // 2)], -1) if r else np.zeros((B, T, 0))  # [B, T, r/2]
    ang = pos * f
    c, s = np.cos(ang)[:, :, None], np.sin(ang)[:, :, None]
    if inverse or undo:
        s = -s
    scale = 1.0 / af if undo else af
    sl = a[..., off:off + r]
    if rope.layout == "half":
        x1, x2 = sl[..., :r // 2].copy(), sl[..., r // 2:].copy()
    else:
        x1, x2 = sl[..., 0::2].copy(), sl[..., 1::2].copy()
    o1, o2 = scale * (x1 * c - x2 * s), scale * (x2 * c + x1 * s)
    return a, (x1, x2), (o1, o2), scale


def formula_check(rope, x_in, got, full, order, dtype, inverse=False, undo=False):
    """Worst error of got vs the formula, in units of the dtype's rounding bound (<= 1 is right), and
    whether the pass-through channels kept their bits."""
    a, (x1, x2), (o1, o2), scale = formula(rope, x_in, full, order, inverse, undo)
    g = canonical(got, order)
    r, off = rope.rotary_dim, rope.rotary_offset
    sl = g[..., off:off + r]
    g1, g2 = (sl[..., :r // 2], sl[..., r // 2:]) if rope.layout == "half" else (sl[..., 0::2], sl[..., 1::2])
    u = UNIT[dtype]
    bound = 4 * u * (np.abs(x1) + np.abs(x2)) * abs(scale) * 2 + 1e-300
    worst = 0.0
    if g1.size:
        worst = float(max(np.max(np.abs(g1 - o1) / bound), np.max(np.abs(g2 - o2) / bound)))
    keep = np.ones(a.shape[-1], bool)
    keep[off:off + r] = False
    passed = np.array_equal(g[..., keep], a[..., keep])
    return worst, passed


# ---- Rope.apply / apply_rope / ops: accepted calls ----------------------------------------------------

ENTRY_NP = ("apply", "apply inplace", "apply out")
ENTRY_TORCH = ENTRY_NP + ("apply_rope", "apply_rope grad", "apply_rope_", "ops.rope", "ops.rope_")


def refused(ref_error, error, ledger, where, failures):
    """Whether the layout fuzz's call or its contiguous reference was refused; a failure unless both
    were, alike, with nothing written."""
    if ref_error is None and error is None:
        return False
    if ref_error is None or error is None or type(ref_error) is not type(error):
        failures.append(f"{where}: reference {ref_error!r}, call {error!r}")
    elif ledger.mismatches():
        failures.append(f"{where}: refused ({error}) and wrote: {ledger.mismatches()}")
    return True


def run_entry(entry, rope, q, k, kw, outs=None):
    """Calls the entry point; returns (q result, k result or None)."""
    kw = dict(kw)
    if entry == "apply":
        res = rope.apply(q, k, **kw)
    elif entry == "apply inplace":
        res = rope.apply(q, k, inplace=True, **kw)
    elif entry == "apply out":
        res = rope.apply(q, k, out=outs if k is not None else outs[0], **kw)
    elif entry.startswith("apply_rope") or entry.startswith("ops"):
        kw.pop("threads", None)
        return run_torch(entry, rope, q, k, kw)
    else:
        raise AssertionError(entry)
    if k is None:
        return res, None
    return res[0], res[1]


def run_torch(entry, rope, q, k, kw):
    """rotary.torch's entry points: eager (apply_rope, apply_rope_), autograd, or the operators."""
    if entry in ("apply_rope", "apply_rope grad"):
        res = apply_rope(rope, q, k, **kw)
    elif entry == "apply_rope_":
        res = apply_rope_(rope, q, k, **kw)
    else:
        pos = kw.get("positions")
        if pos is not None and not isinstance(pos, torch.Tensor):
            pos = torch.as_tensor(np.asarray(pos))
        args = (rope._handle, pos, kw.get("offset", 0), kw.get("order", "bshd"), kw.get("inverse", False),
                kw.get("numerics", "exact"), kw.get("cos"), kw.get("sin"), kw.get("cos_sin_cache"), None)
        if entry == "ops.rope":
            res = torch.ops.rotary.rope(q, k, *args)
            res = res[0] if k is None else (res[0], res[1])
        else:
            torch.ops.rotary.rope_(q, k, *args)
            res = q if k is None else (q, k)
    if k is None:
        return res, None
    return res[0], res[1]


def draw_apply(rng, nrng, kind):
    name = rng.choice(list(ROPES))
    rope = rope_of(name)
    xpos = rope.xpos_scale_base is not None
    dtype = rng.choice(NP_DTYPES if kind == "np" else TORCH_DTYPES)
    entry = rng.choice(ENTRY_NP if kind == "np" else ENTRY_TORCH)
    order = rng.choice(("bshd", "bhsd", "thd"))
    batch, seq = rng.choice((1, 2, 3)), rng.choice((0, 1, 2, 5, 7))
    packed = order == "thd" or (order == "bshd" and rng.random() < 0.15)
    if packed:
        batch = 1
    heads, kv = rng.choice((0, 1, 2, 3)), rng.choice((1, 2))
    with_k = rng.random() < 0.7 or (xpos and heads == 0)
    d = rope.head_dim

    def shape(h):
        if packed:
            return (seq, h, d)
        return (batch, seq, h, d) if order == "bshd" else (batch, h, seq, d)

    q0 = data(nrng, shape(heads), dtype, kind)
    k0 = data(nrng, shape(kv), dtype, kind) if with_k else None
    kw = {}
    if packed and order == "thd":
        kw["order"] = "thd"
    elif order == "bhsd":
        kw["order"] = "bhsd"
    undo = entry.startswith("apply") and entry[:5] == "apply" and not entry.startswith("apply_rope") and \
        rng.random() < 0.15
    inverse = not undo and rng.random() < 0.25
    positions, offset, full = draw_positions(rng, nrng, kind, rope, batch, seq, packed, xpos)
    fractional = positions is not None and np.any(full != np.floor(full))
    numerics = rng.choice(("exact", "exact", "on_the_fly", "hf-float32"))
    if numerics == "hf-float32" and (fractional or undo):
        numerics = "exact"
    if positions is not None:
        kw["positions"] = positions
    if offset:
        kw["offset"] = offset
    if inverse:
        kw["inverse"] = True
    if undo:
        kw["undo"] = True
    if numerics != "exact":
        kw["numerics"] = numerics
    if entry.startswith("apply") and not entry.startswith("apply_rope") and rng.random() < 0.3:
        kw["threads"] = rng.choice((1, 2, 3))
    caller = None
    if numerics == "exact" and not undo and not xpos and rope.streams == 1 and rng.random() < 0.2:
        caller = rng.choice(("cos/sin rows", "cos/sin per token", "cos_sin_cache"))
        h = rope.rotary_dim // 2
        if caller == "cos/sin per token":
            kw.pop("positions", None)
            kw.pop("offset", None)
            full = None
            rows = (rng.choice((1, batch)) if not packed else 1, seq, h)
        else:
            full_i = full.astype(np.int64) % 50
            if positions is not None or offset:
                kw.pop("offset", None)
                kw["positions"] = as_kind(np.ascontiguousarray(full_i[0]), kind)
            full = np.broadcast_to(full_i[:1], full.shape).astype(np.float64)
            rows = (50, h) if caller != "cos_sin_cache" else (50, 2 * h)
        ang = nrng.uniform(-3, 3, rows)
        cdt = rng.choice(("float32", dtype))
        if caller == "cos_sin_cache":
            cache = np.concatenate([np.cos(ang[..., :h]), np.sin(ang[..., :h])], -1).astype(np.float32)
            kw["cos_sin_cache"] = place(rng, as_kind(cache.astype(cdt) if kind == "np" else cache, kind)) \
                if rng.random() < 0.5 else as_kind(cache, kind)
        else:
            for nm, fn in (("cos", np.cos), ("sin", np.sin)):
                v = fn(ang).astype(np.float32)
                v = as_kind(v, kind)
                kw[nm] = place(rng, v) if rng.random() < 0.5 else v
    params = dict(rope=name, kind=kind, entry=entry, dtype=dtype, order=order, packed=packed, batch=batch, seq=seq,
                  heads=heads, kv=kv, k=with_k, numerics=numerics, inverse=inverse, undo=undo, caller=caller,
                  positions=None if positions is None else (type(positions).__name__,
                                                            getattr(positions, "dtype", "list"),
                                                            tuple(np.shape(positions))), offset=offset)
    return rope, entry, q0, k0, kw, full, params


def laid_out(rng, x):
    if x is None:
        return None
    return place(rng, x) if rng.random() < 0.85 else contiguous(x)


@pytest.mark.parametrize("kind", ["np", "torch"])
def test_apply_layouts_bit_for_bit(kind):
    rng = random.Random(SEED * 7 + (kind == "torch"))
    nrng = np.random.default_rng(SEED + (kind == "torch"))
    failures, total, accepted, formula_checked, grads_checked = [], 300, 0, 0, 0
    for case in range(total):
        rope, entry, q0, k0, kw, full, params = draw_apply(rng, nrng, kind)
        # The reference: Rope.apply out of place on contiguous copies, contiguous positions/angles.
        ref_kw = {n: contiguous(v) for n, v in kw.items()}
        try:
            want_q, want_k = run_entry("apply", rope, contiguous(q0), contiguous(k0), ref_kw)
            ref_error = None
        except (TypeError, ValueError) as e:
            ref_error = e
        grad = entry == "apply_rope grad"
        q, k = laid_out(rng, q0), laid_out(rng, k0)
        if grad:  # a leaf in the poisoned layout (detach keeps the view's strides)
            q = q.detach().requires_grad_(True)
        outs = None
        if entry == "apply out":
            mk = (lambda x: place(rng, np.zeros(x.shape, x.dtype) if is_np(x) else torch.zeros_like(x)))
            outs = (mk(q0), mk(k0) if k0 is not None else None)
            outs = outs if k0 is not None else (outs[0],)
        tensors = [q, k] + list(outs or ()) + [v for v in kw.values() if is_np(v) or isinstance(v, torch.Tensor)]
        ledger = Ledger(*[t for t in tensors if t is not None])
        try:
            got_q, got_k = run_entry(entry, rope, q, k, kw, outs)
            error = None
        except (TypeError, ValueError) as e:
            error = e
        if refused(ref_error, error, ledger, f"case {case} {params}", failures):
            continue
        accepted += 1
        problems = []
        for nm, got, want, inp, o in (("q", got_q, want_q, q, outs[0] if outs else None),
                                      ("k", got_k, want_k, k, outs[1] if outs and len(outs) > 1 else None)):
            if inp is None:
                continue
            g = got.detach() if isinstance(got, torch.Tensor) else got
            if not same_bits(g, want):
                problems.append(f"{nm} differs from the contiguous call's bits")
            if entry in ("apply inplace", "apply_rope_", "ops.rope_"):
                if got is not inp:
                    problems.append(f"{nm}: in place returned another object")
                ledger.expect(inp, want, nm)
            elif entry == "apply out":
                if got is not o:
                    problems.append(f"{nm}: out= returned another object")
                ledger.expect(o, want, f"{nm}_out")
        problems += ledger.mismatches()
        rope_ok = rope.xpos_scale_base is None and rope.layout in ("half", "interleaved")
        if (rope_ok and full is not None and params["numerics"] != "hf-float32" and params["caller"] is None
                and params["dtype"] in ("float32", "float64")):
            worst, passed = formula_check(rope, q0, want_q, full, kw.get("order", "bshd"), params["dtype"],
                                          params["inverse"], params["undo"])
            formula_checked += 1
            if not worst <= 1 or not passed:
                problems.append(f"q is {worst:.2f} bounds from the float64 formula (pass-through kept: {passed})")
        if grad and not problems and q0.numel():
            # d(sum of outputs)/dq: the transpose (inverse=not inverse) of ones, reaching the kernel as an
            # expanded (stride 0) gradient.
            (got_q.sum() + (got_k.sum() if got_k is not None else 0)).backward()
            back = dict(kw, inverse=not kw.get("inverse", False))
            want_grad, _ = run_entry("apply", rope, torch.ones_like(q0), None if k0 is None else torch.ones_like(k0),
                                     back)
            grads_checked += 1
            if q.grad is None or not same_bits(q.grad, want_grad):
                problems.append("q's gradient is not the inverse rotation of ones")
        if problems:
            failures.append(f"case {case} {params}: {'; '.join(problems)}")
    assert not failures, report(f"apply ({kind})", failures, total)
    assert accepted >= total * 0.6, f"only {accepted} of {total} calls accepted: the fuzz tests little"
    assert formula_checked >= 10, f"only {formula_checked} cases checked against the formula"
    assert kind == "np" or grads_checked >= 3, f"only {grads_checked} gradients checked"


# ---- rerotate / switch ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["np", "torch"])
def test_rerotate_and_switch_layouts_bit_for_bit(kind):
    rng = random.Random(SEED * 11 + (kind == "torch"))
    nrng = np.random.default_rng(SEED + 50 + (kind == "torch"))
    failures, total, accepted, checked = [], 150, 0, 0
    for case in range(total):
        name = rng.choice([n for n in ROPES if n != "d32 xpos"])
        rope = rope_of(name)
        op = rng.choice(("rerotate", "switch"))
        dtype = rng.choice(NP_DTYPES if kind == "np" else TORCH_DTYPES)
        order = rng.choice(("bshd", "bhsd", "thd"))
        batch, seq, heads = (1 if order == "thd" else rng.choice((1, 2))), rng.choice((0, 1, 3, 6)), rng.choice((1, 2))
        d = rope.head_dim
        shp = {"thd": (seq, heads, d), "bshd": (batch, seq, heads, d), "bhsd": (batch, heads, seq, d)}[order]
        k0 = data(nrng, shp, dtype, kind)
        kw = {"order": order} if order != "bshd" else {}
        positions, offset, full = draw_positions(rng, nrng, kind, rope, batch, seq, order == "thd", False,
                                                 allow_float=False)
        if positions is not None:
            kw["positions"] = positions
        if offset:
            kw["offset"] = offset
        inplace = rng.random() < 0.5
        if op == "rerotate":
            if rope.streams > 1 and rng.random() < 0.5:
                delta = [rng.randint(-50, 50) for _ in range(rope.streams)]
            else:
                delta = rng.choice((0, 1, -1, 37, -1000, 1 << 20))
            arg = delta
        else:
            to = {"d64 half": lambda: Rope(64, base=5e5), "d64 interleaved": lambda: Rope(64, pairing="interleaved"),
                  "d48 partial r16": lambda: Rope(48, rotary_dim=16, schedule="linear", factor=2.0),
                  "d32 yarn": lambda: Rope(32, schedule="yarn", factor=8.0, original_max_position=4096),
                  "d64 r32 at offset 32": lambda: Rope(64, rotary_dim=32, rotary_offset=32, base=1e5),
                  "d64 mrope": lambda: Rope(64, base=5e5, stream_layout="sections", sections=[8, 12, 12])}[name]()
            arg = to
        params = dict(rope=name, kind=kind, op=op, dtype=dtype, order=order, shape=shp, inplace=inplace,
                      arg=arg if op == "rerotate" else "to", positions=None if positions is None else
                      (type(positions).__name__, getattr(positions, "dtype", "list")), offset=offset)
        fn = getattr(rope, op)
        ref_kw = {n: contiguous(v) for n, v in kw.items()}
        try:
            want = fn(contiguous(k0), arg, **ref_kw)
            ref_error = None
        except (TypeError, ValueError) as e:
            ref_error = e
        k = laid_out(rng, k0)
        ledger = Ledger(*[t for t in [k] + list(kw.values()) if is_np(t) or isinstance(t, torch.Tensor)])
        try:
            got = fn(k, arg, inplace=inplace, **kw)
            error = None
        except (TypeError, ValueError) as e:
            error = e
        if refused(ref_error, error, ledger, f"case {case} {params}", failures):
            continue
        accepted += 1
        problems = []
        if not same_bits(got, want):
            problems.append("differs from the contiguous call's bits")
        if inplace:
            if got is not k:
                problems.append("in place returned another object")
            ledger.expect(k, want, "k")
        problems += ledger.mismatches()
        if dtype in ("float32", "float64") and rope.layout in ("half", "interleaved"):
            checked += 1
            if op == "rerotate":
                deltas = arg if isinstance(arg, list) else [arg] * rope.streams
                move = np.broadcast_to(np.array(deltas, np.float64)[:, None, None], full.shape)
                # the formula at "positions" delta, without the factor: a turn by delta * inv_freq
                a, (x1, x2), (o1, o2), scale = formula(rope, k0, move, order)
                o1, o2 = o1 / scale, o2 / scale
                scale = 1.0
            else:
                a, (x1, x2), _, _ = formula(rope, k0, full, order)
                r = rope.rotary_dim
                ps = rope.pair_stream
                pos = np.stack([full[ps[j]] for j in range(r // 2)], -1)
                ang = pos * (arg.inv_freq - rope.inv_freq)
                c, s = np.cos(ang)[:, :, None], np.sin(ang)[:, :, None]
                scale = arg.attention_factor / rope.attention_factor
                o1, o2 = scale * (x1 * c - x2 * s), scale * (x2 * c + x1 * s)
            g = canonical(want, order)
            r, off = rope.rotary_dim, rope.rotary_offset
            sl = g[..., off:off + r]
            g1, g2 = (sl[..., :r // 2], sl[..., r // 2:]) if rope.layout == "half" else (sl[..., 0::2], sl[..., 1::2])
            bound = 8 * UNIT[dtype] * (np.abs(x1) + np.abs(x2)) * max(scale, 1.0) * 2 + 1e-300
            if g1.size:
                worst = float(max(np.max(np.abs(g1 - o1) / bound), np.max(np.abs(g2 - o2) / bound)))
                if not worst <= 1:
                    problems.append(f"{worst:.2f} bounds from the float64 formula")
        if problems:
            failures.append(f"case {case} {params}: {'; '.join(problems)}")
    assert not failures, report(f"rerotate/switch ({kind})", failures, total)
    assert accepted >= total * 0.6, f"only {accepted} of {total} accepted"
    assert checked >= 5


# ---- Refusals: ValueError/TypeError naming the argument, every byte unchanged -------------------------

def _spoil(name, kind, rng, nrng, q, k, kw, outs):
    """One broken call: returns (q, k, kw, outs, message regex, entries it applies to) or None."""
    tensor = (lambda a: a) if kind == "np" else (lambda a: torch.from_numpy(np.ascontiguousarray(a)))
    seq = q.shape[1]
    inplace = ("apply inplace", "apply_rope_", "ops.rope_")
    every = ("apply", "apply inplace", "apply out", "apply_rope", "apply_rope grad", "apply_rope_", "ops.rope",
             "ops.rope_")
    pos = {"positions bool": np.ones(seq, bool), "positions complex": np.zeros(seq, complex),
           "positions NaN": np.r_[np.arange(seq - 1), np.nan], "positions inf": np.r_[np.arange(seq - 1), np.inf],
           "positions -inf": np.r_[np.arange(seq - 1), -np.inf], "positions negative": np.r_[np.arange(seq - 1), -1],
           "positions -0.5": np.r_[np.arange(seq - 1), -0.5], "positions 2^31": np.r_[np.arange(seq - 1), 1 << 31],
           "positions 2^31 float": np.r_[np.arange(seq - 1), 2.0 ** 31],
           "positions too many": np.arange(seq + 1),
           "positions transposed": np.zeros((seq, 2) if seq != 2 else (2, 3), np.int64),
           "positions 4-D": np.zeros((1, 1, 1, seq), np.int64), "positions 2 streams": np.zeros((2, 2, seq), np.int64),
           "positions uint64 huge": np.array(list(range(seq - 1)) + [2 ** 64 - 1], np.uint64)}
    if name in pos:
        p = pos[name]
        if name == "positions uint64 huge" and kind == "torch":
            return None
        if rng.random() < 0.5 and p.ndim == 1 and p.dtype != complex:
            buf = np.zeros(2 * p.size + 1, p.dtype)
            buf[1::2] = p
            p = buf[1::2]
        return q, k, dict(kw, positions=tensor(p) if kind == "torch" else p), outs, "positions", every
    if name == "positions beyond int64 (list)":
        return q, k, dict(kw, positions=list(range(seq - 1)) + [1 << 70]), outs, "positions", every[:6]
    if name == "positions strings (list)":
        return q, k, dict(kw, positions=["a"] * seq), outs, "positions", every[:6]
    if name == "offset beside positions":
        return q, k, dict(kw, positions=tensor(np.arange(seq)), offset=3), outs, "offset", every
    if name == "offset beyond int64":
        return q, k, dict(kw, offset=1 << 70), outs, "offset", every[:6]
    if name == "offset negative":
        return q, k, dict(kw, offset=-1), outs, "offset", every
    if name == "offset past 2^31":
        return q, k, dict(kw, offset=(1 << 31) - 1), outs, "offset", every
    if name == "offset float":
        return q, k, dict(kw, offset=2.0), outs, "offset", every[:6]
    if name == "order unknown":
        return q, k, dict(kw, order="bsdh"), outs, "order", every
    if name == "numerics unknown":
        return q, k, dict(kw, numerics="fast"), outs, "numerics", every
    if name == "inverse not a bool":
        return q, k, dict(kw, inverse=1), outs, "inverse", every[:6]
    if name == "threads too many":
        return q, k, dict(kw, threads=1 << 70), outs, "threads", every[:3]
    if name == "undo with inverse":
        return q, k, dict(kw, undo=True, inverse=True), outs, "undo|inverse", every[:3]
    if name == "hf-float32 with fractional positions":
        return q, k, dict(kw, numerics="hf-float32", positions=tensor(np.arange(seq) + 0.5)), outs, \
            "numerics|positions", every
    if name == "q of ints":
        qi = np.zeros(q.shape, np.int32)
        return tensor(qi), k, kw, outs, r"\bq\b", every
    if name == "k of another dtype":
        kk = np.zeros(k.shape, np.float64 if str(k.dtype) != "float64" and str(k.dtype) != "torch.float64"
                      else np.float32)
        return q, tensor(kk), kw, outs, r"\bk\b", every
    if name == "k of another seq":
        longer = (k.shape[0], k.shape[1] + 1) + tuple(k.shape[2:])
        return q, (np.zeros(longer, q.dtype) if kind == "np" else torch.zeros(longer, dtype=q.dtype)), kw, outs, \
            r"\bk\b", every
    if name == "q expanded (in place)":
        one = q[:1]
        return (np.broadcast_to(one, q.shape) if kind == "np" else one.expand(q.shape)), k, kw, outs, r"\bq\b", inplace
    if name == "k expanded over seq (in place)":
        one = k[:, :1]
        return q, (np.broadcast_to(one, k.shape) if kind == "np" else one.expand(k.shape)), kw, outs, r"\bk\b", inplace
    if name == "q read-only (in place)" and kind == "np":
        q = q.copy()
        q.flags.writeable = False
        return q, k, kw, outs, r"\bq\b", ("apply inplace",)
    if name == "k is q (in place)":
        return q, q, kw, outs, r"\bq\b|\bk\b", inplace
    if name == "k overlaps q (in place)":
        whole = np.concatenate([q, q], 2) if kind == "np" else torch.cat([q, q], 2)
        return whole[:, :, :3], whole[:, :, 2:], kw, outs, r"\bq\b|\bk\b", inplace
    if name == "q requires grad (in place)" and kind == "torch":
        return q.clone().requires_grad_(True), k, kw, outs, r"\bq\b", inplace
    mk = (lambda shape, dt: np.zeros(shape, dt)) if kind == "np" else (lambda shape, dt: torch.zeros(shape, dtype=dt))
    if name == "q_out of another dtype":
        return q, k, kw, (mk(q.shape, np.float64 if kind == "np" else torch.float64), outs[1]), r"q_out", ("apply out",)
    if name == "k_out of another shape":
        shape = tuple(k.shape[:-1]) + (k.shape[-1] + 2,)
        return q, k, kw, (outs[0], mk(shape, k.dtype)), r"k_out", ("apply out",)
    if name == "k_out is q_out":
        return q, q.copy() if kind == "np" else q.clone(), kw, (outs[0], outs[0]), r"q_out|k_out", ("apply out",)
    if name == "q_out overlaps q":
        whole = np.concatenate([q, q[:, :1]], 1) if kind == "np" else torch.cat([q, q[:, :1]], 1)
        return whole[:, :-1], k, kw, (whole[:, 1:], outs[1]), r"q_out", ("apply out",)
    if name == "k_out is q (swapped)":
        kk = q.copy() if kind == "np" else q.clone()
        return q, kk, kw, (kk, q), r"q_out|k_out", ("apply out",)
    if name == "q_out expanded":
        one = outs[0][:1]
        return q, k, kw, ((np.broadcast_to(one, q.shape) if kind == "np" else one.expand(q.shape)), outs[1]), \
            r"q_out", ("apply out",)
    if name == "q_out read-only" and kind == "np":
        o = outs[0].copy()
        o.flags.writeable = False
        return q, k, kw, (o, outs[1]), r"q_out", ("apply out",)
    if name == "q_out of the other kind":
        o = torch.zeros(tuple(q.shape)) if kind == "np" else np.zeros(tuple(q.shape), np.float32)
        return q, k, kw, (o, outs[1]), r"q_out|out", ("apply out",)
    if name == "out with one array for q and k":
        return q, k, kw, (outs[0],), r"\bout\b", ("apply out",)
    return None


SPOILERS = ("positions bool", "positions complex", "positions NaN", "positions inf", "positions -inf",
            "positions negative", "positions -0.5", "positions 2^31", "positions 2^31 float", "positions too many",
            "positions transposed", "positions 4-D", "positions 2 streams", "positions uint64 huge",
            "positions beyond int64 (list)", "positions strings (list)", "offset beside positions",
            "offset beyond int64", "offset negative", "offset past 2^31", "offset float", "order unknown",
            "numerics unknown", "inverse not a bool", "threads too many", "undo with inverse",
            "hf-float32 with fractional positions", "q of ints", "k of another dtype", "k of another seq",
            "q expanded (in place)", "k expanded over seq (in place)", "q read-only (in place)", "k is q (in place)",
            "k overlaps q (in place)", "q requires grad (in place)", "q_out of another dtype",
            "k_out of another shape", "k_out is q_out", "q_out overlaps q", "k_out is q (swapped)", "q_out expanded",
            "q_out read-only", "q_out of the other kind", "out with one array for q and k")


@pytest.mark.parametrize("kind", ["np", "torch"])
def test_refusals_name_the_argument_and_write_nothing(kind):
    rng = random.Random(SEED * 13 + (kind == "torch"))
    nrng = np.random.default_rng(SEED + 70 + (kind == "torch"))
    rope = rope_of("d64 half")
    failures, total = [], 0
    entries = ENTRY_NP if kind == "np" else ENTRY_TORCH
    for spoiler in SPOILERS:
        for entry in entries:
            seq = rng.choice((2, 3, 5))
            dtype = rng.choice(("float32", "float16") if kind == "np" else ("float32", "bfloat16"))
            q0, k0 = data(nrng, (2, seq, 2, 64), dtype, kind), data(nrng, (2, seq, 2, 64), dtype, kind)
            q, k = place(rng, q0), place(rng, k0)
            mk = (lambda x: place(rng, np.zeros(x.shape, x.dtype) if kind == "np" else torch.zeros_like(x)))
            outs = (mk(q0), mk(k0))
            spoiled = _spoil(spoiler, kind, rng, nrng, q, k, {}, outs)
            if spoiled is None:
                continue
            q, k, kw, outs, message, applies = spoiled
            if entry not in applies:
                continue
            if entry == "apply_rope grad":
                if not (isinstance(q, torch.Tensor) and q.dtype.is_floating_point):
                    continue
                q = q.detach().clone().requires_grad_(True)
            if entry.startswith("ops") and "positions" in kw and not isinstance(kw["positions"], torch.Tensor):
                continue
            total += 1
            arrays = [q, k] + list(outs) + [v for v in kw.values() if is_np(v) or isinstance(v, torch.Tensor)]
            ledger = Ledger(*[a for a in arrays if a is not None and (not isinstance(a, torch.Tensor)
                                                                       or a.device.type == "cpu")])
            try:
                run_entry(entry, rope, q, k, kw, outs)
            except (TypeError, ValueError) as e:
                problems = [] if re.search(message, str(e)) else [f"the message does not name {message}: {e}"]
                problems += ledger.mismatches()
                if problems:
                    failures.append(f"{spoiler} via {entry}: {'; '.join(problems)}")
            except Exception as e:  # noqa: BLE001 - any other kind of error is a failure
                failures.append(f"{spoiler} via {entry}: raised {type(e).__name__}: {e}")
            else:
                failures.append(f"{spoiler} via {entry}: accepted")
    assert total >= 100
    assert not failures, report(f"refusals ({kind})", failures, total)


@pytest.mark.parametrize("kind", ["np", "torch"])
def test_move_refusals_name_the_argument_and_write_nothing(kind):
    """rerotate and switch: delta, positions, offset, to, in-place rules."""
    rng = random.Random(SEED * 17 + (kind == "torch"))
    nrng = np.random.default_rng(SEED + 90)
    rope, mrope = rope_of("d64 half"), rope_of("d64 mrope")
    tensor = (lambda a: a) if kind == "np" else (lambda a: torch.from_numpy(np.ascontiguousarray(a)))
    cases = {
        "delta a bool": (rope, "rerotate", dict(delta=True), "delta"),
        "delta a float": (rope, "rerotate", dict(delta=1.5), "delta"),
        "delta 2^31": (rope, "rerotate", dict(delta=1 << 31), "delta"),
        "delta beyond int64": (rope, "rerotate", dict(delta=1 << 70), "delta"),
        "delta -2^31": (rope, "rerotate", dict(delta=-(1 << 31)), "delta"),
        "delta list of 2 for 3 streams": (mrope, "rerotate", dict(delta=[1, 2]), "delta"),
        "delta list with a float": (mrope, "rerotate", dict(delta=[1, 2.0, 3]), "delta"),
        "delta a str": (rope, "rerotate", dict(delta="3"), "delta"),
        "position + delta past 2^31": (rope, "rerotate", dict(delta=10, offset=(1 << 31) - 12),
                                       "delta|offset|position"),
        "position + delta negative": (rope, "rerotate", dict(delta=-1, positions=tensor(np.array([5, 0, 3]))),
                                      "delta|position"),
        "positions NaN": (rope, "rerotate", dict(delta=1, positions=tensor(np.array([5, np.nan, 3]))), "positions"),
        "positions bool": (rope, "rerotate", dict(delta=1, positions=tensor(np.ones(3, bool))), "positions"),
        "offset beside positions": (rope, "rerotate", dict(delta=1, positions=tensor(np.arange(3)), offset=2),
                                    "offset"),
        "offset beyond int64": (rope, "rerotate", dict(delta=1, offset=1 << 70), "offset"),
        "to not a Rope": (rope, "switch", dict(to="rope"), r"\bto\b"),
        "to of another head_dim": (rope, "switch", dict(to=Rope(32)), "head_dim"),
        "to of another pairing": (rope, "switch", dict(to=Rope(64, pairing="interleaved")), "pairing"),
        "to with other streams": (rope, "switch", dict(to=mrope), "stream"),
        "to positions huge": (rope, "switch", dict(to=Rope(64, base=5e5), positions=[1, 2, 1 << 70]), "positions"),
        "k expanded (in place)": (rope, "rerotate", dict(delta=1, expand=True), r"\bk\b"),
        "k expanded (in place, switch)": (rope, "switch", dict(to=Rope(64, base=5e5), expand=True), r"\bk\b"),
        "k read-only (in place)": (rope, "rerotate", dict(delta=1, readonly=True), r"\bk\b"),
        "k of ints": (rope, "rerotate", dict(delta=1, ints=True), r"\bk\b"),
        "order unknown": (rope, "rerotate", dict(delta=1, order="bsdh"), "order"),
        "inplace not a bool": (rope, "rerotate", dict(delta=1, inplace=1), "inplace"),
    }
    failures = []
    for name, (r, op, args, message) in cases.items():
        args = dict(args)
        k0 = data(nrng, (1, 3, 2, 64), "float32", kind)
        k = place(rng, k0)
        inplace = rng.random() < 0.5
        if args.pop("expand", False):
            k = np.broadcast_to(k[:, :1], k.shape) if kind == "np" else k[:, :1].expand(k.shape)
            inplace = True
        if args.pop("readonly", False):
            if kind != "np":
                continue
            k = k.copy()
            k.flags.writeable = False
            inplace = True
        if args.pop("ints", False):
            k = tensor(np.zeros((1, 3, 2, 64), np.int32))
        if "inplace" in args:
            inplace = args.pop("inplace")
        first = args.pop("delta") if op == "rerotate" else args.pop("to")
        arrays = [k] + [v for v in args.values() if is_np(v) or isinstance(v, torch.Tensor)]
        ledger = Ledger(*arrays)
        try:
            getattr(r, op)(k, first, inplace=inplace, **args)
        except (TypeError, ValueError) as e:
            problems = [] if re.search(message, str(e)) else [f"the message does not name {message}: {e}"]
            problems += ledger.mismatches()
            if problems:
                failures.append(f"{name}: {'; '.join(problems)}")
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: raised {type(e).__name__}: {e}")
        else:
            failures.append(f"{name}: accepted")
    assert not failures, "\n".join(failures)


# ---- Sharing memory: either refused (naming them, nothing written) or right -----------------------------

def _fixed(kind, seed=0):
    nrng = np.random.default_rng(SEED + 200 + seed)
    q, k = data(nrng, (1, 6, 2, 64), "float32", kind), data(nrng, (1, 6, 2, 64), "float32", kind)
    positions = np.array([0, 5, 9, 100, 7, 3])
    return rope_of("d64 half"), q, k, positions if kind == "np" else torch.from_numpy(positions)


@pytest.mark.parametrize("kind", ["np", "torch"])
def test_out_that_is_the_input_itself_is_in_place(kind):
    rope, q, k, positions = _fixed(kind)
    want_q, want_k = rope.apply(q, k, positions=positions)
    qm, km = contiguous(q), contiguous(k)
    got = rope.apply(qm, km, positions=positions, out=(qm, km))
    assert got[0] is qm and got[1] is km
    assert same_bits(qm, want_q) and same_bits(km, want_k)


@pytest.mark.parametrize("kind, share", [("np", "k is q"), ("np", "k overlaps q"), ("np", "k is q reversed twice"),
                                         ("torch", "k is q"), ("torch", "k overlaps q")])
def test_inputs_sharing_memory_out_of_place(kind, share):
    """Inputs are only read out of place: q and k may share memory (a fused buffer, the same array)."""
    rope, q, k, positions = _fixed(kind)
    whole = np.concatenate([q, k], 2) if kind == "np" else torch.cat([q, k], 2)
    if share == "k is q":
        qv, kv = whole[:, :, :2], whole[:, :, :2]
    elif share == "k overlaps q":
        qv, kv = whole[:, :, :3], whole[:, :, 1:]
    else:
        qv, kv = whole[:, :, :2], whole[:, :, :2][:, ::-1, ::-1][:, ::-1, ::-1]
    want_q, want_k = rope.apply(contiguous(qv), contiguous(kv), positions=positions)
    ledger = Ledger(whole)
    got_q, got_k = rope.apply(qv, kv, positions=positions)
    assert same_bits(got_q, want_q) and same_bits(got_k, want_k)
    assert not ledger.mismatches()
    if kind == "torch":
        got_q, got_k = apply_rope(rope, qv, kv, positions=positions)
        assert same_bits(got_q, want_q) and same_bits(got_k, want_k)
        assert not ledger.mismatches()


@pytest.mark.parametrize("kind", ["np", "torch"])
@pytest.mark.parametrize("where", ["cos inside q (in place)", "sin inside q_out", "positions inside q (in place)"])
def test_angles_or_positions_inside_an_output(kind, where):
    rope, q, k, positions = _fixed(kind)
    nrng = np.random.default_rng(SEED + 300)
    ang = nrng.uniform(-3, 3, (6, 32))
    cos, sin = np.cos(ang).astype(np.float32)[None], np.sin(ang).astype(np.float32)[None]
    if kind == "torch":
        cos, sin = torch.from_numpy(cos), torch.from_numpy(sin)
    if where == "positions inside q (in place)":
        want = rope.apply(q, positions=positions)
        buf = np.zeros((1, 6, 3, 64), np.float32) if kind == "np" else torch.zeros(1, 6, 3, 64)
        buf[:, :, :2] = q
        ints = buf.view(np.int32) if kind == "np" else buf.view(torch.int32)
        ints[0, :, 2, 0] = positions
        call = dict(q=buf[:, :, :2], inplace=True, positions=ints[0, :, 2, 0])
        out_view, names = buf[:, :, :2], r"\bq\b|positions"
    else:
        want = rope.apply(q, cos=cos, sin=sin)
        buf = np.zeros((1, 6, 3, 64), np.float32) if kind == "np" else torch.zeros(1, 6, 3, 64)
        buf[:, :, :2] = q if where.endswith("(in place)") else 0
        buf[0, :, 2, :32], buf[0, :, 2, 32:] = cos[0], sin[0]
        angles = dict(cos=buf[:, :, 2, :32], sin=buf[:, :, 2, 32:])
        if where.startswith("cos"):
            call = dict(q=buf[:, :, :2], inplace=True, **angles)
            names = r"\bq\b|cos"
        else:
            call = dict(q=q, out=buf[:, :, 1:3], **angles)  # the output's last head is where sin lives
            names = r"q_out|sin|cos"
    ledger = Ledger(buf)
    qarg = call.pop("q")
    out_view = qarg if call.get("inplace") else call["out"]
    try:
        got = rope.apply(qarg, **call)
    except ValueError as e:
        assert re.search(names, str(e)), str(e)
        assert not ledger.mismatches()
        return
    assert got is out_view and same_bits(got, want)


# ---- Bugs this fuzz found, fixed ---------------------------------------------------------------------

def _neg_bit(values):
    """A float tensor equal to ``values`` whose memory holds -values: the negative bit set (what
    ``z.conj().imag`` of a complex tensor gives)."""
    z = torch.complex(torch.zeros_like(values), -values)
    t = z.conj().imag
    assert t.is_neg() and torch.equal(t, values)
    return t


@pytest.mark.parametrize("entry", ["Rope.apply", "apply_rope", "rerotate", "switch", "ops.rope"])
def test_negative_bit_q_is_read_as_its_values(entry):
    """(torch.ops.rotary.rope is right: the dispatcher resolves the bit before its kernel runs.)"""
    rope = rope_of("d64 half")
    g = torch.Generator().manual_seed(SEED + 400)
    values = torch.randn(1, 4, 2, 64, generator=g)
    q = _neg_bit(values)
    if entry == "Rope.apply":
        got, want = rope.apply(q), rope.apply(values)
    elif entry == "apply_rope":
        got, want = apply_rope(rope, q), apply_rope(rope, values)
    elif entry == "ops.rope":
        args = (rope._handle, None, 0, "bshd", False, "exact", None, None, None, None)
        got, want = torch.ops.rotary.rope(q, None, *args)[0], torch.ops.rotary.rope(values, None, *args)[0]
    elif entry == "rerotate":
        got, want = rope.rerotate(q, 3), rope.rerotate(values, 3)
    else:
        to = Rope(64, base=5e5)
        got, want = rope.switch(q, to), rope.switch(values, to)
    assert same_bits(got, want)


@pytest.mark.parametrize("what", ["q_out", "positions", "sin"])
def test_negative_bit_outputs_positions_and_angles(what):
    """Read, a tensor with the negative bit gives its values; written (its memory holds -values), it is
    refused naming it, with nothing written."""
    rope = rope_of("d64 half")
    g = torch.Generator().manual_seed(SEED + 401)
    q = torch.randn(1, 4, 2, 64, generator=g)
    if what == "q_out":
        out = _neg_bit(torch.ones(1, 4, 2, 64))
        with pytest.raises(ValueError, match="q_out"):
            rope.apply(q, out=out)
        assert torch.equal(out, torch.ones(1, 4, 2, 64))
    elif what == "positions":
        positions = torch._neg_view(torch.tensor([0, -1, -7, -3]))  # the values 0, 1, 7, 3
        assert positions.is_neg() and positions.tolist() == [0, 1, 7, 3]
        assert same_bits(rope.apply(q, positions=positions), rope.apply(q, positions=torch.tensor([0, 1, 7, 3])))
    else:
        ang = torch.rand(4, 32, generator=g)
        cos, sin = torch.cos(ang)[None], torch.sin(ang)[None]
        assert same_bits(rope.apply(q, cos=cos, sin=_neg_bit(sin)), rope.apply(q, cos=cos, sin=sin))


@pytest.mark.parametrize("entry", ["Rope.apply inplace", "Rope.apply out", "apply_rope_", "rerotate inplace",
                                   "switch inplace"])
def test_in_place_writes_bump_the_version_counter(entry):
    rope = rope_of("d64 half")
    g = torch.Generator().manual_seed(SEED + 402)
    w = torch.randn(1, 4, 2, 64, generator=g, requires_grad=True)
    x = torch.randn(1, 4, 2, 64, generator=g)
    loss = (w * x).sum()  # saves x for backward
    before = x._version
    if entry == "Rope.apply inplace":
        rope.apply(x, inplace=True)
    elif entry == "Rope.apply out":
        rope.apply(torch.randn(1, 4, 2, 64, generator=g), out=x)
    elif entry == "apply_rope_":
        apply_rope_(rope, x)
    elif entry == "rerotate inplace":
        rope.rerotate(x, 3, inplace=True)
    else:
        rope.switch(x, Rope(64, base=5e5), inplace=True)
    assert x._version > before, "written without bumping the version counter"
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_in_place_through_the_operator_bumps_the_version_counter():
    """The operator (torch.ops.rotary.rope_) does: what the eager paths above should match."""
    rope = rope_of("d64 half")
    x = torch.randn(1, 4, 2, 64)
    before = x._version
    torch.ops.rotary.rope_(x, None, rope._handle, None, 0, "bshd", False, "exact", None, None, None, None)
    assert x._version > before


@pytest.mark.parametrize("entry", ["Rope.apply inplace", "apply_rope_"])
def test_inference_tensor_in_place_outside_inference_mode_is_refused(entry):
    rope = rope_of("d64 half")
    with torch.inference_mode():
        x = torch.randn(1, 4, 2, 64)
    before = x.clone()
    with pytest.raises((RuntimeError, ValueError)):
        if entry == "apply_rope_":
            apply_rope_(rope, x)
        else:
            rope.apply(x, inplace=True)
    assert torch.equal(x, before)


@pytest.mark.parametrize("entry", ["Rope.apply", "apply_rope", "apply_rope_", "rerotate", "ops.rope"])
@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_positions_are_refused_naming_positions(entry, layout):
    rope = rope_of("d64 half")
    q = torch.randn(1, 4, 2, 64)
    positions = torch.tensor([[0, 1, 2, 3]])
    positions = positions.to_sparse() if layout == "coo" else positions.to_sparse_csr()
    ledger = Ledger(q)
    with pytest.raises((ValueError, TypeError), match="positions"):
        if entry == "Rope.apply":
            rope.apply(q, positions=positions)
        elif entry == "apply_rope":
            apply_rope(rope, q, positions=positions)
        elif entry == "apply_rope_":
            apply_rope_(rope, q, positions=positions)
        elif entry == "rerotate":
            rope.rerotate(q, 1, positions=positions)
        else:
            torch.ops.rotary.rope(q, None, rope._handle, positions, 0, "bshd", False, "exact", None, None, None, None)
    assert not ledger.mismatches()


def test_sparse_q_and_cos_are_refused_naming_them():
    """(What sparse positions should match.)"""
    rope = rope_of("d64 half")
    q = torch.randn(1, 4, 2, 64)
    with pytest.raises(ValueError, match=r"^q\b"):
        rope.apply(q.to_sparse())
    with pytest.raises(ValueError, match=r"^cos\b"):
        rope.apply(q, cos=torch.ones(1, 4, 32).to_sparse(), sin=torch.zeros(1, 4, 32))


@pytest.mark.parametrize("entry", ["Rope.apply", "apply_rope", "rerotate", "switch", "float positions"])
def test_mkldnn_tensors_are_refused_naming_them(entry):
    rope = rope_of("d64 half")
    q = torch.randn(1, 4, 2, 64)
    with pytest.raises((ValueError, TypeError), match=r"\bq\b|\bk\b|positions"):
        if entry == "Rope.apply":
            rope.apply(q.to_mkldnn())
        elif entry == "apply_rope":
            apply_rope(rope, q.to_mkldnn())
        elif entry == "rerotate":
            rope.rerotate(q.to_mkldnn(), 1)
        elif entry == "switch":
            rope.switch(q.to_mkldnn(), Rope(64, base=5e5))
        else:
            rope.apply(q, positions=torch.arange(4.0).to_mkldnn())


def test_mkldnn_tensors_in_place_are_refused_naming_them():
    """(In place, and as out=, they are: what out of place should match.)"""
    rope = rope_of("d64 half")
    with pytest.raises(ValueError, match=r"^q\b"):
        rope.apply(torch.randn(1, 4, 2, 64).to_mkldnn(), inplace=True)
    with pytest.raises(ValueError, match=r"\bq_out\b"):
        rope.apply(torch.randn(1, 4, 2, 64), out=torch.zeros(1, 4, 2, 64).to_mkldnn())


def test_a_bool_among_int_positions_is_refused():
    rope = rope_of("d64 half")
    q = np.zeros((1, 4, 2, 64), np.float32)
    with pytest.raises(TypeError, match="positions"):
        rope.apply(q, positions=[0, 1, 2, True])
