#!/usr/bin/env python3
"""Where a first `zerohop.checkpoint.save` and a first
`zerohop.checkpoint.load` spend their time, each in a fresh process
(`import zerohop` before the clock, as bench/matrix.py times them).

The save: its wall time, the engine's transfer, and the save's `phases`
(before the data moves, waiting for the checksums, committing the
manifest). The load of what it saved, in a process of its own: its wall
time cut into reading the manifest, allocating, the native restore (and
the engine's transfer inside it), and making the state, timed by wrapping
those calls.

SHAPE is `one` (one tensor), `four`, `sixty-four` or `small` (3,280
tensors of 1 - 4 MiB, as the matrix's small-fp8). `--settle S` sleeps S
seconds between the import and the save (the import's background
`prepare` done by then), and likewise before the load; `--calls N` saves N times in the process, the
later calls labelled warm; `--rounds R` repeats the save and the load in
new processes; `--sample` prints the calling thread's timeline through
each call (what it waits for in the kernel, bench/probe/thread_sampler.py).

    python3 bench/probe/checkpoint_phases.py one|four|sixty-four|small [--dir /dev/shm] [--gib 8] [--device cuda:0]
        [--settle S] [--calls N] [--rounds R] [--sample]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from thread_sampler import Sampler  # noqa: E402

SHAPES = ("one", "four", "sixty-four", "small")


def sizes(shape: str, size: int) -> list:
    if shape == "small":
        unit = size // (3280 * 5 // 2) // 4096 * 4096
        return [unit * (1 + i % 4) for i in range(3280)]
    count = {"one": 1, "four": 4, "sixty-four": 64}[shape]
    return [size // count] * count


def sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def save_child(args, target: str) -> None:
    import torch

    g = torch.Generator(device=args.device).manual_seed(1)
    state = {f"e{i}": torch.randint(0, 256, (n,), generator=g, device=args.device, dtype=torch.uint8)
             for i, n in enumerate(sizes(args.shape, args.size))}
    sync(torch, args.device)
    import zerohop

    time.sleep(args.settle)
    nbytes = sum(x.numel() for x in state.values())
    for call in range(args.calls):
        here = target if call == 0 else f"{target}-{call}"
        sampler = Sampler().start() if args.sample else None
        t = time.perf_counter()
        out = zerohop.checkpoint.save(state, here)
        wall = time.perf_counter() - t
        show(sampler, "save")
        if call:
            shutil.rmtree(here, ignore_errors=True)
        p, st = out["phases"], out["stats"]
        w = st["profile"]
        per = 1e3 / max(st["io_threads"], 1)  # ms per worker
        label = "first" if call == 0 else "warm"
        print(f"{args.shape} save, {label}: {nbytes / wall / 1e9:.2f} GB/s as waited ({wall * 1e3:.0f} ms); the call's own"
              f" {out['seconds'] * 1e3:.0f} ms: transfer {st['seconds'] * 1e3:.0f} ms,"
              f" layout {p['layout_seconds'] * 1e3:.1f} ms, checksums waited for {p['checksum_wait_seconds'] * 1e3:.1f} ms,"
              f" manifest {p['commit_seconds'] * 1e3:.1f} ms; {setup(st)}; per worker: writes {w['io_seconds'] * per:.0f} ms,"
              f" copy wait {w['copy_wait_seconds'] * per:.0f}, staging wait {w['staging_wait_seconds'] * per:.1f},"
              f" queueing {w['queue_seconds'] * per:.1f}; sync {st['sync_seconds'] * 1e3:.1f} ms", flush=True)


def load_child(args, target: str) -> None:
    import torch

    torch.zeros(1, device=args.device)
    sync(torch, args.device)
    import zerohop.checkpoint
    from zerohop import _buffers, _flat, _native

    time.sleep(args.settle)

    spent: dict = {}
    restored: list = []

    def timed(name, call):
        def run(*a, **kw):
            t = time.perf_counter()
            try:
                return call(*a, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return run

    class TimedNative:
        def __getattr__(self, name):
            return getattr(_native, name)

        def checkpoint_open(self, *a, **kw):
            return TimedCheckpoint(_native.checkpoint_open(*a, **kw))

    class TimedCheckpoint:
        def __init__(self, opened):
            self.opened = opened

        def __getattr__(self, name):
            return getattr(self.opened, name)

        def restore(self, *a, **kw):
            out = timed("native restore", self.opened.restore)(*a, **kw)
            restored.append(json.loads(out))
            return out

    _flat._native = TimedNative()
    _flat._open = timed("manifest", _flat._open)
    zerohop.checkpoint._decode_state = timed("state", zerohop.checkpoint._decode_state)
    _buffers.allocate = timed("allocate", _buffers.allocate)
    _buffers.tensors_while = timed("restore + views", _buffers.tensors_while)
    sampler = Sampler().start() if args.sample else None
    t = time.perf_counter()
    got = zerohop.checkpoint.load(target, device=args.device)
    sync(torch, args.device)
    wall = time.perf_counter() - t
    show(sampler, "load")
    nbytes = sum(x.numel() * x.element_size() for x in got.values())
    st = restored[0] if restored else {}
    w = st.get("profile", {})
    per = 1e3 / max(st.get("io_threads", 1), 1)
    parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in spent.items())
    print(f"{args.shape} load, first: {nbytes / wall / 1e9:.2f} GB/s as waited ({wall * 1e3:.0f} ms); ms: {parts};"
          f" the engine's transfer {st.get('seconds', 0) * 1e3:.0f} ms ({st.get('gbps', 0):.2f} GB/s),"
          f" {st.get('windows', 0)} windows; {setup(st)}; per worker: reads {w.get('io_seconds', 0) * per:.0f} ms,"
          f" copy wait {w.get('copy_wait_seconds', 0) * per:.0f}, staging wait {w.get('staging_wait_seconds', 0) * per:.1f}",
          flush=True)


def show(sampler, what: str) -> None:
    """The calling thread's timeline through the call, from `--sample`."""
    if sampler is None:
        return
    sampler.stop()
    for begin, end, state in sampler.spans():
        print(f"  {what} {begin:7.1f} - {end:7.1f} ms: {state}")


def setup(stats: dict) -> str:
    """The engine's setup as a transfer's stats report it, in ms."""
    return (f"setup {stats.get('setup_seconds', 0) * 1e3:.1f} ms (staging {stats.get('staging_seconds', 0) * 1e3:.1f},"
            f" the engine's own {stats.get('engine_setup_seconds', 0) * 1e3:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=SHAPES)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--device", default="cuda:0", help="cuda:N, or cpu (to try the probe without a GPU)")
    ap.add_argument("--settle", type=float, default=0.0)
    ap.add_argument("--calls", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sample", action="store_true", help="print the calling thread's timeline through each call "
                    "(bench/probe/thread_sampler.py)")
    ap.add_argument("--child", choices=("save", "load"), help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.size = int(args.gib * (1 << 30))
    if args.child == "save":
        return save_child(args, args.target)
    if args.child == "load":
        return load_child(args, args.target)
    target = os.path.join(args.dir, f"zerohop-checkpoint-phases-{os.getpid()}")
    for _ in range(args.rounds):
        try:
            for child in ("save", "load"):
                subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", child, "--target", target], check=True)
        finally:
            shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    main()
