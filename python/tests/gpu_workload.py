"""The GPU workload of the worker processes: a transformer layer run eagerly
and captured in a CUDA graph, plus MiB of filler tensors, and a check that
all of it gives exactly what it gave at the start."""

import torch


def build(where, mib):
    """Allocates the layer, its input and `mib` MiB of filler inside the
    context `where` (zerohop.suspendable(), or a null context for
    PyTorch's own memory), captures the graph outside it, and returns
    `check() -> [what changed]` and what `where` yielded (zerohop's
    MemPool: keep it while the tensors live)."""
    torch.manual_seed(3)
    with where as pool:
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

    return check, pool
