"""Starting ranks of a worker script as torchrun would (RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in the environment), for the tests that talk
gloo over loopback sockets."""

import json
import os
import socket
import subprocess
import sys

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
