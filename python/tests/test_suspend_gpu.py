"""`zerohop.suspendable()`, `suspend` and `resume` with PyTorch on a GPU:
the memory goes back to the driver and the tensors, and a CUDA graph that
reads them, are as they were after a resume."""

import pytest

torch = pytest.importorskip("torch")

import zerohop  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def test_tensors_and_a_captured_graph_survive_a_suspend(tmp_path):
    g = torch.Generator(device="cuda").manual_seed(5)
    with zerohop.suspendable() as pool:
        a = torch.randn(64 << 20, generator=g, device="cuda")  # 256 MiB
        w = torch.randn(1024, 1024, generator=g, device="cuda")
    want_a, want_ww = a.clone(), w @ w

    # A graph that reads `a` at its address; its output lives in the
    # graph's own pool, outside the heap.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = a * 3 + 1
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = a * 3 + 1
    graph.replay()
    want_out = out.clone()

    free_before = torch.cuda.mem_get_info()[0]
    done = zerohop.suspend(tmp_path / "s")
    free_suspended = torch.cuda.mem_get_info()[0]
    assert free_suspended - free_before >= a.nbytes, (free_before, free_suspended, done)
    assert done["released_bytes"] >= a.nbytes + w.nbytes

    # Another allocation may use the freed memory meanwhile.
    other = torch.ones(64 << 20, device="cuda")
    del other
    torch.cuda.synchronize()

    zerohop.resume(tmp_path / "s")
    assert torch.equal(a, want_a) and torch.equal(w @ w, want_ww)
    out.zero_()
    graph.replay()
    assert torch.equal(out, want_out)
    del pool
