#!/usr/bin/env python3
"""Where the wall time of one `zerohop.load_file(FILE, device="cuda:0")` goes
as a user meets it: the first call in a fresh process (torch's CUDA context
and `import zerohop` before the clock; `--warm` adds the tiny untimed
warm-up load that bench/peers.py does). The real load_file runs with timestamps
taken around its allocation, its engine call (on the reader thread) and
its views, next to variants that change one thing:

- `load_file`: the package as it is (its import starts pinning staging for
  torch's device in the background);
- `no-prepare`: the same with `ZEROHOP_PREPARE=0`, so the first call makes
  its engine and pins as its workers start;
- `views-after`: the tensors' views made after the transfer instead of
  while it runs (the engine's read on the calling thread);
- `one-alloc`: one allocation viewed as every tensor, the engine on the
  calling thread (what the CLI does; the floor for any Python load);
- `prepared`: `zerohop.prepare()` called, and half a second for the
  pinning it started, before the clock (a program that prepares while it
  builds its model): the load with no setup of its own and nothing
  running beside it;
- `import-inside`: `import zerohop` inside the clock, as bench/matrix.py
  times it (`imported` marks its end).

    python3 bench/probe/load_timeline.py /dev/shm/model.safetensors [--runs 5] [--variants load_file,...]
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

VARIANTS = ("load_file", "no-prepare", "views-after", "one-alloc", "prepared", "import-inside")


def instrument(marks: dict, stats: dict, warm: bool, variant: str) -> float:
    """Imports zerohop, does what `variant` does before the clock, and
    wraps the engine's read and the allocation to mark their times in
    `marks` (the read's statistics into `stats`); returns the time it is
    done."""
    import torch
    import zerohop
    from zerohop import _buffers, _file_tensors, _native

    now = time.perf_counter
    if warm:
        with tempfile.TemporaryDirectory() as d:
            tiny = os.path.join(d, "tiny.safetensors")
            zerohop.save_file({"x": torch.zeros(1 << 20)}, tiny)
            zerohop.load_file(tiny, device="cuda:0")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    if variant == "prepared":
        zerohop.prepare("cuda:0")
        time.sleep(0.5)

    class TimedNative:
        def __getattr__(self, name):
            return getattr(_native, name)

        def read(self, *args, **kwargs):
            marks["read_enter"] = now()
            marks["read_thread"] = threading.current_thread().name
            out = _native.read(*args, **dict(kwargs, stats=True))
            marks["read_exit"] = now()
            stats.update(json.loads(out))
            return out

    def timed_views(memory) -> None:
        make = memory._make

        def timed_make():
            marks["views_enter"] = now()
            out = make()
            marks["views_exit"] = now()
            return out

        memory._make = timed_make

    def timed(real, memory_of):
        """`real` (an allocation) marked, and the views of what it returns."""
        def allocate(*args):
            marks["alloc_enter"] = now()
            out = real(*args)
            marks["alloc_exit"] = now()
            timed_views(memory_of(out))
            return out
        return allocate

    _buffers.allocate = timed(_buffers.allocate, lambda memory: memory)
    # load_file's tensors in shared blocks: the native layout's allocation.
    _buffers.allocate_layout = timed(_buffers.allocate_layout, lambda out: out[0])
    _file_tensors._native = TimedNative()
    if variant == "views-after":
        _buffers.OVERLAP_MIN = 1 << 30
    return now()


def child(path: str, variant: str, warm: bool) -> dict:
    import torch

    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()
    now = time.perf_counter
    marks: dict = {}
    stats: dict = {}
    # The interpreter's cycle collections inside the clock: a full one walks
    # every object torch made (tens of ms).
    collected: list = []
    gc_began: list = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_began.append(now())
        elif gc_began:
            collected.append((info["generation"], (now() - gc_began.pop()) * 1e3))

    gc.callbacks.append(on_gc)
    start = now()
    ready = instrument(marks, stats, warm, variant)
    if variant == "import-inside":
        marks["imported"] = ready
    else:
        start = ready
    import zerohop
    from zerohop import _buffers, _file_tensors, _native

    size = os.path.getsize(path)

    if variant == "one-alloc":
        _, infos = _native.safetensors_header(path)
        marks["alloc_enter"] = now()
        total = sum(end - begin for _, _, _, begin, end in infos)
        whole = torch.empty(total, dtype=torch.uint8, device="cuda:0")
        marks["alloc_exit"] = now()
        pieces = [(0, infos[0][3], total, whole.data_ptr())]
        _file_tensors._native.read("cuda:0", [path], pieces, _buffers.current_stream("cuda:0"), False)
        out = {"whole": whole}
    else:
        out = zerohop.load_file(path, device="cuda:0")
    marks["returned"] = now()
    torch.cuda.synchronize()
    marks["synced"] = now()
    # What peers.py's child does next: fresh memory faulted in, which waits
    # for whoever holds the memory-map lock.
    with mmap.mmap(-1, 256 << 10) as m:
        for at in range(0, 256 << 10, mmap.PAGESIZE):
            m[at] = 1
    marks["touched"] = now()
    gc.callbacks.remove(on_gc)
    rel = {k: (v - start) * 1e3 for k, v in marks.items() if isinstance(v, float)}
    return {
        "variant": variant,
        "tensors": len(out),
        "gbps": size / (marks["touched"] - start) / 1e9,
        "ms": rel,
        "reader": marks.get("read_thread"),
        "engine_ms": stats.get("seconds", 0) * 1e3,
        "route_setup_ms": stats.get("setup_seconds", 0) * 1e3,
        "engine_setup_ms": stats.get("engine_setup_seconds", 0) * 1e3,
        "worker_start_ms": stats.get("profile", {}).get("start_seconds", 0) * 1e3,
        "staging_ms": stats.get("staging_seconds", 0) * 1e3,
        "staging_wait_ms": stats.get("profile", {}).get("staging_wait_seconds", 0) * 1e3,
        "notes": stats.get("notes", []),
        "gc_ms": sum(ms for _, ms in collected),
        "gc_full": sum(1 for gen, _ in collected if gen == 2),
        "engine_gbps": stats.get("gbps"),
    }


def report(rows: list[dict]) -> None:
    keys = ("imported", "alloc_enter", "alloc_exit", "read_enter", "views_enter", "views_exit", "read_exit", "returned", "synced", "touched")
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        if not mine:
            continue
        print(f"{variant}: GB/s as waited best {max(r['gbps'] for r in mine):.2f}, "
              f"median {statistics.median(r['gbps'] for r in mine):.2f} ({len(mine)} runs)")
        for k in keys:
            got = [r["ms"][k] for r in mine if k in r["ms"]]
            if got:
                print(f"    {k:12s} at {statistics.median(got):7.2f} ms (median; min {min(got):.2f})")
        for k in ("gc_ms", "engine_ms", "route_setup_ms", "engine_setup_ms", "worker_start_ms", "staging_ms", "staging_wait_ms"):
            print(f"    {k:16s} {statistics.median(r[k] for r in mine):7.2f} ms (median)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warm", action="store_true", help="an untimed tiny load first, as bench/peers.py does")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of " + ",".join(VARIANTS))
    ap.add_argument("--child", choices=VARIANTS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.file, args.child, args.warm)))
        return
    rows = []
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    if args.warm and "import-inside" in variants:
        ap.error("--warm warms up after the import, which import-inside times")
    for run in range(args.runs):
        for variant in variants[run % len(variants):] + variants[: run % len(variants)]:
            env = dict(os.environ, ZEROHOP_PREPARE="0") if variant == "no-prepare" else None
            out = subprocess.run([sys.executable, __file__, args.file, "--child", variant]
                                 + (["--warm"] if args.warm else []),
                                 capture_output=True, text=True, timeout=300, env=env)
            if out.returncode != 0:
                print(f"{variant}: failed: {out.stderr.strip()[-500:]}")
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"run {run} {variant:10s} {row['gbps']:6.2f} GB/s  engine {row['engine_ms']:.1f} ms"
                  f" ({row['engine_gbps']:.2f} GB/s) engine setup {row['engine_setup_ms']:.1f} ms,"
                  f" route setup {row['route_setup_ms']:.1f} ms, staging {row['staging_ms']:.1f} ms"
                  f" (workers waited {row['staging_wait_ms']:.1f} ms for it, summed),"
                  f" gc {row['gc_ms']:.1f} ms ({row['gc_full']} full)  "
                  + " ".join(f"{k}={v:.1f}" for k, v in row["ms"].items()) + f"  notes {row['notes']}",
                  flush=True)
            rows.append(row)
    report(rows)


if __name__ == "__main__":
    main()
