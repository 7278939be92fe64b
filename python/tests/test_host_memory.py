"""Host memory (numpy arrays and other buffers): safetensors loading and
saving, directly and through the simulated device, checked against the
safetensors package; and raw bytes, `read_into` and `write_from`, on any
contiguous host buffer."""

import json
import os

import numpy as np
import pytest

import zerohop
from zerohop import _buffers

st_numpy = pytest.importorskip("safetensors.numpy")

DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64"]


def odd_tensors(rng):
    """Many entries of odd sizes and every numpy dtype, zero-size included."""
    out = {}
    for i, dtype in enumerate(DTYPES):
        shape = (int(rng.integers(1, 9)), int(rng.integers(1, 1000)))
        raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
        out[f"t{i}.{dtype}"] = raw.view(dtype).reshape(shape)
    out["empty"] = np.zeros((0, 5), np.float32)
    out["scalar"] = np.array(3.5, np.float64)
    out["big"] = rng.integers(0, 256, size=(3 << 20) + 17, dtype=np.uint8)
    return out


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_load_file_reads_what_safetensors_wrote(tmp_path, rng, device):
    tensors = odd_tensors(rng)
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path), metadata={"format": "np"})
    loaded = zerohop.load_file(path, device=device, framework="np")
    assert sorted(loaded) == sorted(tensors)
    for name, t in tensors.items():
        assert same(loaded[name], t), name


def test_load_file_takes_a_list_of_shards(tmp_path, rng):
    tensors = odd_tensors(rng)
    names = sorted(tensors)
    paths = []
    for i, part in enumerate([names[::2], names[1::2]]):
        paths.append(str(tmp_path / f"shard{i}.safetensors"))
        st_numpy.save_file({n: tensors[n] for n in part}, paths[-1])
    loaded = zerohop.load_file(paths, device="sim", framework="np")
    assert all(same(loaded[n], tensors[n]) for n in names)
    with pytest.raises(ValueError, match="is in both"):
        zerohop.load_file([paths[0], paths[0]], framework="np")


def test_save_file_is_read_by_safetensors(tmp_path, rng):
    tensors = odd_tensors(rng)
    path = tmp_path / "out.safetensors"
    zerohop.save_file(tensors, path, metadata={"who": "zerohop"})
    back = st_numpy.load_file(str(path))
    assert all(same(back[n], t) for n, t in tensors.items())
    from safetensors import safe_open
    with safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"who": "zerohop"}
    # Saving again replaces the file atomically, leaving no temporaries.
    zerohop.save_file({"only": tensors["big"]}, path)
    assert list(st_numpy.load_file(str(path))) == ["only"]
    assert os.listdir(tmp_path) == ["out.safetensors"]


def test_safe_open_reads_only_what_is_asked(tmp_path, rng):
    w = rng.standard_normal((10, 6)).astype(np.float32)
    path = tmp_path / "m.safetensors"
    st_numpy.save_file({"w": w, "s": np.array(2, np.int32)}, str(path), metadata={"a": "b"})
    with zerohop.safe_open(path, framework="np", device="cpu") as f:
        assert f.keys() == ["s", "w"]
        assert f.metadata() == {"a": "b"}
        assert same(f.get_tensor("w"), w)
        sl = f.get_slice("w")
        assert sl.get_shape() == [10, 6] and sl.get_dtype() == "F32"
        for index in [slice(2, 5), slice(None), slice(1, 9, 3), 4, -1, (slice(3, 7), slice(1, 4)),
                      (Ellipsis, 2), (-2, slice(None, None, 2)), slice(8, 2)]:
            assert same(sl[index], np.ascontiguousarray(w[index])), index
        assert f.get_slice("s")[()] == 2
        with pytest.raises(KeyError):
            f.get_tensor("missing")
        with pytest.raises(IndexError):
            sl[10]


def test_bf16_is_refused_by_numpy_with_a_clear_error(tmp_path):
    path = tmp_path / "bf16.safetensors"
    header = b'{"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    with pytest.raises(ValueError, match="framework='pt'"):
        zerohop.load_file(path, framework="np")


def test_get_slice_follows_numpy_indexing(tmp_path, rng):
    w = rng.standard_normal((6, 5, 4)).astype(np.float32)
    v = rng.standard_normal(7).astype(np.float32)
    path = tmp_path / "m.safetensors"
    st_numpy.save_file({"w": w, "v": v}, str(path))
    with zerohop.safe_open(path, framework="np") as f:
        sw, sv = f.get_slice("w"), f.get_slice("v")
        for index in [(Ellipsis, 1, 2), (1, Ellipsis), (Ellipsis,), np.int64(2), (np.int32(-1), slice(1, 3)), (slice(None, None, 2), Ellipsis, 0)]:
            got, want = sw[index], w[index]
            assert np.array_equal(got, want), index
            assert np.asarray(got).flags.c_contiguous
        assert np.array_equal(sv[..., 2], v[..., 2])
        with pytest.raises(TypeError):
            sw[True]
        with pytest.raises(IndexError):
            sw[1, 2, 3, 4]


def test_safe_open_notices_a_replaced_file(tmp_path):
    path = tmp_path / "m.safetensors"
    st_numpy.save_file({"a": np.ones(4, np.float32)}, str(path))
    f = zerohop.safe_open(path, framework="np")
    zerohop.save_file({"b": np.zeros(8, np.float32), "a": np.zeros(4, np.float32)}, path)
    with pytest.raises(RuntimeError, match="changed"):
        f.get_tensor("a")


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_safe_open_lets_its_file_go_on_exit_and_reads_again_after(tmp_path, monkeypatch, device):
    # Reads of the first tensor and on start windows read on threads (a
    # chain of them on a device), which hold the file until they end: the
    # with block's end waits for them, every time.
    path = tmp_path / "m.safetensors"
    st_numpy.save_file({f"t{i:02d}": np.arange(256, dtype=np.float32) + i for i in range(12)}, str(path))
    _window_sizes(monkeypatch, 2048, 2048, 2048)

    def open_fds():
        return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{fd}")}

    for rounds in range(30):
        with zerohop.safe_open(path, framework="np", device=device) as f:
            for i in range(1 + rounds % 12):
                assert f.get_slice(f"t{i:02d}")[1:3].tolist() == [1.0 + i, 2.0 + i]
            assert str(path) in open_fds(), "the file is held open while in use"
        assert str(path) not in open_fds(), f"the file stays open after the with block (round {rounds})"
    assert f.get_tensor("t00")[:4].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_save_refuses_what_safetensors_refuses_with_its_exception_types(tmp_path):
    path = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match=r"^Expected a dict of \[str, torch.Tensor\] but received <class 'str'>$"):
        zerohop.save_file("notadict", path)
    with pytest.raises(ValueError, match=r"^Key `bad` is invalid, expected torch.Tensor but received <class 'dict'>$"):
        zerohop.save_file({"ok": np.ones(2), "bad": {"some": "thing"}}, path)
    # A value of a type that holds memory keeps its own error, even a
    # TypeError: only a wrong type becomes safetensors' "expected" message.
    class RefusesExport:
        def __dlpack__(self, *args, **kwargs):
            raise TypeError("export refused")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match="export refused"):
        zerohop.save_file({"ok": np.ones(2), "odd": RefusesExport()}, path)
    # Overlapping views of one array: named, in a RuntimeError.
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(RuntimeError, match=r"share memory.*\['head', 'w'\]"):
        zerohop.save_file({"w": w, "head": w[:1], "tail": np.ones(3)}, path)
    assert not path.exists()
    # Disjoint parts of one array share no bytes: saved.
    zerohop.save_file({"head": w[:1], "rest": w[1:]}, path)
    assert np.array_equal(st_numpy.load_file(str(path))["rest"], w[1:])


# How load_file packs tensors into shared blocks of GPU memory (the plan
# only: the GPU tests in test_torch.py load through it).
def test_blocks_fill_in_order_aligned_and_never_overflow():
    sizes = [100, 0, 1000, 3000, 5000, 4096, 1, 10_000, 8]
    places = _buffers.plan_blocks(sizes, 8192)
    assert places[1] is None and places[7] is None  # empty, and too large
    used = {}
    for n, place in zip(sizes, places):
        if place is None:
            continue
        block, at = place
        assert at % 512 == 0 and at + n <= 8192
        assert all(at >= end or at + n <= start for start, end in used.get(block, []))
        used.setdefault(block, []).append((at, at + n))
    assert places[0] == (0, 0) and places[2] == (0, 512)
    assert places[4][0] == 1, "a tensor that does not fit starts the next block"
    assert places[8] == (2, 4608), "the large one in between does not end the block"
    assert [p[0] for p in places if p] == sorted(p[0] for p in places if p)


# read_into and write_from on any contiguous host buffer.


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


def test_bulk_calls_pause_the_cycle_collector_and_restore_it(tmp_path, rng):
    """load_file, save_file and the checkpoint calls run with the cycle
    collector off (a full collection inside them costs tens of ms), and
    leave it as they found it, on or off, errors included."""
    import gc

    import zerohop.checkpoint

    tensors = {"a": rng.integers(0, 256, size=5000, dtype=np.uint8)}
    path, ckpt = str(tmp_path / "m.safetensors"), str(tmp_path / "c")
    seen = []

    def progress(done, total):
        seen.append(gc.isenabled())

    calls = [
        lambda: zerohop.save_file(tensors, path, progress=progress),
        lambda: zerohop.load_file(path, progress=progress),
        lambda: zerohop.checkpoint.save(tensors, ckpt, progress=progress),
        lambda: zerohop.checkpoint.load(ckpt, progress=progress),
        lambda: zerohop.checkpoint.restore_into(tensors, ckpt, progress=progress),
    ]
    assert gc.isenabled()
    try:
        for call in calls:
            seen.clear()
            call()
            assert seen and not any(seen), "the collector ran during the call"
            assert gc.isenabled(), "the collector is back on after it"
        gc.disable()
        zerohop.load_file(path)
        assert not gc.isenabled(), "a collector turned off stays off"
        gc.enable()
        with pytest.raises(FileNotFoundError):
            zerohop.load_file(str(tmp_path / "missing.safetensors"))
        assert gc.isenabled(), "an error restores it too"
    finally:
        gc.enable()


def _counting_reads(monkeypatch):
    """The bytes of each engine read that safe_open makes, in order."""
    from zerohop import _native
    reads = []

    def counted(real):
        def read(device, sources, pieces, *args, **kwargs):
            reads.append(sum(n for _, _, n, _ in pieces))
            return real(device, sources, pieces, *args, **kwargs)
        return read

    # Reads of tensors alone, and of windows (queued in the order made).
    monkeypatch.setattr(_native, "read", counted(_native.read))
    monkeypatch.setattr(_native, "read_queued", counted(_native.read_queued))
    return reads


def _window_sizes(monkeypatch, first, most, dense_most):
    """The read-ahead's first window, and its largest ones (taken densely
    or not), in bytes."""
    from zerohop import _read_ahead
    monkeypatch.setattr(_read_ahead, "READ_AHEAD_FIRST", first)
    monkeypatch.setattr(_read_ahead, "READ_AHEAD_MOST", most)
    monkeypatch.setattr(_read_ahead, "READ_AHEAD_DENSE_MOST", dense_most)


def test_safe_open_reads_ahead_the_rows_asked_of_each_kind(tmp_path, rng, monkeypatch):
    # Three windows' worth of small tensors of several dtypes and sizes,
    # odd row counts among them: half of each is `[:rows // 2]`, not the
    # same fraction of every tensor's rows.
    tensors = {}
    for i in range(300):
        dtype = (np.float32, np.int8, np.float64, np.uint16)[i % 4]
        tensors[f"t{i:03d}"] = rng.integers(0, 100, (int(rng.integers(2, 40)), 997)).astype(dtype)
    path = tmp_path / "small.safetensors"
    st_numpy.save_file(tensors, str(path))
    _window_sizes(monkeypatch, 1 << 20, 4 << 20, 4 << 20)
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        names = f.offset_keys()
        got = {n: f.get_slice(n)[: f.get_slice(n).get_shape()[0] // 2] for n in names}
        for n, t in tensors.items():
            assert np.array_equal(got[n], t[: t.shape[0] // 2]) and got[n].dtype == t.dtype, n
            # Each in memory of its own: changing one changes nothing read
            # after.
            assert got[n].base is None, n
        got[names[1]][...] = 0
        assert np.array_equal(f.get_tensor(names[1]), tensors[names[1]])
    asked = sum(t[: t.shape[0] // 2].nbytes for t in tensors.values())
    # The first read starts the windows: of 1 MiB, then 4 (four times as
    # large while every tensor is taken), holding only the rows asked; then
    # the tensor read again whole.
    assert got[names[0]].nbytes < reads[0] <= 1 << 20 and 3 << 20 < reads[1] <= 4 << 20
    assert max(reads) <= 4 << 20
    assert sum(reads[:-1]) == asked, "no byte read that was not asked for"
    assert reads[-1] == tensors[names[1]].nbytes
    assert len(reads) <= 4 + asked // (3 << 20), reads


def test_safe_open_reads_alone_what_a_window_missed_and_keeps_the_windows(tmp_path, monkeypatch):
    # A tensor-parallel rank takes rows of some weights (rank 1 of 4 of
    # `a`, the first half of `c`) and all of others (`b`).
    tensors = {}
    for layer in range(40):
        tensors[f"layers.{layer:02d}.a"] = np.full((64, 100), layer, np.float32)
        tensors[f"layers.{layer:02d}.b"] = np.arange(100, dtype=np.float32) + layer
        tensors[f"layers.{layer:02d}.c"] = np.arange(100, dtype=np.float32) - layer
    asks = {"a": np.s_[16:32], "b": np.s_[:], "c": np.s_[:50]}
    path = tmp_path / "tp.safetensors"
    st_numpy.save_file(tensors, str(path))
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.keys():
            index = np.s_[0:16] if name == "layers.10.a" else asks[name[-1]]
            assert np.array_equal(f.get_slice(name)[index], tensors[name][index]), name
        # Asked again, a tensor given out is read anew.
        assert np.array_equal(f.get_slice("layers.03.a")[16:32], tensors["layers.03.a"][16:32])
    rows_of_a, vector = 16 * 100 * 4, 100 * 4
    layer = rows_of_a + vector + vector // 2
    # The first read asks part of `a`: no window reaches past a kind not
    # read yet, so layer 0's `a` and `b` are windows of their own, and the
    # two queued meanwhile hold `c` of layers 0 and 1 whole, as it is not
    # asked yet (its halves copied out of them). Then one window holds
    # what each kind asks of layers 2 - 39. Rows of layer 10's `a` that
    # the window lacks, and layer 3's `a` again, are read alone.
    windows = [rows_of_a, vector, vector + rows_of_a + vector, vector + rows_of_a + vector, vector // 2 + 37 * layer]
    assert reads == windows + [rows_of_a, rows_of_a], reads


@pytest.mark.parametrize("step", [1, 2])
def test_read_ahead_windows_grow_larger_while_reads_take_every_tensor(tmp_path, monkeypatch, step):
    tensors = {f"t{i:03d}": np.full(2048, i, np.float32) for i in range(400)}
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path))
    _window_sizes(monkeypatch, 64 << 10, 128 << 10, 1 << 20)
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.keys()[::step]:
            assert np.array_equal(f.get_tensor(name), tensors[name]), name
    if step == 1:
        assert max(reads) == 1 << 20, reads
    else:  # every other tensor: once a window shows it, windows stay small
        assert max(reads[4:]) == 128 << 10, reads


def test_read_ahead_reads_the_end_of_the_file_as_a_small_window_of_its_own(tmp_path, monkeypatch):
    # 100 tensors of 8 KiB taken in turn: windows of 64 KiB from the first
    # read on, then 256 KiB (grown four times while every tensor is taken),
    # then the rest, whose last 64 KiB or so are a window of their own.
    tensors = {f"t{i:03d}": np.full(2048, i, np.float32) for i in range(100)}
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path))
    _window_sizes(monkeypatch, 64 << 10, 64 << 10, 1 << 20)
    from zerohop import _read_ahead
    monkeypatch.setattr(_read_ahead, "READ_AHEAD_LAST", 64 << 10)
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.keys():
            assert np.array_equal(f.get_tensor(name), tensors[name]), name
    assert reads == [64 << 10, 256 << 10, 416 << 10, 64 << 10], reads


def test_fractions_of_rows_asked_carry_over_to_other_row_counts():
    from zerohop._read_ahead import _fraction
    assert _fraction(127, 255) == (1, 2)  # [:255 // 2]
    assert _fraction(1536, 4096) == (3, 8)  # rank 3 of 8
    assert _fraction(0, 7) == (0, 1) and _fraction(7, 7) == (1, 1)
    p, q = _fraction(1, 1000)  # no fraction of 64ths or coarser: the row
    assert 1000 * p // q == 1 and 2000 * p // q == 2


def test_safe_open_reads_ahead_tensors_of_tens_of_mib(tmp_path, monkeypatch):
    # A layer's weights of 24 MiB each, the first half of each asked: each
    # read alone would cost an engine call of its own.
    tensors = {f"layer.{i}": np.full((96, 1 << 16), i, np.float32) for i in range(8)}
    path = tmp_path / "layers.safetensors"
    st_numpy.save_file(tensors, str(path))
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.keys():
            assert np.array_equal(f.get_slice(name)[:48], tensors[name][:48]), name
    half = 12 << 20
    assert sum(reads) == 8 * half and reads[0] > half, reads
    assert len(reads) <= 4 and max(reads) >= 4 * half, reads


def test_safe_open_reads_ahead_a_tensor_larger_than_a_window_in_a_window_of_its_own(tmp_path, monkeypatch):
    # Halves larger than any window (4 x 2 GiB at full size), then one
    # over READ_AHEAD_TENSOR_BYTES: that one alone, each of the others (the
    # first too) read ahead in a window of its own.
    from zerohop import _native, _read_ahead
    _window_sizes(monkeypatch, 16 << 10, 32 << 10, 64 << 10)
    monkeypatch.setattr(_read_ahead, "READ_AHEAD_TENSOR_BYTES", 128 << 10)
    tensors = {f"w.{i}": np.full((64, 1024), i, np.float32) for i in range(4)}
    tensors["w.4"] = np.full((128, 1024), 4, np.float32)
    path = tmp_path / "large.safetensors"
    st_numpy.save_file(tensors, str(path))
    alone, queued = [], []
    for name, reads in (("read", alone), ("read_queued", queued)):
        def counted(*args, real=getattr(_native, name), reads=reads, **kwargs):
            reads.append(sum(n for _, _, n, _ in args[2]))
            return real(*args, **kwargs)
        monkeypatch.setattr(_native, name, counted)
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.keys():
            rows = tensors[name].shape[0] // 2
            assert np.array_equal(f.get_slice(name)[:rows], tensors[name][:rows]), name
    half = 128 << 10
    assert alone == [2 * half], alone
    assert queued == [half, half, half, half], queued


def test_safe_open_reads_only_the_rows_of_a_large_tensor(tmp_path, rng, monkeypatch):
    from zerohop import _read_ahead
    monkeypatch.setattr(_read_ahead, "READ_AHEAD_TENSOR_BYTES", 16 << 20)
    big = rng.integers(0, 255, (17 << 10, 1024), dtype=np.uint8)  # 17 MiB
    small = {f"s{i}": np.full(1000, i, np.float32) for i in range(4)}
    path = tmp_path / "big.safetensors"
    st_numpy.save_file({"big": big, **small}, str(path))
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.offset_keys():
            if name != "big":
                assert np.array_equal(f.get_slice(name)[1:3], small[name][1:3])
        assert np.array_equal(f.get_slice("big")[100:200], big[100:200])
    assert reads[-1] == 100 * 1024, "a large tensor is never read ahead"
    assert max(reads) < 17 << 20


def test_safe_open_reads_ahead_across_unaligned_tensors(tmp_path):
    # A writer may place a tensor at an offset that is no multiple of its
    # dtype's size: its bytes still come back whole.
    values = np.arange(6, dtype=np.float32)
    entries = {"a": ("F32", [1], values[:1].tobytes()), "b": ("U8", [3], b"\x01\x02\x03"),
               "c": ("F32", [2, 3], values.tobytes()), "d": ("I16", [2], b"\x05\x00\x06\x00")}
    header, data = {}, b""
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    blob = json.dumps(header).encode()
    path = tmp_path / "odd.safetensors"
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)
    with zerohop.safe_open(path, framework="np") as f:
        assert f.get_tensor("a").tolist() == [0.0]
        assert f.get_tensor("b").tolist() == [1, 2, 3]  # and c and d with it
        assert np.array_equal(f.get_slice("c")[1], values[3:])
        assert f.get_tensor("d").tolist() == [5, 6]


def test_safe_open_reads_ahead_in_name_order_and_not_when_reads_jump(tmp_path, rng, monkeypatch):
    # Mixed dtypes: safetensors places them by alignment, so the names'
    # order (keys()) is not the file's.
    tensors = {f"t{i:03d}": rng.integers(0, 100, 300).astype((np.float64, np.int8)[i % 2]) for i in range(120)}
    path = tmp_path / "mixed.safetensors"
    st_numpy.save_file(tensors, str(path))
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        assert f.keys() != f.offset_keys()
        for name in f.keys():
            assert np.array_equal(f.get_tensor(name), tensors[name]), name
    assert len(reads) <= 3, reads
    reads.clear()
    with zerohop.safe_open(path, framework="np") as f:
        names, in_file = f.keys(), {n: i for i, n in enumerate(f.offset_keys())}
        # No step forward by 1 - 8 in either order, and no first read of
        # either order's first tensor.
        jumps = []
        for b in (names[int(i)] for i in rng.permutation(120)):
            a = jumps[-1] if jumps else None
            if (names.index(b) and in_file[b]) if a is None else \
                    not (0 < names.index(b) - names.index(a) <= 8 or 0 < in_file[b] - in_file[a] <= 8):
                jumps.append(b)
        assert len(jumps) > 50
        for name in jumps:
            assert np.array_equal(f.get_slice(name)[10:20], tensors[name][10:20])
    assert reads == [10 * tensors[n].itemsize for n in jumps]


@pytest.mark.parametrize("iterate", ["keys", "offset_keys"])
def test_read_ahead_reads_each_byte_once_in_either_order_of_a_file_written_unsorted(tmp_path, monkeypatch, iterate):
    # Written as the tensors came: the data's order (layer.0, layer.1,
    # layer.2, ...) is not the names' (layer.0, layer.1, layer.10, ...),
    # and both start with the same two tensors.
    tensors = {f"layer.{i}": np.full((8, 250), i, np.float32) for i in range(64)}
    path = tmp_path / "m.safetensors"
    zerohop.save_file(tensors, path)
    _window_sizes(monkeypatch, 32_000, 128_000, 512_000)  # a first window of 8 halves
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        assert f.keys()[:3] == ["layer.0", "layer.1", "layer.10"]
        assert f.offset_keys()[:3] == ["layer.0", "layer.1", "layer.2"]
        for name in getattr(f, iterate)():
            assert np.array_equal(f.get_slice(name)[:4], tensors[name][:4]), name
    assert sum(reads) == 64 * 4000, reads
    assert len(reads) < 12, reads


def test_read_ahead_waits_to_learn_each_kind_once_reads_take_parts(tmp_path, monkeypatch):
    # A tensor-parallel rank's reads: its rows of some kinds; of others,
    # its columns, so every row; small ones whole.
    tensors = {}
    for layer in range(12):
        for kind in ("q", "k", "v", "up"):
            tensors[f"layers.{layer}.{kind}"] = np.full((64, 250), layer, np.float32)
        for kind in ("o", "down"):
            tensors[f"layers.{layer}.{kind}"] = np.full((250, 64), layer, np.float32)
        tensors[f"layers.{layer}.norm"] = np.full(250, layer, np.float32)
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path))
    _window_sizes(monkeypatch, 64_000, 256_000, 1_024_000)
    reads = _counting_reads(monkeypatch)
    needed = 0
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.keys():
            part, whole = f.get_slice(name), tensors[name]
            kind = name.rsplit(".", 1)[1]
            if kind in ("o", "down"):
                got, want, needed = part[:, 16:32], whole[:, 16:32], needed + whole.nbytes
            elif kind == "norm":
                got, want, needed = part[:], whole, needed + whole.nbytes
            else:
                got, want = part[16:32], whole[16:32]
                needed += want.nbytes
            assert np.array_equal(got, want), name
    # Of the first layer's kinds, those read ahead before their first read
    # come whole; the windows after hold what each kind asks.
    assert sum(reads) <= 1.15 * needed, (sum(reads), needed)


def test_read_ahead_windows_span_names_that_do_not_repeat(tmp_path, monkeypatch):
    # No kind to learn: windows hold tensors not read yet, whole.
    names = [a + b for a in "abcdefgh" for b in "xyzw"]
    tensors = {name: np.full((10, 100), i, np.float32) for i, name in enumerate(names)}
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path))
    _window_sizes(monkeypatch, 40_000, 40_000, 40_000)  # 10 tensors a window
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.keys():
            assert np.array_equal(f.get_slice(name)[:5], tensors[name][:5]), name
    # The first read's half, then whole tensors of names not read yet.
    assert reads[:2] == [2000 + 9 * 4000, 10 * 4000], reads


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_queued_reads_run_in_order_and_report_once(tmp_path, device):
    # Into host memory each read is a transfer of its own; into a device
    # (simulated: its copies land late) the second joins the first's run.
    from zerohop import _native
    data = np.arange(1 << 20, dtype=np.uint8)
    path = tmp_path / "bytes"
    data.tofile(path)
    sources = _native.Sources([str(path)])
    halves = [np.zeros(1 << 19, np.uint8) for _ in range(2)]
    first = _native.read_queued(device, sources, [(0, 0, 1 << 19, halves[0].ctypes.data)], None, None, halves[0])
    second = _native.read_queued(device, sources, [(0, 1 << 19, 1 << 19, halves[1].ctypes.data)], None, None,
                                 halves[1], after=first)
    assert json.loads(second.wait())["bytes"] == 1 << 19
    assert json.loads(first.wait())["bytes"] == 1 << 19, "its outcome kept until taken"
    assert first.wait() is None and second.wait() is None, "an outcome is reported once"
    assert np.array_equal(np.concatenate(halves), data)
    bad = _native.read_queued(device, sources, [(3, 0, 8, halves[0].ctypes.data)], None, None, halves[0], after=second)
    with pytest.raises(ValueError, match="file index 3 out of range"):
        bad.wait()


def test_read_ahead_queues_the_windows_after_a_window_before_waiting_for_it(tmp_path, monkeypatch):
    from zerohop import _native
    tensors = {f"t{i:03d}": np.full(1000, i, np.float32) for i in range(40)}
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path))
    _window_sizes(monkeypatch, 40_000, 40_000, 40_000)  # 10 tensors a window
    real, events = _native.read_queued, []

    class Logged:
        def __init__(self, read, k):
            self.read, self.k = read, k

        def wait(self):
            events.append(("wait", self.k))
            return self.read.wait()

    def read_queued(*args, after=None, **kwargs):
        k = sum(event == "queued" for event, _ in events)
        events.append(("queued", k))
        return Logged(real(*args, after=getattr(after, "read", after), **kwargs), k)

    monkeypatch.setattr(_native, "read_queued", read_queued)
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.keys():
            assert np.array_equal(f.get_tensor(name), tensors[name]), name
    # The first read's window (t000 - t009) and one after it queued before
    # the first is waited for: one only, as that read may be all the
    # program wants; once reads go on, the others (t020 - t029, t030 -
    # t039) before the second is.
    assert events == [("queued", 0), ("queued", 1), ("wait", 0),
                      ("queued", 2), ("queued", 3), ("wait", 1), ("wait", 2), ("wait", 3)], events


def test_a_first_read_of_the_first_tensor_reads_one_window_ahead_at_most(tmp_path, monkeypatch):
    tensors = {f"t{i:03d}": np.full(1000, i, np.float32) for i in range(40)}
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path))
    _window_sizes(monkeypatch, 40_000, 40_000, 40_000)  # 10 tensors a window
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        assert np.array_equal(f.get_tensor("t000"), tensors["t000"])
    assert reads == [40_000, 40_000], "its window and the next"
    reads.clear()
    with zerohop.safe_open(path, framework="np") as f:
        assert np.array_equal(f.get_tensor("t005"), tensors["t005"])
    assert reads == [4000], "a first read elsewhere is read alone"


@pytest.mark.parametrize("failing", [1, 2])  # the first window, or one read ahead of it
def test_a_window_that_memory_cannot_hold_is_not_read(tmp_path, monkeypatch, failing):
    from zerohop import _read_ahead
    tensors = {f"t{i:03d}": np.full(1000, i, np.float32) for i in range(40)}
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path))
    _window_sizes(monkeypatch, 40_000, 40_000, 40_000)  # 10 tensors a window
    real, windows = _read_ahead._placed, []

    def placed(*args):
        windows.append(None)
        if len(windows) >= failing:
            raise MemoryError("no memory for this window")
        return real(*args)

    monkeypatch.setattr(_read_ahead, "_placed", placed)
    reads = _counting_reads(monkeypatch)
    with zerohop.safe_open(path, framework="np") as f:
        for name in f.keys():
            assert np.array_equal(f.get_tensor(name), tensors[name]), name
    # Each read the windows would have held goes alone.
    assert reads == [4000] * 40 if failing == 1 else [40_000] + [4000] * 30, reads


@pytest.mark.parametrize("failing", [1, 2])  # the first window, or one read ahead of it
def test_a_failed_read_ahead_fails_the_read_that_needs_it_and_no_other(tmp_path, monkeypatch, failing):
    from zerohop import _native
    tensors = {f"t{i:03d}": np.full(1000, i, np.float32) for i in range(40)}
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path))
    _window_sizes(monkeypatch, 40_000, 40_000, 40_000)
    real, calls = _native.read_queued, []

    class Failing:
        """A queued read whose wait fails, as a read that failed does."""

        def __init__(self, read):
            self.read = read

        def wait(self):
            self.read.wait()
            raise OSError(5, "Input/output error")

    def read_queued(*args, after=None, **kwargs):
        calls.append(None)
        read = real(*args, after=getattr(after, "read", after), **kwargs)
        return Failing(read) if len(calls) == failing else read

    monkeypatch.setattr(_native, "read_queued", read_queued)
    with zerohop.safe_open(path, framework="np") as f:
        names = f.keys()
        got = {}
        for name in names:
            try:
                got[name] = f.get_tensor(name)
            except OSError:
                got[name] = None
    failed = [n for n, g in got.items() if g is None]
    assert len(failed) == 1, failed
    assert all(np.array_equal(g, tensors[n]) for n, g in got.items() if g is not None)
