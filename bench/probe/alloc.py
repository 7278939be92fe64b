#!/usr/bin/env python3
"""What `load_file`'s allocation costs before its transfer can start: in a
fresh process (as bench/peers.py times loaders), N torch.empty blocks of
256 MiB, one allocation of the same total, and the blocks again from
torch's cache. Needs torch and a GPU.

    python3 bench/probe/alloc.py [--gib 8]
"""
import argparse
import time

import torch


def timed(make):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = make()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=8)
    args = ap.parse_args()
    block = 256 << 20
    n = (args.gib << 30) // block
    torch.zeros(1, device="cuda:0")  # the context, untimed
    rows = []
    took, blocks = timed(lambda: [torch.empty(block, dtype=torch.uint8, device="cuda:0") for _ in range(n)])
    rows.append((f"{n} blocks of 256 MiB, fresh", took))
    del blocks
    torch.cuda.empty_cache()
    took, one = timed(lambda: torch.empty(n * block, dtype=torch.uint8, device="cuda:0"))
    rows.append((f"one allocation of {args.gib} GiB, fresh", took))
    del one
    took, blocks = timed(lambda: [torch.empty(block, dtype=torch.uint8, device="cuda:0") for _ in range(n)])
    rows.append((f"{n} blocks of 256 MiB from torch's cache", took))
    for name, took in rows:
        print(f"alloc  {took * 1e3:7.2f} ms  {name}", flush=True)


if __name__ == "__main__":
    main()
