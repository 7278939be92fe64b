"""The suspendable heap through the Python package, on host memory (the
same heap and checkpoint code as on a GPU; `zerohop.suspendable()` and the
GPU run in the GPU suite)."""

import ctypes

import pytest

import zerohop
from zerohop import _native


def test_host_memory_is_suspended_and_resumed_at_the_same_addresses(tmp_path, damaged_copy):
    sizes = [(1 << 20) + 5, 4096, 3 << 20]
    allocations = []
    for i, n in enumerate(sizes):
        addr = _native.heap_alloc("cpu", n)
        data = bytes((j * 7 + i) % 251 for j in range(n))
        ctypes.memmove(addr, data, n)
        allocations.append((addr, data))
    try:
        done = zerohop.suspend(tmp_path / "s1", device="cpu")
        assert done["released_bytes"] >= sum(sizes) and done["written_bytes"] >= sum(sizes)
        live, backed, suspended_to = _native.heap_state("cpu")
        assert backed == 0 and suspended_to == tmp_path / "s1"
        assert sorted(a for a, _ in live) == sorted(a for a, _ in allocations)
        with pytest.raises(ValueError, match="the heap is suspended to"):
            _native.heap_alloc("cpu", 10)
        zerohop.checkpoint.verify(tmp_path / "s1")

        # A damaged copy is refused and the heap stays suspended.
        bad = damaged_copy(tmp_path / "s1", tmp_path / "bad")
        with pytest.raises(zerohop.IntegrityError, match="the heap stays suspended"):
            zerohop.resume(bad, device="cpu")
        assert _native.heap_state("cpu")[1:] == (0, tmp_path / "s1")

        resumed = zerohop.resume(tmp_path / "s1", device="cpu")
        assert resumed["bytes"] == sum(sizes) and resumed["backing_seconds"] >= 0
        assert _native.heap_state("cpu")[2] is None
        for addr, data in allocations:
            assert ctypes.string_at(addr, len(data)) == data

        # The next suspend writes only what changed since the first.
        ctypes.memmove(allocations[2][0] + 100, b"changed", 7)
        done = zerohop.suspend(tmp_path / "s2", device="cpu", parent=tmp_path / "s1")
        assert done["written_bytes"] <= 4 << 20
        zerohop.resume(tmp_path / "s2", device="cpu")
        assert ctypes.string_at(allocations[2][0] + 100, 7) == b"changed"
    finally:
        if _native.heap_state("cpu")[2] is None:
            for addr, _ in allocations:
                _native.heap_free("cpu", addr)


def test_the_pluggable_allocator_entry_points_fail_cleanly_without_a_gpu():
    if "cuda" in _native.device_name("auto"):
        pytest.skip("a GPU is present (the GPU suite allocates through them)")
    lib = ctypes.CDLL(_native.__file__)
    lib.zerohop_suspendable_alloc.restype = ctypes.c_void_p
    lib.zerohop_suspendable_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.zerohop_suspendable_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    assert lib.zerohop_suspendable_alloc(1 << 20, 0, None) is None  # null: PyTorch's out of memory
    lib.zerohop_suspendable_free(None, 0, 0, None)  # nothing to free, and no crash
    assert lib.zerohop_suspendable_alloc(-5, 0, None) is None
