"""zerohop.distributed over a real process group: two processes started as
torchrun starts them, talking gloo over loopback sockets, on host memory
(the NCCL path runs on the two-GPU machine: bench/distributed.py)."""

import os

import pytest

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no gloo process groups", allow_module_level=True)

import zerohop  # noqa: E402
import zerohop.distributed as zd  # noqa: E402

import workers  # noqa: E402


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


def run_ranks(tmp_path, plan, world=2, worker="dist_worker.py", args=None):
    """Ranks of a worker script (dist_worker.py: loads with `plan`); what
    each reported."""
    argv = args if args is not None else [str(tmp_path / "m.safetensors"), plan]
    return workers.run_ranks(worker, argv, tmp_path, world)


def test_replicated_tensors_are_read_once_across_the_ranks(tmp_path):
    model(tmp_path / "m.safetensors")
    ranks = run_ranks(tmp_path, "replicated")
    for r in ranks:
        assert r["wrong"] == [], r
    header = zerohop._file_tensors._headers([str(tmp_path / "m.safetensors")])[1]
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


def test_a_rank_that_fails_fails_every_rank_instead_of_hanging_them(tmp_path):
    model(tmp_path / "m.safetensors")
    first, second = run_ranks(tmp_path, "missing")
    assert second["error"].startswith("FileNotFoundError"), second
    assert first["error"].startswith("RuntimeError: rank 1 of the group failed: FileNotFoundError"), first


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


def test_dcp_save_and_load_through_zerohop_match_dcps_own_storage(tmp_path):
    from torch.distributed.checkpoint import state_dict_loader  # noqa: F401  (DCP is there)

    ranks = run_ranks(tmp_path, None, worker="dcp_worker.py", args=[str(tmp_path)])
    for r in ranks:
        assert r["zerohop"]["tensors"] == r["want"] == r["dcp"]["tensors"], r["rank"]
        assert r["zerohop"]["extra"] == {"step": 1234, "name": "run-a"} == r["dcp"]["extra"]
        assert "holds a committed checkpoint already" in r.get("again", ""), r.get("again")
    files = sorted(os.listdir(tmp_path / "zerohop"))
    assert files == [".metadata", "__0_0.safetensors", "__1_0.safetensors"], files

    # Resharded: the two ranks' checkpoint into one process's plain tensors.
    import torch.distributed.checkpoint as dcp
    import zerohop.dcp

    back = {"sharded": torch.zeros(10, 6, dtype=torch.bfloat16), "replicated": torch.zeros(33),
            "ids": torch.zeros(3, 4, dtype=torch.int64), "extra": {"step": 0, "name": ""}}
    dcp.load(back, storage_reader=zerohop.dcp.StorageReader(tmp_path / "zerohop"))
    want = ranks[0]["want"]
    assert back["sharded"].view(torch.uint8).flatten().tolist() == want["sharded"]
    assert back["ids"].flatten().tolist() == want["ids"] and back["extra"]["step"] == 1234

    # Every item carries its checksum: a flipped bit in a data file fails
    # the load, naming the file and the item.
    from torch.distributed.checkpoint.api import CheckpointException

    data = tmp_path / "zerohop" / "__1_0.safetensors"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointException, match="__1_0.safetensors: .* does not match its checksum"):
        dcp.load(back, storage_reader=zerohop.dcp.StorageReader(tmp_path / "zerohop"))


def test_a_dcp_save_that_never_committed_is_no_checkpoint(tmp_path):
    import torch.distributed.checkpoint as dcp
    import zerohop.dcp

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "__0_0.safetensors").write_bytes(b"partial")
    assert not zerohop.dcp.StorageReader.validate_checkpoint_id(tmp_path / "c")
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(FileNotFoundError, match="holds no committed checkpoint"):
        zerohop.dcp.StorageReader(tmp_path / "c").read_metadata()
    # DCP wraps the reader's error (torch 2.15 names it; 2.11 only says the
    # metadata is None).
    with pytest.raises(CheckpointException):
        dcp.load({"x": torch.zeros(2)}, storage_reader=zerohop.dcp.StorageReader(tmp_path / "c"))


def test_the_distributed_benchmark_runs_on_host_memory(tmp_path):
    """bench/distributed.py --cpu: every row, small, over gloo, so the
    script the two-GPU machine runs is known to work before it gets there."""
    import json
    import subprocess
    import sys

    binary = os.environ.get("ZEROHOP_BIN")
    if not binary:
        pytest.skip("ZEROHOP_BIN (the zerohop binary, for `gen`) is not set")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "distributed.py")
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", script, "--cpu",
                    "--rounds", "1", "--size", "16MiB", "--dcp-gib", "0.01", "--ckpt-gib", "0.02", "--warm-gib", "0",
                    "--zerohop", binary, "--cold-dir", str(tmp_path), "--dcp-dir", str(tmp_path),
                    "--hot", str(tmp_path / "model.safetensors"), "--json-out", str(out)], check=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert {r["row"] for r in rows} == {"cold read-once", "cold each-whole", "hot tp", "dcp zerohop", "dcp dcp-own",
                                        "sharded tmpfs", "sharded disk"}
    assert all(r["identical"] for r in rows if "identical" in r)
    once, each = (next(r for r in rows if r["row"] == f"cold {n}") for n in ("read-once", "each-whole"))
    assert once["storage_bytes"] * 2 == each["storage_bytes"] and once["storage_bytes"] <= once["model_bytes"]
