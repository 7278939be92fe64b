#!/usr/bin/env python3
"""Where one `zerohop.checkpoint.save` spends its time, first call in a
fresh process (`import zerohop` before the clock, as bench/matrix.py times
saves): the call's wall time, the engine's transfer, and the save's
`phases` (before the data moves, waiting for the checksums, committing the
manifest). SHAPE is `one` (one 8 GiB tensor) or `small` (3,280 tensors of
1 - 4 MiB, as the matrix's small-fp8).

`--settle S` sleeps S seconds between the import and the call (the
import's background `prepare` done by then); `--calls N` saves N times in
the process, the later calls labelled warm.

    python3 bench/probe/save_phases.py one|small [--dir /dev/shm] [--gib 8] [--settle S] [--calls N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=("one", "small"))
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--settle", type=float, default=0.0)
    ap.add_argument("--calls", type=int, default=1)
    args = ap.parse_args()

    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    size = args.gib << 30

    def random(n: int):
        return torch.randint(0, 256, (n,), generator=g, device="cuda", dtype=torch.uint8)

    if args.shape == "one":
        state = {"w": random(size)}
    else:
        unit = size // (3280 * 5 // 2) // 4096 * 4096
        state = {f"e{i}": random(unit * (1 + i % 4)) for i in range(3280)}
    torch.cuda.synchronize()
    import zerohop

    time.sleep(args.settle)
    nbytes = sum(x.numel() for x in state.values())
    for call in range(args.calls):
        target = os.path.join(args.dir, f"zerohop-save-phases-{os.getpid()}-{call}")
        t = time.perf_counter()
        out = zerohop.checkpoint.save(state, target)
        wall = time.perf_counter() - t
        shutil.rmtree(target, ignore_errors=True)
        p, st = out["phases"], out["stats"]
        w = st["profile"]
        per = 1e3 / max(st["io_threads"], 1)  # ms per worker
        label = "first" if call == 0 else "warm"
        print(f"{args.shape} {label}: {nbytes / wall / 1e9:.2f} GB/s as waited ({wall * 1e3:.0f} ms); the call's own"
              f" {out['seconds'] * 1e3:.0f} ms: transfer {st['seconds'] * 1e3:.0f} ms,"
              f" layout {p['layout_seconds'] * 1e3:.1f} ms, checksums waited for {p['checksum_wait_seconds'] * 1e3:.1f} ms,"
              f" manifest {p['commit_seconds'] * 1e3:.1f} ms; per worker: writes {w['io_seconds'] * per:.0f} ms,"
              f" copy wait {w['copy_wait_seconds'] * per:.0f}, staging wait {w['staging_wait_seconds'] * per:.1f},"
              f" queueing {w['queue_seconds'] * per:.1f}; sync {st['sync_seconds'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
