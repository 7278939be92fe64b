"""One rank of the distributed loading tests (test_distributed.py starts
two, as torchrun would: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in
the environment). Loads the model given as argv[1] with the plan named by
argv[2] over gloo, checks every tensor against safetensors' own load and
writes what it saw to argv[3] as JSON."""

import fnmatch
import json
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file as reference_load

import zerohop
import zerohop.distributed as zd
from workers import leave_group

# Blocks of 1 MiB, so that the test model spans several and its largest
# tensor has one of its own, as 256 MiB blocks do with a real model.
zerohop._buffers.BLOCK_BYTES = 1 << 20

PLANS = {
    "replicated": None,
    "mixed": {
        "*.rows": zd.Split(0),
        "*.cols": zd.Split(1),
        "*.thin": zd.Split(-1),  # narrow segments: read as a covering range
        "*.three": zd.Split(0, parts=3),
        "skip.*": None,
    },
    # Rank 1 is given a file that does not exist: both ranks fail, neither hangs.
    "missing": None,
    # Rank 1 replicates what rank 0 splits: refused on both.
    "disagree": lambda name, shape, dtype: zd.Split(0) if dist.get_rank() == 0 and name.endswith(".rows") else zd.REPLICATED,
}


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)


def expected(name, t, rank, world):
    """What this rank should hold of tensor `t`: None where the plan skips it."""
    plan = PLANS[sys.argv[2]]
    spec = zd.REPLICATED
    if plan is not None:
        spec = next((s for p, s in plan.items() if fnmatch.fnmatchcase(name, p)), zd.REPLICATED)
    if spec is None or spec == zd.REPLICATED:
        return None if spec is None else t
    parts = spec.parts or world
    return torch.tensor_split(t, parts, dim=spec.dim)[rank % parts]


def main():
    model, plan_name, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    totals = []
    result = {"rank": rank}
    try:
        path = model + ".missing" if plan_name == "missing" and rank == 1 else model
        loaded = zd.load_file(path, device="cpu", plan=PLANS[plan_name], progress=lambda done, total: totals.append(total))
    except (ValueError, RuntimeError, OSError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
    else:
        reference = reference_load(model)
        wrong = []
        for name, t in reference.items():
            want = expected(name, t, rank, world)
            got = loaded.get(name)
            if want is None:
                if got is not None:
                    wrong.append(f"{name}: loaded but the plan skips it")
            elif got is None or got.dtype != want.dtype or got.shape != want.shape or not torch.equal(bits(got), bits(want)):
                wrong.append(name)
        result.update(wrong=wrong, bytes=max(totals, default=0), names=sorted(loaded))
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
    leave_group()
