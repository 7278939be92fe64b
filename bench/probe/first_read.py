#!/usr/bin/env python3
"""The first read of freshly written tmpfs pages against the second, through
a mapping copied from in 4 MiB windows (each dropped from the page tables
after its copy, as zerohop's mapped route does), with and without
MADV_SEQUENTIAL: how much the kernel's LRU bookkeeping on a first access
costs, and whether the advice avoids it. One thread, standard library only.

    python3 bench/probe/first_read.py [DIR] [--gib N]
"""
import argparse
import mmap
import os
import time

WINDOW = 4 << 20


def write(path: str, size: int) -> None:
    block = os.urandom(WINDOW)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        for off in range(0, size, WINDOW):
            os.pwrite(fd, block, off)
    finally:
        os.close(fd)


def read_mapped(path: str, size: int, advice) -> float:
    dst = bytearray(WINDOW)
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            if advice is not None:
                m.madvise(advice)
            view = memoryview(m)
            start = time.perf_counter()
            for off in range(0, size, WINDOW):
                dst[:] = view[off:off + WINDOW]
                m.madvise(mmap.MADV_DONTNEED, off, WINDOW)
            took = time.perf_counter() - start
            view.release()
    finally:
        os.close(fd)
    return size / took / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default="/dev/shm")
    ap.add_argument("--gib", type=int, default=2)
    args = ap.parse_args()
    size = args.gib << 30
    path = os.path.join(args.dir, f"zerohop-first-read-{os.getpid()}")
    try:
        for name, advice in [("none", None), ("sequential", mmap.MADV_SEQUENTIAL)] * 2:
            write(path, size)
            first = read_mapped(path, size, advice)
            second = read_mapped(path, size, advice)
            print(f"first-read  advice {name:<10}  first {first:5.2f} GB/s  second {second:5.2f} GB/s"
                  f"  first/second {first / second:.2f}", flush=True)
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
