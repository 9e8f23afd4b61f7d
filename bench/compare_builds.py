"""Two builds of rotary timed side by side, alternating, in one session: the record of issue 24's
speed (the angle-from-table rows must be at least as fast after the redesign as at 59e0efc).

    python3 bench/compare_builds.py --old OLD/rotary --new build/rotary-dev [--rounds 7]

Each round runs `<tool> bench --json` for the rows below once per build, old then new then (next
round) new then old; a row's figure is the median over rounds of its median_ns, and the verdict
is the ratio new/old of those medians (and, within each round, of the two runs). A build whose
tool has no `bench` subcommand (the user's `rotary` after the move) is given as its rotary-dev.
"""
import argparse
import json
import statistics
import subprocess
import sys

ROWS = ["--cases", "decode,batched_decode,prefill_k,prefill_q", "--dtypes", "f32", "--pairings", "half",
        "--angles", "table", "--placement", "inplace", "--threads", "1", "--reps", "15", "--json"]


def run(tool):
    out = subprocess.run([tool, "bench", *ROWS], check=True, capture_output=True, text=True).stdout
    return {r["case"]: r["median_ns"] for r in json.loads(out)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    old, new, ratios = {}, {}, {}
    for i in range(a.rounds):
        order = [("old", a.old), ("new", a.new)] if i % 2 == 0 else [("new", a.new), ("old", a.old)]
        got = {name: run(tool) for name, tool in order}
        for case in got["old"]:
            old.setdefault(case, []).append(got["old"][case])
            new.setdefault(case, []).append(got["new"][case])
            ratios.setdefault(case, []).append(got["new"][case] / got["old"][case])
        print(f"round {i + 1}/{a.rounds} done", file=sys.stderr)
    print(f"{'row (f32, half, table, in place, 1 thread)':44} {'old ns':>10} {'new ns':>10} {'new/old':>8} "
          f"{'per-round new/old (min..max)':>30}")
    for case in old:
        o, n = statistics.median(old[case]), statistics.median(new[case])
        r = ratios[case]
        print(f"{case:44} {o:10.1f} {n:10.1f} {n / o:8.3f} {min(r):14.3f} .. {max(r):.3f}")


if __name__ == "__main__":
    main()
