#!/usr/bin/env python3
"""How long a save's layout step takes without zerohop: N data files
created, sized and given a 4 KiB header each, one after another and
spread over T threads, in DIR. Each round first writes and removes GIB of
other files there (as a save that follows another's removal finds its
file system), then times both ways in turn.

    python3 bench/probe/create_files.py [DIR] [--files 32] [--threads 16] [--gib 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def make(path: str, size: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, b"h" * 4096, 0)
    finally:
        os.close(fd)


def fill_and_free(dir: str, gib: int) -> None:
    """`gib` GiB written into 16 files, then removed."""
    scratch = tempfile.mkdtemp(dir=dir)
    block = os.urandom(4 << 20)
    with ThreadPoolExecutor(16) as pool:
        def write(k: int) -> None:
            with open(os.path.join(scratch, str(k)), "wb") as f:
                for _ in range((gib << 30) // 16 // len(block)):
                    f.write(block)
        list(pool.map(write, range(16)))
    shutil.rmtree(scratch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", default="/dev/shm")
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    size = (args.gib << 30) // args.files
    times: dict = {"one after another": [], f"on {args.threads} threads": []}
    pool = ThreadPoolExecutor(args.threads)
    for r in range(args.rounds):
        ways = list(times) if r % 2 == 0 else list(times)[::-1]
        for way in ways:
            fill_and_free(args.dir, args.gib)
            target = tempfile.mkdtemp(dir=args.dir)
            paths = [os.path.join(target, f"data-{k:05}") for k in range(args.files)]
            t = time.perf_counter()
            if way == "one after another":
                for p in paths:
                    make(p, size)
            else:
                list(pool.map(lambda p: make(p, size), paths))
            times[way].append(time.perf_counter() - t)
            shutil.rmtree(target)
    for way, runs in times.items():
        print(f"{args.files} files created, sized and headed {way}: median {statistics.median(runs) * 1e3:.1f} ms,"
              f" best {min(runs) * 1e3:.1f} ({len(runs)} rounds, each after {args.gib} GiB written and removed)")


if __name__ == "__main__":
    main()
