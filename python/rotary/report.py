"""The main job's report: ``python3 -m rotary.report --cli build/rotary --out out [--extra FILE ...]``.

Runs ``rotary-dev demo``, draws the six plots for the model (default Llama-3.1-8B) at its own factor and
lengths, and writes ``out/report.md`` with both (and any extra text files, e.g. the bench tables,
verbatim)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from . import plot


def _error(message: str) -> int:
    print(f"rotary.report: error: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rotary.report")
    parser.add_argument("--cli", required=True, help="path of the rotary-dev executable (its demo)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--preset", default="llama-3.1-8b")
    parser.add_argument("--extra", nargs="*", default=[], help="text files to include verbatim")
    args = parser.parse_args(argv)
    # Every argument checked before the demo runs (it takes a while): one line on stderr, exit 2.
    try:
        model = plot.load_model(preset=args.preset)
    except (ValueError, TypeError) as e:
        return _error(f"--preset: {e}")
    for extra in args.extra:
        if not os.path.isfile(extra):
            return _error(f"--extra {extra!r} is not a file")
    problem = plot.output_folder_problem(args.out)
    if problem is not None:
        return _error(f"--out {args.out!r} {problem}")
    try:
        demo = subprocess.run([args.cli, "demo"], capture_output=True, text=True)
    except OSError as e:
        return _error(f"--cli {args.cli!r} cannot be run: {e.strerror or e}")
    if demo.returncode != 0:
        print(demo.stdout + demo.stderr, file=sys.stderr)
        return 1
    figures = os.path.join(args.out, "figures")
    try:
        paths = plot.plot_all([model], figures)
        lines = ["# rotary report", "", f"Model: {args.preset} ({model.rope!r}; original context {model.original}, "
                 f"context {model.context} = {model.context_source}).", "",
                 "## Demo: schedule, table accuracy, apply accuracy and time", "", "```", demo.stdout.rstrip(), "```",
                 ""]
        for extra in args.extra:
            with open(extra, encoding="utf-8") as f:
                lines += [f"## {os.path.basename(extra)}", "", "```", f.read().rstrip(), "```", ""]
    except OSError as e:
        return _error(f"cannot {'read' if e.filename in args.extra else 'write'} {e.filename!r}: {e.strerror or e}")
    captions = {
        "1": "Long-term decay: RoFormer's relative upper bound of |q·k| against distance, default vs the schedule.",
        "2": f"Angle difference mod 2π of the first pair against distance over the model's {model.context}-token context: the model's first pair wraps (at distance 7 when θ = 1); the monotone schedule ([{plot.HE_XU}]({plot.HE_XU_LINK})) for that context never wraps.",
        "3": "Wavelength of each pair against the model's original and own context; dots mark the pairs the schedule interpolates.",
        "4": "Per-pair frequency ratio to default: the model's own schedule, and linear, NTK, YaRN, Llama 3 and LongRoPE at the model's factor and original length.",
        "5": "Angle error that the stored cos/sin encode (atan2 against the exact angle), for transformers' float32 pipeline and rotary's tables, positions 1 to 2^24 (further for longer models), the model's last position marked.",
        "6": "The precision doctor (rotary.doctor): each pair's wrap distance ceil(2π/inv_freq) and the first position where transformers' float32 angle strays more than 1e-3 rad, against the context; where a bf16 cos/sin cache stops telling adjacent positions apart.",
    }
    lines += ["## Plots", ""]
    for path in paths:
        name = os.path.basename(path)
        lines += [f"![{name}](figures/{name})", "", captions[name[0]], ""]
    report = os.path.join(args.out, "report.md")
    try:
        with open(report, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    except OSError as e:
        return _error(f"--out {args.out!r}: cannot write {report!r}: {e.strerror or e}")
    print(f"report written to {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
