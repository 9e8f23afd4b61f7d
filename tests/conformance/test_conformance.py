"""Conformance against transformers itself.

For every published config in configs/ (sources in configs/SOURCES.md) and every RoPE layer type it
has, transformers' own rotary embedding module is built from the same config and its numbers are
compared with rotary's ``Rope.from_hf_config``: the rotated width, the layer types, inv_freq (and
``inv_freq_hf32``, transformers' own float32 values, bit for bit), the attention factor, cos/sin at
positions up to 2^31 - 1 (exact and ``angles="hf-float32"``), the values
after transformers' dynamic update (dynamic NTK, LongRoPE) at long sequence lengths, M-RoPE's
streams, and the pairing (the model's own ``apply_rotary_pos_emb`` against ``Rope.apply``). Nothing
here is a number written down: every expectation is computed by transformers at test time, so a
release that changes a rule fails this suite.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import json
import math
import contextlib
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import rotary  # noqa: E402
from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.configuration_auto import model_type_to_module_name  # noqa: E402

CONFIGS = Path(__file__).parent / "configs"

# Tolerances, in the unit of each claim.
# transformers' float32 inv_freq against rotary's exact (double) one, in float32 ulps of the exact
# value: transformers rounds 3 to 6 times on the way (the exponent 2i/d, pow, whose vectorised
# float32 form on CPU is itself up to 1 ulp off, the reciprocal, then the factor, ramp or smoothing
# products); the corpus needs 4.3 (Phi-3.5's LongRoPE, whose factor lists transformers first
# rounds to float32).
INV_FREQ_ULPS = 8
# rotary's angles="hf-float32" cos/sin against transformers' own forward: both form
# fl32(fl32(p) * inv_freq) from the same float32 inv_freq (inv_freq_hf32 is transformers' own, bit
# for bit), rotary takes the correctly rounded cos/sin of that float angle, torch's float32 cos/sin
# are within 1 ulp of it, then each multiplies by the attention factor in float32.
COS_SIN_ULPS = 2
# rotary's attention factor against transformers' attention_scaling, relative.
ATTENTION_FACTOR_RTOL = 1e-6

# torch's float32 pow on CPU is the one step of transformers' inv_freq that is not correctly
# rounded (a vectorised 1-ulp pow over whole vector blocks, the C library's powf over the rest, so
# its bits depend on the machine and on the tensor's length). rotary's inv_freq_hf32 replays every
# other float32 operation exactly and takes the correctly rounded pow: it must equal, bit for bit,
# transformers' own code run with a correctly rounded pow (correctly_rounded_pow below); against
# stock transformers it may differ where torch's pow misrounds (about 1.6% of default schedules'
# exponents, each one ulp before the reciprocal), which is counted and reported.
POW_ULPS = 2


@contextlib.contextmanager
def correctly_rounded_pow():
    """torch's ``**`` on float32 CPU tensors replaced by the float32 nearest the exact power (a
    double pow of the same operands, rounded once) while transformers builds or updates inv_freq.
    A Python number meeting a float32 tensor is first rounded to float32 (torch's rule for
    ``number ** tensor``); ``tensor ** number`` keeps the exponent in double, as torch does."""
    pow_, rpow = torch.Tensor.__pow__, torch.Tensor.__rpow__

    def exact(base: Any, exponent: Any) -> Any:
        b = base.double().numpy() if isinstance(base, torch.Tensor) else np.float64(base)
        e = exponent.double().numpy() if isinstance(exponent, torch.Tensor) else np.float64(exponent)
        return torch.from_numpy(np.asarray(np.power(b, e), dtype=np.float32).copy())

    def float32_cpu(*values: Any) -> bool:
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors) and all(
            isinstance(v, (torch.Tensor, int, float)) for v in values)

    def patched_pow(self: Any, other: Any) -> Any:
        return exact(self, other) if float32_cpu(self, other) else pow_(self, other)

    def patched_rpow(self: Any, other: Any) -> Any:
        return exact(np.float32(other), self) if float32_cpu(self, other) else rpow(self, other)

    torch.Tensor.__pow__, torch.Tensor.__rpow__ = patched_pow, patched_rpow
    try:
        yield
    finally:
        torch.Tensor.__pow__, torch.Tensor.__rpow__ = pow_, rpow


# Remote-code model types (their config.json names code outside transformers): the native config
# class whose RoPE the remote code copies, named here rather than guessed.
NATIVE_STAND_IN = {
    # modeling_internlm2.py: Llama's rotary classes, InternLM2DynamicNTKScalingRotaryEmbedding is
    # transformers' dynamic NTK (base grows with the sequence length over max_position_embeddings).
    "internlm2": "llama",
    # modeling_phi3_v.py: Phi-3's decoder; its Phi3SuScaledRotaryEmbedding is transformers' longrope.
    "phi3_v": "phi3",
    # Kimi-K2 ships DeepSeek-V3's modeling code (architectures DeepseekV3ForCausalLM).
    "kimi_k2": "deepseek_v3",
}

# Configs whose published form transformers 5.x cannot build, and the one-key rewrite that gives
# transformers the rule it means: the variant runs as its own test, beside the skipped original.
#   Phi-3.5-vision's rope_scaling {"type": "su"}: Phi3Config renames su to longrope only after
#   standardize_rope_params ran, so original_max_position_embeddings is never moved into
#   rope_parameters and validation raises KeyError. rotary still reads the published "su".
REWRITES = {
    "microsoft--Phi-3.5-vision-instruct": ("su-as-longrope", lambda c: c["rope_scaling"].update(type="longrope")),
}
REWRITES_BY_VARIANT = {name: rewrite for name, rewrite in REWRITES.values()}


def _load(stem: str) -> dict:
    return json.loads((CONFIGS / f"{stem}.json").read_text())


def _cases() -> list[Any]:
    """One case per (config, layer type, variant); rotary's layer_types name the layer types (the
    test checks them against transformers' module)."""
    cases = []
    for path in sorted(CONFIGS.glob("*.json")):
        config = json.loads(path.read_text())
        try:
            layer_types = rotary.layer_types(config)
        except (ValueError, TypeError):
            layer_types = ["full_attention"]  # the test itself reports rotary's error
        variants = [None] + ([REWRITES[path.stem][0]] if path.stem in REWRITES else [])
        for variant in variants:
            for layer_type in layer_types:
                name = f"{path.stem}:{layer_type}" + (f":{variant}" if variant else "")
                cases.append(pytest.param(path.stem, layer_type, variant, id=name))
    return cases


# ---- transformers' side ----

def _hf_text_config(config: dict, variant: Optional[str]) -> Any:
    """transformers' config object of the text decoder, built as from_pretrained builds it
    (CONFIG_MAPPING[model_type].from_dict), or the reason it cannot be."""
    config = copy.deepcopy(config)
    if variant:
        REWRITES_BY_VARIANT[variant](config)
    model_type = NATIVE_STAND_IN.get(config["model_type"], config["model_type"])
    config["model_type"] = model_type
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no config class for model_type {model_type!r}")
    try:
        built = CONFIG_MAPPING[model_type].from_dict(config)
        text = built.get_text_config()
        if isinstance(text, dict):
            # The top-level class does not own a text_config (Ministral 3's file names the text
            # model's own type, ministral3, at the top): the text_config as its own type builds it.
            text = CONFIG_MAPPING[text["model_type"]].from_dict(text)
    except (KeyError, ValueError, TypeError) as e:
        pytest.skip(f"transformers {transformers.__version__} cannot build {model_type!r} from this published "
                    f"config: {type(e).__name__}: {e}")
    return text


def _modeling(text_config: Any) -> Any:
    name = model_type_to_module_name(text_config.model_type)
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _rope_class(modeling: Any) -> type:
    """The decoder's rotary embedding class (vision towers have their own)."""
    names = [n for n in dir(modeling) if n.endswith("RotaryEmbedding") and "Vision" not in n]
    assert len(names) == 1, f"{modeling.__name__}: expected one text rotary embedding class, found {names}"
    return getattr(modeling, names[0])


class HfRope:
    """transformers' rotary module for one layer type, with the few ways models call it."""

    def __init__(self, text_config: Any, layer_type: str):
        self.config = text_config
        self.modeling = _modeling(text_config)
        self.module = _rope_class(self.modeling)(config=text_config)
        self.per_layer = "layer_type" in inspect.signature(self.module.forward).parameters
        self.layer_type = layer_type
        self.prefix = f"{layer_type}_" if self.per_layer else ""
        # M-RoPE modules recompose three position streams (t, h, w) by mrope_section.
        self.streams = 3 if hasattr(self.module, "mrope_section") else 1
        self.x = torch.zeros(1, dtype=torch.float32)  # forward reads only x's device and dtype

    @property
    def layer_types(self) -> Optional[set]:
        """The layer types of a per-layer-type module (None: one RoPE for every layer)."""
        return set(self.module.rope_type) if self.per_layer else None

    @property
    def inv_freq(self) -> np.ndarray:
        return getattr(self.module, f"{self.prefix}inv_freq").numpy().copy()

    @property
    def attention_scaling(self) -> float:
        return float(getattr(self.module, f"{self.prefix}attention_scaling"))

    @property
    def head_dim(self) -> int:
        config = self.config
        if self.per_layer and hasattr(config, "per_layer_config"):  # Gemma 4: global_head_dim on full layers
            config = config.per_layer_config[self.layer_type]
        return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def _args(self, position_ids: Any) -> tuple:
        return (self.x, position_ids, self.layer_type) if self.per_layer else (self.x, position_ids)

    def forward(self, position_ids: Any) -> Any:
        """The module's forward, with transformers' dynamic update (dynamic NTK, LongRoPE)."""
        return self.module(*self._args(position_ids))

    def forward_with(self, inv_freq32: np.ndarray, position_ids: Any) -> Any:
        """The forward's arithmetic alone (no dynamic update) with inv_freq replaced."""
        raw = inspect.unwrap(type(self.module).forward)
        buffer = getattr(self.module, f"{self.prefix}inv_freq")
        saved = buffer.clone()
        buffer.copy_(torch.from_numpy(inv_freq32))
        try:
            return raw(self.module, *self._args(position_ids))
        finally:
            buffer.copy_(saved)

    def rotate(self, q: Any, k: Any, emb: Any) -> tuple:
        """q, k [batch, heads, seq, width] rotated as the model's attention does, width being the
        rotated slice (every model here rotates the leading cos.shape[-1] channels of the head it
        hands to the function, MLA models that of q_pe/k_pe), in rotary's channel order."""
        module = self.modeling.__name__.rsplit(".", 1)[-1]
        if module in ("modeling_llama4", "modeling_deepseek_v2"):  # complex freqs_cis, interleaved pairs
            if module == "modeling_llama4":  # [batch, seq, heads, width]
                q, k = self.modeling.apply_rotary_emb(q.transpose(1, 2), k.transpose(1, 2), emb)
                return q.transpose(1, 2), k.transpose(1, 2)
            return self.modeling.apply_rotary_emb(q, k, emb)
        cos, sin = emb
        if module == "modeling_gemma4":
            apply = self.modeling.apply_rotary_pos_emb
            return apply(q, cos, sin, unsqueeze_dim=1), apply(k, cos, sin, unsqueeze_dim=1)
        if module == "modeling_glm_moe_dsa" or (module == "modeling_deepseek_v3" and self.config.rope_interleave):
            # apply_rotary_pos_emb_interleave rotates pairs (x[2i], x[2i+1]) and writes pair i's two
            # results to channels i and i + width/2: back to the input's channel order.
            q, k = self.modeling.apply_rotary_pos_emb_interleave(q, k, cos, sin)
            return _interleave_halves(q), _interleave_halves(k)
        return self.modeling.apply_rotary_pos_emb(q, k, cos, sin)


def _interleave_halves(x: Any) -> Any:
    half = x.shape[-1] // 2
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = x[..., :half], x[..., half:]
    return out


def _pairs_of(t: Any, pairs: int, what: str) -> np.ndarray:
    """transformers' cos or sin [..., width] as one value per pair [..., pairs]: width pairs as
    given (gpt-oss), or 2*pairs written twice, as halves (rotate_half models, cat) or repeated
    (Cohere, repeat_interleave)."""
    t = t.numpy()
    if t.shape[-1] == pairs:
        return t
    assert t.shape[-1] == 2 * pairs, f"{what} has width {t.shape[-1]}, not rotary_dim/2={pairs} or rotary_dim"
    if np.array_equal(t[..., :pairs], t[..., pairs:]):
        return t[..., :pairs]
    if np.array_equal(t[..., 0::2], t[..., 1::2]):
        return t[..., 0::2]
    raise AssertionError(f"{what} is neither two equal halves nor each value repeated")


def _cos_sin(emb: Any, pairs: int) -> tuple:
    if isinstance(emb, torch.Tensor) and emb.is_complex():  # freqs_cis = (cos + i sin) * scaling
        return _pairs_of(emb.real, pairs, "freqs_cis.real"), _pairs_of(emb.imag, pairs, "freqs_cis.imag")
    cos, sin = emb
    return _pairs_of(cos, pairs, "cos"), _pairs_of(sin, pairs, "sin")


# ---- positions ----

def _stream_positions(positions: list, streams: int) -> np.ndarray:
    """[streams, 1, seq] int64: stream 0 the positions, the others distinct (M-RoPE's h and w)."""
    p = np.asarray(positions, dtype=np.int64)
    rows = [p, p // 3 + 1, p // 7 + 2][:streams]
    return np.stack(rows)[:, None, :]


def _rotary_rows(rope: Any, streams: np.ndarray, angles: str) -> tuple:
    """rotary's cos/sin [seq, pairs], pair j from its stream's positions."""
    tables = [rope.table(streams[s, 0], angles=angles) for s in range(streams.shape[0])]
    pick = rope.pair_stream if streams.shape[0] > 1 else np.zeros(rope.rotary_dim // 2, dtype=np.int32)
    columns = np.arange(rope.rotary_dim // 2)
    cos = np.stack([tables[s][0][:, j] for j, s in zip(columns, pick)], axis=-1)
    sin = np.stack([tables[s][1][:, j] for j, s in zip(columns, pick)], axis=-1)
    return cos, sin


def _ulps_apart(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in float32 ulps of the larger magnitude (ulps of the smallest normal near zero)."""
    scale = np.maximum(np.abs(a), np.abs(b)).astype(np.float32)
    spacing = np.spacing(np.maximum(scale, np.float32(np.finfo(np.float32).tiny))).astype(np.float64)
    return np.abs(a.astype(np.float64) - b.astype(np.float64)) / spacing


def _position_sets(hf: HfRope) -> list:
    """The forwards to run, in order, on one module: each a list of positions whose largest + 1 is
    the sequence length transformers' dynamic update sees. L is where dynamic NTK and LongRoPE
    switch; the sets go short, just past L, far past it, to 2^31 - 1, then short again (dynamic
    NTK's reset). The first set stays below L - 1 (transformers resets only when n < L)."""
    params = hf.config.rope_parameters
    params = params.get(hf.layer_type, params) if hf.per_layer else params
    L = int(params.get("original_max_position_embeddings") or hf.config.max_position_embeddings)
    short = sorted({0, 1, 2, 3, 7, 8, 31, 255, 1000, L // 2, L - 2})
    return [
        short,
        [0, 1, 5, L - 1],  # n = L: still the original schedule
        [0, 1, 5, L - 1, L],  # n = L + 1: switched
        [0, 3, L, L + 1, 2 * L + 3, 65535, 100_000, 1_000_000],
        [0, 1, 17, L + 1, 1 << 20, (1 << 24) - 1, (1 << 24) + 1, 30_000_000, 1_000_000_007, 2**31 - 1],
        short,
    ]


# ---- the test ----

@pytest.mark.parametrize("stem,layer_type,variant", _cases())
def test_matches_transformers(stem: str, layer_type: str, variant: Optional[str]) -> None:
    config = _load(stem)
    text_config = _hf_text_config(config, variant)
    hf = HfRope(text_config, layer_type)
    with correctly_rounded_pow():
        hf_exact_pow = HfRope(text_config, layer_type)
    rope = rotary.Rope.from_hf_config(config, layer_type=layer_type)

    # Layer types: a per-layer-type module has one RoPE per type; the others one for every layer.
    if hf.layer_types is not None:
        assert set(rotary.layer_types(config)) == hf.layer_types
    else:
        assert rotary.layer_types(config) == ["full_attention"]

    # The head and its rotated slice: transformers' inv_freq has one entry per pair.
    pairs = rope.rotary_dim // 2
    assert rope.head_dim == hf.head_dim
    assert hf.inv_freq.shape == (pairs,), (
        f"transformers rotates {2 * hf.inv_freq.size} channels, rotary {rope.rotary_dim}")
    assert rope.rotary_offset == 0  # transformers rotates the leading slice (see HfRope.rotate)
    assert rope.streams == hf.streams

    _check_schedule(hf, hf_exact_pow, rope, "at init (no sequence length)")
    for positions in _position_sets(hf):
        streams = _stream_positions(positions, hf.streams)
        seq_len = int(streams.max()) + 1
        position_ids = torch.from_numpy(streams if hf.streams > 1 else streams[0])
        emb = hf.forward(position_ids)
        with correctly_rounded_pow():
            hf_exact_pow.forward(position_ids)  # its dynamic update, with the exact pow
        at = rotary.Rope.from_hf_config(config, seq_len=seq_len, layer_type=layer_type)
        where = f"after a forward at positions up to {seq_len - 1}"
        excused = _check_schedule(hf, hf_exact_pow, at, where)
        _check_exact_cos_sin(hf, at, emb, streams, where)
        _check_hf_float32(hf, at, emb, streams, excused, where)
    _check_pairing(hf, rope)
    _check_rope_layers(hf, rope)


def _check_hf32_bits(theirs: np.ndarray, exact_pow: np.ndarray, ours: np.ndarray, where: str) -> np.ndarray:
    """rotary's inv_freq_hf32 bit for bit against transformers run with a correctly rounded pow
    (exact_pow), and within POW_ULPS of stock transformers (theirs) where torch's pow misrounds;
    returns those pairs (reported as a warning)."""
    assert ours.dtype == np.float32 and ours.shape == theirs.shape == exact_pow.shape
    wrong = np.nonzero(exact_pow.view(np.uint32) != ours.view(np.uint32))[0]
    assert wrong.size == 0, (
        f"{where}: inv_freq_hf32 differs from transformers' float32 inv_freq (with a correctly rounded pow) at "
        f"pairs {wrong[:8].tolist()}: transformers {exact_pow[wrong[:4]].tolist()}, rotary {ours[wrong[:4]].tolist()}")
    excused = theirs.view(np.uint32) != ours.view(np.uint32)
    ulps = _ulps_apart(theirs[excused], ours[excused])
    assert ulps.size == 0 or ulps.max() <= POW_ULPS, (
        f"{where}: inv_freq_hf32 {ulps.max():.3g} ulps off stock transformers where torch's pow misrounds")
    if excused.any():
        warnings.warn(f"{where}: {int(excused.sum())} of {excused.size} float32 inv_freq values differ from stock "
                      f"transformers' by <= {POW_ULPS} ulps, where torch's pow is not correctly rounded (capability "
                      f"{torch.backends.cpu.get_cpu_capability()}): pairs {np.nonzero(excused)[0].tolist()}")
    return excused


def _check_schedule(hf: HfRope, hf_exact_pow: HfRope, rope: Any, where: str) -> np.ndarray:
    """inv_freq within INV_FREQ_ULPS of rotary's exact values (zeros, proportional RoPE's unturned
    pairs, equal), inv_freq_hf32 bit for bit (_check_hf32_bits; returned: the pairs excused there),
    the attention factor within ATTENTION_FACTOR_RTOL."""
    excused = _check_hf32_bits(hf.inv_freq, hf_exact_pow.inv_freq, rope.inv_freq_hf32, where)
    theirs, ours = hf.inv_freq.astype(np.float64), rope.inv_freq
    ulp = np.spacing(ours.astype(np.float32)).astype(np.float64)
    ulps = np.where(ours == 0, np.where(theirs == 0, 0.0, np.inf), np.abs(theirs - ours) / np.where(ours == 0, 1, ulp))
    worst = int(np.argmax(ulps))
    assert ulps[worst] <= INV_FREQ_ULPS, (
        f"{where}: inv_freq[{worst}] transformers {theirs[worst]!r}, rotary {ours[worst]!r}: "
        f"{ulps[worst]:.3g} float32 ulps apart (bound {INV_FREQ_ULPS})")
    assert math.isclose(rope.attention_factor, hf.attention_scaling, rel_tol=ATTENTION_FACTOR_RTOL), (
        f"{where}: attention factor transformers {hf.attention_scaling!r}, rotary {rope.attention_factor!r}")
    return excused


def _check_exact_cos_sin(hf: HfRope, rope: Any, emb: Any, streams: np.ndarray, where: str) -> None:
    """transformers' own forward against rotary's exact cos/sin, within what float32 angles allow:
    its angle fl32(fl32(p) * inv_freq32) is within (INV_FREQ_ULPS + 1) * 2^-23 * p * inv_freq of
    the exact one, plus 1 ulp for cos/sin and one rounding of the factor."""
    pairs = rope.rotary_dim // 2
    cos, sin = _cos_sin(emb, pairs)
    cos, sin = cos.reshape(-1, pairs), sin.reshape(-1, pairs)
    exact_cos, exact_sin = _rotary_rows(rope, streams, "exact")
    pick = rope.pair_stream if streams.shape[0] > 1 else np.zeros(pairs, dtype=np.int32)
    p = streams[pick, 0, :].T.astype(np.float64)  # [seq, pairs]: each pair's own position
    g = rope.attention_factor
    bound = g * ((INV_FREQ_ULPS + 1) * 2.0**-23 * p * rope.inv_freq + 2.0**-21)
    for name, theirs, ours in (("cos", cos, exact_cos), ("sin", sin, exact_sin)):
        excess = np.abs(theirs.astype(np.float64) - ours) - bound
        row, j = np.unravel_index(int(np.argmax(excess)), excess.shape)
        assert excess[row, j] <= 0, (
            f"{where}: {name} at position {int(p[row, j])} pair {j}: transformers {theirs[row, j]!r}, "
            f"rotary exact {ours[row, j]!r}, beyond the float32-angle bound {bound[row, j]:.3g}")


def _check_hf_float32(hf: HfRope, rope: Any, emb: Any, streams: np.ndarray, excused: np.ndarray,
                      where: str) -> None:
    """rotary's angles="hf-float32" against transformers' own forward `emb` (its own float32
    inv_freq, after its dynamic update): within COS_SIN_ULPS at every position, 2^31 - 1 included.
    Pairs `excused` by _check_schedule (where torch's pow misrounds) are compared with the
    forward's arithmetic fed rotary's value for them instead."""
    pairs = rope.rotary_dim // 2
    if excused.any():
        mixed = np.where(excused, rope.inv_freq_hf32, hf.inv_freq).astype(np.float32)
        emb = hf.forward_with(mixed, torch.from_numpy(streams if hf.streams > 1 else streams[0]))
    cos, sin = _cos_sin(emb, pairs)
    ours_cos, ours_sin = _rotary_rows(rope, streams, "hf-float32")
    for name, theirs, ours in (("cos", cos.reshape(-1, pairs), ours_cos), ("sin", sin.reshape(-1, pairs), ours_sin)):
        ulps = _ulps_apart(theirs, ours)
        row, j = np.unravel_index(int(np.argmax(ulps)), ulps.shape)
        assert ulps[row, j] <= COS_SIN_ULPS, (
            f"{where}: hf-float32 {name} at position {int(streams[0, 0, row])} pair {j}: transformers "
            f"{theirs[row, j]!r}, rotary {ours[row, j]!r} ({ulps[row, j]:.3g} ulps)")


def _check_pairing(hf: HfRope, rope: Any) -> None:
    """The model's own rotation of q and k against Rope.apply (exact angles) at positions below 32:
    channels pair as transformers pairs them, the slice past rotary_dim passes through, M-RoPE
    pairs read their streams. A wrong pairing is off by about |q|; the bound is what float32 angles
    (as in _check_exact_cos_sin) and a few float32 products allow, a few 1e-5 here."""
    rng = np.random.default_rng(7)
    head_dim, width = rope.head_dim, rope.rotary_dim
    streams = _stream_positions([0, 1, 2, 3, 5, 8, 13, 21, 31], hf.streams)
    q = rng.standard_normal((1, 2, streams.shape[-1], head_dim)).astype(np.float32)
    k = rng.standard_normal((1, 1, streams.shape[-1], head_dim)).astype(np.float32)
    emb = hf.forward(torch.from_numpy(streams if hf.streams > 1 else streams[0]))
    tq, tk = (torch.from_numpy(x) for x in (q, k))
    hq, hk = hf.rotate(tq[..., :width].contiguous(), tk[..., :width].contiguous(), emb)
    hq = torch.cat([hq, tq[..., width:]], dim=-1).numpy()
    hk = torch.cat([hk, tk[..., width:]], dim=-1).numpy()
    positions = streams if hf.streams > 1 else streams[0]
    rq, rk = rope.apply(q, k, positions=positions, layout="bhsd")
    angle = (INV_FREQ_ULPS + 1) * 2.0**-23 * float(streams.max()) * float(rope.inv_freq.max()) + 2.0**-21
    for name, theirs, ours, x in (("q", hq, rq, q), ("k", hk, rk, k)):
        bound = 2 * rope.attention_factor * float(np.abs(x).max()) * (angle + 2.0**-22)
        error = np.abs(theirs - ours)
        worst = np.unravel_index(int(np.argmax(error)), error.shape)
        assert error[worst] <= bound, (
            f"rotated {name} [batch, head, token, channel]={tuple(int(i) for i in worst)}: transformers "
            f"{theirs[worst]!r}, rotary {ours[worst]!r}, bound {bound:.3g} "
            f"(pairing {rope.pairing}, layout {rope.layout})")


# ---- angles="hf-float32": its one documented exception, measured ----

# Models whose rotary runs one torch float32 pow over base^(2j/d) (default, YaRN, llama3, M-RoPE): the
# README's example (base 1e6 at head_dim 128: Qwen2, Qwen2.5, Qwen3, CodeLlama), Qwen3-VL's base 5e6,
# and Llama 3.1's 5e5.
POW_EXCEPTION_CASES = ["Qwen--Qwen2-7B-Instruct", "Qwen--Qwen2.5-7B-Instruct", "Qwen--Qwen3-8B",
                       "codellama--CodeLlama-7b-hf", "Qwen--Qwen2.5-VL-7B-Instruct", "Qwen--Qwen3-VL-32B-Instruct",
                       "meta-llama--Llama-3.1-8B"]
POW_EXCEPTION_POSITIONS = [0, 1, 1000, 1 << 20, (1 << 24) + 1, 1 << 30, 2**31 - 1]
# The documented bound on a pair whose float32 inv_freq is one ulp (of the power; <= 2 ulps after
# the reciprocal, POW_ULPS) from transformers': |f_t - f_r| <= 2^-22 f, and each side's float32
# product fl32(fl32(p) * f) rounds once more (2^-24 of it): below 2^-21 p f in all.
POW_ANGLE_BOUND = 2.0**-21
# What reading an angle back from float32 cos/sin (atan2) adds, both sides together.
ATAN2_RAD = 2.0**-20
# A rotation by the model's own cos/sin against transformers' apply_rotary_pos_emb, relative to
# attention_factor * max |q|: rotary's kernel rounds each output once, torch's q*cos +
# rotate_half(q)*sin three times (two products and a sum).
OWN_COS_SIN_ROTATION = 2.0**-21


@pytest.mark.parametrize("stem", POW_EXCEPTION_CASES)
def test_hf_float32_differs_from_transformers_only_where_torch_pow_misrounds(stem: str) -> None:
    """The exception the README, table.hpp, the docstrings and the CLI help state for
    angles="hf-float32", measured against real torch and transformers on this machine: which pairs
    (those whose power torch's float32 pow does not round correctly, and only those), by how much
    (one ulp of the power; the angle within POW_ANGLE_BOUND * p * inv_freq up to 2^31 - 1), and the
    way around it (the model's own cos/sin)."""
    config = _load(stem)
    hf = HfRope(_hf_text_config(config, None), "full_attention")
    rope = rotary.Rope.from_hf_config(config)
    pairs = rope.rotary_dim // 2
    # transformers' power, on this machine: base (a Python float, rounded to float32 where it meets
    # the tensor) ** (arange(0, dim, 2).float() / dim), as one tensor of `pairs` values.
    base = np.float32(rope.base)
    exponents = torch.arange(0, 2 * pairs, 2, dtype=torch.int64).float() / (2 * pairs)
    torch_pow = (float(base) ** exponents).numpy()
    exact_pow = np.power(np.float64(base), exponents.double().numpy()).astype(np.float32)
    misrounded = torch_pow.view(np.int32) != exact_pow.view(np.int32)
    assert np.all(np.abs(torch_pow.view(np.int32).astype(np.int64) - exact_pow.view(np.int32))[misrounded] == 1)

    differs = hf.inv_freq.view(np.uint32) != rope.inv_freq_hf32.view(np.uint32)
    where = f"{stem} (capability {torch.backends.cpu.get_cpu_capability()})"
    assert not (differs & ~misrounded).any(), (
        f"{where}: inv_freq_hf32 differs from transformers' at pairs {np.nonzero(differs & ~misrounded)[0]} "
        "where torch's pow is correctly rounded")
    if rope.schedule == "default":  # 1.0 / tensor is one correctly rounded reciprocal: rotary's, bit for bit
        assert np.array_equal(rope.inv_freq_hf32, np.float32(1) / exact_pow)
    if (float(base), 2 * pairs) == (1e6, 128) and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert differs[37], f"{where}: the documented example, pair 37, is correctly rounded by torch here"

    # The angles, at positions up to 2^31 - 1 (each pair at its stream's position).
    streams = _stream_positions(POW_EXCEPTION_POSITIONS, hf.streams)
    emb = hf.forward(torch.from_numpy(streams if hf.streams > 1 else streams[0]))
    theirs_cos, theirs_sin = (t.reshape(-1, pairs).astype(np.float64) for t in _cos_sin(emb, pairs))
    ours_cos, ours_sin = (t.astype(np.float64) for t in _rotary_rows(rope, streams, "hf-float32"))
    pick = rope.pair_stream if hf.streams > 1 else np.zeros(pairs, dtype=np.int32)
    p = streams[pick, 0, :].T.astype(np.float64)  # [positions, pairs]
    gap = np.abs((np.arctan2(theirs_sin, theirs_cos) - np.arctan2(ours_sin, ours_cos) + np.pi) % (2 * np.pi) - np.pi)
    bound = POW_ANGLE_BOUND * p * rope.inv_freq_hf32.astype(np.float64) + ATAN2_RAD
    row, j = np.unravel_index(int(np.argmax(gap - bound)), gap.shape)
    assert gap[row, j] <= bound[row, j], (
        f"{where}: hf-float32 angle of pair {j} at position {int(p[row, j])} is {gap[row, j]:.3g} rad from "
        f"transformers', beyond the documented {bound[row, j]:.3g}")
    for name, theirs, ours in (("cos", theirs_cos, ours_cos), ("sin", theirs_sin, ours_sin)):
        ulps = _ulps_apart(theirs[:, ~differs].astype(np.float32), ours[:, ~differs].astype(np.float32))
        assert ulps.size == 0 or ulps.max() <= COS_SIN_ULPS, f"{where}: {name} {ulps.max():.3g} ulps off elsewhere"
    if differs.any():
        warnings.warn(f"{where}: hf-float32 differs from transformers at pairs {np.nonzero(differs)[0].tolist()}, "
                      f"by up to {gap[:, differs].max():.3g} rad at position {max(POW_EXCEPTION_POSITIONS)}")

    # The way around it: the model's own cos/sin, rotated by rotary's kernel, give transformers' rotation.
    if hf.streams == 1:
        g = torch.Generator().manual_seed(22)
        q = torch.randn(1, 2, len(POW_EXCEPTION_POSITIONS), rope.head_dim, generator=g)
        k = torch.randn(1, 1, len(POW_EXCEPTION_POSITIONS), rope.head_dim, generator=g)
        cos, sin = emb
        hq, hk = hf.rotate(q, k, emb)
        rq, rk = rope.apply(q, k, layout="bhsd", cos=cos, sin=sin)  # per token: row s is token s's
        scale = rope.attention_factor * float(torch.cat([q.abs().flatten(), k.abs().flatten()]).max())
        for name, theirs, ours in (("q", hq, rq), ("k", hk, rk)):
            error = float((theirs - ours).abs().max())
            assert error <= OWN_COS_SIN_ROTATION * scale, f"{where}: {name} with the model's cos/sin off by {error:.3g}"


REPO = Path(__file__).resolve().parents[2]


def _rotary_cli() -> Optional[str]:
    """The `rotary` command: beside this Python, built by CMake here, or on PATH; None if none."""
    import shutil
    import sysconfig
    for candidate in (Path(sysconfig.get_path("scripts")) / "rotary", REPO / "build" / "rotary",
                      REPO / "build" / "cli" / "rotary"):
        if candidate.is_file():
            return str(candidate)
    return shutil.which("rotary")


def _flat(text: str) -> str:
    """Whitespace (line breaks, the /// of wrapped comment lines) as single spaces."""
    return " ".join(text.replace("///", " ").split())


def test_every_description_of_hf_float32_states_its_exception() -> None:
    """Where users read what angles="hf-float32" does, the exception measured above is stated: the
    correctly rounded power, which pairs, how far; never "reproduces" without it."""
    import subprocess
    from rotary.torch import apply_rope

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for paragraph in readme.split("\n\n"):
        if "hf-float32" in paragraph:
            assert "reproduc" not in paragraph, f"README says hf-float32 reproduces transformers: {paragraph[:200]}"
    texts = {
        "README": (_flat(readme), ["the power `base^(2j/d)` is rounded correctly, and torch's float32 `pow` is not",
                                   "pair 37 of base 10^6 at head_dim 128", "2^-21·p·inv_freq", "pass its cos/sin"]),
        "table.hpp": (_flat((REPO / "include/rotary/table.hpp").read_text()),
                      ["One exception: inv_freq_hf32 takes the power base^(2j/d) correctly rounded", "2^-21 * p * f"]),
        "rotary.h": (_flat((REPO / "include/rotary/rotary.h").read_text()),
                     ["base^(2j/d) correctly rounded where torch's float32 pow is not"]),
        "Rope.apply": (_flat(rotary.Rope.apply.__doc__), ["the power ``base**(2j/d)`` is correctly rounded",
                                                          "``2**-21 * p * inv_freq``", "pass its cos and sin"]),
        "Rope.table": (_flat(rotary.Rope.table.__doc__), ["correctly rounded where torch's float32 pow is not"]),
        "Rope.inv_freq_hf32": (_flat(rotary.Rope.inv_freq_hf32.__doc__), ["correctly rounded, so one ulp"]),
        "apply_rope": (_flat(apply_rope.__doc__), ["correctly rounded power"]),
    }
    cli = _rotary_cli()
    if cli is not None:
        for command in ("table", "apply"):
            help_text = subprocess.run([cli, command, "--help"], capture_output=True, text=True, check=True).stdout
            texts[f"rotary {command} --help"] = (_flat(help_text), ["base^(2j/d) correctly rounded where torch's "
                                                                   "float32 pow is not", "2^-21*p*inv_freq"])
    for where, (text, needles) in texts.items():
        for needle in needles:
            assert needle in text, f"{where} does not state hf-float32's exception: {needle!r}"


def _layer_applies_rope(layer: Any) -> bool:
    """Whether one of transformers' decoder layers rotates q and k: it has softmax attention
    (recurrent and convolutional mixers live under other names, linear_attn, mamba, conv) whose
    forward calls a rotary function, and it is not a NoPE layer (Llama 4's use_rope)."""
    for name in ("self_attn", "attention"):
        attention = getattr(layer, name, None)
        if isinstance(attention, torch.nn.Module):
            source = inspect.getsource(type(attention).forward)
            return "rotary" in source and bool(getattr(attention, "use_rope", True))
    return False


def _decoder_layer_class(modeling: Any) -> type:
    own = [n for n in dir(modeling) if getattr(getattr(modeling, n), "__module__", None) == modeling.__name__]
    names = [n for n in own if n.endswith("DecoderLayer") and "Vision" not in n]
    names = names or [n for n in own if n.endswith("Layer") and "Vision" not in n]  # GPTNeoXLayer
    assert len(names) == 1, f"{modeling.__name__}: expected one decoder layer class, found {names}"
    return getattr(modeling, names[0])


def _check_rope_layers(hf: HfRope, rope: Any) -> None:
    """rope_layers (None: every layer) against transformers' decoder layers, built on the meta
    device (no memory): layer i rotates with this RoPE when it applies RoPE at all and, for a
    per-layer-type module, its layer type is this one."""
    layer_class = _decoder_layer_class(hf.modeling)
    types = getattr(hf.config, "layer_types", None)
    with torch.device("meta"):
        applies = [_layer_applies_rope(layer_class(hf.config, i)) for i in range(hf.config.num_hidden_layers)]
    expected = [a and (not hf.per_layer or types[i] == hf.layer_type) for i, a in enumerate(applies)]
    ours = [True] * len(expected) if rope.rope_layers is None else rope.rope_layers
    wrong = [i for i, (a, b) in enumerate(zip(ours, expected)) if a != b]
    assert len(ours) == len(expected) and not wrong, (
        f"rope_layers: rotary marks {sum(ours)} of {len(ours)} layers, transformers rotates {sum(expected)} of "
        f"{len(expected)} with this RoPE; first differing layers {wrong[:8]}")


# ---- what config classes fill in ----

# The model types whose config class fills in a RoPE fact when config.json leaves it out, each as
# rotary resolves it (src/config/hf_config.cpp): partial_rotary_factor defaults (and Bamba's forced 0.5),
# GPT-NeoX(-Japanese)'s rotary_pct, MiniMax-M2's rotary_dim, JetMoE's head (kv_channels, default
# 128), Zamba2's doubled head, and the layers without attention of Qwen3-Next (full_attention_interval),
# Bamba (attn_layer_indices) and RecurrentGemma (block_types). Each case's own keys; None drops a
# key of the base config. Other class defaults (head_dim, rope_theta: MiniMaxM2Config's 5e6, ...)
# are given in the base config: rotary does not read them from the model type (see README.md).
CONFIG_CLASS_BASE = {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128,
                     "num_hidden_layers": 8, "max_position_embeddings": 4096, "rope_theta": 10000.0}
CONFIG_CLASS_CASES = {
    "bamba": {"partial_rotary_factor": 1.0, "attn_layer_indices": [2, 5]},  # 0.5 whatever the config says
    "glm": {}, "glm4": {}, "glm4_moe": {}, "nemotron": {}, "persimmon": {}, "phi": {},
    "recurrent_gemma": {"num_key_value_heads": 1}, "stablelm": {}, "qwen3_next": {"full_attention_interval": 3},
    "moonshine": {"head_dim": None, "num_attention_heads": 8, "num_key_value_heads": 8},  # 0.9 of 256: even
    "gpt_neox": {}, "gpt_neox_japanese": {"rotary_pct": 0.5}, "minimax_m2": {"rotary_dim": 64},
    "jetmoe": {"head_dim": None, "num_attention_heads": 32, "num_key_value_heads": 32},  # 2048 / 32 is not 128
    "zamba2": {"head_dim": None, "use_mem_rope": True, "num_hidden_layers": 6,
               "layers_block_type": ["mamba", "hybrid", "mamba", "mamba", "hybrid", "mamba"]},
}


@pytest.mark.parametrize("model_type", sorted(CONFIG_CLASS_CASES))
def test_config_class_defaults(model_type: str) -> None:
    """A config.json that leaves the case's fact to the config class: the head, the rotated width,
    inv_freq and the layers that rotate as transformers' config class and rotary module build them."""
    config = {"model_type": model_type, **CONFIG_CLASS_BASE, **CONFIG_CLASS_CASES[model_type]}
    config = {key: value for key, value in config.items() if value is not None}
    text_config = CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(config))
    hf = HfRope(text_config, "full_attention")
    with correctly_rounded_pow():
        hf_exact_pow = HfRope(text_config, "full_attention")
    rope = rotary.Rope.from_hf_config(config)
    assert rope.head_dim == hf.head_dim
    assert rope.rotary_dim == 2 * hf.inv_freq.size, f"transformers rotates {2 * hf.inv_freq.size} channels"
    _check_schedule(hf, hf_exact_pow, rope, "defaults")
    types = getattr(text_config, "layer_types", None)
    if types is not None and "linear_attention" in types:
        assert rope.rope_layers == [t != "linear_attention" for t in types]


# ---- vision towers ----

def _vision_cases() -> list[Any]:
    return [pytest.param(path.stem, id=path.stem) for path in sorted(CONFIGS.glob("*.json"))
            if "vision_config" in json.loads(path.read_text())]


def _hf_vision_config(config: dict) -> Any:
    """transformers' vision_config object, as the model's own config class builds it."""
    config = copy.deepcopy(config)
    config["model_type"] = NATIVE_STAND_IN.get(config["model_type"], config["model_type"])
    try:
        vision = getattr(CONFIG_MAPPING[config["model_type"]].from_dict(copy.deepcopy(config)), "vision_config", None)
        if vision is None or isinstance(vision, dict):  # see _hf_text_config: Ministral 3
            vision = CONFIG_MAPPING[config["vision_config"]["model_type"]].from_dict(config["vision_config"])
    except (KeyError, ValueError, TypeError) as e:
        pytest.skip(f"transformers {transformers.__version__} cannot build this vision_config: {type(e).__name__}: {e}")
    return vision


class HfVisionRope:
    """transformers' vision rotary module (None when the tower has no RoPE) and its attention's call."""

    def __init__(self, vision_config: Any):
        package = type(vision_config).__module__.rsplit(".", 1)[0]
        self.modeling = importlib.import_module(f"{package}.modeling_{package.rsplit('.', 1)[1]}")
        names = [n for n in dir(self.modeling) if n.endswith("VisionRotaryEmbedding")]
        assert len(names) <= 1, f"{self.modeling.__name__}: several vision rotary classes {names}"
        self.module = getattr(self.modeling, names[0])(config=vision_config) if names else None
        self.name = self.modeling.__name__.rsplit(".", 1)[-1]
        self.x = torch.zeros(1, dtype=torch.float32)

    def position_ids(self, streams: np.ndarray) -> Any:
        """streams [2, 1, patches] as the tower's (patches, 2) position_ids (Gemma 4: (1, patches, 2))."""
        ids = torch.from_numpy(np.ascontiguousarray(streams[:, 0, :].T))
        return ids[None] if self.name == "modeling_gemma4" else ids

    def rotate(self, q: Any, k: Any, emb: Any, position_ids: Any) -> tuple:
        """q [1, patches, heads, head_dim], k alike, rotated as the tower's attention does."""
        cos, sin = emb
        if self.name == "modeling_gemma4":
            apply = self.modeling.apply_multidimensional_rope
            return apply(q, cos, sin, position_ids, unsqueeze_dim=2), apply(k, cos, sin, position_ids, unsqueeze_dim=2)
        if self.name == "modeling_pixtral":  # [batch, heads, patches, head_dim], cos [patches, head_dim]
            rq, rk = self.modeling.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=0)
            return rq.transpose(1, 2), rk.transpose(1, 2)
        rq, rk = self.modeling.apply_rotary_pos_emb_vision(q[0], k[0], cos, sin)  # [patches, heads, head_dim]
        return rq[None], rk[None]


def _block_pairs_of(t: Any, pairs: int, blocks: int, what: str) -> np.ndarray:
    """_pairs_of for a head split in `blocks` blocks (Gemma 4's vision tower), block by block."""
    parts = torch.chunk(t, blocks, dim=-1)
    return np.concatenate([_pairs_of(part, pairs // blocks, what) for part in parts], axis=-1)


@pytest.mark.parametrize("stem", _vision_cases())
def test_vision_tower_matches_transformers(stem: str) -> None:
    """The vision tower's 2-D RoPE (patch row and column as two position streams): the same
    comparisons as the decoder's, at patch positions up to 2^20."""
    config = _load(stem)
    hf = HfVisionRope(_hf_vision_config(config))
    if hf.module is None:  # the tower has no RoPE (SigLIP): rotary must refuse it, not guess one
        with pytest.raises(ValueError, match="does not know this vision tower's RoPE"):
            rotary.Rope.from_hf_config(config, vision=True)
        return
    rope = rotary.Rope.from_hf_config(config, vision=True)
    pairs = rope.rotary_dim // 2
    assert rope.streams == 2
    assert rope.rotary_offset == 0

    # One buffer of per-axis frequencies (Qwen, Gemma 4: shared by both axes) or one per pair (Pixtral).
    theirs = hf.module.inv_freq.numpy()
    assert pairs % theirs.size == 0, f"transformers has {theirs.size} frequencies for rotary's {pairs} pairs"
    tiled = np.tile(theirs, pairs // theirs.size)
    ulps = np.abs(tiled.astype(np.float64) - rope.inv_freq) / np.spacing(rope.inv_freq.astype(np.float32))
    assert ulps.max() <= INV_FREQ_ULPS, f"inv_freq {int(np.argmax(ulps))} is {ulps.max():.3g} float32 ulps off"
    with correctly_rounded_pow():
        exact_pow = HfVisionRope(_hf_vision_config(config)).module.inv_freq.numpy()
    excused = _check_hf32_bits(tiled, np.tile(exact_pow, pairs // theirs.size), rope.inv_freq_hf32, "vision")
    assert math.isclose(rope.attention_factor, hf.module.attention_scaling, rel_tol=ATTENTION_FACTOR_RTOL)

    rows = [0, 1, 2, 3, 5, 8, 13, 31, 100, 1000, 4095, 65535, 1 << 20]
    streams = np.stack([np.array(rows), np.array(rows[::-1]) // 2 + 1])[:, None, :].astype(np.int64)
    position_ids = hf.position_ids(streams)
    emb = hf.module(hf.x, position_ids)

    def per_pair(emb: Any) -> tuple:
        cos, sin = (_block_pairs_of(t, pairs, rope.blocks, name) for t, name in zip(emb, ("cos", "sin")))
        return cos.reshape(-1, pairs), sin.reshape(-1, pairs)

    cos, sin = per_pair(emb)
    exact_cos, exact_sin = _rotary_rows(rope, streams, "exact")
    p = streams[rope.pair_stream, 0, :].T.astype(np.float64)
    bound = rope.attention_factor * ((INV_FREQ_ULPS + 1) * 2.0**-23 * p * rope.inv_freq + 2.0**-21)
    for name, t, ours in (("cos", cos, exact_cos), ("sin", sin, exact_sin)):
        excess = np.abs(t.astype(np.float64) - ours) - bound
        row, j = np.unravel_index(int(np.argmax(excess)), excess.shape)
        assert excess[row, j] <= 0, (
            f"{name} at patch {row} pair {j}: transformers {t[row, j]!r}, rotary {ours[row, j]!r}")

    # angles="hf-float32" against the tower's own forward (rotary's values fed for pairs excused above).
    cos32, sin32 = cos, sin
    if excused.any():
        buffer = hf.module.inv_freq
        saved = buffer.clone()
        buffer.copy_(torch.from_numpy(np.where(excused, rope.inv_freq_hf32, tiled)[: theirs.size]))
        try:
            cos32, sin32 = per_pair(hf.module(hf.x, position_ids))
        finally:
            buffer.copy_(saved)
    ours_cos, ours_sin = _rotary_rows(rope, streams, "hf-float32")
    for name, t, ours in (("cos", cos32, ours_cos), ("sin", sin32, ours_sin)):
        assert _ulps_apart(t, ours).max() <= COS_SIN_ULPS, f"hf-float32 {name}: {_ulps_apart(t, ours).max():.3g} ulps"

    # Pairing and blocks: the tower's own rotation against Rope.apply, at patch positions below 32.
    small = streams[:, :, :8]
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, small.shape[-1], 2, rope.head_dim)).astype(np.float32)
    k = rng.standard_normal((1, small.shape[-1], 2, rope.head_dim)).astype(np.float32)
    ids = hf.position_ids(small)
    hq, hk = hf.rotate(torch.from_numpy(q), torch.from_numpy(k), hf.module(hf.x, ids), ids)
    rq, rk = rope.apply(q, k, positions=small, layout="bshd")
    angle = (INV_FREQ_ULPS + 1) * 2.0**-23 * float(small.max()) * float(rope.inv_freq.max()) + 2.0**-21
    for name, t, ours, x in (("q", hq.numpy(), rq, q), ("k", hk.numpy(), rk, k)):
        bound = 2 * rope.attention_factor * float(np.abs(x).max()) * (angle + 2.0**-22)
        error = np.abs(t - ours)
        worst = np.unravel_index(int(np.argmax(error)), error.shape)
        assert error[worst] <= bound, (
            f"rotated {name} [batch, patch, head, channel]={tuple(int(i) for i in worst)}: transformers "
            f"{t[worst]!r}, rotary {ours[worst]!r} (layout {rope.layout}, blocks {rope.blocks})")
