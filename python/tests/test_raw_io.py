"""read_into and write_from on any contiguous host buffer."""

import numpy as np
import pytest

import zerohop


def test_arrays_round_trip_at_offsets(tmp_path, rng):
    data = rng.integers(0, 256, size=(5 << 20) + 3, dtype=np.uint8)
    path = tmp_path / "raw.bin"
    stats = zerohop.write_from(data, path, offset=4096 + 1)
    assert stats["bytes"] == data.nbytes
    assert path.stat().st_size == 4096 + 1 + data.nbytes
    # Writing elsewhere in the file keeps what is there (no truncation).
    zerohop.write_from(np.full(7, 9, np.uint8), path, offset=10)
    raw = path.read_bytes()
    assert raw[10:17] == bytes([9] * 7) and raw[4097:] == data.tobytes()
    back = np.empty_like(data)
    assert zerohop.read_into(back, path, offset=4097)["bytes"] == data.nbytes
    assert (back == data).all()
    typed = np.empty(1000, np.float32)
    zerohop.read_into(typed, path, offset=4097)
    assert typed.tobytes() == data[:4000].tobytes()


def test_buffer_protocol_objects(tmp_path):
    path = tmp_path / "b.bin"
    zerohop.write_from(b"hello world", path)  # read-only bytes can be written out
    buf = bytearray(5)
    zerohop.read_into(buf, path, offset=6)
    assert buf == b"world"
    view = memoryview(bytearray(11))
    zerohop.read_into(view, path)
    assert view.tobytes() == b"hello world"


def test_bad_buffers_are_refused(tmp_path):
    path = tmp_path / "b.bin"
    path.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="read-only"):
        zerohop.read_into(b"12345", path)
    with pytest.raises(ValueError, match="contiguous"):
        zerohop.read_into(np.zeros((4, 4), np.uint8)[:, 1], path)
    with pytest.raises(TypeError):
        zerohop.read_into(object(), path)
    with pytest.raises(ValueError, match="offset"):
        zerohop.read_into(bytearray(4), path, offset=-1)
    # Past the end of the file: an error, and nothing reported read.
    with pytest.raises(OSError, match="past the end"):
        zerohop.read_into(bytearray(10), path, offset=95)


def test_raw_io_takes_any_dtype(tmp_path):
    data = (np.arange(10) + 1j * np.arange(10)).astype(np.complex128)
    path = tmp_path / "c.bin"
    zerohop.write_from(data, path)
    back = np.zeros_like(data)
    zerohop.read_into(back, path)
    assert (back == data).all()
    be = np.arange(5, dtype=">i4")
    zerohop.write_from(be, path)
    assert path.read_bytes()[:20] == be.tobytes()
    with pytest.raises(ValueError):
        zerohop.write_from(np.array([object()]), path)
