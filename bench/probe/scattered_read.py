#!/usr/bin/env python3
"""What the engine's hot route loses on scattered pieces: the first half
of each tensor of a file in the page cache (a tensor-parallel rank's rows,
as `get_slice` reads them), against one run of as many bytes, each in one
engine call and in several (as `safe_open`'s read-ahead windows make
them). Rows alternate round by round in one process, after one untimed
transfer that makes the engine; each prints the engine's own rate and its
workers' account (their summed seconds over the call's).

    python3 bench/probe/scattered_read.py [--gib 8] [--calls 12,6] [--rounds 3] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

MIB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--calls", default="12", help="engine calls of the split rows, comma-separated counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()

    import torch
    from zerohop import _native

    path = os.path.join(args.dir, "zerohop-scattered.safetensors")
    sizes, total = [], 0
    while total < args.gib * (1 << 30):
        sizes.append((len(sizes) % 4 + 1) * MIB)
        total += sizes[-1]
    with open(path, "wb") as f:
        block = os.urandom(4 * MIB)
        for n in sizes:
            f.write(block[:n])
    starts = [0]
    for n in sizes[:-1]:
        starts.append(starts[-1] + n)
    halves = [(b, n // 2) for b, n in zip(starts, sizes)]
    half_bytes = sum(n for _, n in halves)
    dst = torch.empty(half_bytes, dtype=torch.uint8, device=args.device)
    cuda = args.device.startswith("cuda")
    stream = torch.cuda.current_stream().cuda_stream if cuda else None
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def pieces_of(ranges):
        out, at = [], dst.data_ptr()
        for begin, n in ranges:
            out.append((0, begin, n, at))
            at += n
        return out

    def split(ranges, k):
        per = -(-len(ranges) // k)
        return [ranges[i:i + per] for i in range(0, len(ranges), per)]

    rows = {"halves, one call": [halves], "one run, one call": [[(0, half_bytes)]]}
    for k in map(int, args.calls.split(",")):
        rows[f"halves, {k} calls"] = split(halves, k)
        rows[f"one run, {k} calls"] = [[(i * (half_bytes // k), half_bytes // k)] for i in range(k)]
    # The file opened once, as safe_open holds it; the engine made (staging,
    # threads) as a program's first read would.
    sources = _native.Sources([path])
    _native.read(args.device, sources, pieces_of([(0, min(64 * MIB, half_bytes))]), stream, False, stats=True)
    seen = {name: [] for name in rows}
    for r in range(args.rounds):
        order = list(rows)
        order = order[r % len(order):] + order[:r % len(order)]
        for name in order:
            calls = [pieces_of(c) for c in rows[name]]
            sync()
            t = time.perf_counter()
            stats = [json.loads(_native.read(args.device, sources, p, stream, False, stats=True)) for p in calls]
            sync()
            wall = time.perf_counter() - t
            moved = sum(s["bytes"] for s in stats)
            engine = sum(s["seconds"] for s in stats)
            prof = {k: sum(s["profile"].get(k, 0) for s in stats) for k in stats[0]["profile"] if k.endswith("_seconds")}
            seen[name].append(moved / wall / 1e9)
            account = ", ".join(f"{k.removesuffix('_seconds').replace('_', ' ')} {v / engine:.2f}" for k, v in prof.items())
            windows = sum(s["windows"] for s in stats)
            print(f"{name:<22} {moved / wall / 1e9:6.2f} GB/s wall, engine {moved / engine / 1e9:6.2f}, {windows} windows;"
                  f" workers per engine second: {account}", flush=True)
    print(f"{len(sizes)} tensors of 1 - 4 MiB, {half_bytes / 1e9:.2f} GB moved per row")
    for name, v in seen.items():
        print(f"  {name:<22} best {max(v):6.2f} / median {statistics.median(v):6.2f} GB/s")
    os.unlink(path)


if __name__ == "__main__":
    main()
