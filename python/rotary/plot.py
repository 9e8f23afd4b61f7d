"""Analysis plots of RoPE behaviour: ``python3 -m rotary.plot --preset NAME|--config FILE --out DIR``.

Each figure has a data function (tested on its numbers) and a drawing function (PNG, matplotlib).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Optional

import numpy as np

from . import Rope


# ---- data ----

def decay_bound(inv_freq: np.ndarray, max_distance: int) -> tuple[np.ndarray, np.ndarray]:
    """RoFormer §3.4.3: relative upper bound (1/(d/2)) Σ_j |S_j|, S_j = Σ_{k<j} e^{i r θ_k}, against
    the relative distance r = m - n. Decays with distance for the default frequencies."""
    r = np.arange(max_distance + 1, dtype=np.float64)
    phases = np.exp(1j * np.outer(r, inv_freq))
    partial = np.cumsum(phases, axis=1)
    return r, np.abs(partial).sum(axis=1) / len(inv_freq)


def angle_difference(inv_freq0: float, max_distance: int) -> tuple[np.ndarray, np.ndarray]:
    """Angle difference (j - i) θ mod 2π of one pair against the distance j - i ("A Simple
    Derivation of RoPE", figures 1 and 2). It drops (wraps) whenever (j-i)θ crosses 2π."""
    distance = np.arange(max_distance + 1, dtype=np.float64)
    return distance, np.mod(distance * inv_freq0, 2 * math.pi)


def first_drop(values: np.ndarray) -> Optional[int]:
    """Index of the first decrease, or None when the sequence never drops."""
    drops = np.nonzero(np.diff(values) < 0)[0]
    return int(drops[0] + 1) if len(drops) else None


def wavelengths(rope: Rope) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair: wavelength in tokens of the default and of the chosen schedule, and the ratio."""
    plain = Rope(rope.head_dim, rope.rotary_dim, rope.base).inv_freq
    return 2 * math.pi / plain, 2 * math.pi / rope.inv_freq, rope.inv_freq / plain


def schedule_ratios(head_dim: int, base: float, original: int, factor: float) -> dict[str, np.ndarray]:
    """Per-pair inv_freq / default for linear, NTK, YaRN, Llama 3 and LongRoPE at one factor."""
    half = head_dim // 2
    plain = Rope(head_dim, base=base).inv_freq
    ramp = np.linspace(1.0, factor, half)  # an illustrative LongRoPE long_factor list: 1 .. factor
    ropes = {
        "linear (PI)": Rope(head_dim, base=base, schedule="linear", factor=factor),
        "NTK-aware": Rope(head_dim, base=base, schedule="ntk", factor=factor),
        "YaRN": Rope(head_dim, base=base, schedule="yarn", factor=factor, original_max_position=original),
        "Llama 3": Rope(head_dim, base=base, schedule="llama3", factor=factor, low_freq_factor=1.0,
                        high_freq_factor=4.0, original_max_position=original),
        "LongRoPE (long factors 1..s)": Rope(head_dim, base=base, schedule="longrope", original_max_position=original,
                                             max_position=int(original * factor), short_factor=[1.0] * half,
                                             long_factor=list(ramp), seq_len=int(original * factor)),
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


def float32_pipeline_table(inv_freq: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers' float32 pipeline: angle fl32(fl32(theta) fl32(p)), cos/sin rounded to float32."""
    angle = (inv_freq.astype(np.float32)[None, :] * positions.astype(np.float32)[:, None]).astype(np.float32)
    return np.cos(angle.astype(np.float64)).astype(np.float32), np.sin(angle.astype(np.float64)).astype(np.float32)


def angle_errors(rope: Rope, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float32 pipeline, rotary's tables): effective angle error per position, same yardstick."""
    c32, s32 = float32_pipeline_table(rope.inv_freq, positions)
    c, s = rope.table(positions)
    return (effective_angle_error(positions, rope.inv_freq, c32, s32),
            effective_angle_error(positions, rope.inv_freq, c, s))


# ---- figures ----

def _figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    return plt, fig, ax


def plot_all(rope: Rope, name: str, out_dir: str, original: int, context: int) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    base_rope = Rope(rope.head_dim, rope.rotary_dim, rope.base)

    plt, fig, ax = _figure()
    span = min(max(context, 4096), 65536)
    for label, r in ((f"default (base {rope.base:g})", base_rope), (f"{name} ({rope.schedule})", rope)):
        d, bound = decay_bound(r.inv_freq, span)
        ax.plot(d, bound, lw=0.8, label=label)
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xlabel("relative distance m - n (tokens)")
    ax.set_ylabel("relative upper bound of |q·k| (RoFormer §3.4.3)")
    ax.set_title("Long-term decay of RoPE attention with distance")
    ax.legend()
    paths.append(os.path.join(out_dir, "1_long_term_decay.png"))
    fig.tight_layout(); fig.savefig(paths[-1]); plt.close(fig)

    plt, fig, ax = _figure()
    window = 64
    mono = Rope(rope.head_dim, rope.rotary_dim, rope.base, schedule="monotone", max_length=window)
    for label, theta in (("default, pair 0 (θ = 1 rad/token)", base_rope.inv_freq[0]),
                         (f"monotone for a {window}-token window (θ = {mono.inv_freq[0]:.3f})", mono.inv_freq[0])):
        d, angle = angle_difference(theta, window - 1)
        ax.plot(d, angle, marker=".", lw=1, label=label)
    ax.axhline(2 * math.pi, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("distance j - i (tokens)")
    ax.set_ylabel("angle difference (j - i)·θ mod 2π (rad)")
    ax.set_title("Angle difference wraps for the default frequency; the monotone schedule never wraps")
    ax.legend(loc="lower right")
    paths.append(os.path.join(out_dir, "2_angle_difference_wrap.png"))
    fig.tight_layout(); fig.savefig(paths[-1]); plt.close(fig)

    plt, fig, ax = _figure()
    plain_w, sched_w, ratio = wavelengths(rope)
    pairs = np.arange(len(plain_w))
    ax.semilogy(pairs, plain_w, label="default wavelength")
    ax.semilogy(pairs, sched_w, label=f"{name} ({rope.schedule}) wavelength")
    interpolated = ratio < 1 - 1e-12
    ax.scatter(pairs[interpolated], sched_w[interpolated], s=10, color="C3", zorder=3,
               label="pairs the schedule interpolates (frequency lowered)")
    ax.axhline(original, color="grey", ls="--", lw=0.8, label=f"original context {original}")
    ax.axhline(context, color="black", ls=":", lw=0.8, label=f"extended context {context}")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/θ_i (tokens)")
    ax.set_title("Wavelength of each rotary pair against the context lengths")
    ax.legend(fontsize=8)
    paths.append(os.path.join(out_dir, "3_wavelengths.png"))
    fig.tight_layout(); fig.savefig(paths[-1]); plt.close(fig)

    plt, fig, ax = _figure()
    factor = max(context / original, 2.0)
    for label, values in schedule_ratios(rope.rotary_dim, rope.base, original, factor).items():
        ax.plot(values, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("inv_freq / default inv_freq")
    ax.set_title(f"Per-pair frequency scaling of long-context schedules (factor {factor:g}, L = {original})")
    ax.legend(fontsize=8)
    paths.append(os.path.join(out_dir, "4_schedule_ratios.png"))
    fig.tight_layout(); fig.savefig(paths[-1]); plt.close(fig)

    plt, fig, ax = _figure()
    positions = np.unique(np.logspace(0, 24, 97, base=2).astype(np.int64))
    err32, err_rotary = angle_errors(rope, positions)
    floor = 2.0 ** -60  # exact values plot here (a zero has no logarithm)
    ax.loglog(positions, np.maximum(err32, floor), marker=".", lw=1,
              label="float32 pipeline (transformers): cos/sin of fl32(fl32(θ)·fl32(p))")
    ax.loglog(positions, np.maximum(err_rotary, floor), marker=".", lw=1,
              label="rotary: exact angle, cos/sin within 1 float32 ulp")
    ax.axhline(2 ** -24, color="grey", ls=":", lw=0.8, label="2^-24 (half a float32 ulp of 1)")
    ax.set_xlabel("position p")
    ax.set_ylabel("worst angle error over pairs (rad), from atan2(sin, cos)")
    ax.set_title(f"Angle error the stored cos/sin encode, against position ({name})")
    ax.legend(fontsize=8)
    paths.append(os.path.join(out_dir, "5_float32_angle_error.png"))
    fig.tight_layout(); fig.savefig(paths[-1]); plt.close(fig)
    return paths


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rotary.plot", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--preset", help="built-in preset name")
    group.add_argument("--config", help="a Hugging Face config.json")
    parser.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args(argv)
    try:
        if args.preset:
            rope, name = Rope.from_preset(args.preset), args.preset
        else:
            rope, name = Rope.from_hf_config(args.config), os.path.basename(args.config)
        config = _model_lengths(args)
    except (ValueError, TypeError, OSError) as e:
        print(f"rotary.plot: error: {e}", file=sys.stderr)
        return 2
    for path in plot_all(rope, name, args.out, *config):
        print(path)
    return 0


def _model_lengths(args) -> tuple[int, int]:
    """(original context, extended context) from the config or preset."""
    import json
    if args.preset:
        text = _rotary_preset_config(args.preset)
    else:
        with open(args.config, encoding="utf-8") as f:
            text = json.load(f)
    scaling = text.get("rope_scaling") or text.get("rope_parameters") or {}
    maximum = int(text.get("max_position_embeddings") or 4096)
    original = int(scaling.get("original_max_position_embeddings") or text.get("original_max_position_embeddings") or maximum)
    return original, maximum


def _rotary_preset_config(name: str) -> dict:
    import json
    from . import _rotary
    return json.loads(_rotary.preset_text(name))["config"]


if __name__ == "__main__":
    sys.exit(main())
