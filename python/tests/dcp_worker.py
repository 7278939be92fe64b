"""One rank of the DCP tests (test_distributed.py starts two, as torchrun
would): saves a state of a DTensor sharded over both ranks, a replicated
tensor and plain values with zerohop.dcp and with DCP's own FileSystemWriter,
loads both back with the matching readers, and writes what it found to
argv[2] as JSON. argv[1] is the directory for both checkpoints."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import zerohop.dcp
from workers import leave_group


def state(mesh):
    g = torch.Generator().manual_seed(7)  # the same on every rank
    return {
        "sharded": distribute_tensor(torch.randn(10, 6, generator=g).to(torch.bfloat16), mesh, [Shard(0)]),
        "replicated": torch.randn(33, generator=g),
        "ids": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "extra": {"step": 1234, "name": "run-a"},
    }


def blank(mesh):
    """The state's structure, every value zeroed: what a load fills."""
    return {
        "sharded": distribute_tensor(torch.zeros(10, 6, dtype=torch.bfloat16), mesh, [Shard(0)]),
        "replicated": torch.zeros(33),
        "ids": torch.zeros(3, 4, dtype=torch.int64),
        "extra": {"step": 0, "name": ""},
    }


def listed(tensors):
    """Tensors as lists of their bytes (bf16) or values, for JSON."""
    return {k: (v.view(torch.uint8) if v.dtype == torch.bfloat16 else v).flatten().tolist()
            for k, v in tensors.items() if isinstance(v, torch.Tensor)}


def full(s):
    """The state with each DTensor (sharded along dimension 0) gathered
    whole by a plain collective: DTensor.full_tensor() would keep the
    process group alive past leave_group()."""
    out = {}
    for k, v in s.items():
        if isinstance(v, DTensor):
            assert v.placements == (Shard(0),), v.placements
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, v.to_local())
            v = torch.cat(parts)
        out[k] = v
    return out


def main():
    root, out = sys.argv[1:3]
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    report = {"rank": dist.get_rank()}
    for name, writer, reader in [
        ("zerohop", zerohop.dcp.StorageWriter, zerohop.dcp.StorageReader),
        ("dcp", dcp.FileSystemWriter, dcp.FileSystemReader),
    ]:
        path = os.path.join(root, name)
        dcp.save(state(mesh), storage_writer=writer(path))
        back = blank(mesh)
        dcp.load(back, storage_reader=reader(path))
        got = full(back)
        report[name] = {
            "tensors": listed(got),
            "extra": got["extra"],
        }
    report["want"] = listed(full(state(mesh)))
    try:  # a committed checkpoint is never written over
        dcp.save(state(mesh), storage_writer=zerohop.dcp.StorageWriter(os.path.join(root, "zerohop")))
    except CheckpointException as e:  # DCP's wrapper of each rank's error
        report["again"] = str(e)
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
    leave_group()  # after main(), whose locals hold the mesh
