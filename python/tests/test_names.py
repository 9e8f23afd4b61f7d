"""One meaning per word: ``order=`` is the tensor order ("bshd", "bhsd", "thd"; formerly ``layout=``,
which is the channel layout elsewhere) and ``numerics=`` the angles' numerics ("exact",
"on_the_fly", "hf-float32"; formerly ``angles=``, which is the caller's cos/sin elsewhere).

Each new keyword gives the bits of the former one; the former one still works for a release, with
a DeprecationWarning naming the new spelling; both together are a TypeError naming both; a bad value
is named in the caller's spelling. And the package's modules import without a circle:
``rotary.torch`` does not load ``rotary.transformers``."""
import inspect
import os
import pathlib
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import rotary
from rotary import Rope
from rotary.torch import RotaryEmbedding, apply_rope, apply_rope_, qk_norm_rope, rope_store


def data(shape=(2, 5, 3, 32), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def quietly(fn, *args, **kwargs):
    """fn called with the former keywords, their warning checked and kept out of the way."""
    with pytest.warns(DeprecationWarning):
        return fn(*args, **kwargs)


def same(a, b):
    """Bit for bit: the same kind, dtype, shape and bytes (tuples element by element)."""
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        a, b = a.detach().numpy(), b.detach().numpy()
    return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---- order= (formerly layout=) ---------------------------------------------------------------------

@pytest.mark.parametrize("order", ["bshd", "bhsd"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_order_gives_the_bits_of_layout_in_apply(order, kind):
    rope = Rope(32, base=5e5, schedule="yarn", factor=4.0, original_max_position=64)
    q, k = data(), data(seed=1)[:, :, :1]  # [batch, seq, heads, head_dim]
    if order == "bhsd":
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)  # strided views, as transformers hands them
    if kind == "torch":
        q, k = torch.from_numpy(q), torch.from_numpy(k)
    positions = np.array([0, 9, 70, 4096, 2 ** 31 - 1])
    new = rope.apply(q, k, positions=positions, order=order)
    old = quietly(rope.apply, q, k, positions=positions, layout=order)
    assert same(new, old)


def test_order_gives_the_bits_of_layout_everywhere_it_is_taken():
    rope = Rope(32, base=1e6)
    q = torch.from_numpy(data((2, 3, 5, 32)))  # [batch, heads, seq, head_dim]
    k = torch.from_numpy(data((2, 1, 5, 32), seed=2))
    positions = torch.tensor([3, 1, 4, 1, 5])
    assert same(apply_rope(rope, q, k, positions=positions, order="bhsd"),
                quietly(apply_rope, rope, q, k, positions=positions, layout="bhsd"))
    assert same(apply_rope_(rope, q.clone(), k.clone(), positions=positions, order="bhsd"),
                quietly(apply_rope_, rope, q.clone(), k.clone(), positions=positions, layout="bhsd"))
    # through the operator (autograd records the call), gradients included
    a, b = q.clone().requires_grad_(), q.clone().requires_grad_()
    apply_rope(rope, a, positions=positions, order="bhsd").sum().backward()
    quietly(apply_rope, rope, b, positions=positions, layout="bhsd").sum().backward()
    assert torch.equal(a.grad, b.grad)
    rotated = rope.apply(k, positions=positions, order="bhsd")
    assert same(rope.rerotate(rotated, 7, positions=positions, order="bhsd"),
                quietly(rope.rerotate, rotated, 7, positions=positions, layout="bhsd"))
    longer = Rope(32, base=4e6)
    assert same(rope.switch(rotated, longer, positions=positions, order="bhsd"),
                quietly(rope.switch, rotated, longer, positions=positions, layout="bhsd"))
    new, old = RotaryEmbedding(rope, order="bhsd"), quietly(RotaryEmbedding, rope, layout="bhsd")
    assert new.order == old.order == "bhsd"
    assert same(new(q, k, positions), old(q, k, positions))
    assert same(RotaryEmbedding(rope, "bhsd")(q, k, positions), new(q, k, positions))  # positionally


def test_packed_order():
    rope = Rope(32)
    q = torch.from_numpy(data((7, 3, 32)))
    assert same(rope.apply(q, order="thd"), quietly(rope.apply, q, layout="thd"))
    assert same(rope.apply(q, order="thd", offset=9), rope.apply(q[None], offset=9)[0])


def test_layout_warns_naming_order():
    rope = Rope(16)
    q = data((1, 2, 1, 16))
    with pytest.warns(DeprecationWarning, match=r"layout= is deprecated \(it names the tensor order\): use order="):
        rope.apply(q, layout="bshd")
    with pytest.warns(DeprecationWarning, match="use order=") as record:
        apply_rope(rope, torch.from_numpy(q), layout="bshd")
    assert record[0].filename == __file__  # the caller's line
    for call in (lambda: rope.rerotate(q, 1, layout="bshd"), lambda: rope.switch(q, Rope(16, base=2e4), layout="bshd"),
                 lambda: apply_rope_(rope, torch.from_numpy(q.copy()), layout="bshd"),
                 lambda: RotaryEmbedding(rope, layout="bshd")):
        with pytest.warns(DeprecationWarning, match="use order="):
            call()
    module = RotaryEmbedding(rope, order="bhsd")
    with pytest.warns(DeprecationWarning, match="use .order"):
        assert module.layout == "bhsd"


def test_order_alone_does_not_warn():
    rope = Rope(16)
    q = data((1, 2, 1, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rope.apply(q, order="bshd", numerics="exact")
        rope.table([1, 2], numerics="exact")
        apply_rope(rope, torch.from_numpy(q), order="bshd", numerics="on_the_fly")
        RotaryEmbedding(rope, order="thd")


def test_order_and_layout_together_are_refused_naming_both():
    rope = Rope(16)
    q = data((1, 2, 1, 16))
    calls = {
        "Rope.apply": lambda: rope.apply(q, order="bshd", layout="bshd"),
        "Rope.rerotate": lambda: rope.rerotate(q, 1, order="bshd", layout="bhsd"),
        "Rope.switch": lambda: rope.switch(q, rope, order="bshd", layout="bshd"),
        "apply_rope": lambda: apply_rope(rope, torch.from_numpy(q), order="bshd", layout="bshd"),
        "apply_rope_": lambda: apply_rope_(rope, torch.from_numpy(q), order="bhsd", layout="bshd"),
        "RotaryEmbedding": lambda: RotaryEmbedding(rope, "bshd", layout="bshd"),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=r"got both order= and layout="):
            call()


@pytest.mark.parametrize("spelling", ["order", "layout"])
def test_a_bad_order_is_named_as_the_caller_spelled_it(spelling):
    rope = Rope(16)
    q, t = data((1, 2, 1, 16)), torch.from_numpy(data((1, 2, 1, 16)))
    calls = [lambda kw: rope.apply(q, **kw), lambda kw: rope.apply(t, **kw), lambda kw: rope.rerotate(q, 1, **kw),
             lambda kw: rope.switch(q, rope, **kw), lambda kw: apply_rope(rope, t, **kw),
             lambda kw: apply_rope(rope, t.clone().requires_grad_(), **kw),  # the operator's path
             lambda kw: apply_rope_(rope, t.clone(), **kw), lambda kw: RotaryEmbedding(rope, **kw)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for call in calls:
            with pytest.raises(ValueError, match=rf"^{spelling}='xyz' must be 'bshd', 'bhsd' or 'thd'"):
                call({spelling: "xyz"})
            with pytest.raises(TypeError, match=rf"^{spelling} must be a str, got int"):
                call({spelling: 3})
        with pytest.raises(ValueError, match=rf"^{spelling}='bhsd' is for 4-D tensors"):
            rope.apply(q[0], **{spelling: "bhsd"})


# ---- numerics= (formerly angles=) ------------------------------------------------------------------

@pytest.mark.parametrize("numerics", ["exact", "on_the_fly", "hf-float32", "table"])
def test_numerics_gives_the_bits_of_angles(numerics):
    rope = Rope(32, base=5e5)
    q, k = data(), data(seed=3)[:, :, :1]
    positions = np.array([0, 7, 1000, 123456, 2 ** 31 - 1])
    assert same(rope.apply(q, k, positions=positions, numerics=numerics),
                quietly(rope.apply, q, k, positions=positions, angles=numerics))
    tq, tk = torch.from_numpy(q), torch.from_numpy(k)
    assert same(apply_rope(rope, tq, tk, positions=positions, numerics=numerics),
                quietly(apply_rope, rope, tq, tk, positions=positions, angles=numerics))
    assert same(apply_rope_(rope, tq.clone(), tk.clone(), positions=positions, numerics=numerics),
                quietly(apply_rope_, rope, tq.clone(), tk.clone(), positions=positions, angles=numerics))
    if numerics in ("exact", "hf-float32"):
        assert same(rope.table(positions, numerics=numerics), quietly(rope.table, positions, angles=numerics))
        assert same(rope.table(positions, numerics), rope.table(positions, numerics=numerics))  # positionally
    if numerics == "hf-float32":
        assert not same(rope.apply(q, positions=positions, numerics=numerics), rope.apply(q, positions=positions))


def fused_case():
    rope = Rope(64, base=1e6)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(4, h, 64, generator=g) for h in (4, 2, 2))
    caches = [torch.zeros(2, 4, 2, 64) for _ in range(2)]
    slots = torch.tensor([0, 5, 2, 7])
    positions = torch.tensor([1, 4000, 70000, 2 ** 31 - 1])
    return rope, q, k, v, caches, slots, positions


@pytest.mark.parametrize("numerics", ["exact", "hf-float32"])
def test_numerics_gives_the_bits_of_angles_in_the_fused_operations(numerics):
    rope, q, k, v, caches, slots, positions = fused_case()
    results = []
    for keyword in ("numerics", "angles"):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            qs, k_cache, v_cache = q.clone(), caches[0].clone(), caches[1].clone()
            rope_store(rope, qs, k, v, k_cache, v_cache, slots, positions=positions, **{keyword: numerics})
            qn, kn = q.clone(), k.clone()
            qk_norm_rope(rope, qn, kn, None, None, eps=1e-6, positions=positions, **{keyword: numerics})
        assert [w.category for w in record] == ([] if keyword == "numerics" else [DeprecationWarning] * 2)
        results.append((qs, k_cache, v_cache, qn, kn))
    assert all(same(a, b) for a, b in zip(*results))


def test_angles_warns_naming_numerics_and_both_are_refused():
    rope, q, k, v, caches, slots, positions = fused_case()
    message = r"angles= is deprecated \(it names the angle numerics\): use numerics="
    with pytest.warns(DeprecationWarning, match=message):
        rope.apply(q.numpy(), angles="exact")
    with pytest.warns(DeprecationWarning, match=message):
        rope.table([3], angles="exact")
    with pytest.warns(DeprecationWarning, match=message):
        apply_rope(rope, q, angles="exact")
    with pytest.warns(DeprecationWarning, match=message):
        rope_store(rope, q.clone(), k, v, caches[0].clone(), caches[1].clone(), slots, angles="exact")
    with pytest.warns(DeprecationWarning, match=message):
        qk_norm_rope(rope, q.clone(), k.clone(), None, None, eps=1e-6, angles="exact")
    with pytest.warns(DeprecationWarning) as record:  # both former names: one warning each
        rope.apply(q.numpy(), layout="bshd", angles="exact")
    assert sorted(str(w.message).split("=")[0] for w in record) == ["angles", "layout"]
    calls = [lambda: rope.apply(q.numpy(), numerics="exact", angles="exact"),
             lambda: rope.table([3], "exact", angles="exact"),
             lambda: apply_rope(rope, q, numerics="exact", angles="on_the_fly"),
             lambda: rope_store(rope, q, k, v, caches[0], caches[1], slots, numerics="exact", angles="exact"),
             lambda: qk_norm_rope(rope, q, k, None, None, eps=1e-6, numerics="exact", angles="exact")]
    for call in calls:
        with pytest.raises(TypeError, match=r"got both numerics= and angles="):
            call()


@pytest.mark.parametrize("spelling", ["numerics", "angles"])
def test_a_bad_numerics_is_named_as_the_caller_spelled_it(spelling):
    rope, q, k, v, caches, slots, positions = fused_case()
    calls = {
        "'exact', 'on_the_fly' or 'hf-float32'": [
            lambda kw: rope.apply(q.numpy(), **kw), lambda kw: rope.apply(q, **kw),
            lambda kw: apply_rope(rope, q, **kw), lambda kw: apply_rope(rope, q.clone().requires_grad_(), **kw),
            lambda kw: apply_rope_(rope, q.clone(), **kw)],
        "'exact' or 'hf-float32'": [
            lambda kw: rope.table([1], **kw),
            lambda kw: rope_store(rope, q, k, v, caches[0], caches[1], slots, **kw),
            lambda kw: qk_norm_rope(rope, q, k, None, None, eps=1e-6, **kw)],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for allowed, group in calls.items():
            for call in group:
                with pytest.raises(ValueError, match=rf"^{spelling}='xyz' must be {allowed}$"):
                    call({spelling: "xyz"})
                with pytest.raises(TypeError, match=rf"^{spelling} must be a str, got float"):
                    call({spelling: 1.5})
        # the extension's other words about the numerics, in the caller's spelling too
        cos = np.ones((4, 32), np.float32)
        with pytest.raises(ValueError, match=rf"^{spelling}='hf-float32' cannot be combined with the caller's "
                                             rf"cos/sin \(leave {spelling}='exact', the default\)"):
            rope.apply(q.numpy(), cos=cos, sin=cos, positions=[0, 1, 2, 3], **{spelling: "hf-float32"})
        with pytest.raises(ValueError, match=rf"^{spelling}='hf-float32' needs whole positions"):
            rope.apply(q.numpy(), positions=[0.5, 1, 2, 3], **{spelling: "hf-float32"})
        with pytest.raises(ValueError, match=rf"^{spelling}='on_the_fly' computes apply's angles without a table"):
            rope.table([1], **{spelling: "on_the_fly"})


# ---- Signatures, pickles, torch.compile ------------------------------------------------------------

def test_signatures_list_the_new_names_and_the_former_ones_keyword_only():
    for fn, renamed in ((Rope.apply, {"order": "layout", "numerics": "angles"}), (Rope.table, {"numerics": "angles"}),
                        (Rope.rerotate, {"order": "layout"}), (Rope.switch, {"order": "layout"}),
                        (apply_rope, {"order": "layout", "numerics": "angles"}),
                        (apply_rope_, {"order": "layout", "numerics": "angles"}),
                        (RotaryEmbedding.__init__, {"order": "layout"}), (rope_store, {"numerics": "angles"}),
                        (qk_norm_rope, {"numerics": "angles"})):
        parameters = inspect.signature(fn).parameters
        for new, former in renamed.items():
            assert parameters[new].default == parameters[former].default, fn
            assert parameters[former].kind is inspect.Parameter.KEYWORD_ONLY, fn
            assert list(parameters)[-len(renamed):] == list(renamed.values()), fn
    # kv_layout (the KV cache's NHD/HND) and qk_norm_rope's order (norm then RoPE) keep their words
    assert "kv_layout" in inspect.signature(rope_store).parameters
    assert inspect.signature(qk_norm_rope).parameters["order"].default == "norm_rope"


def test_rope_pickles_as_rotary_rope():
    rope = Rope(32, base=5e5, schedule="linear", factor=2.0)
    assert Rope.__module__ == "rotary" and rotary.Rope is Rope
    data_ = pickle.dumps(rope)
    assert b"rotary" in data_ and b"rotary._rope" not in data_
    copy = pickle.loads(data_)
    assert type(copy) is Rope and np.array_equal(copy.inv_freq, rope.inv_freq) and copy._handle != rope._handle


def test_a_rotary_embedding_saved_with_layout_loads_with_order():
    rope = Rope(16)
    module = RotaryEmbedding(rope, order="bhsd")
    state = dict(module.__dict__)
    state["layout"] = state.pop("order")  # as a module pickled by the former release holds it
    loaded = RotaryEmbedding.__new__(RotaryEmbedding)
    loaded.__setstate__(state)
    q = torch.randn(1, 2, 3, 16)
    assert loaded.order == "bhsd" and same(loaded(q, q), module(q, q))
    assert pickle.loads(pickle.dumps(module)).order == "bhsd"


def test_order_and_numerics_compile_without_a_graph_break():
    rope = Rope(32, base=1e6)
    q, k = torch.randn(1, 2, 5, 32), torch.randn(1, 1, 5, 32)
    positions = torch.tensor([0, 3, 9, 4000, 2 ** 31 - 1])

    def rotate(q, k, positions):
        return apply_rope(rope, q * 1, k, positions=positions, order="bhsd", numerics="hf-float32")

    compiled = torch.compile(rotate, fullgraph=True, backend="aot_eager")
    assert same(compiled(q, k, positions), rotate(q, k, positions))
    assert same(rotate(q, k, positions), quietly(apply_rope, rope, q, k, positions=positions, layout="bhsd",
                                                 angles="hf-float32"))


# ---- No import circle between rotary.torch and rotary.transformers ---------------------------------

def run_python(code):
    """stdout's words of a fresh Python importing the same rotary as this process."""
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(rotary.__file__).parents[1]))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("first, second", [("rotary.transformers", "rotary.torch"),
                                           ("rotary.torch", "rotary.transformers")])
def test_torch_and_transformers_import_in_either_order(first, second):
    code = f"""if True:
        import sys, importlib
        a = importlib.import_module("{first}")
        b = importlib.import_module("{second}")
        import rotary.torch, rotary.transformers
        assert rotary.torch.apply_rotary_pos_emb is rotary.transformers.apply_rotary_pos_emb
        print("ok")
    """
    assert run_python(code) == ["ok"]


def test_rotary_torch_does_not_import_rotary_transformers():
    # rotary.transformers builds on rotary.torch (its operators), so importing it imports rotary.torch;
    # rotary.torch imports neither rotary.transformers nor transformers.
    code = """if True:
        import sys
        import rotary.torch
        rotary.torch.apply_rotary_pos_emb  # no lazy import behind it either
        print("rotary.transformers" in sys.modules, "transformers" in sys.modules)
    """
    assert run_python(code) == ["False", "False"]


def test_the_package_root_imports_neither():
    code = """if True:
        import sys
        import rotary
        print(rotary.Rope.__module__, *(m in sys.modules for m in ("rotary._rope", "rotary.torch",
                                                                   "rotary.transformers")))
    """
    assert run_python(code) == ["rotary", "True", "False", "False"]
