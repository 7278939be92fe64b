"""A process CRIU can freeze and thaw whole: nothing ties it to the test
(stdin is /dev/null, its output goes to a file, it leads its own session),
and it takes requests as files in a spool directory (spool.py).

    spool_worker.py SPOOL MODE MIB

MODE "cpu": MIB MiB of random host memory. MODE "zerohop": a transformer
layer, a CUDA graph captured over it and MIB MiB of filler tensors in
zerohop's suspendable heap, served to `zerohop suspend` (what a freeze
uses). MODE "driver": the same in PyTorch's own memory, serving nothing
(the driver then checkpoints all of it). Requests: "check" (is every value
what it was at the start? "intact" or what changed), "pid", "stop".
"""

import hashlib
import os
import sys
import threading
import time

spool, mode, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
lock = threading.Lock()

if mode == "cpu":
    state = bytearray(os.urandom(mib << 20))
    want = hashlib.sha256(state).hexdigest()

    def check():
        return [] if hashlib.sha256(state).hexdigest() == want else ["memory"]
else:
    import contextlib

    import torch

    import zerohop

    torch.manual_seed(3)
    where = zerohop.suspendable() if mode == "zerohop" else contextlib.nullcontext()
    with where:
        layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True,
                                                 device="cuda").eval()
        x = torch.randn(4, 64, 256, device="cuda")
        filler = [torch.randn(64 << 18, device="cuda") for _ in range(mib // 64)]  # 64 MiB each
    with torch.no_grad():
        want_eager = layer(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(x)  # warm-up before capture, as CUDA graphs need
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(x)
        graph.replay()
        want_graph = out.clone()
    sums = [int(t.view(torch.int32).sum(dtype=torch.int64)) for t in filler]
    torch.cuda.synchronize()
    server = zerohop.serve_suspend(lock=lock) if mode == "zerohop" else None

    def check():
        with torch.no_grad():
            out.zero_()
            graph.replay()
            same = {
                "eager": torch.equal(layer(x), want_eager),
                "graph": torch.equal(out, want_graph),
                "filler": [int(t.view(torch.int32).sum(dtype=torch.int64)) for t in filler] == sums,
            }
        return [k for k, v in same.items() if not v]


def answer(name, text):
    tmp = os.path.join(spool, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(spool, name + ".ans"))


answer("ready", str(os.getpid()))
while True:
    requests = sorted(n for n in os.listdir(spool) if n.endswith(".req"))
    for name in requests:
        path = os.path.join(spool, name)
        with open(path) as f:
            command = f.read().strip()
        os.unlink(path)
        with lock:
            if command == "check":
                bad = check()
                answer(name[:-4], "intact" if not bad else "changed: " + ",".join(bad))
            elif command == "pid":
                answer(name[:-4], str(os.getpid()))
            elif command == "stop":
                answer(name[:-4], "stopping")
                sys.exit(0)
            else:
                answer(name[:-4], f"unknown request {command!r}")
    time.sleep(0.005)
