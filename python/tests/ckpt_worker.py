"""One rank of the sharded checkpoint tests (test_sharded_checkpoint.py
starts several, as torchrun would). argv: ACTION ROOT OUT.

    save N     saves this rank's state (seed N) to ROOT/step-N
    load N     loads ROOT/step-N with group=, checks it against the state
               of seed N as this world size would hold it
    restore N  restores ROOT/step-N in place into a zeroed state
    kill N     saves to ROOT/step-N; rank 1 dies (SIGKILL) mid-save
    plain N    loads ROOT/step-N, which holds plain tensors, at another size

Writes what it saw to OUT as JSON: {"rank", "ok"} or {"rank", "error"}.
"""

import json
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import zerohop.checkpoint as ckpt


def full_state(seed):
    """The global tensors every world size shards (same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "rows": torch.randn(11, 6, generator=g),  # 11 rows: uneven shards at 2 and 3 ranks
        "emb": torch.randn(40, 3, generator=g).to(torch.bfloat16),
        "bias": torch.randn(5, generator=g),  # replicated
        "few": torch.randn(2, 4, generator=g),  # fewer rows than 3 ranks
    }


def state(seed, mesh, rank, plain):
    full = full_state(seed)
    out = {
        "model": {n: distribute_tensor(t, mesh, [Replicate() if n == "bias" else Shard(0)]) for n, t in full.items()},
        "step": seed * 10,
        "note": ("zerohop", [1.5, None]),
    }
    if plain:
        out["mine"] = torch.full((3,), float(rank))  # per-rank, not resharded
    return out


def check(loaded, seed, mesh, rank, plain):
    want = state(seed, mesh, rank, plain)
    assert loaded["step"] == want["step"] and loaded["note"] == want["note"], (loaded["step"], loaded["note"])
    for name, w in want["model"].items():
        got = loaded["model"][name]
        assert type(got).__name__ == "DTensor", type(got)
        assert got.placements == w.placements and got.shape == w.shape, (name, got.placements, got.shape)
        assert torch.equal(got.to_local(), w.to_local()), name
        assert torch.equal(got.full_tensor(), full_state(seed)[name]), name
    if plain:
        assert torch.equal(loaded["mine"], want["mine"])


def main():
    action, seed, root, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD  # None until the group is initialized
    mesh = init_device_mesh("cpu", (world,))
    target = os.path.join(root, f"step-{seed}")
    result = {"rank": rank}
    try:
        if action in ("save", "kill"):
            def die(done, total):
                if action == "kill" and rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)

            ckpt.save(state(seed, mesh, rank, plain=world == 2), target, group=group, progress=die)
        elif action in ("load", "plain"):
            check(ckpt.load(target, group=group), seed, mesh, rank, plain=action == "load" and world == 2)
        elif action == "restore":
            live = state(seed + 1, mesh, rank, plain=True)  # other values, same layout
            ckpt.restore_into(live, target, group=group)
            live["step"] = seed * 10  # plain values are not restored in place
            check(live, seed, mesh, rank, plain=True)
        result["ok"] = True
    except (ValueError, RuntimeError, OSError, AssertionError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
    with open(out, "w") as f:
        json.dump(result, f)
    # Out without tearing the group down: after a peer died, or all ranks
    # failed alike, gloo's teardown may abort the process (what is under
    # test is written above).
    os._exit(0)


if __name__ == "__main__":
    main()
