"""Context parallelism (rotary.torch.distributed): the zigzag and contiguous splits against the rule
written out independently, and real torch.distributed groups (gloo, CPU) of 2 and 4 processes in
which each rank rotates its shard and attends over the gathered keys, compared with the same work
done here in one process; every bad input with its message.

This file is also the launcher: ``python test_distributed.py --groups 2,4 DIR`` runs a group of 2
processes, then one of 4 (forked from it), and rank 0 of each writes what its group gathered to
``DIR/results-{world}.pt``; ``--rank RANK WORLD DIR`` runs one rank (where there is no fork).
"""
import inspect
import os
import signal
import subprocess
import sys
import traceback
import zlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import rotary  # noqa: E402
import rotary.torch  # noqa: E402
from rotary.torch import distributed as cp  # noqa: E402


def _gloo_available() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_gloo_available()


needs_gloo = pytest.mark.skipif(not _gloo_available(),
                                reason="torch.distributed with the gloo backend is not in this torch build")

RUN_TIMEOUT_S = 180  # one group from start to exit: 4 processes importing torch on 2 busy cores
COLLECTIVE_TIMEOUT_S = 60  # gloo gives up on a collective a peer never joins (a crashed rank)
ATTENTION_TOLERANCE = 1e-5  # float32, values ~1: a shard's softmax sums its keys in another order
BATCH, SEQ, HEADS, KV_HEADS = 2, 48, 3, 1  # 48: 2*cp_size chunks for cp_size 2 and 4


# ---- The rule, stated independently of the module ------------------------------------------------

def expected_positions(seq_len, cp_size, rank, scheme):
    """Megatron-LM's and TransformerEngine's statement: 2*cp_size equal chunks, rank r takes chunks r
    and 2*cp_size-1-r (zigzag); or the r-th of cp_size blocks (contiguous)."""
    if scheme == "contiguous":
        n = seq_len // cp_size
        return list(range(rank * n, (rank + 1) * n))
    n = seq_len // (2 * cp_size)
    return [p for p in range(seq_len) if p // n in (rank, 2 * cp_size - 1 - rank)]


# ---- The cases (built alike by the workers and by the single-process reference) -----------------

def _llama():
    return rotary.Rope(64, base=500000.0)


def _interleaved():
    return rotary.Rope(64, base=10000.0, pairing="interleaved")


def _yarn():
    rope = rotary.Rope(64, base=10000.0, schedule="yarn", factor=4.0, original_max_position=4096)
    assert rope.attention_factor > 1.1  # 0.1 ln 4 + 1: the shards must carry the factor too
    return rope


def _mrope():
    rope = rotary.Rope(128, base=1e6, stream_layout="sections", sections=[16, 24, 24])  # Qwen2-VL
    assert rope.streams == 3
    return rope


@dataclass(frozen=True)
class RotationCase:
    name: str
    rope: Callable[[], "rotary.Rope"]
    dtype: str
    scheme: str = "zigzag"
    layout: str = "bshd"
    positions: str = "default"  # default 0..seq-1 | "batch": [batch, seq] ids | "mrope": [3, batch, seq]

    @property
    def seq_dim(self):
        return 2 if self.layout == "bhsd" else 1


ROTATION_CASES = [
    RotationCase("half-f32", _llama, "float32"),
    RotationCase("half-bf16", _llama, "bfloat16"),
    RotationCase("interleaved-f32", _interleaved, "float32"),
    RotationCase("interleaved-bf16", _interleaved, "bfloat16"),
    RotationCase("half-f32-contiguous", _llama, "float32", scheme="contiguous"),
    RotationCase("yarn-f32-bhsd-far", _yarn, "float32", layout="bhsd", positions="batch"),
    RotationCase("yarn-bf16-far", _yarn, "bfloat16", positions="batch"),
    RotationCase("mrope-f32", _mrope, "float32", positions="mrope"),
    RotationCase("mrope-bf16-contiguous", _mrope, "bfloat16", scheme="contiguous", positions="mrope"),
]


def _generator(name):
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def rotation_inputs(case):
    """Whole-sequence q, k and positions (None: the default 0..seq-1)."""
    rope, g = case.rope(), _generator(case.name)
    dtype = getattr(torch, case.dtype)
    shapes = [(BATCH, SEQ, h, rope.head_dim) for h in (HEADS, KV_HEADS)]
    if case.layout == "bhsd":
        shapes = [(b, h, s, d) for b, s, h, d in shapes]
    q, k = (torch.randn(shape, generator=g).mul(4).to(dtype) for shape in shapes)
    s = torch.arange(SEQ)
    if case.positions == "batch":  # near the top of the range, a different start per batch row
        positions = torch.stack([(2**31 - 1) - 5 * s - b for b in range(BATCH)])
    elif case.positions == "mrope":  # three different streams, as an image block gives them
        positions = torch.stack([torch.stack([s + b, 11 + (3 * s) % 17, 5 + (7 * s) % 23]) for b in range(BATCH)], 1)
    else:
        positions = None
    return rope, q, k, positions


def rotate_whole(case):
    rope, q, k, positions = rotation_inputs(case)
    return rope.apply(q, k, positions=positions, layout=case.layout)


@dataclass(frozen=True)
class AttentionCase:
    name: str
    scheme: str
    gather: str  # "rank-order": torch.distributed.all_gather, mask from gathered positions | "in-order": cp.all_gather


ATTENTION_CASES = [
    AttentionCase("zigzag-rank-order", "zigzag", "rank-order"),
    AttentionCase("zigzag-in-order", "zigzag", "in-order"),
    AttentionCase("contiguous-in-order", "contiguous", "in-order"),
]
SUBGROUP_CASE = AttentionCase("zigzag-subgroups", "zigzag", "in-order")  # cp_size 2 twice in a world of 4
SUBGROUP_SIZE = 2
GRADIENT_BACKWARDS = ("all-reduce", "reduce-scatter")  # all_gather's backward: gloo's branch, NCCL's


def attention_inputs(name):
    g = _generator(name)
    return tuple(torch.randn(BATCH, SEQ, HEADS, 64, generator=g) for _ in range(3))


def attention(q, k, v, mask=None):
    """bshd in, bshd out; mask [q_len, k_len], True where a query sees a key (else causal)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    return out.transpose(1, 2)


def gradient_weight():
    """Small integers: sums of their multiples are exact in any order."""
    return torch.randint(-8, 9, (BATCH, SEQ, KV_HEADS, 64), generator=_generator("gradient")).float()


# ---- The worker: one rank of the group --------------------------------------------------------------

def _gather(t, group=None):
    """Every rank's t (same shape), in rank order, through the process group."""
    import torch.distributed as dist
    t = t.contiguous()
    pieces = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, t, group=group)
    return pieces


def _worker_rotation(case, cp_size, cp_rank):
    rope, q, k, positions = rotation_inputs(case)
    q, k = (cp.shard(t, cp_size, cp_rank, case.scheme, dim=case.seq_dim) for t in (q, k))
    if positions is None:
        positions = cp.shard_positions(SEQ, cp_size, cp_rank, case.scheme)
    else:
        positions = cp.shard(positions, cp_size, cp_rank, case.scheme, dim=-1)
    q, k = rope.apply(q, k, positions=positions, layout=case.layout)
    return {"q": _gather(q), "k": _gather(k)}


def _worker_attention(case, cp_size, cp_rank, group=None):
    q, k, v = (cp.shard(t, cp_size, cp_rank, case.scheme, dim=1) for t in attention_inputs(case.name))
    positions = cp.shard_positions(SEQ, cp_size, cp_rank, case.scheme)
    q, k = _llama().apply(q, k, positions=positions)
    if case.gather == "rank-order":  # keys as they arrive: mask by each one's global position
        keys, values = torch.cat(_gather(k, group), 1), torch.cat(_gather(v, group), 1)
        key_positions = torch.cat(_gather(positions, group))
    else:
        keys = cp.all_gather(k, dim=1, scheme=case.scheme, group=group)
        values = cp.all_gather(v, dim=1, scheme=case.scheme, group=group)
        key_positions = torch.arange(SEQ)
    out = attention(q, keys, values, key_positions[None, :] <= positions[:, None])
    return {"out": _gather(out), "keys": _gather(keys)}


def _worker_gradient(cp_size, cp_rank, backward):
    # shard -> all_gather -> loss, the keys' path in training; rank r weighs the keys by r+1. (The
    # rotation's own gradient is test_torch_ops'; through rotary's operator it would cost each process
    # the import of torch._dynamo, seconds.) backward "reduce-scatter": the NCCL branch, run on gloo.
    saved = cp._REDUCE_SCATTER_BACKENDS
    cp._REDUCE_SCATTER_BACKENDS = ("gloo",) if backward == "reduce-scatter" else ()
    try:
        k = cp.shard(gradient_weight().neg(), cp_size, cp_rank, dim=1).requires_grad_()
        keys = cp.all_gather(k, dim=1)
        (keys * gradient_weight() * (cp_rank + 1)).sum().backward()
    except (RuntimeError, NotImplementedError) as e:  # raised alike on every rank, before any exchange
        if backward == "reduce-scatter" and "reduce_scatter" in str(e).lower():
            return {"unsupported": str(e)[:200]}
        raise
    finally:
        cp._REDUCE_SCATTER_BACKENDS = saved
    return {"grad": _gather(k.grad)}


def _worker_main(rank, world, tmp):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=(tmp / f"rendezvous-{world}").as_uri(), rank=rank,
                            world_size=world, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        results = {case.name: _worker_rotation(case, world, rank) for case in ROTATION_CASES}
        results.update({case.name: _worker_attention(case, world, rank) for case in ATTENTION_CASES})
        results.update({f"gradient-{b}": _worker_gradient(world, rank, b) for b in GRADIENT_BACKWARDS})
        if world % SUBGROUP_SIZE == 0 and world > SUBGROUP_SIZE:  # CP groups inside a data-parallel world
            groups = [dist.new_group(list(range(g, g + SUBGROUP_SIZE))) for g in range(0, world, SUBGROUP_SIZE)]
            results["subgroups"] = _worker_attention(SUBGROUP_CASE, SUBGROUP_SIZE, rank % SUBGROUP_SIZE,
                                                     groups[rank // SUBGROUP_SIZE])
        if rank == 0:
            torch.save(results, tmp / f"results-{world}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


# ---- Running the groups ------------------------------------------------------------------------------

WORLDS = (2, 4)


def _start_rank(rank, world, tmp, log):
    """One rank, forked from the launcher (torch is imported once, not once per process: that import
    is most of a rank's cost); where there is no fork, a new interpreter. Returns its wait()."""
    if not hasattr(os, "fork"):
        proc = subprocess.Popen([sys.executable, __file__, "--rank", str(rank), str(world), str(tmp)], stdout=log,
                                stderr=subprocess.STDOUT)
        return proc.wait
    pid = os.fork()
    if pid == 0:  # the rank: runs, then leaves without the launcher's cleanup
        code = 1
        try:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            code = _worker_main(rank, world, tmp)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return lambda: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _run_groups(worlds, tmp):
    """The launcher: each group in turn, its ranks' output in cp{world}.log; 0 when all exited 0.
    Nothing runs a thread pool here before the forks (torch and rotary only imported)."""
    import torch.distributed  # noqa: F401  (imported once, shared by the forked ranks)
    failed = False
    for world in worlds:
        with open(tmp / f"cp{world}.log", "wb") as log:
            codes = [wait() for wait in [_start_rank(r, world, tmp, log) for r in range(world)]]
        print(f"cp_size {world}: exit codes {codes}", flush=True)
        failed = failed or any(codes)
    return int(failed)


def _launch(worlds, tmp):
    """Runs the groups in a launcher process of its own session; {world: what rank 0 saved, or the
    AssertionError saying why not}. Never hangs: past RUN_TIMEOUT_S the session is killed."""
    package_parent = str(Path(rotary.__file__).resolve().parent.parent)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, __file__, "--groups", ",".join(map(str, worlds)), str(tmp)]
    with open(tmp / "launcher.log", "wb") as log:
        launcher = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=hasattr(os, "setsid"))
        try:
            launcher.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            if hasattr(os, "killpg"):
                os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and the ranks it started
            else:
                launcher.kill()
            launcher.wait()
    results = {}
    for world in worlds:
        path = tmp / f"results-{world}.pt"
        if path.exists():
            results[world] = torch.load(path)
            continue
        rank_log = tmp / f"cp{world}.log"
        tail = rank_log.read_text(errors="replace")[-4000:] if rank_log.exists() else "(no log)"
        results[world] = AssertionError(
            f"the {world}-process group saved no results (launcher exit {launcher.returncode}; killed after "
            f"{RUN_TIMEOUT_S} s if negative):\n{(tmp / 'launcher.log').read_text(errors='replace')}\n{tail}")
    return results


@pytest.fixture(scope="module")
def group_results(tmp_path_factory):
    """group_results(world): what the group of `world` processes gathered (all groups run once)."""
    runs = {}

    def get(world):
        if not runs:
            runs.update(_launch(WORLDS, tmp_path_factory.mktemp("cp")))
        if isinstance(runs[world], AssertionError):
            raise runs[world]
        return runs[world]

    return get


def _rows(t, dim, world, rank, scheme):
    return t.index_select(dim, torch.tensor(expected_positions(t.shape[dim], world, rank, scheme)))


AXES = {"bshd": ("batch", "token", "head", "channel"), "bhsd": ("batch", "head", "token", "channel")}


def assert_bitwise(got, want, what, layout="bshd"):
    """Equal bits (so -0.0 is not 0.0); a failure names the first differing batch, token (of the
    shard), head and channel, and the worst difference."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype)
    bits = torch.int16 if got.element_size() == 2 else torch.int32
    differ = got.view(bits) != want.view(bits)
    if differ.any():
        first = tuple(int(i) for i in differ.nonzero()[0])
        where = ", ".join(f"{axis} {i}" for axis, i in zip(AXES[layout], first))
        worst = (got.double() - want.double()).abs().max().item()
        raise AssertionError(f"{what}: {int(differ.sum())} values differ in their bits, the first at {where} "
                             f"(got {got[first].item()!r}, want {want[first].item()!r}); worst |diff| {worst:.3g}")


# ---- The groups: rotation, attention, gradients --------------------------------------------------------

@needs_gloo
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", ROTATION_CASES, ids=lambda c: c.name)
def test_each_rank_rotates_its_shard_bit_for_bit(group_results, world, case):
    gathered = group_results(world)[case.name]
    q_whole, k_whole = rotate_whole(case)
    for rank in range(world):
        for name, whole in (("q", q_whole), ("k", k_whole)):
            want = _rows(whole, case.seq_dim, world, rank, case.scheme)
            assert_bitwise(gathered[name][rank], want, f"{case.name}, cp_size={world}, rank {rank}, {name}",
                           case.layout)


def _check_attention(gathered, case, world, cp_size):
    """World rank r ran cp_rank r % cp_size of a CP group of cp_size ranks."""
    q, k, v = attention_inputs(case.name)
    q, k = _llama().apply(q, k)
    whole = attention(q, k, v)  # causal by index: the single-process attention
    if case.gather == "rank-order":
        k = torch.cat([_rows(k, 1, cp_size, r, case.scheme) for r in range(cp_size)], 1)
    for rank in range(world):
        cp_rank = rank % cp_size
        assert_bitwise(gathered["keys"][rank], k, f"{case.name}, rank {rank} of {world}: the gathered keys")
        torch.testing.assert_close(gathered["out"][rank], _rows(whole, 1, cp_size, cp_rank, case.scheme),
                                   rtol=ATTENTION_TOLERANCE, atol=ATTENTION_TOLERANCE,
                                   msg=lambda m: f"{case.name}, rank {rank} of {world} (cp_size {cp_size}): {m}")


@needs_gloo
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.name)
def test_attention_over_gathered_keys_equals_single_process(group_results, world, case):
    _check_attention(group_results(world)[case.name], case, world, world)


@needs_gloo
def test_cp_groups_inside_a_larger_world(group_results):
    # Ranks {0, 1} and {2, 3} are two CP groups of 2 (two data-parallel replicas): all_gather(group=...).
    _check_attention(group_results(4)["subgroups"], SUBGROUP_CASE, 4, SUBGROUP_SIZE)


@needs_gloo
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("backward", GRADIENT_BACKWARDS)
def test_gradient_of_gathered_keys_sums_over_ranks(group_results, world, backward):
    # d/dk of sum_r (r+1) * <all_gather(k), w> is (sum_r (r+1)) * w's rows: exact in small integers.
    result = group_results(world)[f"gradient-{backward}"]
    if "unsupported" in result:
        pytest.skip(f"this torch's gloo has no reduce_scatter_tensor: {result['unsupported']}")
    grads = result["grad"]
    scale = world * (world + 1) // 2
    for rank in range(world):
        want = _rows(gradient_weight(), 1, world, rank, "zigzag") * scale
        assert_bitwise(grads[rank], want, f"cp_size={world}, rank {rank}: gradient of k")


# ---- The split, in one process ---------------------------------------------------------------------------

def test_zigzag_written_out():
    # cp_size 2, seq_len 8: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
    assert cp.shard_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp.shard_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert [cp.shard_positions(8, 4, r).tolist() for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert cp.shard_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert [cp.shard_positions(8, 2, r, "contiguous").tolist() for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # TransformerEngine's test of thd_get_partitioned_indices (two sequences of 8, cp_size 2), per sequence:
    two = torch.arange(16).view(2, 8)
    assert cp.shard(two, 2, 0, dim=1).flatten().tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert cp.shard(two, 2, 1, dim=1).flatten().tolist() == [2, 3, 4, 5, 10, 11, 12, 13]


@pytest.mark.parametrize("scheme", ["zigzag", "contiguous"])
@pytest.mark.parametrize("cp_size,seq_len", [(1, 6), (2, 4), (2, 12), (3, 18), (4, 8), (4, 40), (8, 64), (5, 0)])
def test_shards_partition_the_sequence(scheme, cp_size, seq_len):
    shards = [cp.shard_positions(seq_len, cp_size, r, scheme) for r in range(cp_size)]
    for r, s in enumerate(shards):
        assert s.dtype == torch.int64 and s.shape == (seq_len // cp_size,)
        assert s.tolist() == expected_positions(seq_len, cp_size, r, scheme)
    assert sorted(torch.cat(shards).tolist()) == list(range(seq_len))
    if scheme == "zigzag":  # the point of zigzag: every rank has the same causal work, sum of (p + 1)
        assert len({int((s + 1).sum()) for s in shards}) <= 1


@pytest.mark.parametrize("scheme", ["zigzag", "contiguous"])
def test_shard_slices_any_tensor_as_the_positions(scheme):
    world = 4
    ids = torch.randint(0, 1000, (3, 2, 24))  # M-RoPE position ids: every stream alike
    q = torch.randn(2, 3, 24, 8)  # bhsd
    for r in range(world):
        index = cp.shard_positions(24, world, r, scheme)
        assert torch.equal(cp.shard(ids, world, r, scheme, dim=-1), ids[..., index])
        assert torch.equal(cp.shard(q, world, r, scheme, dim=-2), q[:, :, index])
        assert np.array_equal(cp.shard(ids.numpy(), world, r, scheme, dim=2), ids.numpy()[..., index.numpy()])
    parts = [cp.shard(q, world, r, scheme, dim=2) for r in range(world)]
    assert torch.equal(cp.unshard(torch.cat(parts, 2), world, scheme, dim=2), q)
    arrays = [cp.shard(ids.numpy(), world, r, scheme, dim=-1) for r in range(world)]
    assert np.array_equal(cp.unshard(np.concatenate(arrays, -1), world, scheme, dim=-1), ids.numpy())


def test_unshard_costs_one_copy_whatever_cp_size():
    # unshard looked up each chunk's slot in a list (cp_size^2 steps): 2^16 ranks took hours, and an
    # empty sequence (every cp_size divides 0) with a huge cp_size never returned. The input is
    # built here from Megatron-LM's rule (rank r holds chunks r and 2*cp_size-1-r), not by shard.
    import signal

    def too_slow(*_):
        raise TimeoutError("unshard took more than 20 s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        cp_size, chunk = 1 << 16, 2
        chunks = np.arange(2 * cp_size * chunk).reshape(2 * cp_size, chunk)
        held = np.stack([np.arange(cp_size), 2 * cp_size - 1 - np.arange(cp_size)], 1).reshape(-1)
        shards = chunks[held].reshape(-1)
        assert np.array_equal(cp.unshard(shards, cp_size, dim=0), np.arange(chunks.size))
        whole = cp.unshard(torch.from_numpy(shards).view(1, -1, 1).double().requires_grad_(), cp_size, dim=1)
        assert torch.equal(whole.detach().view(-1), torch.arange(chunks.size, dtype=torch.float64))
        assert cp.unshard(torch.empty(2, 0, 3), 1 << 30, dim=1).shape == (2, 0, 3)
        assert cp.unshard(np.empty((0, 4)), 1 << 31, "contiguous", dim=0).shape == (0, 4)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("call", [
    lambda n, scheme, length: cp.shard_positions(length, n, 0, scheme),
    lambda n, scheme, length: cp.shard(torch.empty(3, length), n, 0, scheme, dim=1),
    lambda n, scheme, length: cp.unshard(np.empty(length), n, scheme, dim=0),
], ids=["shard_positions", "shard", "unshard"])
def test_cp_size_is_bounded_by_the_chunks_a_sequence_can_hold(call):
    # 2 * cp_size zigzag chunks (cp_size contiguous ones) of a sequence of at most 2^31 positions.
    # The refusals come first, on a sequence of 2 tokens: before the bound, a cp_size this large was
    # refused only for not dividing the length, and accepted for an empty sequence.
    with pytest.raises(ValueError, match=r"^cp_size=1073741825 must be <= 2\^30: scheme 'zigzag' cuts a sequence "
                                         r"into 2\*cp_size chunks, and a sequence has at most 2\^31 positions"):
        call((1 << 30) + 1, "zigzag", 2)
    with pytest.raises(ValueError, match=r"^cp_size=2147483649 must be <= 2\^31: scheme 'contiguous'"):
        call((1 << 31) + 1, "contiguous", 2)
    with pytest.raises(ValueError, match=r"^cp_size=18446744073709551616 must be <= 2\^30"):
        call(1 << 64, "zigzag", 2)
    with pytest.raises(ValueError, match=r"^cp_size=0 must be >= 1"):
        call(0, "zigzag", 2)
    call(1 << 30, "zigzag", 0)  # the largest groups, on the one sequence they can split: at once
    call(1 << 31, "contiguous", 0)


def test_shard_copies_and_carries_gradients():
    x = torch.randn(2, 8, requires_grad=True)
    part = cp.shard(x, 2, 1, dim=1)
    part.sum().backward()
    assert x.grad.tolist() == [[0, 0, 1, 1, 1, 1, 0, 0]] * 2
    a = np.arange(8)
    cp.shard(a, 2, 0, "contiguous", dim=0)[:] = -1  # a copy: the input is never written
    assert a.tolist() == list(range(8))


def test_reached_as_rotary_torch_distributed():
    import rotary._distributed
    assert rotary.torch.distributed is rotary._distributed is cp
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        rotary.torch.nothing


def test_public_functions_document_numpy_sections():
    for name in cp.__all__:
        obj = getattr(cp, name)
        if inspect.isfunction(obj):
            doc = inspect.getdoc(obj)
            for section in ("Parameters\n----------", "Returns\n-------", "Raises\n------"):
                assert section in doc, f"{name}: no {section.splitlines()[0]} section"


# ---- Bad input -----------------------------------------------------------------------------------------

X = torch.zeros(2, 10, 3)

BAD = [
    (lambda: cp.shard_positions(8, 2, 2), ValueError, r"cp_rank=2 must be in \[0, cp_size=2\)"),
    (lambda: cp.shard_positions(8, 2, -1), ValueError, r"cp_rank=-1 must be in \[0, cp_size=2\)"),
    (lambda: cp.shard_positions(8, 0, 0), ValueError, r"cp_size=0 must be >= 1"),
    (lambda: cp.shard_positions(8, -3, 0), ValueError, r"cp_size=-3 must be >= 1"),
    (lambda: cp.shard_positions(10, 2, 0), ValueError,
     r"seq_len=10 is not divisible by 2\*cp_size=4: scheme 'zigzag' splits"),
    (lambda: cp.shard_positions(12, 8, 0), ValueError, r"seq_len=12 is not divisible by 2\*cp_size=16"),
    (lambda: cp.shard_positions(9, 2, 0, "contiguous"), ValueError, r"seq_len=9 is not divisible by cp_size=2"),
    (lambda: cp.shard_positions(-8, 2, 0), ValueError, r"seq_len=-8 must be in \[0, 2\^31\]"),
    (lambda: cp.shard_positions(2**32, 2, 0), ValueError, r"seq_len=4294967296 must be in \[0, 2\^31\]"),
    (lambda: cp.shard_positions(8, 2, 0, "ring"), ValueError, r"scheme='ring' must be 'zigzag' or 'contiguous'"),
    (lambda: cp.shard_positions(8, 2, 0, "x" * 500), ValueError, r"scheme='x{90,}\.\.\. \(502 bytes\) must be"),
    (lambda: cp.shard_positions(8, 2, 0, None), TypeError, r"scheme must be a str, got NoneType"),
    (lambda: cp.shard_positions(True, 2, 0), TypeError, r"seq_len must be an int, got bool"),
    (lambda: cp.shard_positions(8, True, 0), TypeError, r"cp_size must be an int, got bool"),
    (lambda: cp.shard_positions(8, 2, np.True_), TypeError, r"cp_rank must be an int, got bool"),
    (lambda: cp.shard_positions(8.0, 2, 0), TypeError, r"seq_len must be an int, got float"),
    (lambda: cp.shard_positions(8, 2, "0"), TypeError, r"cp_rank must be an int, got str"),
    (lambda: cp.shard_positions(8, 2, torch.tensor(0)), TypeError, r"cp_rank must be an int, got Tensor"),
    (lambda: cp.shard([0, 1, 2, 3], 2, 0, dim=0), TypeError,
     r"x must be a torch.Tensor or numpy.ndarray, got list"),
    (lambda: cp.shard(X, 2, 0, dim=3), ValueError, r"dim=3 is out of range for x of shape \(2, 10, 3\)"),
    (lambda: cp.shard(X, 2, 0, dim=-4), ValueError, r"dim=-4 is out of range"),
    (lambda: cp.shard(torch.tensor(1.0), 1, 0, dim=0), ValueError, r"dim=0 is out of range for x of shape \(\)"),
    (lambda: cp.shard(X, 2, 0, dim=True), TypeError, r"dim must be an int, got bool"),
    (lambda: cp.shard(X, 2, 0, dim=1), ValueError, r"x.shape\[1\]=10 is not divisible by 2\*cp_size=4"),
    (lambda: cp.shard(X, 2, 0, "contiguous", dim=-1), ValueError, r"x.shape\[2\]=3 is not divisible"),
    (lambda: cp.shard(X, 2, 5, "contiguous", dim=1), ValueError, r"cp_rank=5 must be in \[0, cp_size=2\)"),
    (lambda: cp.shard(X, 2, 0, "Zigzag", dim=1), ValueError, r"scheme='Zigzag' must be"),
    (lambda: cp.unshard(X, 2, dim=1), ValueError, r"x.shape\[1\]=10 is not divisible by 2\*cp_size=4"),
    (lambda: cp.unshard(X, 0, dim=1), ValueError, r"cp_size=0 must be >= 1"),
    (lambda: cp.unshard(X, 2.5, dim=1), TypeError, r"cp_size must be an int, got float"),
    (lambda: cp.unshard((1, 2), 2, dim=0), TypeError, r"x must be a torch.Tensor or numpy.ndarray, got tuple"),
    (lambda: cp.all_gather(np.zeros(4), dim=0), TypeError, r"x must be a torch.Tensor, got ndarray"),
    (lambda: cp.all_gather(X, dim=2), ValueError, r"x.shape\[2\]=3 is odd: a 'zigzag' shard holds two"),
    (lambda: cp.all_gather(X, dim=1, scheme="ring"), ValueError, r"scheme='ring' must be"),
    (lambda: cp.all_gather(X, dim=7), ValueError, r"dim=7 is out of range"),
]


@pytest.mark.parametrize("call,kind,message", BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_input_is_refused_with_its_value(call, kind, message):
    with pytest.raises(kind, match=message):
        call()


if __name__ == "__main__" and sys.argv[1:2] == ["--groups"]:
    sys.exit(_run_groups([int(w) for w in sys.argv[2].split(",")], Path(sys.argv[3])))
if __name__ == "__main__" and sys.argv[1:2] == ["--rank"]:
    sys.exit(_worker_main(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])))


def test_documented_module_paths_import_in_a_fresh_interpreter():
    # `from rotary.torch.distributed import ...` is how Python users write it; rotary.torch used to
    # be a module with `distributed` as a lazy attribute, so this import failed ("'rotary.torch' is
    # not a package"). Each statement runs in its own interpreter: nothing imported before it.
    statements = ["from rotary.torch.distributed import shard_positions, shard, unshard, all_gather",
                  "import rotary.torch.distributed as cp; cp.shard_positions(8, 2, 0)",
                  "from rotary.torch import distributed; distributed.unshard",
                  "import rotary.torch; rotary.torch.distributed.shard_positions(8, 2, 1)"]
    for statement in statements:
        done = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(Path(rotary.__file__).parents[1])))
        assert done.returncode == 0, f"{statement!r}: {done.stderr.strip().splitlines()[-1:]}"
