#!/usr/bin/env python3
"""zerohop.distributed on the GPUs of one host, one process per GPU:

  torchrun --nproc-per-node 2 bench/distributed.py --zerohop .stage/bin/zerohop \\
      --cold-dir /data --hot /dev/shm/model.safetensors --json-out dist.json

Rows (times are the slowest rank's, from a barrier to a barrier after every
rank's tensors are usable; storage bytes are summed over the ranks):
  cold read-once   zd.load_file(fresh file, plan=None): every tensor
                   replicated, read once in shares, completed over NCCL
  cold each-whole  zerohop.load_file(fresh file) on every rank: the bytes
                   read once per GPU
  hot tp           zd.load_file(--hot, plan: 2-D weights split along dim 0)
                   against zerohop.load_file of the same file on rank 0
                   alone (the single-GPU rate), per rank's own bytes
Each cold row reads a fresh copy of the model (`zerohop gen --seed`),
written and synced first, page cache dropped before the load; the two
cold loaders alternate first between rounds.  Targets (issue 13): cold
read-once >= 1.7 x each-whole and storage bytes = one model; hot tp >= 0.9 x
the single-GPU rate per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers_child import drop_page_cache  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import zerohop  # noqa: E402
import zerohop.distributed as zd  # noqa: E402


def timed(rank: int, load) -> tuple[float, int]:
    """Seconds from a barrier until every rank is done, and this rank's
    storage bytes."""
    totals = [0]
    dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    tensors = load(lambda done, total: totals.__setitem__(0, total))
    torch.cuda.synchronize()
    dist.barrier()
    seconds = time.perf_counter() - start
    del tensors
    return seconds, totals[0]


def gather(value):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def fresh_model(args, rank: int, name: str, seed: int) -> str:
    """A new model file, written by rank 0, synced and out of the page cache."""
    path = os.path.join(args.cold_dir, f"zerohop-dist-{name}-{seed}.safetensors")
    if rank == 0:
        subprocess.run([args.zerohop, "gen", "--size", args.size, "--seed", str(seed), path],
                       check=True, stdout=subprocess.DEVNULL)
        drop_page_cache([path])
    dist.barrier()
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zerohop", required=True, help="the zerohop binary (for `gen`)")
    p.add_argument("--cold-dir", required=True, help="a directory on the disk for fresh model copies")
    p.add_argument("--hot", required=True, help="a model on tmpfs, for the hot TP rows")
    p.add_argument("--size", default="8GiB")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json-out")
    args = p.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = f"cuda:{torch.cuda.current_device()}"
    zerohop.prepare(device)
    rows = []

    loaders = {
        "read-once": lambda path: lambda progress: zd.load_file(path, device=device, progress=progress),
        "each-whole": lambda path: lambda progress: zerohop.load_file(path, device=device, progress=progress),
    }
    for rnd in range(args.rounds):
        order = list(loaders) if rnd % 2 == 0 else list(reversed(loaders))
        for name in order:
            path = fresh_model(args, rank, name, 100 + 10 * rnd + order.index(name))
            seconds, nbytes = timed(rank, loaders[name](path))
            storage = sum(gather(nbytes))
            rows.append({"row": f"cold {name}", "round": rnd, "seconds": seconds, "storage_bytes": storage,
                         "model_bytes": os.path.getsize(path)})
            if rank == 0:
                os.unlink(path)

    tp_plan = lambda name, shape, dtype: zd.Split(0) if len(shape) == 2 else zd.REPLICATED  # noqa: E731
    for rnd in range(args.rounds):
        single = None
        if rank == 0:
            start = time.perf_counter()
            t = zerohop.load_file(args.hot, device=device)
            torch.cuda.synchronize()
            single = os.path.getsize(args.hot) / (time.perf_counter() - start) / 1e9
            del t
        single = gather(single)[0]
        seconds, nbytes = timed(rank, lambda progress: zd.load_file(args.hot, device=device, plan=tp_plan, progress=progress))
        per_rank = [n / seconds / 1e9 for n in gather(nbytes)]
        rows.append({"row": "hot tp", "round": rnd, "seconds": seconds, "rank_gbps": per_rank,
                     "single_gpu_gbps": single, "ratio": min(per_rank) / single})

    if rank == 0:
        for r in rows:
            if r["row"].startswith("cold"):
                print(f"{r['row']:<16} round {r['round']}: {r['model_bytes'] / r['seconds'] / 1e9:6.2f} GB/s of model, "
                      f"{r['seconds']:.2f} s, storage bytes = {r['storage_bytes'] / r['model_bytes']:.2f} x model")
            else:
                print(f"{r['row']:<16} round {r['round']}: ranks {', '.join(f'{g:.1f}' for g in r['rank_gbps'])} GB/s "
                      f"of own bytes; single GPU {r['single_gpu_gbps']:.1f} GB/s; ratio {r['ratio']:.2f} (target 0.90)")
        best = {name: min(r["seconds"] for r in rows if r["row"] == f"cold {name}") for name in loaders}
        print(f"cold read-once vs each-whole: {best['each-whole'] / best['read-once']:.2f} x (target 1.70)")
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump({"rows": rows, "world_size": dist.get_world_size()}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
