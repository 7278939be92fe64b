#!/usr/bin/env python3
"""Cold read patterns of one disk, side by side: which way of asking the
kernel for a file's bytes gets them off this disk fastest? Each measurement
reads a fresh file (all of a round's files written and synced before any is
read, the page cache dropped before each read), the order rotated between
rounds; ratios are paired per round against the first pattern.

Patterns:
  read:BLOCK:THREADS:direct|buffered  threads with one blocking pread each,
                                      one shared cursor (as `zerohop-lab raw-read`)
  ahead:BLOCK:THREADS:AHEAD           buffered readers as above, plus a thread
                                      that keeps POSIX_FADV_WILLNEED up to
                                      AHEAD bytes ahead of the cursor
  seq:BLOCK:THREADS                   buffered readers after POSIX_FADV_SEQUENTIAL
  zerohop:OPTIONS                     `zerohop load FILE --json OPTIONS`
  raw:OPTIONS                         `zerohop-lab raw-read FILE --json OPTIONS`
(OPTIONS with spaces, e.g. "zerohop:--direct never --threads 8").

    python3 bench/probe/cold_patterns.py --dir /var/tmp --rounds 3 PATTERN...
"""
import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import threading
import time

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def size(text: str) -> int:
    t = text.lower().removesuffix("ib").removesuffix("b")
    return int(t[:-1]) * UNITS[t[-1]] if t[-1] in UNITS else int(t)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class Cursor:
    """The next block to read, shared by the readers."""

    def __init__(self, total: int, block: int):
        self.lock, self.next, self.total, self.block = threading.Lock(), 0, total, block

    def take(self):
        with self.lock:
            off = self.next
            if off >= self.total:
                return None
            self.next += self.block
            return off


def read_threads(path: str, block: int, threads: int, direct: bool, advice=None, ahead: int = 0) -> float:
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags)
    total = os.fstat(fd).st_size
    cursor, errors, done = Cursor(total, block), [], threading.Event()
    if advice is not None:
        os.posix_fadvise(fd, 0, 0, advice)

    def reader():
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
        try:
            while (off := cursor.take()) is not None:
                n = os.preadv(fd, [buf], off)
                if n <= 0 and off < total:
                    raise OSError(f"short read at {off}")
        except Exception as e:  # reported after the join
            errors.append(e)
        finally:
            buf.close()

    def advisor():
        issued, chunk = 0, min(ahead, 16 << 20)
        while issued < total and not done.is_set():
            if issued - cursor.next < ahead:
                os.posix_fadvise(fd, issued, chunk, os.POSIX_FADV_WILLNEED)
                issued += chunk
            else:
                time.sleep(0.0002)

    workers = [threading.Thread(target=reader) for _ in range(threads)]
    if ahead:
        workers.append(threading.Thread(target=advisor))
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers[:threads]:
        w.join()
    took = time.perf_counter() - start
    done.set()
    for w in workers[threads:]:
        w.join()
    os.close(fd)
    if errors:
        raise errors[0]
    return total / took / 1e9


def measure(pattern: str, path: str, zerohop: str) -> tuple[float, float]:
    """(GB/s, CPU seconds) of one cold read of `path`."""
    kind, _, rest = pattern.partition(":")
    if kind in ("zerohop", "raw"):
        cmd = [zerohop, "load", path, "--json"] if kind == "zerohop" else [os.path.join(os.path.dirname(os.path.abspath(shutil.which(zerohop) or zerohop)), "zerohop-lab"), "raw-read", path, "--json"]
        r = json.loads(subprocess.run(cmd + rest.split(), check=True, capture_output=True, text=True).stdout)
        return r["gbps"], r["cpu_seconds"]
    parts = rest.split(":")
    block, threads = size(parts[0]), int(parts[1])
    cpu = os.times()
    if kind == "read":
        gbps = read_threads(path, block, threads, parts[2] == "direct")
    elif kind == "ahead":
        gbps = read_threads(path, block, threads, False, ahead=size(parts[2]))
    elif kind == "seq":
        gbps = read_threads(path, block, threads, False, advice=os.POSIX_FADV_SEQUENTIAL)
    else:
        raise SystemExit(f"unknown pattern {pattern!r}")
    after = os.times()
    return gbps, (after.user - cpu.user) + (after.system - cpu.system)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("patterns", nargs="+")
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--size", default="3GiB")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--zerohop", default="zerohop")
    a = p.parse_args()
    rates = {pat: [] for pat in a.patterns}
    cpus = {pat: [] for pat in a.patterns}
    for rnd in range(a.rounds):
        order = a.patterns[rnd % len(a.patterns):] + a.patterns[:rnd % len(a.patterns)]
        files = [os.path.join(a.dir, f"zerohop-cold-pattern-{i}.safetensors") for i in range(len(order))]
        t = time.perf_counter()
        gens = [subprocess.Popen([a.zerohop, "gen", "--size", a.size, "--seed", str(1000 * rnd + i), f],
                                 stdout=subprocess.DEVNULL) for i, f in enumerate(files)]
        if any(g.wait() for g in gens):
            raise SystemExit("zerohop gen failed")
        os.sync()
        print(f"round {rnd + 1}: wrote {len(files)} x {a.size} in {time.perf_counter() - t:.1f} s", flush=True)
        for pat, f in zip(order, files):
            drop_caches()
            gbps, cpu = measure(pat, f, a.zerohop)
            os.unlink(f)
            rates[pat].append(gbps)
            cpus[pat].append(cpu)
            print(f"  r{rnd + 1} {pat:<44} {gbps:5.2f} GB/s  cpu {cpu:5.2f} s", flush=True)
    base = a.patterns[0]
    print(f"\n| pattern | best GB/s | median | paired ratio to {base} (median) | CPU s |")
    print("|---|---|---|---|---|")
    for pat in a.patterns:
        ratio = statistics.median(x / y for x, y in zip(rates[pat], rates[base]))
        print(f"| {pat} | {max(rates[pat]):.2f} | {statistics.median(rates[pat]):.2f} | {ratio:.3f} "
              f"| {statistics.median(cpus[pat]):.2f} |")


if __name__ == "__main__":
    main()
