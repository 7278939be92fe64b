"""Checkpoints of nested state held in numpy arrays (host memory through
the simulated device's pipeline)."""

import math
import os

import numpy as np
import pytest

import zerohop
from zerohop import _flat, checkpoint


def training_state(rng):
    w = rng.standard_normal((300, 257)).astype(np.float32)
    return {
        "model": {"layer.weight": w, "layer.bias": rng.standard_normal(257).astype(np.float32),
                  "empty": np.zeros((0,), np.int64)},
        "optimizer": {
            "state": {0: {"step": np.array(12.0, np.float32), "exp_avg": rng.standard_normal((300, 257)).astype(np.float32)},
                      1: {"step": np.array(12.0, np.float32)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
                              "amsgrad": False, "foreach": None, "params": [0, 1], "name": "main"}],
        },
        "tied": w,
        "misc": [1, 2 ** 70, -0.0, math.inf, b"\x00raw", ("a", None)],
    }


def assert_same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, float):
        assert a.hex() == b.hex()
    else:
        assert a == b


def test_nested_state_round_trips(tmp_path, rng):
    state = training_state(rng)
    saved = checkpoint.save(state, tmp_path / "ck")
    assert saved["written_bytes"] > 0 and saved["seconds"] > 0
    back = checkpoint.load(tmp_path / "ck")
    assert_same(state, back)
    # A tensor reachable twice was stored once and comes back shared.
    assert back["tied"] is back["model"]["layer.weight"]
    checked = checkpoint.verify(tmp_path / "ck")
    assert checked.chunks > 0 and checked.bytes >= state["model"]["layer.weight"].nbytes
    assert tuple(checked) == (checked.chunks, checked.bytes)


def test_restore_into_existing_arrays(tmp_path, rng):
    state = training_state(rng)
    checkpoint.save(state, tmp_path / "ck")
    live = training_state(np.random.default_rng(99))
    live["tied"] = live["model"]["layer.weight"]
    checkpoint.restore_into(live, tmp_path / "ck")
    for path in [("model", "layer.weight"), ("model", "layer.bias"), ("optimizer", "state", 0, "exp_avg")]:
        a, b = state, live
        for k in path:
            a, b = a[k], b[k]
        assert a.tobytes() == b.tobytes()
    wrong = training_state(rng)
    wrong["model"]["layer.bias"] = np.zeros(256, np.float32)
    with pytest.raises(ValueError):
        checkpoint.restore_into(wrong, tmp_path / "ck")
    other = {"just": np.zeros(3, np.float32)}
    with pytest.raises(ValueError, match="structure"):
        checkpoint.restore_into(other, tmp_path / "ck")


def test_incremental_save_writes_only_changes(tmp_path, rng):
    big = rng.integers(0, 256, size=32 << 20, dtype=np.uint8)
    first = checkpoint.save({"big": big}, tmp_path / "c1")
    big[5 << 20] ^= 0xFF
    second = checkpoint.save({"big": big}, tmp_path / "c2", parent=tmp_path / "c1")
    assert second["written_bytes"] < first["written_bytes"] // 4
    back = checkpoint.load(tmp_path / "c2")
    assert back["big"].tobytes() == big.tobytes()


def test_damage_is_an_integrity_error(tmp_path, rng):
    state = {"x": rng.standard_normal(1 << 20).astype(np.float32)}
    checkpoint.save(state, tmp_path / "ck")
    data = sorted(p for p in os.listdir(tmp_path / "ck") if p.endswith(".safetensors"))[0]
    path = tmp_path / "ck" / data
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(zerohop.IntegrityError, match="chunk"):
        checkpoint.verify(tmp_path / "ck")
    with pytest.raises(zerohop.IntegrityError):
        checkpoint.load(tmp_path / "ck")
    target = {"x": np.zeros(1 << 20, np.float32)}
    with pytest.raises(zerohop.IntegrityError):
        checkpoint.restore_into(target, tmp_path / "ck")


def test_existing_checkpoints_and_unsupported_values(tmp_path):
    checkpoint.save({"a": np.ones(3)}, tmp_path / "ck")
    with pytest.raises(FileExistsError):
        checkpoint.save({"a": np.ones(3)}, tmp_path / "ck")
    with pytest.raises(TypeError, match="a.b"):
        checkpoint.save({"a": {"b": object()}}, tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_a_malformed_structure_is_a_value_error(tmp_path, monkeypatch):
    """The structure comes from the manifest, which is checksummed; one
    written by another tool may still be wrong."""
    checkpoint.save({"a": np.ones(3, np.float32)}, tmp_path / "ck")

    def tampered(opened):
        return {"dict": [[{"str": "a"}, {"tensor": "missing", "device": "cpu", "framework": "np"}]]}

    monkeypatch.setattr(_flat, "_structure", tampered)
    with pytest.raises(ValueError, match="malformed"):
        checkpoint.load(tmp_path / "ck")


def test_ordered_dicts_numpy_scalars_and_int_enums(tmp_path):
    import enum
    from collections import OrderedDict

    class Phase(enum.IntEnum):
        WARMUP = 3

    state = OrderedDict([("b", np.ones(2, np.float32)), ("a", {"n": np.float32(0.5), "k": np.int64(7), "p": Phase.WARMUP})])
    checkpoint.save(state, tmp_path / "ck")
    back = checkpoint.load(tmp_path / "ck")
    assert type(back) is OrderedDict and list(back) == ["b", "a"]
    assert back["a"] == {"n": 0.5, "k": 7, "p": 3}


def test_restore_into_does_not_depend_on_dict_order(tmp_path):
    state = {"state": {0: {"m": np.ones(4, np.float32)}, 1: {"m": np.full(4, 2, np.float32)}}}
    checkpoint.save(state, tmp_path / "ck")
    live = {"state": {1: {"m": np.zeros(4, np.float32)}, 0: {"m": np.zeros(4, np.float32)}}}
    checkpoint.restore_into(live, tmp_path / "ck")
    assert (live["state"][0]["m"] == 1).all() and (live["state"][1]["m"] == 2).all()


def test_partly_overlapping_views_are_refused_clearly(tmp_path):
    w = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="head and w share memory"):
        checkpoint.save({"w": w, "head": w[:2]}, tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


def test_checksums_are_the_same_wherever_the_bytes_are_hashed():
    from zerohop import _native

    data = np.arange(100_000, dtype=np.uint32)
    empty = np.empty(0, dtype=np.uint8)
    other = np.arange(75, dtype=np.uint32)
    buffers = [(data.ctypes.data, data.nbytes), (empty.ctypes.data, 0), (other.ctypes.data, other.nbytes)]
    on_host = _native.checksums("cpu", buffers)
    # The simulated device reads its memory back to hash it (no kernel).
    assert _native.checksums("sim", buffers) == on_host
    assert len(set(on_host)) == 3 and all(len(h) == 16 for h in on_host)
    data[5] += 1
    assert _native.checksums("cpu", buffers[:1]) != on_host[:1]


def test_a_load_reads_the_structure_while_the_data_moves_and_raises_the_reads_error_first():
    """`tensors_while` runs `meanwhile` (a load's reading of the saved
    structure) on the calling thread while the fill still runs; where both
    fail, the fill's error is the one raised."""
    from zerohop import _buffers
    import threading

    n = _buffers.OVERLAP_MIN
    memory = _buffers.Allocation([], [], [], lambda: list(range(n)), count=n)
    structure_read = threading.Event()
    seen = []

    def fill():
        seen.append(structure_read.wait(timeout=30))

    made = _buffers.tensors_while(fill, [memory], meanwhile=structure_read.set)
    assert made == [list(range(n))] and seen == [True]

    def failing_fill():
        structure_read.wait(timeout=30)
        raise OSError("the read failed")

    def bad_structure():
        structure_read.set()
        raise ValueError("malformed structure")

    structure_read.clear()
    with pytest.raises(OSError, match="the read failed"):
        _buffers.tensors_while(failing_fill, [memory], meanwhile=bad_structure)
    structure_read.clear()
    with pytest.raises(ValueError, match="malformed structure"):
        _buffers.tensors_while(fill, [memory], meanwhile=bad_structure)
