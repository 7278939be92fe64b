"""Sharded checkpoints (`zerohop.checkpoint.save(..., group=)`) over a real
process group: ranks started as torchrun starts them, talking gloo over
loopback sockets, DTensors on a CPU device mesh (ckpt_worker.py)."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no gloo process groups", allow_module_level=True)
pytest.importorskip("torch.distributed.tensor")

import zerohop.checkpoint as ckpt  # noqa: E402

import workers  # noqa: E402


def run(tmp_path, action, seed, world=2):
    out = tmp_path / f"out-{action}-{seed}-{world}"
    out.mkdir(exist_ok=True)
    return workers.run_ranks("ckpt_worker.py", [action, str(seed), str(tmp_path)], out, world)


def ok(results):
    assert all(r.get("ok") for r in results), results


def test_a_sharded_save_loads_back_at_its_own_and_other_world_sizes(tmp_path):
    ok(run(tmp_path, "save", 1))
    step = tmp_path / "step-1"
    assert sorted(os.listdir(step)) == ["SHARDS.json", "rank-00000-of-00002", "rank-00001-of-00002", "replicated"]
    commit = json.loads((step / "SHARDS.json").read_text())
    assert commit["world_size"] == 2 and commit["dtensors"]["model.rows"]["rows"] == [6, 5]
    assert commit["dtensors"]["model.bias"]["placement"] == "replicate"
    # Every rank's part and the replicated one are verified.
    v = ckpt.verify(step)
    assert v.chunks >= 3 and v.bytes >= sum(t.numel() * t.element_size() for t in _full().values())
    with pytest.raises(ValueError, match="is a sharded checkpoint: every rank loads it with group="):
        ckpt.load(step)
    ok(run(tmp_path, "load", 1))
    ok(run(tmp_path, "restore", 1))
    # Resharded: DTensors only, so the state of a 2-rank save with a plain
    # per-rank tensor is refused at 3 and 1 ranks, naming it.
    for world in (3, 1):
        for r in run(tmp_path, "plain", 1, world=world):
            assert "mine is a plain per-rank tensor, saved by 2 ranks" in r["error"], r


def test_dtensors_reshard_between_world_sizes(tmp_path):
    ok(run(tmp_path, "save", 2, world=3))  # 3 ranks: 4+4+3 rows, "few" 1+1+0
    assert json.loads((tmp_path / "step-2" / "SHARDS.json").read_text())["dtensors"]["model.few"]["rows"] == [1, 1, 0]
    ok(run(tmp_path, "plain", 2, world=2))
    ok(run(tmp_path, "plain", 2, world=1))


def test_a_rank_killed_mid_save_leaves_the_last_checkpoint_the_latest(tmp_path):
    ok(run(tmp_path, "save", 3))
    killed = run(tmp_path, "kill", 4)
    assert killed[1] == {"rank": 1, "exit": -9}
    # The survivor got an error from the group, not a hang.
    assert "the ranks could not compare results (did a rank die or hang?)" in killed[0].get("error", ""), killed[0]
    assert not (tmp_path / "step-4" / "SHARDS.json").exists()
    assert ckpt.latest(tmp_path) == str(tmp_path / "step-3")
    ckpt.verify(tmp_path / "step-3")
    for r in run(tmp_path, "load", 4):
        assert "holds no committed sharded checkpoint" in r["error"], r


def test_a_commit_file_that_is_not_one_is_refused(tmp_path):
    (tmp_path / "c").mkdir()
    for bad in (b"{", b"[]", json.dumps({"format": "zerohop-sharded-checkpoint/1", "world_size": 0, "dtensors": {}}).encode(),
                json.dumps({"format": "zerohop-sharded-checkpoint/1", "world_size": 2,
                            "dtensors": {"x": {"placement": "shard0", "shape": [3], "dtype": "F32", "rows": [3]}}}).encode()):
        (tmp_path / "c" / "SHARDS.json").write_bytes(bad)
        with pytest.raises(ValueError, match="is not a zerohop sharded checkpoint's commit file"):
            ckpt.verify(tmp_path / "c")


def test_a_dtensor_needs_group(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path}/pg")
    try:
        d = distribute_tensor(torch.ones(4), init_device_mesh("cpu", (1,)))
        with pytest.raises(TypeError, match="is a DTensor: save it with group="):
            ckpt.save({"w": d}, tmp_path / "x")
        assert not (tmp_path / "x").exists()
        # One rank is a group too.
        ckpt.save({"w": d, "n": 3}, tmp_path / "y", group=dist.group.WORLD)
        back = ckpt.load(tmp_path / "y", group=dist.group.WORLD)
        assert back["n"] == 3 and torch.equal(back["w"].full_tensor(), torch.ones(4))
    finally:
        dist.destroy_process_group()


def _full():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ckpt_worker", os.path.join(os.path.dirname(__file__), "ckpt_worker.py"))
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    return worker.full_state(1)
