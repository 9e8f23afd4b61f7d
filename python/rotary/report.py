"""The main job's report: ``python3 -m rotary.report --cli build/rotary --out out [--extra FILE ...]``.

Runs ``rotary demo``, draws the five plots for the default model (Llama-3.1-8B), and writes
``out/report.md`` with both (and any extra text files, e.g. the bench tables, verbatim)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from . import Rope, plot


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rotary.report")
    parser.add_argument("--cli", required=True, help="path of the rotary executable")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--preset", default="llama-3.1-8b")
    parser.add_argument("--extra", nargs="*", default=[], help="text files to include verbatim")
    args = parser.parse_args(argv)
    demo = subprocess.run([args.cli, "demo"], capture_output=True, text=True)
    if demo.returncode != 0:
        print(demo.stdout + demo.stderr, file=sys.stderr)
        return 1
    rope = Rope.from_preset(args.preset)
    figures = os.path.join(args.out, "figures")
    paths = plot.plot_all(rope, args.preset, figures, 8192, 131072)
    lines = ["# rotary report", "", f"Default model: {args.preset} ({rope!r}).", "",
             "## Demo: schedule, table accuracy, apply accuracy and time", "", "```", demo.stdout.rstrip(), "```", ""]
    for extra in args.extra:
        if os.path.exists(extra):
            with open(extra, encoding="utf-8") as f:
                lines += [f"## {os.path.basename(extra)}", "", "```", f.read().rstrip(), "```", ""]
    captions = {
        "1": "Long-term decay: RoFormer's relative upper bound of |q·k| against distance, default vs the schedule.",
        "2": "Angle difference mod 2π of the first pair against distance: the default wraps at distance 7; the monotone schedule never wraps inside its window.",
        "3": "Wavelength of each pair against the original and extended context; dots mark the pairs the schedule interpolates.",
        "4": "Per-pair frequency ratio to default for linear, NTK, YaRN, Llama 3 and LongRoPE at one factor.",
        "5": "Angle error that the stored cos/sin encode (atan2 against the exact angle), for transformers' float32 pipeline and rotary's tables, positions 1 to 2^24.",
    }
    lines += ["## Plots", ""]
    for path in paths:
        name = os.path.basename(path)
        lines += [f"![{name}](figures/{name})", "", captions[name[0]], ""]
    report = os.path.join(args.out, "report.md")
    with open(report, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"report written to {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
