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
  dcp save/load    dcp.save and dcp.load of --dcp-gib GiB of bf16 DTensors
                   per rank (Shard(0) over the GPUs) into --dcp-dir, through
                   zerohop.dcp and through DCP's FileSystemWriter/Reader,
                   alternating first; loads checked bit-identical
  sharded save     zerohop.checkpoint.save(..., group=) of --ckpt-gib GiB
                   of GPU tensors per rank, to --dcp-dir (tmpfs) and to
                   --cold-dir (disk), against every rank writing as many
                   bytes from host memory at once (64 MiB writes, fsync):
                   the raw parallel write rate of the same run; then
                   restore_into (disk: page cache dropped first), checked
                   bit-identical
Before any timing, rank 0 touches --warm-gib GiB of fresh host memory once
(the VM grows its memory on first touch, ~0.6 s per GiB: DCP's own writer
stages through host memory and would pay that, zerohop's pinned staging is
set up by zerohop.prepare first).  DCP's FileSystemWriter/Reader run with
their defaults.  Each cold row reads a fresh copy of the model (`zerohop gen --seed`),
written and synced first, page cache dropped before the load; the two
cold loaders alternate first between rounds.  Targets (issue 13): cold
read-once >= 1.7 x each-whole and storage bytes = one model; hot tp >= 0.9 x
the single-GPU rate per rank; dcp through zerohop >= 2 x DCP's own storage;
sharded save at the raw parallel write rate.

`--cpu` runs every row on host memory over gloo, with small sizes, to
check the script itself where there is no GPU:

  torchrun --nproc-per-node 2 bench/distributed.py --cpu --size 64MiB --dcp-gib 0.05 \
      --ckpt-gib 0.1 --warm-gib 0 --zerohop target/release/zerohop --cold-dir /tmp \
      --dcp-dir /tmp --hot /tmp/model.safetensors
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import warm_host_memory  # noqa: E402
from peers_child import drop_page_cache  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import zerohop  # noqa: E402
import zerohop.distributed as zd  # noqa: E402


def sync() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(rank: int, load) -> tuple[float, int]:
    """Seconds from a barrier until every rank is done, and this rank's
    storage bytes."""
    totals = [0]
    dist.barrier()
    sync()
    start = time.perf_counter()
    tensors = load(lambda done, total: totals.__setitem__(0, total))
    sync()
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
    p.add_argument("--dcp-dir", default="/dev/shm", help="where the DCP checkpoints go")
    p.add_argument("--dcp-gib", type=float, default=4.0, help="GiB of state per rank for the DCP rows")
    p.add_argument("--ckpt-gib", type=float, default=8.0, help="GiB of state per rank for the sharded save rows")
    p.add_argument("--warm-gib", type=float, default=24.0, help="host memory to touch before timing")
    p.add_argument("--cpu", action="store_true", help="host memory and gloo: a dry run of the script without GPUs")
    p.add_argument("--json-out")
    args = p.parse_args()
    # torch modules imported after the group exists hold it (as default
    # arguments) past destroy_process_group(), and its threads then run
    # into the interpreter's exit, which can abort the rank: import first.
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.device_mesh  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

    dist.init_process_group("gloo" if args.cpu else "nccl")
    rank = dist.get_rank()
    if args.cpu:
        device = "cpu"
        if rank == 0 and not os.path.exists(args.hot):
            subprocess.run([args.zerohop, "gen", "--size", args.size, args.hot], check=True, stdout=subprocess.DEVNULL)
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = f"cuda:{torch.cuda.current_device()}"
        zerohop.prepare(device)
    if rank == 0:
        warmed = warm_host_memory(args.warm_gib)
        print(f"warmed {warmed['gib']:.0f} GiB of host memory in {warmed['seconds']:.1f} s", flush=True)
    dist.barrier()
    rows = []

    loaders = {
        "read-once": lambda path: lambda progress: zd.load_file(path, device=device, progress=progress),
        "each-whole": lambda path: lambda progress: zerohop.load_file(path, device=device, progress=progress),
    }
    for rnd in range(args.rounds):
        order = list(loaders) if rnd % 2 == 0 else list(reversed(loaders))
        for name in order:
            path = fresh_model(args, rank, name, 100 + 10 * rnd + order.index(name))
            model_bytes = os.path.getsize(path)
            seconds, nbytes = timed(rank, loaders[name](path))
            storage = sum(gather(nbytes))  # every rank is done with the file past this
            rows.append({"row": f"cold {name}", "round": rnd, "seconds": seconds, "storage_bytes": storage,
                         "model_bytes": model_bytes})
            if rank == 0:
                os.unlink(path)

    tp_plan = lambda name, shape, dtype: zd.Split(0) if len(shape) == 2 else zd.REPLICATED  # noqa: E731
    for rnd in range(args.rounds):
        single = None
        if rank == 0:
            start = time.perf_counter()
            t = zerohop.load_file(args.hot, device=device)
            sync()
            single = os.path.getsize(args.hot) / (time.perf_counter() - start) / 1e9
            del t
        single = gather(single)[0]
        seconds, nbytes = timed(rank, lambda progress: zd.load_file(args.hot, device=device, plan=tp_plan, progress=progress))
        per_rank = [n / seconds / 1e9 for n in gather(nbytes)]
        rows.append({"row": "hot tp", "round": rnd, "seconds": seconds, "rank_gbps": per_rank,
                     "single_gpu_gbps": single, "ratio": min(per_rank) / single})

    rows += dcp_rows(args, rank, device)
    rows += sharded_save_rows(args, rank, device)

    if rank == 0:
        for r in rows:
            if r["row"].startswith("sharded"):
                print(f"{r['row']:<16} round {r['round']}: save {r['save_gbps']:.1f} GB/s = {r['save_gbps'] / r['raw_gbps']:.2f} x "
                      f"the raw parallel write ({r['raw_gbps']:.1f}), restore {r['restore_gbps']:.1f} GB/s (all ranks' bytes), "
                      f"identical {r['identical']}")
            elif r["row"].startswith("dcp"):
                print(f"{r['row']:<16} round {r['round']}: save {r['save_gbps']:.1f} GB/s, load {r['load_gbps']:.1f} GB/s "
                      f"(all ranks' bytes), identical {r['identical']}")
            elif r["row"].startswith("cold"):
                print(f"{r['row']:<16} round {r['round']}: {r['model_bytes'] / r['seconds'] / 1e9:6.2f} GB/s of model, "
                      f"{r['seconds']:.2f} s, storage bytes = {r['storage_bytes'] / r['model_bytes']:.2f} x model")
            else:
                print(f"{r['row']:<16} round {r['round']}: ranks {', '.join(f'{g:.1f}' for g in r['rank_gbps'])} GB/s "
                      f"of own bytes; single GPU {r['single_gpu_gbps']:.1f} GB/s; ratio {r['ratio']:.2f} (target 0.90)")
        best = {name: min(r["seconds"] for r in rows if r["row"] == f"cold {name}") for name in loaders}
        print(f"cold read-once vs each-whole: {best['each-whole'] / best['read-once']:.2f} x (target 1.70)")
        for op in ("save", "load"):
            best = {w: max(r[f"{op}_gbps"] for r in rows if r["row"] == f"dcp {w}") for w in ("zerohop", "dcp-own")}
            print(f"dcp {op} through zerohop vs DCP's own: {best['zerohop'] / best['dcp-own']:.2f} x (target 2.00)")
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump({"rows": rows, "world_size": dist.get_world_size()}, f, indent=1)
    dist.destroy_process_group()
    gc.collect()  # meshes and DTensors sit in reference cycles that hold the group


def dcp_rows(args, rank: int, device: str) -> list[dict]:
    """dcp.save and dcp.load of the same DTensors through zerohop.dcp and
    through DCP's own file system storage, same run."""
    import shutil

    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import zerohop.dcp

    world = dist.get_world_size()
    mesh = init_device_mesh(device.split(":")[0], (world,))
    count = 8
    rows_each = max(1, int(args.dcp_gib * (1 << 30)) // count // 2 // 4096)
    g = torch.Generator(device=device).manual_seed(1)
    state = {f"w{i}": distribute_tensor(torch.randn(rows_each * world, 4096, generator=g, device=device)
                                        .to(torch.bfloat16), mesh, [Shard(0)]) for i in range(count)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    storages = {"zerohop": (zerohop.dcp.StorageWriter, zerohop.dcp.StorageReader),
                "dcp-own": (dcp.FileSystemWriter, dcp.FileSystemReader)}
    out = []
    for rnd in range(args.rounds):
        for name in (list(storages) if rnd % 2 == 0 else list(reversed(storages))):
            writer, reader = storages[name]
            path = os.path.join(args.dcp_dir, f"zerohop-dcp-{name}-{rnd}")
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            dist.barrier()
            save_s, _ = timed(rank, lambda progress: dcp.save(state, storage_writer=writer(path)))
            # Zeros of each global shape (not full_tensor(): torch caches its
            # plan, which keeps the mesh and its group alive into the exit).
            back = {k: distribute_tensor(torch.zeros(v.shape, dtype=v.dtype, device=device), mesh, [Shard(0)])
                    for k, v in state.items()}
            load_s, _ = timed(rank, lambda progress: dcp.load(back, storage_reader=reader(path)))
            same = all(torch.equal(back[k].to_local(), v.to_local()) for k, v in state.items())
            out.append({"row": f"dcp {name}", "round": rnd, "save_gbps": nbytes / save_s / 1e9,
                        "load_gbps": nbytes / load_s / 1e9, "identical": all(gather(same))})
            del back
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    return out


def sharded_save_rows(args, rank: int, device: str) -> list[dict]:
    """zerohop.checkpoint.save(group=) and restore_into of --ckpt-gib GiB
    per rank, to tmpfs and to disk, against the raw parallel write rate."""
    import shutil

    import zerohop.checkpoint as ckpt

    world = dist.get_world_size()
    count = 8
    numel = max(1, int(args.ckpt_gib * (1 << 30)) // count // 2)
    g = torch.Generator(device=device).manual_seed(2 + rank)
    state = {f"s{i}": torch.randn(numel, generator=g, device=device).to(torch.bfloat16) for i in range(count)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    host = torch.ones(nbytes, dtype=torch.uint8)  # what each rank writes raw
    group = dist.group.WORLD
    out = []
    for where, root in (("tmpfs", args.dcp_dir), ("disk", args.cold_dir)):
        for rnd in range(args.rounds):
            raw = os.path.join(root, f"zerohop-raw-{rnd}-{rank}")
            raw_s, _ = timed(rank, lambda progress: write_raw(raw, host))
            os.unlink(raw)
            path = os.path.join(root, f"zerohop-sharded-{rnd}")
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            save_s, _ = timed(rank, lambda progress: ckpt.save(state, path, group=group))
            if where == "disk" and rank == 0:
                drop_page_cache([os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs])
            back = {k: torch.zeros_like(v) for k, v in state.items()}
            restore_s, _ = timed(rank, lambda progress: ckpt.restore_into(back, path, group=group))
            same = all(torch.equal(back[k], v) for k, v in state.items())
            total = nbytes * world
            out.append({"row": f"sharded {where}", "round": rnd, "save_gbps": total / save_s / 1e9,
                        "raw_gbps": total / raw_s / 1e9, "restore_gbps": total / restore_s / 1e9,
                        "identical": all(gather(same))})
            del back
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    return out


def write_raw(path: str, host) -> None:
    """`host`'s bytes to a new file at `path`, 64 MiB per write, durable."""
    view = memoryview(host.numpy())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        step = 64 << 20
        for at in range(0, len(view), step):
            os.pwrite(fd, view[at : at + step], at)
        os.fsync(fd)
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
