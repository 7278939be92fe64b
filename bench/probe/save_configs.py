#!/usr/bin/env python3
"""One checkpoint save under several engine settings, alternated: which
setting moves a save's bytes fastest. Each row is `zerohop checkpoint save
--from FILE` (a fresh process: the file loaded into the GPU, then saved
into a new directory under DIR) with the settings of one configuration;
the rows rotate every round. Prints, per configuration, the transfer's
rate (the engine's own clock), the whole save's (until durable), and
where the workers' time went.

    python3 bench/probe/save_configs.py FILE --zerohop .stage/bin/zerohop [--dir /dev/shm] [--rounds 3]
        [--configs "default;--threads 12;--slot 2MiB --write-window 2MiB"]

A configuration may begin with `@BINARY` (another build of zerohop, e.g.
the commit before a change) and NAME=VALUE settings of its environment.
FILE is made if missing, as bench/matrix.py's small-fp8 shape (3,280 FP8
tensors of 1 - 4 MiB, 8 GiB; needs torch and safetensors).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess

DEFAULT_CONFIGS = "default;--threads 12;--threads 24 --staging 256MiB;--slot 2MiB --write-window 2MiB;--staging 64MiB --slot 2MiB --write-window 2MiB"


def make_small_fp8(path: str, save_file=None) -> None:
    """bench/matrix.py's small-fp8 shape, written by `save_file`
    (safetensors', which sorts the tensors by name, if None)."""
    import torch

    if save_file is None:
        from safetensors.torch import save_file
    g = torch.Generator().manual_seed(1)
    unit = (8 << 30) // (3280 * 5 // 2) // 4096 * 4096
    save_file({f"expert.{i}": torch.randint(0, 256, (unit * (1 + i % 4),), generator=g, dtype=torch.uint8)
               .view(torch.float8_e4m3fn).view(-1, 4096) for i in range(3280)}, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--zerohop", default="target/release/zerohop")
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="engine options per configuration, ';'-separated")
    args = ap.parse_args()
    if not os.path.exists(args.file):
        make_small_fp8(args.file)
    configs = [c.strip() for c in args.configs.split(";")]
    rows: dict = {c: [] for c in configs}
    target = os.path.join(args.dir, f"zerohop-save-configs-{os.getpid()}")
    for r in range(args.rounds):
        for c in configs[r % len(configs):] + configs[:r % len(configs)]:
            shutil.rmtree(target, ignore_errors=True)
            options = [] if c == "default" else shlex.split(c)
            binary, env = args.zerohop, dict(os.environ)
            while options and (options[0].startswith("@") or "=" in options[0]):
                word = options.pop(0)
                if word.startswith("@"):
                    binary = word[1:]
                else:
                    name, value = word.split("=", 1)
                    env[name] = value
            out = subprocess.run([binary, "checkpoint", "save", "--from", args.file, target, "--json", *options],
                                 check=True, capture_output=True, text=True, env=env).stdout
            report = json.loads(out)
            t = report["transfer"]
            per = 1e3 / max(t["io_threads"], 1)
            row = (report["bytes"] / t["seconds"] / 1e9, report["gbps"], t["profile"]["io_seconds"] * per,
                   t["profile"]["copy_wait_seconds"] * per)
            rows[c].append(row)
            print(f"round {r} [{c}]: transfer {row[0]:.2f} GB/s, durable {row[1]:.2f} GB/s;"
                  f" per worker: writes {row[2]:.0f} ms, copy wait {row[3]:.0f} ms", flush=True)
    shutil.rmtree(target, ignore_errors=True)
    print("configuration: transfer GB/s best / median, until durable best / median")
    for c, got in rows.items():
        transfer, durable = [x[0] for x in got], [x[1] for x in got]
        print(f"  [{c}]: {max(transfer):.2f} / {statistics.median(transfer):.2f},"
              f" {max(durable):.2f} / {statistics.median(durable):.2f}")


if __name__ == "__main__":
    main()
