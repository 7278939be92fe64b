"""`zerohop.suspendable()`, `suspend` and `resume` with PyTorch on a GPU:
the memory goes back to the driver and the tensors, and a CUDA graph that
reads them, are as they were after a resume."""

import json
import os
import subprocess
import time

import workers
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


# From outside: a real workload in another process (workers.py "gpu"),
# driven by the zerohop command.

BIN = os.environ.get("ZEROHOP_BIN")


@pytest.fixture
def worker():
    """Yields start(mib): workers.py "gpu" with MiB of filler, as (process, ask)."""
    if not BIN:
        pytest.skip("ZEROHOP_BIN does not name the zerohop binary")
    started = []

    def start(mib):
        started.append(workers.start("gpu", mib))
        return started[-1]

    yield start
    for p, _ in started:
        if p.poll() is None:
            workers.stop(p)


def zerohop_cli(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)


def resumes_intact(p, ask, checkpoint):
    resumed = zerohop_cli("resume", p.pid, checkpoint)
    assert resumed.returncode == 0, resumed.stderr
    assert ask("check") == "intact"


def free_mib():
    return torch.cuda.mem_get_info()[0] >> 20


def test_a_transformer_in_another_process_is_identical_after_suspend_and_resume(worker, tmp_path):
    p, ask = worker(2048)
    held = int(ask("mib"))
    before = free_mib()
    done = zerohop_cli("suspend", p.pid, tmp_path / "s")
    assert done.returncode == 0, done.stderr
    assert ask("mib") == "0" and ask("work") == "paused"
    freed = free_mib() - before
    assert freed >= held * 0.95, (held, freed, done.stdout)

    # Another process (this one) allocates the freed memory and uses it.
    other = torch.ones((freed - 64) << 20, dtype=torch.uint8, device="cuda")
    assert int(other.sum()) == other.numel()
    del other
    torch.cuda.empty_cache()

    resumes_intact(p, ask, tmp_path / "s")


def test_a_resume_without_the_memory_fails_clearly_and_can_be_retried(worker, tmp_path):
    p, ask = worker(4096)
    assert zerohop_cli("suspend", p.pid, tmp_path / "s").returncode == 0
    # Hold all but 1 GiB of the GPU: the 4 GiB heap cannot come back.
    hog = torch.empty((free_mib() - 1024) << 20, dtype=torch.uint8, device="cuda")
    refused = zerohop_cli("resume", p.pid, tmp_path / "s")
    assert refused.returncode != 0 and "out of memory" in refused.stderr.lower(), refused.stderr
    assert ask("work") == "paused" and ask("mib") == "0"
    del hog
    torch.cuda.empty_cache()
    resumes_intact(p, ask, tmp_path / "s")


def test_a_process_killed_mid_suspend_leaves_no_checkpoint_and_no_memory(worker, tmp_path):
    before = free_mib()
    p, _ = worker(8192)
    assert free_mib() < before - 8000
    suspend = subprocess.Popen([BIN, "suspend", str(p.pid), str(tmp_path / "s")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.15)  # mid-save: 8 GiB take about 0.4 s
    p.kill()
    p.wait()
    _, err = suspend.communicate(timeout=60)
    assert suspend.returncode != 0, err
    assert not (tmp_path / "s").exists(), sorted(os.listdir(tmp_path))
    # The driver frees a dead process's memory: all of it comes back.
    deadline = time.monotonic() + 20
    while free_mib() < before - 64 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert free_mib() >= before - 64, (before, free_mib())


def test_checkpoint_process_and_restore_process(worker, tmp_path):
    p, ask = worker(2048)
    done = zerohop_cli("checkpoint-process", p.pid, tmp_path / "c")
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "c" / "PROCESS.json").read_text())
    assert record["zerohop_suspend"] and record["pid"] == p.pid
    # The driver staged little: the heap went to storage through zerohop.
    assert record["driver_host_bytes"] < 1 << 30, (record, done.stdout)
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split()
    assert str(p.pid) not in apps, apps  # no GPU memory at all while checkpointed

    again = zerohop_cli("restore-process", p.pid, tmp_path / "c")
    assert again.returncode == 0, again.stderr
    assert ask("work") == "worked" and ask("check") == "intact"
