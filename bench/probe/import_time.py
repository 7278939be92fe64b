#!/usr/bin/env python3
"""What `import zerohop` costs a process that already made torch's CUDA
context, and where it goes: fresh processes time the import (wall ms) with
the background prepare on (`ZEROHOP_PREPARE` unset) and off (`=0`), then
one `python3 -X importtime` run lists the modules the import loaded that
took longest (self time, with their cumulative time), and how long the
native module's `dlopen` alone takes.

    python3 bench/probe/import_time.py [--runs 3] [--top 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

CHILD = r"""
import time, torch
torch.zeros(1, device="cuda") if torch.cuda.is_available() else None
t = time.perf_counter()
import zerohop
print(f"{(time.perf_counter() - t) * 1e3:.2f}")
"""

DLOPEN = r"""
import ctypes, importlib.util, time, torch
torch.zeros(1, device="cuda") if torch.cuda.is_available() else None
spec = importlib.util.find_spec("zerohop")
import glob, os
so = glob.glob(os.path.join(os.path.dirname(spec.origin), "_native*.so"))[0]
t = time.perf_counter()
ctypes.CDLL(so)
print(f"{(time.perf_counter() - t) * 1e3:.2f} {os.path.getsize(so) / 2**20:.1f}")
"""


def run(code: str, env: dict) -> str:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()
    for label, extra in (("prepare at import", {}), ("ZEROHOP_PREPARE=0", {"ZEROHOP_PREPARE": "0"})):
        env = {k: v for k, v in os.environ.items() if k != "ZEROHOP_PREPARE"} | extra
        ms = [float(run(CHILD, env)) for _ in range(args.runs)]
        print(f"import zerohop, {label}: best {min(ms):.2f} ms, median {statistics.median(ms):.2f} "
              f"({', '.join(f'{m:.1f}' for m in ms)})")
    for _ in range(2):
        ms, mib = run(DLOPEN, dict(os.environ)).split()
        print(f"dlopen of the native module alone ({mib} MiB): {ms} ms")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", CHILD], capture_output=True, text=True,
                         check=True, env={**os.environ, "ZEROHOP_PREPARE": "0"})
    rows = []
    seen_torch = False
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[0].strip().split(":")[-1].strip().isdigit():
            continue
        self_us, cum_us, name = int(parts[0].split(":")[-1]), int(parts[1]), parts[2].rstrip()
        # What was imported after torch's own line: `import zerohop`, and
        # anything the first CUDA tensor pulled in.
        if name.strip() == "torch":
            seen_torch = True
            rows = []
            continue
        if seen_torch:
            rows.append((self_us, cum_us, name))
    print(f"modules imported after torch ({len(rows)}), slowest first (self us, cumulative us):")
    for self_us, cum_us, name in sorted(rows, reverse=True)[: args.top]:
        print(f"  {self_us:8d} {cum_us:9d} {name}")


if __name__ == "__main__":
    main()
