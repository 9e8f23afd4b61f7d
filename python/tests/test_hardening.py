"""The Python module under stress and misuse: a Rope shared by threads, read-only and empty inputs,
bad arguments of every kind (the exception type and the argument named), pickling."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import rotary
from rotary import Rope


def _stress_shared_rope(rounds):
    """Readers rotate a large strided q (the kernel then holds each token's cos/sin row while it
    rotates all heads) while growers ask for ever further positions, so the Rope's cached tables
    (exact and hf-float32) are regrown under the readers. Every result must equal the same call
    made alone, bit for bit. Returns the list of mismatches."""
    head_dim = 8
    rng = np.random.default_rng(7)
    big = rng.standard_normal((1, 32, 1024, 2 * head_dim)).astype(np.float32)[..., ::2]
    small = rng.standard_normal((1, 4, 2, head_dim)).astype(np.float32)
    reach = [int(4096 * 2 ** (j / 2)) for j in range(1, 9)]  # past the cache's 4096 rows, doubling
    calls = [dict(offset=r) for r in reach] + [dict(positions=[[r, 3, r + 5, 1]], angles="hf-float32") for r in reach]
    reads = [dict(), dict(angles="hf-float32"), dict(positions=np.arange(32)[None] * 3)]
    alone = Rope(head_dim, base=5e5)
    want_reads = [alone.apply(big, **kw) for kw in reads]
    want_calls = [alone.apply(small, **kw) for kw in calls]
    mismatches = []
    for _ in range(rounds):
        rope = Rope(head_dim, base=5e5)
        rope.apply(small)  # the first tables, 4096 rows
        rope.apply(small, angles="hf-float32")
        done = threading.Event()

        def read(i):
            while not done.is_set():
                kw = reads[i % len(reads)]
                if not np.array_equal(rope.apply(big, threads=1, **kw), want_reads[i % len(reads)]):
                    mismatches.append(("read", kw))
                i += 1

        def grow():
            for kw, want in zip(calls, want_calls):
                if not np.array_equal(rope.apply(small, **kw), want):
                    mismatches.append(("grow", kw))

        readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        grower = threading.Thread(target=grow)
        for t in readers + [grower]:
            t.start()
        grower.join()
        done.set()
        for t in readers:
            t.join()
    return mismatches


def test_rope_shared_by_threads_while_its_cache_grows():
    """One Rope shared by threads: while calls (GIL released) read a cached cos/sin table, another
    call grows it. Each call keeps the table it started with, so results equal the same call made
    alone, bit for bit. The old module freed the table under its readers: run in a child process
    with glibc's mmap threshold fixed, so that a freed table is unmapped at once and a reader of it
    faults (rather than reading stale memory that happens to hold the same values)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(rotary.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, __file__, "stress"], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"child exited with {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.strip() == "mismatches: []", result.stdout



def test_positions_are_copied_before_the_library_checks_them():
    """The call reads its own copy: a thread rewriting the caller's positions (here, after the
    conversion) cannot slip an unchecked position past validate into the table lookup."""
    for positions in (np.arange(6, dtype=np.int64), torch.arange(6)):
        converted = rotary._positions_array(positions)
        assert converted.dtype == np.int64 and converted.flags.c_contiguous
        assert not np.shares_memory(converted, np.asarray(positions))


# ---- threads ------------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [rotary.max_threads + 1, 2 ** 31, 2 ** 63, 10 ** 30, -1])
def test_threads_beyond_the_limit_is_a_value_error_naming_threads(threads):
    """A huge count never reaches OpenMP, and one beyond C int is a ValueError, not an
    OverflowError or pybind's 'incompatible function arguments'."""
    rope = Rope(8)
    q = np.ones((1, 2, 1, 8), np.float32)
    with pytest.raises(ValueError, match=rf"threads={threads} must be in \[0, 1024\]"):
        rope.apply(q, threads=threads, inplace=True)
    assert np.all(q == 1)
    assert rotary.max_threads == 1024
    assert np.array_equal(rope.apply(q, threads=rotary.max_threads), rope.apply(q, threads=np.int64(1)))


# ---- empty tensors ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("shape", [(0, 3, 2, 16), (2, 0, 2, 16), (2, 3, 0, 16)])
def test_empty_tensors_are_a_no_op(shape, layout):
    """torch gives an empty tensor a null data pointer: no error, empty results of the same kind."""
    rope = Rope(16)
    q = torch.empty(shape)
    assert q.data_ptr() == 0
    out = rope.apply(q, layout=layout)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    assert rope.apply(q, inplace=True, layout=layout) is q
    heads_dim = 2 if layout == "bshd" else 1
    k_shape = list(shape)
    k_shape[heads_dim] = 1  # one k head: non-empty when q's emptiness is its heads
    k = torch.randn(k_shape)
    rq, rk = rope.apply(q, k, offset=5, layout=layout)
    assert rq.shape == q.shape and rk.shape == k.shape
    assert torch.equal(rk, rope.apply(k, offset=5, layout=layout))
    if shape[heads_dim] == 0:
        assert not torch.equal(rk, k)  # rotated although q is empty
    tokens = shape[0] * shape[3 - heads_dim]
    positions = np.zeros((tokens,), np.int64)
    assert rope.apply(q, positions=positions, angles="on_the_fly", layout=layout).shape == q.shape
    a = np.empty(shape, np.float32)
    assert rope.apply(a, layout=layout).shape == shape and rope.apply(a, inplace=True, layout=layout) is a


# ---- inputs are borrowed read-only --------------------------------------------------------------


def _read_only_inputs(x, tmp_path):
    """x [2, 3, 4, 16] float32 as memory apply may read but not write, with the array it equals."""
    ro = x.copy()
    ro.flags.writeable = False
    np.save(tmp_path / "q.npy", x)
    x.tofile(tmp_path / "q.raw")
    broadcast = np.broadcast_to(x[:, :1], x.shape)  # zero stride along seq
    return {
        "read-only": (ro, x),
        "np.load mmap": (np.load(tmp_path / "q.npy", mmap_mode="r"), x),
        "np.memmap": (np.memmap(tmp_path / "q.raw", dtype=np.float32, mode="r", shape=x.shape), x),
        "frombuffer": (np.frombuffer(x.tobytes(), dtype=np.float32).reshape(x.shape), x),
        "broadcast_to": (broadcast, np.ascontiguousarray(broadcast)),
    }


def test_out_of_place_reads_read_only_and_broadcast_arrays(tmp_path, rng):
    rope = Rope(16, pairing="interleaved")
    x = rng.standard_normal((2, 3, 4, 16)).astype(np.float32)
    for name, (q, same) in _read_only_inputs(x, tmp_path).items():
        want = rope.apply(same.copy(), offset=11)
        got = rope.apply(q, offset=11)
        assert type(got) is np.ndarray and got.flags.writeable, name
        assert np.array_equal(got, want), name
        gq, gk = rope.apply(same.copy(), q, offset=11)  # as k too
        assert np.array_equal(gk, want), name
        before = np.array(q)
        with pytest.raises(ValueError, match="q is read-only"):
            rope.apply(q, inplace=True)
        with pytest.raises(ValueError, match="k is read-only"):
            rope.apply(same.copy(), q, inplace=True)
        assert np.array_equal(np.array(q), before), name
    assert np.array_equal(np.load(tmp_path / "q.npy"), x)


def test_out_of_place_reads_tensors_that_require_grad_and_expanded_tensors():
    rope = Rope(16)
    x = torch.randn(2, 3, 4, 16)
    leaf = x.clone().requires_grad_(True)
    got = rope.apply(leaf, offset=3)
    assert torch.equal(got, rope.apply(x, offset=3)) and not got.requires_grad
    expanded = x[:, :1].expand(2, 3, 4, 16)
    assert torch.equal(rope.apply(expanded), rope.apply(expanded.contiguous()))
    with pytest.raises(ValueError, match="q requires grad and would be written in place"):
        rope.apply(leaf, inplace=True)
    with pytest.raises(ValueError, match="k requires grad"):
        rope.apply(x.clone(), leaf, inplace=True)
    with pytest.raises(ValueError, match=r"q \(in place\) strides .* overlap"):
        rope.apply(expanded, inplace=True)
    assert torch.equal(leaf.detach(), x) and leaf.grad is None


def test_numpy_strides_byte_order_and_alignment(rng):
    rope = Rope(8)
    x = rng.standard_normal((1, 3, 2, 8))
    reversed_view = x[:, ::-1, :, ::-1]  # negative strides
    assert np.array_equal(rope.apply(reversed_view), rope.apply(np.ascontiguousarray(reversed_view)))
    with pytest.raises(TypeError, match=r"q dtype dtype\('>f8'\) is not in the machine's byte order"):
        rope.apply(x.astype(">f8"))
    odd = np.lib.stride_tricks.as_strided(np.zeros(64, np.uint8).view(np.float32), (1, 1, 1, 8), (32, 32, 32, 2))
    with pytest.raises(ValueError, match="q stride 2 bytes is not a multiple of its 4-byte elements"):
        rope.apply(odd)
    with pytest.raises(TypeError, match=r"q dtype must be float32, float64, float16 or bfloat16, got dtype\('int64'\)"):
        rope.apply(np.zeros((1, 1, 1, 8), np.int64))


# ---- numbers: numpy scalars are numbers, bool is not --------------------------------------------


def test_numpy_scalars_are_accepted_wherever_numbers_are(rng):
    plain = Rope(64, rotary_dim=32, base=10000.0, schedule="yarn", factor=2.0, original_max_position=4096,
                 beta_fast=32.0, mscale=0.5, truncate=False, seq_len=100)
    numpy_ = Rope(np.int64(64), rotary_dim=np.int32(32), base=np.float32(10000), schedule="yarn",
                  factor=np.float32(2), original_max_position=np.uint16(4096), beta_fast=np.float64(32),
                  mscale=np.float16(0.5), truncate=np.bool_(False), seq_len=np.int8(100))
    assert np.array_equal(numpy_.inv_freq, plain.inv_freq)
    assert numpy_.attention_factor == plain.attention_factor
    long_rope = dict(schedule="longrope", original_max_position=4096, max_position=131072)
    factors = np.linspace(1.0, 4.0, 16)
    assert np.array_equal(Rope(32, short_factor=factors, long_factor=tuple(factors), **long_rope).inv_freq,
                          Rope(32, short_factor=list(factors), long_factor=list(factors), **long_rope).inv_freq)
    q = rng.standard_normal((1, 3, 2, 64)).astype(np.float32)
    assert np.array_equal(plain.apply(q, offset=np.int64(7), threads=np.int32(1), inverse=np.bool_(True)),
                          plain.apply(q, offset=7, threads=1, inverse=True))
    w = rng.standard_normal((2 * 64, 3))
    assert np.array_equal(rotary.permute_for_pairing(w, np.int64(2), rotary_dim=np.int64(32)),
                          rotary.permute_for_pairing(w, 2, rotary_dim=32))
    assert Rope.from_preset("llama-3.1-8b", seq_len=np.int64(10)).head_dim == 128


# ---- bad arguments: the exception type, and the argument named ----------------------------------

_Q = np.zeros((1, 2, 1, 8), np.float32)
_R = Rope(8)
_YARN = dict(schedule="yarn", factor=2.0, original_max_position=4096)
_LONGROPE = dict(schedule="longrope", original_max_position=4096, max_position=8192, long_factor=[1.0] * 4)
_LONG = "x" * 100000


def _deep_dict(depth):
    d = {}
    for _ in range(depth):
        d = {"a": d}
    return d


BAD_ARGUMENTS = [
    # Rope(...)
    ("head_dim str", lambda: Rope("64"), TypeError, "head_dim must be an int, got str"),
    ("head_dim bool", lambda: Rope(True), TypeError, "head_dim must be an int, got bool"),
    ("head_dim float", lambda: Rope(64.0), TypeError, "head_dim must be an int, got float"),
    ("head_dim None", lambda: Rope(None), TypeError, "head_dim must be an int, got NoneType"),
    ("head_dim huge", lambda: Rope(2 ** 70), ValueError, "head_dim=1180591620717411303424 is out of range"),
    ("head_dim negative", lambda: Rope(-8), ValueError, "head_dim=-8 must be > 0"),
    ("head_dim 10**5000", lambda: Rope(10 ** 5000), ValueError, "head_dim=<int> is out of range"),
    ("rotary_dim bool", lambda: Rope(8, rotary_dim=False), TypeError, "rotary_dim must be an int, got bool"),
    ("rotary_dim huge", lambda: Rope(8, rotary_dim=-2 ** 64), ValueError, "rotary_dim=-18446744073709551616"),
    ("base str", lambda: Rope(8, base="x"), TypeError, "base must be a number, got str"),
    ("base bool", lambda: Rope(8, base=True), TypeError, "base must be a number, got bool"),
    ("base complex", lambda: Rope(8, base=1j), TypeError, "base must be a number, got complex"),
    ("base huge", lambda: Rope(8, base=10 ** 400), ValueError, "base=1000000000000000000"),
    ("base nan", lambda: Rope(8, base=float("nan")), ValueError, "base=nan must be finite"),
    ("pairing int", lambda: Rope(8, pairing=1), TypeError, "pairing must be a str, got int"),
    ("pairing long", lambda: Rope(8, pairing=_LONG), ValueError, "pairing='xxxx"),
    ("pairing surrogate", lambda: Rope(8, pairing="\ud800"), ValueError,
     "pairing='\\\\ud800' is not encodable as UTF-8"),
    ("schedule None", lambda: Rope(8, schedule=None), TypeError, "schedule must be a str, got NoneType"),
    ("schedule long", lambda: Rope(8, schedule=_LONG), ValueError, "schedule='xxxx"),
    ("seq_len str", lambda: Rope(8, seq_len="5"), TypeError, "seq_len must be an int, got str"),
    ("seq_len huge", lambda: Rope(8, seq_len=2 ** 64), ValueError, "seq_len=18446744073709551616"),
    ("seq_len negative", lambda: Rope(8, seq_len=-1), ValueError, "seq_len=-1"),
    ("factor bool", lambda: Rope(8, schedule="linear", factor=True), TypeError, "factor must be a number, got bool"),
    ("factor str", lambda: Rope(8, schedule="linear", factor="2"), TypeError, "factor must be a number, got str"),
    ("factor list", lambda: Rope(8, schedule="linear", factor=[2.0]), TypeError, "factor must be a number, got list"),
    ("factor huge", lambda: Rope(8, schedule="linear", factor=-10 ** 400), ValueError, "factor=-10000000"),
    ("factor nan", lambda: Rope(8, schedule="linear", factor=float("nan")), ValueError, "factor=nan"),
    ("original_max_position float", lambda: Rope(8, **dict(_YARN, original_max_position=4096.0)), TypeError,
     "original_max_position must be an int, got float"),
    ("original_max_position huge", lambda: Rope(8, **dict(_YARN, original_max_position=2 ** 63)), ValueError,
     "original_max_position=9223372036854775808"),
    ("truncate int", lambda: Rope(8, truncate=1, **_YARN), TypeError, "truncate must be a bool, got int"),
    ("truncate str", lambda: Rope(8, truncate="no", **_YARN), TypeError, "truncate must be a bool, got str"),
    ("short_factor str", lambda: Rope(8, short_factor="1234", **_LONGROPE), TypeError,
     "short_factor must be a list of numbers, got str"),
    ("short_factor int", lambda: Rope(8, short_factor=4, **_LONGROPE), TypeError,
     "short_factor must be a list of numbers, got int"),
    ("short_factor None item", lambda: Rope(8, short_factor=[1.0, None, 1.0, 1.0], **_LONGROPE), TypeError,
     "short_factor[1] must be a number, got NoneType"),
    ("short_factor str item", lambda: Rope(8, short_factor=[1.0, 1.0, "x", 1.0], **_LONGROPE), TypeError,
     "short_factor[2] must be a number, got str"),
    ("short_factor bool item", lambda: Rope(8, short_factor=[True] * 4, **_LONGROPE), TypeError,
     "short_factor[0] must be a number, got bool"),
    ("short_factor nan", lambda: Rope(8, short_factor=[1.0, float("nan"), 1.0, 1.0], **_LONGROPE), ValueError,
     "short_factor[1]=nan"),
    ("short_factor long", lambda: Rope(8, short_factor=[1.0] * 2000000, **_LONGROPE), ValueError,
     "short_factor has 2000000 values"),
    ("unknown argument", lambda: Rope(8, **{_LONG: 1}), TypeError, "unknown schedule argument 'xxxx"),
    # from_hf_config / from_preset
    ("config int", lambda: Rope.from_hf_config(5), TypeError, "path_or_dict must be a path or a dict, got int"),
    ("config object", lambda: Rope.from_hf_config({"a": object()}), TypeError, "path_or_dict is not a JSON config"),
    ("config nan", lambda: Rope.from_hf_config({"rope_theta": float("nan")}), ValueError,
     "path_or_dict is not a JSON config"),
    ("config deep", lambda: Rope.from_hf_config(_deep_dict(100000)), ValueError, "path_or_dict is not a JSON config"),
    ("config value", lambda: Rope.from_hf_config({"hidden_size": 64, "num_attention_heads": 1, "rope_theta": _LONG}),
     ValueError, "rope_theta='xxxx"),
    ("config seq_len", lambda: Rope.from_hf_config({}, seq_len=1.5), TypeError, "seq_len must be an int, got float"),
    ("preset int", lambda: Rope.from_preset(5), TypeError, "name must be a str, got int"),
    ("preset long", lambda: Rope.from_preset(_LONG), ValueError, "preset 'xxxx"),
    ("preset seq_len", lambda: Rope.from_preset("llama-3.1-8b", seq_len=True), TypeError,
     "seq_len must be an int, got bool"),
    # table
    ("table floats", lambda: _R.table([1.5]), TypeError, "positions must hold integers, got dtype float64"),
    ("table huge", lambda: _R.table([2 ** 70]), ValueError, "positions[0]=1180591620717411303424 must be in [0, 2^31)"),
    ("table negative", lambda: _R.table([3, -1]), ValueError, "position=-1"),
    ("table ragged", lambda: _R.table([[1, 2], [3]]), TypeError, "positions must be an array of integers"),
    ("table angles int", lambda: _R.table([1], angles=5), TypeError, "angles must be a str, got int"),
    ("table angles long", lambda: _R.table([1], angles=_LONG), ValueError, "angles='xxxx"),
    # apply
    ("q list", lambda: _R.apply([1.0]), TypeError, "q must be a numpy.ndarray or torch.Tensor, got list"),
    ("q 2-D", lambda: _R.apply(_Q[0, 0]), ValueError, "q must have 4 dimensions"),
    ("q torch.Size", lambda: _R.apply(torch.Size([1, 2, 1, 8])), TypeError,
     "q must be a numpy.ndarray or torch.Tensor"),
    ("k kind", lambda: _R.apply(_Q, torch.zeros(1, 2, 1, 8)), TypeError, "k must be the same kind as q"),
    ("positions torch bool", lambda: _R.apply(_Q, positions=torch.ones(2, dtype=torch.bool)), TypeError,
     "positions must hold integers or real numbers, got dtype torch.bool"),
    ("positions str", lambda: _R.apply(_Q, positions=["0", "1"]), TypeError,
     "positions must hold integers or real numbers"),
    ("positions 4-D", lambda: _R.apply(_Q, positions=np.zeros((1, 1, 1, 2), np.int64)), ValueError,
     "positions must have at most 3 dimensions"),
    ("cos list", lambda: _R.apply(_Q, cos=[1.0], sin=[0.0]), TypeError, "cos must be a numpy.ndarray or torch.Tensor"),
    ("cos_sin_columns", lambda: _R.apply(_Q, cos=np.ones((1, 2, 8)), sin=np.ones((1, 2, 8)), cos_sin_columns=3),
     TypeError, "cos_sin_columns must be a str, got int"),
    ("layer_type", lambda: Rope.from_preset("llama-3-8b", layer_type=b"x"), TypeError, "layer_type must be a str"),
    ("stream_layout", lambda: Rope(8, stream_layout=1), TypeError, "stream_layout must be a str, got int"),
    ("sections long", lambda: Rope(8, stream_layout="sections", sections=_LONG), TypeError,
     "sections must be a list of ints, got str"),
    ("positions None items", lambda: _R.apply(_Q, positions=[None, 1]), TypeError, "positions[0] must be an int"),
    ("positions str", lambda: _R.apply(_Q, positions="01"), TypeError, "positions must hold integers"),
    ("positions huge", lambda: _R.apply(_Q, positions=[1, 2 ** 64]), ValueError, "positions[1]=18446744073709551616"),
    ("positions uint64", lambda: _R.apply(_Q, positions=np.array([1, 2 ** 64 - 1], np.uint64)), ValueError,
     "positions[1]=18446744073709551615 must be in [0, 2^31)"),
    ("positions negative", lambda: _R.apply(_Q, positions=[1, -5]), ValueError, "positions[1]=-5 must be in [0, 2^31)"),
    ("positions 2M", lambda: _R.apply(_Q, positions=np.arange(2000000)), ValueError,
     "positions has 2000000 entries but batch*seq=2"),
    ("offset huge", lambda: _R.apply(_Q, offset=2 ** 70), ValueError, "offset=1180591620717411303424 must keep"),
    ("offset 2^63-1", lambda: _R.apply(_Q, offset=2 ** 63 - 1), ValueError, "offset=9223372036854775807"),
    ("offset negative", lambda: _R.apply(_Q, offset=-1), ValueError, "offset=-1"),
    ("offset float", lambda: _R.apply(_Q, offset=1.0), TypeError, "offset must be an int, got float"),
    ("offset bool", lambda: _R.apply(_Q, offset=True), TypeError, "offset must be an int, got bool"),
    ("layout int", lambda: _R.apply(_Q, layout=0), TypeError, "layout must be a str, got int"),
    ("layout long", lambda: _R.apply(_Q, layout=_LONG), ValueError, "layout='xxxx"),
    ("angles None", lambda: _R.apply(_Q, angles=None), TypeError, "angles must be a str, got NoneType"),
    ("angles bad", lambda: _R.apply(_Q, angles="fast"), ValueError, "angles='fast' must be 'exact', 'on_the_fly' or 'hf-float32'"),
    ("inverse int", lambda: _R.apply(_Q, inverse=1), TypeError, "inverse must be a bool, got int"),
    ("inplace str", lambda: _R.apply(_Q, inplace="yes"), TypeError, "inplace must be a bool, got str"),
    ("threads str", lambda: _R.apply(_Q, threads="2"), TypeError, "threads must be an int, got str"),
    ("threads float", lambda: _R.apply(_Q, threads=2.0), TypeError, "threads must be an int, got float"),
    # permute_for_pairing
    ("weight list", lambda: rotary.permute_for_pairing([1.0], 1), TypeError, "weight must be a numpy.ndarray"),
    ("weight 0-d", lambda: rotary.permute_for_pairing(np.array(1.0), 1), ValueError,
     "weight must have at least 1 dimension"),
    ("num_heads bool", lambda: rotary.permute_for_pairing(np.ones((8, 2)), True), TypeError,
     "num_heads must be an int, got bool"),
    ("num_heads zero", lambda: rotary.permute_for_pairing(np.ones((8, 2)), 0), ValueError, "num_heads=0 must be > 0"),
    ("num_heads huge", lambda: rotary.permute_for_pairing(np.ones((8, 2)), 10 ** 5000), ValueError,
     "not a positive multiple of num_heads=<int>"),
    ("to int", lambda: rotary.permute_for_pairing(np.ones((8, 2)), 1, to=1), TypeError, "to must be a str, got int"),
    ("to long", lambda: rotary.permute_for_pairing(np.ones((8, 2)), 1, to=_LONG), ValueError, "to='xxxx"),
    ("rotary_dim str", lambda: rotary.permute_for_pairing(np.ones((8, 2)), 1, rotary_dim="4"), TypeError,
     "rotary_dim must be an int, got str"),
    ("rotary_dim odd", lambda: rotary.permute_for_pairing(np.ones((8, 2)), 1, rotary_dim=3), ValueError,
     "rotary_dim=3"),
]


@pytest.mark.parametrize("call, kind, needle", [c[1:] for c in BAD_ARGUMENTS], ids=[c[0] for c in BAD_ARGUMENTS])
def test_bad_arguments_name_the_argument(call, kind, needle):
    """Every public argument: TypeError for a wrong kind, ValueError for a bad value (never
    OverflowError, RuntimeError or pybind's 'incompatible function arguments'), the message naming
    the argument and echoing at most ~100 characters of the value."""
    with pytest.raises(Exception) as info:
        call()
    assert type(info.value) is kind or type(info.value) is rotary.RotaryError and kind is ValueError, \
        f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    assert needle in message, message
    assert "incompatible function arguments" not in message, message[:400]
    # The value is cut (the message may list what is known: the presets, the layer types).
    assert "x" * 120 not in message and len(message) < 1200, message[:400]


# ---- pickle, deepcopy, torch.save -----------------------------------------------------------------

ROPES_TO_COPY = {
    "llama3 preset": lambda: Rope.from_preset("llama-3.1-8b"),
    "yarn preset with notes": lambda: Rope.from_preset("qwen2.5-7b-instruct"),
    "hf config dict": lambda: Rope.from_hf_config(
        {"hidden_size": 1024, "num_attention_heads": 8, "max_position_embeddings": 4096, "rope_theta": 1e6,
         "model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, seq_len=9000),
    "longrope": lambda: Rope(32, schedule="longrope", short_factor=np.linspace(1, 2, 16),
                             long_factor=[1.5] * 16, original_max_position=4096, max_position=131072, seq_len=5000),
    "yarn by hand": lambda: Rope(16, rotary_dim=8, pairing="interleaved", base=5e5, schedule="yarn", factor=4.0,
                                 original_max_position=64, truncate=False, mscale=0.7, mscale_all_dim=1.0,
                                 beta_fast=16.0),
    "monotone": lambda: Rope(64, schedule="monotone", max_length=4096, attention_factor=1.25),
}


def _same_rope(a, b, x):
    assert type(b) is Rope and b is not a and b._impl is not a._impl
    assert b.notes == a.notes and repr(b) == repr(a)
    assert np.array_equal(b.inv_freq, a.inv_freq) and b.attention_factor == a.attention_factor
    for kw in (dict(offset=1000), dict(positions=[[7, 2 ** 31 - 1]], angles="hf-float32")):
        assert np.array_equal(b.apply(x, **kw), a.apply(x, **kw))


@pytest.mark.parametrize("make", ROPES_TO_COPY.values(), ids=ROPES_TO_COPY.keys())
def test_rope_pickles_and_deep_copies(make, rng):
    import copy
    import pickle
    rope = make()
    x = rng.standard_normal((1, 2, 3, rope.head_dim)).astype(np.float32)
    rope.apply(x)  # a warm cache does not travel, and does not matter
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        _same_rope(rope, pickle.loads(pickle.dumps(rope, protocol=protocol)), x)
    _same_rope(rope, copy.deepcopy(rope), x)
    holder = copy.deepcopy({"rope": rope, "again": rope})
    assert holder["rope"] is holder["again"]


def test_module_holding_a_rope_survives_torch_save_and_deepcopy(tmp_path):
    import copy
    from rotary.torch import RotaryEmbedding
    module = torch.nn.Sequential(RotaryEmbedding(Rope.from_preset("qwen2.5-7b-instruct"), layout="bhsd"))
    q, k = torch.randn(1, 4, 3, 128), torch.randn(1, 2, 3, 128)
    positions = torch.tensor([[5, 4000, 9000]])
    want = module[0](q, k, positions)
    torch.save(module, tmp_path / "m.pt")
    for other in (torch.load(tmp_path / "m.pt", weights_only=False), copy.deepcopy(module)):
        got = other[0](q, k, positions)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert other[0].rope.notes == module[0].rope.notes and other[0].rope.notes


def test_rope_state_is_checked():
    impl_type = type(Rope(8)._impl)
    with pytest.raises(ValueError, match="Rope state must be the 7-tuple"):
        impl_type.__new__(impl_type).__setstate__((1, 2))
    with pytest.raises(TypeError, match="head_dim must be an int, got str"):
        impl_type.__new__(impl_type).__setstate__(("8", None, 1e4, "half", "default", None, {}))


# ---- torch integration ------------------------------------------------------------------------


def test_gradients_of_any_layout_and_second_derivatives():
    from rotary.torch import apply_rope
    rope = Rope(16, rotary_dim=12, pairing="interleaved", schedule="yarn", factor=4.0, original_max_position=64)
    q = torch.randn(1, 3, 2, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 1, 16, dtype=torch.float64, requires_grad=True)
    f = lambda a, b: apply_rope(rope, a, b, offset=5)  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (q, k))
    # Upstream gradients that are expanded (sum) or transposed reach backward as they are.
    out = apply_rope(rope, q, positions=torch.tensor([[1, 9, 70]], dtype=torch.int32))
    out.sum().backward()
    want = rope.apply(torch.ones_like(out), positions=[[1, 9, 70]], inverse=True)
    assert torch.equal(q.grad, want)
    q.grad = None
    weights = torch.randn(1, 2, 3, 16, dtype=torch.float64)
    (apply_rope(rope, q).transpose(1, 2) * weights).sum().backward()
    assert torch.equal(q.grad, rope.apply(weights.transpose(1, 2).contiguous(), inverse=True))
    with pytest.raises(TypeError, match="positions must hold integers or real numbers, got dtype torch.complex64"):
        apply_rope(rope, q, positions=torch.zeros(1, 3, dtype=torch.complex64))


def test_rotary_embedding_checks_its_arguments():
    from rotary.torch import RotaryEmbedding, apply_rope
    with pytest.raises(ValueError, match="layout='sbhd' must be 'bshd', 'bhsd' or 'thd'"):
        RotaryEmbedding(Rope(8), layout="sbhd")
    with pytest.raises(TypeError, match="rope must be a rotary.Rope, got str"):
        RotaryEmbedding("llama")
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got ndarray"):
        apply_rope(Rope(8), _Q)


# ---- config files: read by the library, with its limits ------------------------------------------


def test_config_paths_errors_name_the_path(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        Rope.from_hf_config(tmp_path)
    big = tmp_path / "config.json"
    big.write_bytes(b" " * ((16 << 20) + 1))
    with pytest.raises(ValueError, match="config.json"):
        Rope.from_hf_config(str(big))
    good = tmp_path / "good.json"
    good.write_text('{"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 5e5, "model_type": "llama"}')
    assert Rope.from_hf_config(good).inv_freq[1] == Rope(64, base=5e5).inv_freq[1]
    assert Rope.from_hf_config(os.fsencode(good)).head_dim == 64


def test_plot_helpers_leave_the_decimal_context_alone():
    import decimal
    from rotary import plot
    precision = decimal.getcontext().prec
    assert abs(plot.exact_angle_mod_2pi(710, 1.0) - (710 - 226 * np.pi)) < 1e-12
    assert decimal.getcontext().prec == precision


# An offset beside positions was dropped (the positions alone were used); the CLI and the C ABI
# refuse the pair. Every Python entry that takes both, on numpy and torch, eager and compiled.
OFFSET_WITH_POSITIONS = "offset=5 is for sequential positions only, but positions are given"


def _offset_with_positions_calls():
    from rotary.torch import apply_rope, apply_rope_
    rope, other = Rope(16), Rope(16, base=500.0)
    op_tail = ("bshd", False, "exact", None, None, None, None)
    compiled = torch.compile(lambda q, p: apply_rope(rope, q, positions=p, offset=5), fullgraph=True,
                             backend="aot_eager")
    return {
        "Rope.apply numpy": lambda q, p: rope.apply(q.numpy(), positions=p.numpy(), offset=5),
        "Rope.apply torch in place": lambda q, p: rope.apply(q, positions=p, offset=np.int64(5), inplace=True),
        "Rope.apply out=": lambda q, p: rope.apply(q, positions=p.tolist(), offset=5, out=torch.empty_like(q)),
        "Rope.rerotate": lambda q, p: rope.rerotate(q, 1, positions=p, offset=5, inplace=True),
        "Rope.switch": lambda q, p: rope.switch(q, other, positions=p, offset=5, inplace=True),
        "apply_rope": lambda q, p: apply_rope(rope, q, positions=p, offset=5),
        "apply_rope autograd": lambda q, p: apply_rope(rope, q.requires_grad_(), positions=p, offset=5),
        "apply_rope_": lambda q, p: apply_rope_(rope, q, positions=p, offset=5),
        "rotary::rope": lambda q, p: torch.ops.rotary.rope(q, None, rope._handle, p, 5, *op_tail),
        "rotary::rope_": lambda q, p: torch.ops.rotary.rope_(q, None, rope._handle, p, 5, *op_tail),
        "compiled apply_rope": compiled,
    }


OFFSET_CALLS = _offset_with_positions_calls()


@pytest.mark.parametrize("call", OFFSET_CALLS.values(), ids=OFFSET_CALLS.keys())
def test_offset_beside_positions_is_refused(call):
    q = torch.randn(1, 3, 2, 16)
    original = q.clone()
    with pytest.raises(ValueError, match="^" + OFFSET_WITH_POSITIONS):
        call(q, torch.tensor([4, 7, 9]))
    assert torch.equal(q.detach(), original)  # refused before any write


@pytest.mark.parametrize("kind", ["numpy", "torch", "apply_rope"])
def test_positions_and_offset_beside_per_token_cos_sin_are_refused(kind):
    # Per-token cos/sin [batch or 1, seq, width] give each token its row: positions and offset were
    # checked, then not read (the rotation ignored them). Per-position cos/sin [rows, width] are
    # indexed by them and keep taking both.
    from rotary.torch import apply_rope
    rope = Rope(16)
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 3, 2, 16)).astype(np.float32)
    angle = np.arange(8)[:, None] * rope.inv_freq
    table_cos, table_sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    token_cos, token_sin = table_cos[None, 4:7], table_sin[None, 4:7]  # tokens at positions 4, 5, 6
    if kind == "numpy":
        call = rope.apply
    else:
        q, table_cos, table_sin, token_cos, token_sin = (torch.from_numpy(t) for t in
                                                         (q, table_cos, table_sin, token_cos, token_sin))
        call = rope.apply if kind == "torch" else (lambda *a, **kw: apply_rope(rope, *a, **kw))
    want = call(q, offset=4, cos=table_cos, sin=table_sin)  # rows 4, 5, 6 of the per-position table
    np.testing.assert_array_equal(np.asarray(call(q, cos=token_cos, sin=token_sin)), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(call(q, positions=[4, 5, 6], cos=table_cos, sin=table_sin)),
                                  np.asarray(want))
    with pytest.raises(ValueError, match=r"^positions is not read with per-token cos/sin \[batch or 1, seq, width\]"):
        call(q, positions=[0, 1, 2], cos=token_cos, sin=token_sin)
    with pytest.raises(ValueError, match=r"^offset=4 is not read with per-token cos/sin"):
        call(q, offset=4, cos=token_cos, sin=token_sin)


def test_offset_zero_beside_positions_and_offset_alone_still_work():
    rope, q = Rope(16), np.random.default_rng(5).standard_normal((1, 3, 2, 16)).astype(np.float32)
    positions = np.array([5, 6, 7])
    np.testing.assert_array_equal(rope.apply(q, positions=positions, offset=0), rope.apply(q, offset=5))
    np.testing.assert_array_equal(rope.rerotate(q, 2, positions=positions, offset=0), rope.rerotate(q, 2, offset=5))
    with pytest.raises(TypeError, match="^offset must be an int, got str"):  # checked with positions too
        rope.rerotate(q, 2, positions=positions, offset="5")


@pytest.mark.parametrize("positions", [[], (), [[]], np.array([]), np.zeros(0, np.float32), torch.tensor([])],
                         ids=["list", "tuple", "nested", "float64 array", "float32 array", "float32 tensor"])
@pytest.mark.parametrize("angles", ["exact", "hf-float32"])
def test_an_empty_table_selection_is_an_empty_table(positions, angles):
    # numpy reads [] as float64 and torch.tensor([]) is float32: no value is fractional, the
    # selection is empty (as numpy's x[[]]), not a wrong kind.
    cos, sin = Rope(64).table(positions, angles=angles)
    for t in (cos, sin):
        assert t.shape == (0, 32) and t.dtype == np.float32
    with pytest.raises(TypeError, match="^positions must hold integers, got dtype float64"):
        Rope(64).table([0.0])  # a real value is still refused, whole or not
    with pytest.raises(TypeError, match="^positions must hold integers, got dtype bool"):
        Rope(64).table(np.zeros(0, bool))


if __name__ == "__main__" and sys.argv[1:] == ["stress"]:
    print("mismatches:", _stress_shared_rope(rounds=6))
