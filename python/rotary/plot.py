"""Analysis plots of RoPE behaviour:
``python3 -m rotary.plot --preset NAME|--config FILE [--compare FILE] --out DIR``.

Every figure describes the model it is given: its schedule, its factor, its original context length
L and its own maximum length (``model_lengths``: the library's rule, rotary::context_length, which
``rotary info``'s float32 drift line and ``rotary doctor`` follow). ``--compare FILE`` draws a second config on the same axes, each series naming its model.
Each figure has a data function returning a ``Figure`` (named series, tested on their numbers);
``draw`` writes any of them as a PNG (matplotlib, Agg backend).

Figure 2 sets the model's first pair against the monotone schedule of He & Xu, "A Simple Derivation
of RoPE for LLMs": one constant scales every frequency so that the angle difference (j - i)·θ mod 2π
grows with the distance j - i over the whole window (their requirement c3). The paper:
https://arxiv.org/search/?query=%22A+Simple+Derivation+of+RoPE%22&searchtype=title

Figure 6 draws the precision doctor's findings (``rotary.doctor``, ``rotary doctor``) pair by pair.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from . import Rope, _rotary

# The monotone schedule's source, as every label and caption cites it.
HE_XU = 'He & Xu, "A Simple Derivation of RoPE for LLMs"'
# The paper's arXiv title search (its identifier is not in this project's sources, so none is
# written here from memory).
HE_XU_LINK = "https://arxiv.org/search/?query=%22A+Simple+Derivation+of+RoPE%22&searchtype=title"


# ---- the model ----

@dataclass(frozen=True)
class Model:
    """A model to draw: its RoPE and the lengths its config states (``model_lengths``).

    Attributes:
        name: what its series are labelled with (the preset's name, or the config file's without .json).
        rope: its RoPE; ``longrope`` and ``dynamic`` resolved at the sequence length ``context``.
        factor: the schedule's factor (LongRoPE: context / original); None when it has none.
        original: L, the context length before any extension.
        context: the model's own maximum length: positions 0 .. context - 1.
        context_source: how the config states ``context`` ("max_position_embeddings",
            "factor 4 x original length 32768", ...).
    """
    name: str
    rope: Rope
    factor: Optional[float]
    original: int
    context: int
    context_source: str


# Positions are < 2^31 (rotary.max_position_limit in C++).
_POSITION_LIMIT = 2 ** 31
# A model whose config states no length at all is drawn over this many positions.
_ASSUMED_CONTEXT = 4096


def _settings(rope: Rope) -> dict[str, Any]:
    """The Spec fields the library resolved the Rope's settings to (its pickle state's keywords)."""
    return dict(rope._impl.__getstate__()[6])


def model_lengths(rope: Rope, max_position_embeddings: int = 0) -> tuple[Optional[float], int, int, str]:
    """(factor, original length L, the model's own length, how the config states it) of a Rope resolved
    from a config whose ``max_position_embeddings`` is given (0: none).

    The model's own length is the library's (rotary::context_length, as ``rotary info``'s drift line
    and ``rotary doctor`` take it): monotone's ``max_length``; for ``yarn`` and ``llama3``, whose
    factor s stretches L, s·L when no larger maximum is stated (Qwen2.5: max_position_embeddings = L =
    32768, factor 4: 131072), else the largest length stated (Llama-3.1: max_position_embeddings
    131072 > L = 8192; LongRoPE's max_position). ``linear`` states no L: its max_position_embeddings
    is the model's length (Gemma 3 states 131072 with factor 8). The factor of ``longrope`` is the
    ratio of its lengths. A length of 0 means the settings state none.
    """
    context, source = _rotary.context_length(rope._impl, int(max_position_embeddings))
    if rope.schedule == "monotone":
        return None, context, context, source
    settings = _settings(rope)
    factor = settings.get("factor")
    max_position = int(settings.get("max_position") or 0)
    original = int(settings.get("original_max_position") or max_position) or context  # Spec::original_length
    if factor is None and rope.schedule == "longrope" and context > original:
        factor = context / original
    return factor, original, context, source


def _max_position_embeddings(config: dict) -> int:
    """The config's max_position_embeddings (0: none), from the language model's settings: text_config
    when the top level has no hidden_size, as the library reads it."""
    text_config = config.get("text_config")
    if "hidden_size" not in config and isinstance(text_config, dict):
        config = text_config
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def load_model(preset: Optional[str] = None, config: Optional[str] = None) -> Model:
    """The Model of a built-in preset or of a config.json path.

    Parameters
    ----------
    preset : str, optional
        A name of ``rotary.preset_names()``.
    config : str, optional
        A ``config.json`` path. Give exactly one of the two.

    Returns
    -------
    Model
        Its Rope, factor, original and own lengths.

    Raises
    ------
    TypeError
        Neither or both given.
    ValueError
        An unknown preset, a config the library refuses or cannot read.
    """
    if (preset is None) == (config is None):
        raise TypeError("load_model takes exactly one of preset and config")

    def resolve(seq_len: Optional[int] = None) -> Rope:
        return Rope.from_preset(preset, seq_len) if preset is not None else Rope.from_hf_config(config, seq_len)

    rope = resolve()  # a config is read by the library first, with its size limit and its errors
    if preset is not None:
        name, settings = preset, json.loads(_rotary.preset_text(preset))["config"]
    else:
        name = os.path.splitext(os.path.basename(config))[0]
        with open(config, encoding="utf-8") as f:
            settings = json.load(f)
    factor, original, context, source = model_lengths(rope, _max_position_embeddings(settings))
    if context <= 0:
        original, context, source = _ASSUMED_CONTEXT, _ASSUMED_CONTEXT, "assumed: the config states no length"
    if rope.schedule in ("longrope", "dynamic"):
        rope = resolve(min(context, _POSITION_LIMIT))  # the schedule the model uses at its own length
    return Model(name, rope, factor, original, context, source)


# ---- data ----

def decay_bound(inv_freq: np.ndarray, max_distance: int) -> tuple[np.ndarray, np.ndarray]:
    """RoFormer §3.4.3: relative upper bound (1/(d/2)) Σ_j |S_j|, S_j = Σ_{k<j} e^{i r θ_k}, against
    the relative distance r = m - n. Decays with distance for the default frequencies."""
    r = np.arange(max_distance + 1, dtype=np.float64)
    return r, _decay_bound_at(inv_freq, r)


def _decay_bound_at(inv_freq: np.ndarray, distances: np.ndarray) -> np.ndarray:
    phases = np.exp(1j * np.outer(distances, inv_freq))
    partial = np.cumsum(phases, axis=1)
    return np.abs(partial).sum(axis=1) / len(inv_freq)


def _wrapped(distances: np.ndarray, theta: float) -> np.ndarray:
    return np.mod(distances * theta, 2 * math.pi)


def angle_difference(inv_freq0: float, max_distance: int) -> tuple[np.ndarray, np.ndarray]:
    """Angle difference (j - i) θ mod 2π of one pair against the distance j - i (He & Xu, figures 1
    and 2). It drops (wraps) whenever (j-i)θ crosses 2π."""
    distance = np.arange(max_distance + 1, dtype=np.float64)
    return distance, _wrapped(distance, inv_freq0)


def first_drop(values: np.ndarray) -> Optional[int]:
    """Index of the first decrease, or None when the sequence never drops."""
    drops = np.nonzero(np.diff(values) < 0)[0]
    return int(drops[0] + 1) if len(drops) else None


def first_wrap(theta: float, window: int) -> Optional[int]:
    """The first distance < window at which (distance·θ) mod 2π drops, or None: among distances 0 ..
    floor(2π/θ) + 1, as ``angle_difference`` draws them. Below floor(2π/θ) - 1 the angle d·θ stays
    under 2π - θ and only grows, so only the last few distances are computed (the answer of the
    whole curve, without its 2π/θ points: 16 GB for θ = 2^-28 at a 2^31 window)."""
    last = min(window - 1, math.floor(2 * math.pi / theta) + 1) if theta > 0 else 0
    first = max(0, last - 4)
    drop = first_drop(_wrapped(np.arange(first, last + 1, dtype=np.float64), theta))
    return None if drop is None else first + drop


def _default_rope(rope: Rope) -> Rope:
    return Rope(rope.head_dim, rope.rotary_dim, rope.base)


def wavelengths(rope: Rope) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair: wavelength in tokens of the default and of the chosen schedule, and the ratio."""
    plain = _default_rope(rope).inv_freq
    with np.errstate(divide="ignore"):  # proportional RoPE's tail: inv_freq 0, an infinite wavelength
        return 2 * math.pi / plain, 2 * math.pi / rope.inv_freq, rope.inv_freq / plain


def schedule_ratios(head_dim: int, base: float, original: int, factor: float) -> dict[str, np.ndarray]:
    """Per-pair inv_freq / default for linear, NTK, YaRN, Llama 3 and LongRoPE at one factor."""
    half = head_dim // 2
    plain = Rope(head_dim, base=base).inv_freq
    ramp = np.linspace(1.0, factor, half)  # an illustrative LongRoPE long_factor list: 1 .. factor
    # LongRoPE's long frequencies are inv_freq / long_factor whatever its lengths: a shorter original
    # keeps max_position = factor * original within rotary's 2^31 positions (a model of 2^30 tokens
    # drawn at factor 2 would need 2^31 + 2).
    longrope_original = max(1, min(original, int(_POSITION_LIMIT // factor)))
    longrope_max = max(longrope_original + 1, min(int(longrope_original * factor), _POSITION_LIMIT))
    ropes = {
        "linear (PI)": Rope(head_dim, base=base, schedule="linear", factor=factor),
        "NTK-aware": Rope(head_dim, base=base, schedule="ntk", factor=factor),
        "YaRN": Rope(head_dim, base=base, schedule="yarn", factor=factor, original_max_position=original),
        "Llama 3": Rope(head_dim, base=base, schedule="llama3", factor=factor, low_freq_factor=1.0,
                        high_freq_factor=4.0, original_max_position=original),
        "LongRoPE (long factors 1..s)": Rope(head_dim, base=base, schedule="longrope",
                                             original_max_position=longrope_original, max_position=longrope_max,
                                             short_factor=[1.0] * half, long_factor=list(ramp), seq_len=longrope_max),
    }
    return {name: r.inv_freq / plain for name, r in ropes.items()}


# 80 significant digits of pi, for the exact reference angles below.
_PI = "3.1415926535897932384626433832795028841971693993751058209749445923078164062862090"


def exact_angle_mod_2pi(position: int, inv_freq: float) -> float:
    """p * inv_freq reduced into [-pi, pi), exactly (Decimal, 80 digits; the double inv_freq and the
    integer p are exact rationals), then rounded to double."""
    from decimal import Decimal, localcontext
    with localcontext() as context:  # the caller's decimal context stays as it was
        context.prec = 80
        two_pi = 2 * Decimal(_PI)
        angle = Decimal(int(position)) * Decimal(float(inv_freq))  # exact: Decimal(float) is exact
        turns = (angle / two_pi).to_integral_value()
        reduced = angle - turns * two_pi
        if reduced >= Decimal(_PI):
            reduced -= two_pi
        return float(reduced)


def effective_angle_error(positions, inv_freq, cos, sin) -> np.ndarray:
    """Per position, the worst over pairs of |atan2(sin, cos) - exact angle| (mod 2pi): the angle
    error that stored cos/sin values (any scale) really encode."""
    out = []
    for row, p in enumerate(positions):
        worst = 0.0
        for i, theta in enumerate(inv_freq):
            encoded = math.atan2(float(sin[row, i]), float(cos[row, i]))
            d = (encoded - exact_angle_mod_2pi(int(p), float(theta)) + math.pi) % (2 * math.pi) - math.pi
            worst = max(worst, abs(d))
        out.append(worst)
    return np.asarray(out)


def angle_errors(rope: Rope, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(transformers' float32 pipeline, rotary's exact tables): effective angle error per position, same
    yardstick. The float32 pipeline is the library's ``numerics="hf-float32"`` table, what ``rotary
    info``'s drift line and ``float32_drift`` measure."""
    c32, s32 = rope.table(positions, numerics="hf-float32")
    c, s = rope.table(positions)
    return (effective_angle_error(positions, rope.inv_freq, c32, s32),
            effective_angle_error(positions, rope.inv_freq, c, s))


def float32_drift(model: Model) -> tuple[int, float, int, float]:
    """transformers' float32 pipeline at the model's last position (rotary's last, 2^31 - 1, when the
    model's lies beyond), as ``rotary info`` gives it: (position, worst angle error in radians, its
    pair, worst cos/sin error in float32 ulps)."""
    position = min(model.context, _POSITION_LIMIT) - 1
    angle, pair, ulps = _rotary.float32_drift(model.rope._impl, position)
    return position, angle, pair, ulps


# ---- figures: data ----

@dataclass
class Series:
    """One curve: ``style`` holds matplotlib keywords; ``scatter`` draws points, not a line."""
    label: str
    x: np.ndarray
    y: np.ndarray
    style: dict[str, Any] = field(default_factory=dict)
    scatter: bool = False


@dataclass
class Line:
    """A reference line across the axes, at ``at`` on the y axis (hlines) or the x axis (vlines)."""
    at: float
    label: str
    style: dict[str, Any] = field(default_factory=dict)


@dataclass
class Figure:
    """What one figure draws; ``draw`` turns it into a PNG named ``file``."""
    file: str
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    hlines: list[Line] = field(default_factory=list)
    vlines: list[Line] = field(default_factory=list)
    xscale: tuple[str, dict[str, Any]] = ("linear", {})
    yscale: tuple[str, dict[str, Any]] = ("linear", {})
    xlim: Optional[tuple[float, float]] = None


def _colors(k: int) -> tuple[str, str]:
    """The two colours of model k's series (its schedule, its reference)."""
    return f"C{2 * k}", f"C{2 * k + 1}"


def _describe(model: Model) -> str:
    """'NAME (llama3, factor 8)': the model and its schedule."""
    factor = f", factor {model.factor:g}" if model.factor is not None else ""
    return f"{model.name} ({model.rope.schedule}{factor})"


def _names(models: Sequence[Model]) -> str:
    return " vs ".join(m.name for m in models)


def decay_figure(models: Sequence[Model], max_points: int = 1 << 12) -> Figure:
    """Figure 1: RoFormer's long-term decay bound of each model's default and schedule frequencies,
    out to the longest model's context (at least 4096, at most 65536 distances; sampled beyond
    max_points as ``_distances`` does)."""
    span = min(max(max(m.context for m in models), 4096), 65536)
    d = _distances(span + 1, max_points)
    series = []
    for k, m in enumerate(models):
        mine, reference = _colors(k)
        for label, rope, style in ((f"{m.name}: default (base {m.rope.base:g})", _default_rope(m.rope),
                                    {"color": reference, "ls": "--"}),
                                   (_describe(m), m.rope, {"color": mine})):
            series.append(Series(label, d, _decay_bound_at(rope.inv_freq, d), {"lw": 0.8, **style}))
    return Figure("1_long_term_decay.png", f"Long-term decay of RoPE attention with distance ({_names(models)})",
                  "relative distance m - n (tokens)", "relative upper bound of |q·k| (RoFormer §3.4.3)", series,
                  xscale=("symlog", {"linthresh": 16}))


def _distances(window: int, max_points: int) -> np.ndarray:
    """0 .. window - 1: all of them up to max_points, else the first max_points/2 and max_points/2
    more spread geometrically up to the last."""
    if window <= max_points:
        return np.arange(window, dtype=np.float64)
    head = np.arange(max_points // 2, dtype=np.float64)
    tail = np.round(np.geomspace(max_points // 2, window - 1, max_points // 2))
    return np.unique(np.concatenate([head, tail]))


def monotone_rope(model: Model) -> Rope:
    """He & Xu's monotone schedule for the model's head and base over its whole context (rotary's 2^31
    positions at most, the longest schedule the library builds)."""
    rope = model.rope
    return Rope(rope.head_dim, rope.rotary_dim, rope.base, schedule="monotone",
                max_length=min(model.context, _POSITION_LIMIT))


def wrap_figure(models: Sequence[Model], max_points: int = 1 << 14) -> Figure:
    """Figure 2: angle difference mod 2π of each model's first pair over the model's own context
    (distances 0 .. context - 1, sampled beyond max_points), against He & Xu's monotone schedule for
    that context, which never wraps inside it."""
    series, vlines = [], []
    for k, m in enumerate(models):
        mine, reference = _colors(k)
        d = _distances(m.context, max_points)
        theta = float(m.rope.inv_freq[0])
        wrap = first_wrap(theta, m.context)
        when = f"first wraps at distance {wrap}" if wrap is not None else f"never wraps within {m.context}"
        series.append(Series(f"{m.name}: pair 0 of {m.rope.schedule} (θ = {theta:.4g}, {when})", d,
                             _wrapped(d, theta), {"color": mine, "lw": 0.5}))
        mono = float(monotone_rope(m).inv_freq[0])
        span = f"its {m.context}-token context" if m.context <= _POSITION_LIMIT else "2^31 positions"
        series.append(Series(f"{m.name}: monotone (He & Xu) for {span} (θ = {mono:.3g})", d,
                             _wrapped(d, mono), {"color": reference, "lw": 1.5}))
        vlines.append(Line(m.context - 1, f"{m.name}: last distance {m.context - 1}",
                           {"color": reference, "ls": ":", "lw": 0.8}))
    longest = max(m.context for m in models)
    return Figure("2_angle_difference_wrap.png",
                  f"Angle difference of the first pair over the model's context: the model's wraps; the monotone "
                  f"schedule of {HE_XU} does not",
                  "distance j - i (tokens)", "angle difference (j - i)·θ mod 2π (rad)", series,
                  hlines=[Line(2 * math.pi, "2π", {"color": "grey", "ls": ":", "lw": 0.8})], vlines=vlines,
                  xscale=("symlog", {"linthresh": 8}) if longest > 256 else ("linear", {}), xlim=(0, longest))


def wavelength_figure(models: Sequence[Model]) -> Figure:
    """Figure 3: wavelength 2π/θ_i of each pair, default and schedule, against each model's original
    and own context lengths; dots mark the pairs its schedule interpolates (frequency lowered)."""
    series, hlines = [], []
    for k, m in enumerate(models):
        mine, reference = _colors(k)
        plain_w, sched_w, ratio = wavelengths(m.rope)
        pairs = np.arange(len(plain_w), dtype=np.float64)
        series.append(Series(f"{m.name}: default wavelength", pairs, plain_w, {"color": reference, "ls": "--"}))
        series.append(Series(f"{_describe(m)} wavelength", pairs, sched_w, {"color": mine}))
        lowered = (ratio < 1 - 1e-12) & (ratio > 0)
        series.append(Series(f"{m.name}: pairs the schedule interpolates", pairs[lowered], sched_w[lowered],
                             {"s": 10, "color": mine, "zorder": 3}, scatter=True))
        hlines.append(Line(m.original, f"{m.name}: original context {m.original}",
                           {"color": mine, "ls": "--", "lw": 0.8}))
        hlines.append(Line(m.context, f"{m.name}: context {m.context} ({m.context_source})",
                           {"color": mine, "ls": ":", "lw": 0.8}))
    return Figure("3_wavelengths.png", "Wavelength of each rotary pair against the model's context lengths",
                  "pair index i", "wavelength 2π/θ_i (tokens)", series, hlines=hlines, yscale=("log", {}))


def schedule_factor(model: Model) -> tuple[float, bool]:
    """(the factor figure 4 draws the schedules at, whether it is the model's own): its own factor when
    it scales (> 1), else its length ratio, at least 2 (an illustration)."""
    if model.factor is not None and model.factor > 1:
        return model.factor, True
    return max(model.context / model.original, 2.0), False


def schedule_figure(models: Sequence[Model]) -> Figure:
    """Figure 4: each model's own per-pair inv_freq / default, and linear, NTK, YaRN, Llama 3 and
    LongRoPE at the first model's factor, original length L and rotary_dim."""
    first = models[0]
    factor, own = schedule_factor(first)
    series = []
    ratios = schedule_ratios(first.rope.rotary_dim, first.rope.base, first.original, factor)
    for j, (label, values) in enumerate(ratios.items()):  # colours after the models' (_colors)
        series.append(Series(f"{label} at factor {factor:g}, L = {first.original}",
                             np.arange(len(values), dtype=np.float64), values,
                             {"lw": 0.8, "ls": "--", "color": f"C{4 + j}"}))
    for k, m in enumerate(models):
        ratio = wavelengths(m.rope)[2]
        ratio = np.where(ratio > 0, ratio, np.nan)  # proportional RoPE's unrotated tail has no logarithm
        series.append(Series(f"{_describe(m)}: its own", np.arange(len(ratio), dtype=np.float64), ratio,
                             {"lw": 2.2, "color": _colors(k)[0]}))
    which = f"{first.name}'s factor" if own else f"illustrative factor ({first.name} has none)"
    return Figure("4_schedule_ratios.png",
                  f"Per-pair frequency scaling: {_names(models)}, and the long-context schedules at {which} "
                  f"{factor:g}, L = {first.original}",
                  "pair index i", "inv_freq / default inv_freq", series, yscale=("log", {}))


def float32_positions(models: Sequence[Model]) -> np.ndarray:
    """1 .. 2^24 in 97 geometric steps, further when a model's context is longer (up to 2^31 - 1)."""
    top = max(24.0, math.log2(max(m.context for m in models)))
    positions = np.unique(np.logspace(0, top, 97, base=2).astype(np.int64))
    return np.minimum(positions, _POSITION_LIMIT - 1)


def float32_figure(models: Sequence[Model]) -> Figure:
    """Figure 5: the angle error the stored cos/sin encode, transformers' float32 pipeline against
    rotary's tables, for each model, with each model's last position marked with ``float32_drift``."""
    positions = float32_positions(models)
    x = positions.astype(np.float64)
    floor = 2.0 ** -60  # exact values plot here (a zero has no logarithm)
    series, vlines = [], []
    for k, m in enumerate(models):
        mine, reference = _colors(k)
        err32, err_rotary = angle_errors(m.rope, positions)
        series.append(Series(f"{m.name}: float32 pipeline (transformers): cos/sin of fl32(θ_fl32·fl32(p))", x,
                             np.maximum(err32, floor), {"color": mine, "marker": ".", "lw": 1}))
        series.append(Series(f"{m.name}: rotary: exact angle, cos/sin within 1 float32 ulp", x,
                             np.maximum(err_rotary, floor), {"color": reference, "marker": ".", "lw": 1}))
        position, angle, _, _ = float32_drift(m)
        vlines.append(Line(position, f"{m.name}: last position {position} ({m.context_source}), float32 pipeline "
                           f"off by {angle:.3g} rad", {"color": mine, "ls": "--", "lw": 0.8}))
    return Figure("5_float32_angle_error.png", f"Angle error the stored cos/sin encode, against position "
                  f"({_names(models)})", "position p", "worst angle error over pairs (rad), from atan2(sin, cos)",
                  series, hlines=[Line(2 ** -24, "2^-24 (half a float32 ulp of 1)", {"color": "grey", "ls": ":",
                                                                                     "lw": 0.8})],
                  vlines=vlines, xscale=("log", {}), yscale=("log", {}))


def doctor_report(model: Model) -> dict[str, Any]:
    """The precision doctor's report for the model's settings over its own context (rotary's 2^31
    positions at most): ``rotary.doctor``'s dict, the library's, as ``rotary doctor --json`` prints it."""
    return json.loads(_rotary.doctor_rope(model.rope._impl, min(model.context, _POSITION_LIMIT)))


def doctor_figure(models: Sequence[Model]) -> Figure:
    """Figure 6: the precision doctor pair by pair, in tokens, against each model's context: each
    pair's wrap distance ceil(2π/θ_i) (pairs under the context line wrap inside it, where He & Xu's c3
    fails), the first position where transformers' float32 angle strays more than 1e-3 rad from the
    exact one (pairs that never stray within the context are left out; the label gives the worst
    error at the last position), and the first position a bf16 cos/sin cache cannot tell from the
    next."""
    series, hlines = [], []
    for k, m in enumerate(models):
        mine, reference = _colors(k)
        report = doctor_report(m)
        drift, bf16 = report["float32_drift"], report["bf16_resolution"]
        wrap = np.array([np.nan if w is None else w for w in report["wrap_distance"]], dtype=np.float64)
        series.append(Series(f"{m.name}: wrap distance ceil(2π/θ_i) ({len(report['wrapping_pairs'])} of {len(wrap)} "
                             f"pairs wrap inside the context)", np.arange(len(wrap), dtype=np.float64), wrap,
                             {"color": reference, "lw": 1.2}))
        first = drift["first_position_per_pair"]
        straying = [j for j, p in enumerate(first) if p is not None]
        series.append(Series(f"{m.name}: first position where transformers' float32 angle strays > "
                             f"{drift['threshold_rad']:g} rad ({drift['max_rad_at_context']:.3g} rad at the last "
                             f"position {drift['last_position']})", np.array(straying, dtype=np.float64),
                             np.array([first[j] for j in straying], dtype=np.float64),
                             {"color": mine, "s": 12, "zorder": 3}, scatter=True))
        hlines.append(Line(m.context, f"{m.name}: context {m.context} ({m.context_source})",
                           {"color": mine, "ls": ":", "lw": 0.8}))
        if bf16["first_position"] is not None:
            p = bf16["first_position"]
            hlines.append(Line(p, f"{m.name}: a bf16 cos/sin cache cannot tell position {p} from {p + 1} (pair "
                               f"{bf16['pair']})", {"color": mine, "ls": "-.", "lw": 0.8}))
    return Figure("6_precision_doctor.png", f"Precision doctor: where each pair wraps and where transformers' "
                  f"float32 angles stray, against the context ({_names(models)})", "pair index i",
                  "tokens (distance or position)", series, hlines=hlines, yscale=("log", {}))


def figures(models: Sequence[Model]) -> list[Figure]:
    """The six figures' data for one model, or several on the same axes."""
    if not models:
        raise ValueError("figures needs at least one model")
    return [decay_figure(models), wrap_figure(models), wavelength_figure(models), schedule_figure(models),
            float32_figure(models), doctor_figure(models)]


# ---- figures: drawing ----

def draw(figure: Figure, path: str, dpi: int = 110) -> None:
    """Write the figure as a PNG at ``path`` (matplotlib, Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=dpi)
    try:  # the legend below the axes: the curves stay visible however many series there are
        for s in figure.series:
            if s.scatter:
                ax.scatter(s.x, s.y, label=s.label, **s.style)
            else:
                ax.plot(s.x, s.y, label=s.label, **s.style)
        for line in figure.hlines:
            ax.axhline(line.at, label=line.label, **line.style)
        for line in figure.vlines:
            ax.axvline(line.at, label=line.label, **line.style)
        ax.set_xscale(figure.xscale[0], **figure.xscale[1])
        ax.set_yscale(figure.yscale[0], **figure.yscale[1])
        if figure.xlim is not None:
            ax.set_xlim(*figure.xlim)
        ax.set_xlabel(figure.xlabel)
        ax.set_ylabel(figure.ylabel)
        ax.set_title(textwrap.fill(figure.title, 100), fontsize=9)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=7)
        fig.savefig(path, bbox_inches="tight")
    finally:
        plt.close(fig)


def plot_all(models: Sequence[Model], out_dir: str, dpi: int = 110) -> list[str]:
    """Draw the six figures of the models (one, or several on the same axes) into out_dir; the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for figure in figures(models):
        paths.append(os.path.join(out_dir, figure.file))
        draw(figure, paths[-1], dpi)
    return paths


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rotary.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--preset", help="built-in preset name")
    group.add_argument("--config", help="a Hugging Face config.json")
    parser.add_argument("--compare", metavar="FILE", help="a second config.json, drawn on the same axes")
    parser.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args(argv)
    try:
        models = [load_model(preset=args.preset, config=args.config)]
        if args.compare is not None:
            models.append(load_model(config=args.compare))
    except (ValueError, TypeError, OSError) as e:
        print(f"rotary.plot: error: {e}", file=sys.stderr)
        return 2
    problem = output_folder_problem(args.out)
    if problem is not None:
        print(f"rotary.plot: error: --out {args.out!r} {problem}", file=sys.stderr)
        return 2
    try:
        paths = plot_all(models, args.out)
    except OSError as e:  # the folder was writable a moment ago: a full disk, a file in the way ...
        print(f"rotary.plot: error: --out {args.out!r}: cannot write {_show_path(e)}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def output_folder_problem(out: str) -> Optional[str]:
    """Makes the folder ``out`` (and its parents) for the figures; None when it is a writable folder,
    else what is wrong with it (one phrase, for ``--out PATH <phrase>``)."""
    try:
        os.makedirs(out, exist_ok=True)
    except FileExistsError:
        return "is a file, not a folder"
    except OSError as e:
        return f"cannot be made: {e.strerror or e}"
    if not os.path.isdir(out):
        return "is not a folder"
    if not os.access(out, os.W_OK | os.X_OK):
        return "is not writable"
    return None


def _show_path(e: OSError) -> str:
    return repr(e.filename) if e.filename is not None else "a figure"


if __name__ == "__main__":
    sys.exit(main())
