#!/usr/bin/env python3
"""Where the time of one small `safe_open(...).get_slice(name)[:half]` goes
on a GPU: many such calls in a fresh process, each timed, the engine's own
time (its stats) and the native call's apart from the Python around them,
then a cProfile of the same calls' Python side. Beside them, the floor of
the same bytes as safetensors would move them (a slice of the file's
mapping, copied to the device by torch).

    python3 bench/probe/slice_calls.py [--tensors 400] [--mib 2] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tensors", type=int, default=400)
    ap.add_argument("--mib", type=int, default=2)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()

    import torch

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.zeros(1, device=args.device)
    import safetensors.torch
    import zerohop
    from zerohop import _file_tensors, _native, _read_ahead

    path = os.path.join(args.dir, "zerohop-slice-calls.safetensors")
    n = (args.mib << 20) // 2
    safetensors.torch.save_file({f"t{i:05d}": torch.full((n // 1024, 1024), i % 7, dtype=torch.bfloat16)
                                 for i in range(args.tensors)}, path)
    native_s: list = []
    engine_s: list = []
    engine_gbps: list = []
    parts: list = []  # the engine's own account of each call

    asks_stats = {"stats": True} if "stats" in (_native.read.__text_signature__ or "") else {}

    class TimedNative:
        def __getattr__(self, name):
            return getattr(_native, name)

        def read(self, *a, **kw):
            # The engine's stats, which get_slice itself does not ask for
            # (builds that cannot leave them out return them anyway).
            kw.pop("stats", None)
            t = time.perf_counter()
            out = _native.read(*a, **kw, **asks_stats)
            native_s.append(time.perf_counter() - t)
            stats = json.loads(out)
            engine_s.append(stats["seconds"])
            engine_gbps.append(stats["gbps"])
            parts.append({"route setup": stats["setup_seconds"], **{k: v for k, v in stats["profile"].items()
                                                                   if k.endswith("_seconds")}})
            return out

    # Reads of tensors alone, and of the read-ahead's windows.
    _file_tensors._native = _read_ahead._native = TimedNative()
    names = [f"t{i:05d}" for i in range(args.tensors)]
    calls = []
    kept = []
    with zerohop.safe_open(path, "pt", device=args.device) as f:
        for name in names:
            t = time.perf_counter()
            s = f.get_slice(name)
            kept.append(s[: s.get_shape()[0] // 2])
            calls.append(time.perf_counter() - t)
    sync()
    half = (args.mib << 20) // 2
    med = statistics.median
    print(f"{args.tensors} x get_slice of {half >> 10} KiB on {args.device}: per call median {med(calls) * 1e6:.0f} us,"
          f" first {calls[0] * 1e6:.0f} us ({half / med(calls) / 1e9:.2f} GB/s at the median)")
    # With safe_open's read-ahead, most calls copy out of a window and
    # only some read: then the Python around a read is not its difference.
    around = f"; Python around it {(med(calls) - med(native_s)) * 1e6:.0f} us" if len(native_s) == len(calls) else ""
    print(f"  {len(native_s)} native reads for {len(calls)} calls, median {med(native_s) * 1e6:.0f} us,"
          f" of it the engine's transfer {med(engine_s) * 1e6:.0f} us ({med(engine_gbps):.2f} GB/s){around}")
    print("  the engine's parts, median us: " + ", ".join(
        f"{k.removesuffix('_seconds').replace('_', ' ')} {med(p[k] for p in parts) * 1e6:.0f}" for k in parts[0]))

    # The same bytes the way safetensors moves them: the mapping's slice,
    # copied by torch (pageable host memory).
    import mmap

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as m:
        _, infos = _native.safetensors_header(path)
        floor = []
        for _name, _dt, _shape, begin, _end in infos:
            t = time.perf_counter()
            host = torch.frombuffer(m, dtype=torch.uint8, count=half, offset=begin)
            kept.append(host.to(args.device) if cuda else host.clone())
            sync()
            floor.append(time.perf_counter() - t)
            del host
        print(f"  pageable copy of the mapping's slice (safetensors' way): median {med(floor) * 1e6:.0f} us")

    profile = cProfile.Profile()
    with zerohop.safe_open(path, "pt", device=args.device) as f:
        profile.enable()
        for name in names:
            s = f.get_slice(name)
            kept.append(s[: s.get_shape()[0] // 2])
        profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)
    os.unlink(path)


if __name__ == "__main__":
    main()
