"""zerohop.distributed over a real process group: two processes started as
torchrun starts them, talking gloo over loopback sockets, on host memory
(the NCCL path runs on the two-GPU machine: bench/distributed.py)."""

import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no gloo process groups", allow_module_level=True)

import zerohop  # noqa: E402
import zerohop.distributed as zd  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")


def model(path):
    g = torch.Generator().manual_seed(11)
    tensors = {
        "embed.weight": torch.randn(1000, 64, generator=g).to(torch.bfloat16),
        "layer.0.rows": torch.randn(37, 16, generator=g),
        "layer.0.cols": torch.randn(3, 100_000, generator=g).to(torch.bfloat16),  # wide segments: strided reads
        "layer.0.thin": torch.randn(64, 9, generator=g),
        "layer.0.three": torch.randint(0, 100, (10, 4), generator=g),
        "layer.0.norm": torch.randn(64, generator=g),
        "layer.0.fp8": torch.randn(33, 7, generator=g).to(torch.float8_e4m3fn),
        "skip.me": torch.randn(8, generator=g),
        "empty": torch.empty(0, 3),
        "big": torch.randn(300_000, generator=g),
    }
    st_torch.save_file(tensors, str(path))
    return tensors


def run_ranks(tmp_path, plan, world=2):
    """Starts `world` ranks of dist_worker.py, as torchrun would; returns
    what each reported."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = tmp_path / f"rank{rank}.json"
        procs.append((subprocess.Popen([sys.executable, WORKER, str(tmp_path / "m.safetensors"), plan, str(out)], env=env), out))
    results = []
    for p, out in procs:
        assert p.wait(timeout=120) == 0
        results.append(json.loads(out.read_text()))
    return results


def test_replicated_tensors_are_read_once_across_the_ranks(tmp_path):
    model(tmp_path / "m.safetensors")
    ranks = run_ranks(tmp_path, "replicated")
    for r in ranks:
        assert r["wrong"] == [], r
    header = zerohop._safetensors._headers([str(tmp_path / "m.safetensors")])[1]
    data_bytes = sum(t.end - t.begin for t in header.values())
    assert sum(r["bytes"] for r in ranks) == data_bytes, "one model read from storage, not one per rank"
    assert all(0 < r["bytes"] < data_bytes for r in ranks), "every rank reads a share"


def test_each_rank_gets_its_slices_and_skips_what_the_plan_skips(tmp_path):
    model(tmp_path / "m.safetensors")
    ranks = run_ranks(tmp_path, "mixed")
    for r in ranks:
        assert r["wrong"] == [], r
        assert "skip.me" not in r["names"] and "layer.0.rows" in r["names"]


def test_ranks_that_disagree_on_replicated_tensors_get_a_clear_error(tmp_path):
    model(tmp_path / "m.safetensors")
    for r in run_ranks(tmp_path, "disagree"):
        assert "disagree on which tensors are replicated" in r.get("error", ""), r


def test_without_a_process_group_it_loads_as_rank_0_of_1(tmp_path):
    tensors = model(tmp_path / "m.safetensors")
    loaded = zd.load_file(tmp_path / "m.safetensors", device="cpu", plan={"layer.0.cols": zd.Split(1, parts=4), "skip.*": None})
    assert torch.equal(loaded["layer.0.cols"], tensors["layer.0.cols"][:, :25_000])
    assert torch.equal(loaded["big"], tensors["big"]) and "skip.me" not in loaded
    assert loaded["empty"].shape == (0, 3)


def test_bad_plans_are_refused_clearly(tmp_path):
    model(tmp_path / "m.safetensors")
    path = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match="cannot be split along dimension 2"):
        zd.load_file(path, device="cpu", plan={"layer.0.rows": zd.Split(2)})
    with pytest.raises(ValueError, match="positive number of parts"):
        zd.load_file(path, device="cpu", plan={"layer.0.rows": zd.Split(0, parts=0)})
    with pytest.raises(TypeError, match="expected REPLICATED, a Split or None"):
        zd.load_file(path, device="cpu", plan={"layer.0.rows": "sharded"})
