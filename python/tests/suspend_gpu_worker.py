"""A PyTorch process on a GPU whose tensors live in zerohop's suspendable
heap and which serves suspend requests (test_suspend_gpu.py drives it with
`zerohop suspend/resume/checkpoint-process/restore-process PID DIR`).

Its workload: a transformer layer run eagerly and captured in a CUDA graph,
plus MiB of filler tensors (argv[1]). It prints "ready PID", then answers
lines on stdin: "check" (do the eager pass, the graph's replay and the
filler give exactly what they gave before?), "work" (takes the lock, as a
step of the process would), "mib" (MiB of device memory behind its heap).
"""

import sys
import threading

import torch

import zerohop
from zerohop import _native

lock = threading.Lock()
torch.manual_seed(3)
with zerohop.suspendable() as pool:
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True,
                                             device="cuda").eval()
    x = torch.randn(4, 64, 256, device="cuda")
    filler = [torch.randn(64 << 18, device="cuda") for _ in range(int(sys.argv[1]) // 64)]  # 64 MiB each

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
want_filler = [int(t.view(torch.int32).sum(dtype=torch.int64)) for t in filler]
torch.cuda.synchronize()

server = zerohop.serve_suspend(lock=lock)
print("ready", server.path, flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "check":
        with lock, torch.no_grad():
            out.zero_()
            graph.replay()
            same = {
                "eager": torch.equal(layer(x), want_eager),
                "graph": torch.equal(out, want_graph),
                "filler": [int(t.view(torch.int32).sum(dtype=torch.int64)) for t in filler] == want_filler,
            }
        bad = [k for k, v in same.items() if not v]
        print("intact" if not bad else "changed: " + ",".join(bad), flush=True)
    elif command == "work":
        got = lock.acquire(timeout=0.5)
        if got:
            lock.release()
        print("worked" if got else "paused", flush=True)
    elif command == "mib":
        _, backed, _ = _native.heap_state("cuda:0")
        print(backed >> 20, flush=True)
server.close()
del pool
