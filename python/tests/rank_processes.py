"""Starting ranks of a worker script as torchrun would (RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in the environment), for the tests that talk
gloo over loopback sockets; and, for the workers, leaving the group."""

import gc
import json
import os
import socket
import subprocess
import sys
import weakref

HERE = os.path.dirname(__file__)


def run_ranks(worker, argv, out_dir, world=2, timeout=120):
    """Runs `world` ranks of `worker` with `argv` plus an output path each;
    returns what each wrote (JSON), or {"rank", "exit"} for a rank that
    wrote nothing (killed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = os.path.join(out_dir, f"rank{rank}.json")
        if os.path.exists(out):
            os.remove(out)
        procs.append((subprocess.Popen([sys.executable, os.path.join(HERE, worker), *argv, out], env=env), out))
    results = []
    for rank, (p, out) in enumerate(procs):
        code = p.wait(timeout=timeout)
        if os.path.exists(out):
            assert code == 0, f"rank {rank} wrote its result but exited with {code}"
            with open(out) as f:
                results.append(json.load(f))
        else:
            results.append({"rank": rank, "exit": code})
    return results


def leave_group():
    """Destroys this rank's process group and checks that it is gone, its
    gloo threads joined; a worker calls it last, once nothing of its own
    holds a DeviceMesh or DTensor.

    A group that outlives this keeps its threads running into the
    interpreter's exit. There, a gloo worker that drops a finished
    collective's last reference to a tensor needs the GIL to free it;
    CPython ends a thread that takes the GIL while it finalizes, the
    unwinding runs into a C++ destructor and std::terminate aborts the
    rank ("terminate called without an active exception", exit -6) now and
    then. Held, it is an error every time instead. Holders seen: torch's
    cache of DTensor redistribute plans (DTensor.full_tensor()), which keeps
    the mesh and its groups, and torch modules first imported after
    init_process_group, whose functions take group.WORLD as a default."""
    import torch.distributed as dist

    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    gc.collect()  # meshes and DTensors sit in reference cycles
    if group() is not None:
        raise SystemExit("the process group outlived destroy_process_group(): "
                         "something still holds it, and its gloo threads would run into the exit")
