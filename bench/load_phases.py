#!/usr/bin/env python3
"""Where the time of `zerohop.load_file(FILE, device="cuda:0")` goes, call by
call, in one fresh process: header parsing, tensor allocation (one torch
tensor each, as load_file does, or one allocation viewed as every tensor),
and the engine's transfer. The first call includes the engine's setup
unless --warm-up loads a tiny file first.

    python3 bench/load_phases.py /dev/shm/model.safetensors [--calls 4] [--warm-up]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--warm-up", action="store_true", help="load a tiny file before the first timed call")
    ap.add_argument("--allocations", type=int, default=0, metavar="N",
                    help="also time N tensor allocations of 1-4 MiB: one torch.empty each against views of shared blocks")
    args = ap.parse_args()

    t = time.perf_counter()
    import torch

    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()
    print(f"torch + CUDA context: {time.perf_counter() - t:.3f} s")
    t = time.perf_counter()
    import zerohop
    from zerohop import _buffers, _native

    print(f"import zerohop: {time.perf_counter() - t:.3f} s")
    if args.warm_up:
        t = time.perf_counter()
        zerohop.prepare("cuda:0")
        print(f"zerohop.prepare (engine setup): {time.perf_counter() - t:.3f} s")
        with tempfile.TemporaryDirectory() as d:
            tiny = os.path.join(d, "tiny.safetensors")
            zerohop.save_file({"x": torch.zeros(1024)}, tiny)
            t = time.perf_counter()
            zerohop.load_file(tiny, device="cuda:0")
            torch.cuda.synchronize()
            print(f"warm-up load: {time.perf_counter() - t:.3f} s")

    if args.allocations:
        time_allocations(torch, args.allocations)
    size = os.path.getsize(args.file)
    for call in range(args.calls):
        single = call % 2 == 1
        t0 = time.perf_counter()
        _, infos = _native.safetensors_header(args.file)
        t1 = time.perf_counter()
        if single:
            total = sum(end - begin for _, _, _, begin, end in infos)
            whole = torch.empty(total, dtype=torch.uint8, device="cuda:0")
            tensors, at = [], 0
            for _, dtype, shape, begin, end in infos:
                tensors.append(whole[at : at + end - begin])
                at += end - begin
        else:
            tensors = [_buffers.empty("pt", dtype, shape, "cuda:0") for _, dtype, shape, _, _ in infos]
        t2 = time.perf_counter()
        pieces = [(0, begin, end - begin, _buffers.address(x)) for (_, _, _, begin, end), x in zip(infos, tensors)]
        stats = json.loads(_native.read("cuda:0", [args.file], pieces, _buffers.current_stream("cuda:0"), False))
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        total = t3 - t0
        print(
            f"call {call} ({'one allocation' if single else 'a tensor each'}): {size / total / 1e9:.2f} GB/s"
            f" as waited ({total:.3f} s): header {t1 - t0:.3f} s, allocation {t2 - t1:.3f} s,"
            f" read call {t3 - t2:.3f} s (engine's own timer {stats['seconds']:.3f} s,"
            f" {stats['gbps']:.2f} GB/s, cpu {stats['cpu_seconds']:.2f} s) via {stats['path']}"
        )
        for note in stats["notes"]:
            print(f"    note: {note}")
        p = stats["profile"]
        print("    profile: " + ", ".join(f"{k} {v:.3f}" for k, v in p.items() if isinstance(v, float)))
        del tensors
        if single:
            del whole
        torch.cuda.empty_cache()
    for call in range(2):
        t = time.perf_counter()
        out = zerohop.load_file(args.file, device="cuda:0")
        torch.cuda.synchronize()
        s = time.perf_counter() - t
        print(f"load_file #{call}: {size / s / 1e9:.2f} GB/s ({s:.3f} s, {len(out)} tensors)")
        del out
        torch.cuda.empty_cache()


def time_allocations(torch, n: int) -> None:
    """N bf16 tensors of 1-4 MiB on cuda:0: a torch.empty each, against one
    64 MiB block per group split into views (each timed twice: the second
    time torch's allocator has the memory cached)."""
    shapes = [(512 + (i * 7919) % 1536, 1024) for i in range(n)]  # 1-4 MiB of bf16
    for round_ in range(2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        each = [torch.empty(s, dtype=torch.bfloat16, device="cuda:0") for s in shapes]
        torch.cuda.synchronize()
        t_each = time.perf_counter() - t
        del each
        torch.cuda.empty_cache() if round_ == 0 else None
        t = time.perf_counter()
        views, group, group_bytes = [], [], 0
        def flush():
            block = torch.empty(sum(a * b for a, b in group), dtype=torch.bfloat16, device="cuda:0")
            parts = block.split([a * b for a, b in group])
            views.extend(p.view(s) for p, s in zip(parts, group))
        for s in shapes:
            if group_bytes + 2 * s[0] * s[1] > 64 << 20:
                flush()
                group, group_bytes = [], 0
            group.append(s)
            group_bytes += 2 * s[0] * s[1]
        flush()
        torch.cuda.synchronize()
        t_views = time.perf_counter() - t
        print(f"allocations, round {round_}: {n} tensors: a torch.empty each {t_each * 1e3:.1f} ms,"
              f" views of 64 MiB blocks {t_views * 1e3:.1f} ms")
        del views
        torch.cuda.empty_cache() if round_ == 0 else None


if __name__ == "__main__":
    main()
