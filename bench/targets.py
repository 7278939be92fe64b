#!/usr/bin/env python3
"""The README's targets, judged from one commit's figures in the results
ledger: what bench/matrix.py, bench/suspend.py and bench/peers.py (cold)
wrote there. Each target says its value, its bound and whether it is met;
a target whose figures are missing says so and counts as not met.

The targets are judged on the H200, first calls, best of 3 or more rounds:
figures of another machine, or of fewer rounds, are judged all the same
and said to be so. Setup before the first copy (<= 10 ms) is not in the
ledger (`bash scripts/gpu.sh device timeline` shows it) and is not judged
here.

Exit status 0 when every target is met, 1 otherwise.

    python3 bench/targets.py --commit C [--ledger bench/results.jsonl] [--machine h200]
"""

from __future__ import annotations

import argparse
import json
import re
import sys

# The bounds the benchmarks print their own verdicts by (both modules need
# only the standard library).
from matrix import OPS, SHAPES, WORST_OVER_BEST
from peers_report import COLD_VS_FASTSAFETENSORS, COLD_VS_RAW_MEDIAN, HOT_VS_H2D, HOT_VS_INSTANTTENSOR

ROUNDS = 3


def figures_of(lines: list, commit: str, machine: str | None) -> dict:
    """{figure: (value, machine)}, the latest line of each for `commit` (on
    machines whose label starts with `machine`, where given)."""
    out = {}
    for x in lines:
        if x.get("commit") == commit and (not machine or x.get("machine", "").startswith(machine)):
            out[x["figure"]] = (x["value"], x.get("machine", ""))
    return out


def best(figures: dict, op: str, shape: str, tool: str):
    """The best-of figure of a matrix row, as (GB/s, rounds), or None."""
    pattern = re.compile(re.escape(f"{op} {shape} {tool} GB/s (best of ") + r"(\d+)\)$")
    for figure, (value, _) in figures.items():
        m = pattern.match(figure)
        if m:
            return value, int(m.group(1))
    return None


def starting(figures: dict, prefix: str):
    """The value of the figure that starts with `prefix`, or None."""
    return next((v for f, (v, _) in figures.items() if f.startswith(prefix)), None)


def judge(figures: dict) -> list:
    """[(target, value or None, bound, met, note)] for every target."""
    out = []

    def add(target: str, value, op: str, bound: float, note: str = "") -> None:
        met = value is not None and (value >= bound if op == ">=" else value <= bound)
        out.append((target, value, f"{op} {bound:g}", met, note if value is not None else "not measured"))

    def ratio(target: str, num, den, bound: float) -> None:
        few = [n for n in (num, den) if n is not None and n[1] < ROUNDS]
        note = f"best of {min(n[1] for n in few)}" if few else ""
        value = num[0] / den[0] if num and den else None
        add(target, value, ">=", bound, note)

    h2d = starting(figures, "pinned host-to-device copies GB/s")
    for shape in SHAPES:
        z = best(figures, "load_file", shape, "zerohop")
        ratio(f"load_file {shape} / InstantTensor", z, best(figures, "load_file", shape, "instanttensor"),
              HOT_VS_INSTANTTENSOR)
        ratio(f"load_file {shape} / pinned H2D", z, (h2d, ROUNDS) if h2d else None, HOT_VS_H2D)
    add("cold load_file / fastsafetensors", starting(figures, "peers cold: zerohop-py / fastsafetensors"), ">=",
        COLD_VS_FASTSAFETENSORS)
    add("cold load_file / the best raw read, medians",
        starting(figures, "peers cold: zerohop-py / the raw-read configuration of the highest median"), ">=",
        COLD_VS_RAW_MEDIAN)
    for op in OPS:
        add(f"{op}: worst shape / best shape", starting(figures, f"{op} zerohop worst shape / best shape"), ">=",
            WORST_OVER_BEST)
    for op, raw in (("checkpoint-save", "raw-16-files"), ("save_file", "raw-1-file-mapped")):
        for shape in SHAPES:
            z = best(figures, op, shape, "zerohop")
            if z is not None:
                ratio(f"{op} {shape} / {raw}", z, best(figures, op, shape, raw), 0.9)
    for row in ("zerohop", "preload-suspend"):
        for step, bound in (("pause", 0.8), ("resume", 0.5)):
            add(f"suspend 16 GiB one tensor, {row}: {step} s",
                starting(figures, f"suspend 16 GiB one tensor, {row} row, first {step} s"), "<=", bound)
    for step, what in (("pause", "checkpoint-process"), ("resume", "restore-process")):
        add(f"{what} 8 GiB one tensor: the driver's time over this",
            starting(figures, f"suspend 8 GiB one tensor, preload row, first {step}: the driver's over this"), ">=", 5)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", required=True, help="the commit whose figures are judged")
    ap.add_argument("--ledger", default="bench/results.jsonl")
    ap.add_argument("--machine", help="only figures of machines whose label starts with this (e.g. h200)")
    args = ap.parse_args()
    with open(args.ledger) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    figures = figures_of(lines, args.commit, args.machine)
    if not figures:
        raise SystemExit(f"no figures of commit {args.commit} in {args.ledger}")
    machines = sorted({m for _, m in figures.values()})
    print(f"commit {args.commit}, machine(s): {', '.join(machines)}")
    if any(not m.startswith("h200") for m in machines):
        print("note: the targets are judged on the H200; figures of other machines only show the way")
    verdicts = judge(figures)
    for target, value, bound, met, note in verdicts:
        shown = "-" if value is None else f"{value:.3f}"
        print(f"{'met' if met else 'NOT met':8} {target}: {shown} ({bound}){f'; {note}' if note else ''}")
    missed = [v for v in verdicts if not v[3]]
    print(f"{len(verdicts) - len(missed)} of {len(verdicts)} targets met")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
