#!/usr/bin/env python3
"""`safe_open` + `get_slice(name)[:half]` of every tensor of a file (or
of each of several files in turn), as
bench/matrix.py times get_slice (first calls in a fresh process), under
several settings of the read-ahead (`zerohop._read_ahead`'s READ_AHEAD_*
constants), alternated round by round. Prints per setting the rate as
waited, and where the time went: the window reads (how many, their
bytes over the bytes asked, the sum of their transfers, how long the
program blocked waiting for them), how long opening the file and the
first two reads took, when the first window was queued, and the tail
after the
wait for the last one (the program taking that window's tensors), and
the interpreter's cycle collections inside the clock (a full one walks
every object of the process).

A missing FILE is made as bench/matrix.py's small-fp8 shape (3,280 FP8
tensors of 1 - 4 MiB, 8 GiB; needs torch and safetensors); several
missing FILEs as its shards shape (8 GiB in all, 16 bf16 tensors each);
written by safetensors, which sorts the tensors by name, or with
`--unsorted` by `zerohop.save_file`, whose data follows the order the
tensors came in (expert.0, expert.1, expert.2, ...), not the order of
their names that `keys()` gives (expert.0, expert.1, expert.10, ...).
With several files, the opening and first two reads are summed over them.

    python3 bench/probe/slice_windows.py FILE... [--rounds 3] [--device cuda:0] [--unsorted]
        [--settings "default;READ_AHEAD_WINDOWS=3;READ_AHEAD_DENSE_MOST=2147483648"]

A setting `settle=SECONDS` waits that long after `import zerohop` before
the clock starts, so its background setup is over.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

from save_configs import make_small_fp8


def make_shards(paths: list, save_file=None) -> None:
    import torch

    if save_file is None:
        from safetensors.torch import save_file
    g = torch.Generator().manual_seed(2)
    per = (8 << 30) // len(paths) // 16 // 4096 * 4096
    for s, path in enumerate(paths):
        save_file({f"shard{s}.layer.{i}": torch.randint(0, 256, (per,), generator=g, dtype=torch.uint8)
                   .view(torch.bfloat16).view(-1, 2048) for i in range(16)}, path)


def child(paths: list, device: str, setting: str) -> dict:
    import torch

    torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    import zerohop
    from zerohop import _native, _read_ahead

    for item in setting.split(",") if setting != "default" else []:
        name, value = item.split("=")
        if name == "settle":  # seconds the import's background setup gets before the clock
            time.sleep(float(value))
            continue
        assert hasattr(_read_ahead, name), name
        setattr(_read_ahead, name, int(value))
    spans: list = []  # (queued, waited for, engine seconds, seconds blocked in wait) of each window read
    read_bytes = [0]  # what the windows read

    class TimedRead:
        def __init__(self, read):
            self.read, self.queued = read, time.perf_counter()

        def wait(self):
            called = time.perf_counter()
            out = self.read.wait()
            done = time.perf_counter()
            spans.append((self.queued, done, json.loads(out)["seconds"] if out else 0.0, done - called))
            return out

    class TimedNative:
        def __getattr__(self, name):
            return getattr(_native, name)

        def read_queued(self, *a, **kw):
            read_bytes[0] += sum(n for _, _, n, _ in a[2])  # its pieces: (file, offset, bytes, address)
            if kw.get("after") is not None:
                kw["after"] = kw["after"].read
            return TimedRead(_native.read_queued(*a, **kw))

    _read_ahead._native = TimedNative()
    collections: list = []  # (generation, seconds) of each cycle collection
    began = [0.0]  # when the collection under way began

    def collected(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            collections.append((info["generation"], time.perf_counter() - began[0]))

    gc.callbacks.append(collected)
    t = time.perf_counter()
    parts, nbytes, opened, first, second = {}, 0, 0.0, 0.0, 0.0
    for path in paths:
        opening = time.perf_counter()
        with zerohop.safe_open(path, framework="pt", device=device) as f:
            marks = [time.perf_counter()]
            for name in f.keys():
                s = f.get_slice(name)
                parts[name] = s[:max(1, s.get_shape()[0] // 2)]
                nbytes += parts[name].numel() * parts[name].element_size()
                if len(marks) < 3:
                    marks.append(time.perf_counter())
        opened += marks[0] - opening
        first += marks[1] - marks[0]
        second += marks[2] - marks[1] if len(marks) > 2 else 0.0
    sync()
    end = time.perf_counter()
    gc.callbacks.remove(collected)
    spans.sort()
    return {"gbps": nbytes / (end - t) / 1e9, "wall": end - t, "reads": len(spans),
            "read_over_asked": read_bytes[0] / nbytes,
            "engine": sum(s[2] for s in spans), "blocked": sum(s[3] for s in spans),
            "head": spans[0][0] - t if spans else 0.0,
            "open": opened, "first": first, "second": second,
            "tail": end - spans[-1][1] if spans else 0.0,
            "gc": sum(c[1] for c in collections), "full_gc": sum(c[0] == 2 for c in collections)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--settings", default="default;READ_AHEAD_WINDOWS=3;READ_AHEAD_DENSE_MOST=2147483648",
                    help="';'-separated; each 'default' or NAME=INT,... (or settle=SECONDS)")
    ap.add_argument("--unsorted", action="store_true", help="make missing files with zerohop.save_file (the data "
                    "in the order the tensors came), not safetensors' (sorted by name)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.files, args.device, args.child)))
        return
    if not all(os.path.exists(f) for f in args.files):
        save_file = None
        if args.unsorted:
            import zerohop

            save_file = zerohop.save_file
        if len(args.files) == 1:
            make_small_fp8(args.files[0], save_file)
        else:
            make_shards(args.files, save_file)
    settings = [s.strip() for s in args.settings.split(";")]
    rows: dict = {s: [] for s in settings}
    for r in range(args.rounds):
        for s in settings[r % len(settings):] + settings[:r % len(settings)]:
            out = subprocess.run([sys.executable, __file__, *args.files, "--device", args.device, "--child", s],
                                 check=True, stdout=subprocess.PIPE, text=True).stdout
            rows[s].append(json.loads(out.splitlines()[-1]))
    med = statistics.median
    for s, runs in rows.items():
        print(f"{s}: {max(x['gbps'] for x in runs):.2f} GB/s best, {med(x['gbps'] for x in runs):.2f} median"
              f" ({len(runs)} runs); medians: wall {med(x['wall'] for x in runs) * 1e3:.0f} ms,"
              f" {med(x['reads'] for x in runs):.0f} window reads of {med(x['read_over_asked'] for x in runs):.2f} x"
              f" the bytes asked (their transfers {med(x['engine'] for x in runs) * 1e3:.0f} ms,"
              f" the program blocked waiting for them {med(x['blocked'] for x in runs) * 1e3:.0f} ms),"
              f" the files opened in {med(x['open'] for x in runs) * 1e3:.1f} ms, the first read took"
              f" {med(x['first'] for x in runs) * 1e3:.1f} ms and the second {med(x['second'] for x in runs) * 1e3:.1f},"
              f" the first window queued after {med(x['head'] for x in runs) * 1e3:.1f} ms, the tail after the last"
              f" one's wait {med(x['tail'] for x in runs) * 1e3:.1f} ms; cycle collections"
              f" {med(x['gc'] for x in runs) * 1e3:.1f} ms, full ones in {sum(x['full_gc'] > 0 for x in runs)} runs;"
              f" each run's wall: {', '.join(str(round(x['wall'] * 1e3)) for x in runs)} ms")


if __name__ == "__main__":
    main()
