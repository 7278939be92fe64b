#!/usr/bin/env python3
"""`safe_open` + `get_slice(name)[:half]` of every tensor of a file, as
bench/matrix.py times get_slice (first calls in a fresh process), under
several settings of the read-ahead (`zerohop._read_ahead`'s READ_AHEAD_*
constants), alternated round by round. Prints per setting the rate as
waited, and where the time went: the engine's window reads (how many,
their sum), the wait before the first one starts, and the tail after the
last one ends (the program taking that window's tensors).

FILE is made if missing, as bench/matrix.py's small-fp8 shape (3,280 FP8
tensors of 1 - 4 MiB, 8 GiB; needs torch and safetensors).

    python3 bench/probe/slice_windows.py FILE [--rounds 3] [--device cuda:0]
        [--settings "default;READ_AHEAD_WINDOWS=3;READ_AHEAD_DENSE_MOST=2147483648"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from save_configs import make_small_fp8


def child(path: str, device: str, setting: str) -> dict:
    import torch

    torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    import zerohop
    from zerohop import _native, _read_ahead

    for item in setting.split(",") if setting != "default" else []:
        name, value = item.split("=")
        assert hasattr(_read_ahead, name), name
        setattr(_read_ahead, name, int(value))
    spans: list = []  # (start, end, engine seconds) of each window read

    class TimedNative:
        def __getattr__(self, name):
            return getattr(_native, name)

        def read(self, *a, **kw):
            kw["stats"] = True
            t = time.perf_counter()
            out = _native.read(*a, **kw)
            spans.append((t, time.perf_counter(), json.loads(out)["seconds"]))
            return None

    _read_ahead._native = TimedNative()
    t = time.perf_counter()
    parts, nbytes = {}, 0
    with zerohop.safe_open(path, framework="pt", device=device) as f:
        for name in f.keys():
            s = f.get_slice(name)
            parts[name] = s[:max(1, s.get_shape()[0] // 2)]
            nbytes += parts[name].numel() * parts[name].element_size()
    sync()
    end = time.perf_counter()
    return {"gbps": nbytes / (end - t) / 1e9, "wall": end - t, "reads": len(spans),
            "engine": sum(s[2] for s in spans), "native": sum(s[1] - s[0] for s in spans),
            "head": spans[0][0] - t if spans else 0.0, "tail": end - spans[-1][1] if spans else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--settings", default="default;READ_AHEAD_WINDOWS=3;READ_AHEAD_DENSE_MOST=2147483648",
                    help="';'-separated; each 'default' or NAME=INT,...")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.file, args.device, args.child)))
        return
    if not os.path.exists(args.file):
        make_small_fp8(args.file)
    settings = [s.strip() for s in args.settings.split(";")]
    rows: dict = {s: [] for s in settings}
    for r in range(args.rounds):
        for s in settings[r % len(settings):] + settings[:r % len(settings)]:
            out = subprocess.run([sys.executable, __file__, args.file, "--device", args.device, "--child", s],
                                 check=True, stdout=subprocess.PIPE, text=True).stdout
            rows[s].append(json.loads(out.splitlines()[-1]))
    med = statistics.median
    for s, runs in rows.items():
        print(f"{s}: {max(x['gbps'] for x in runs):.2f} GB/s best, {med(x['gbps'] for x in runs):.2f} median"
              f" ({len(runs)} runs); medians: wall {med(x['wall'] for x in runs) * 1e3:.0f} ms,"
              f" {med(x['reads'] for x in runs):.0f} engine reads taking {med(x['native'] for x in runs) * 1e3:.0f} ms"
              f" (transfers {med(x['engine'] for x in runs) * 1e3:.0f}), first read after"
              f" {med(x['head'] for x in runs) * 1e3:.1f} ms, tail after the last {med(x['tail'] for x in runs) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
