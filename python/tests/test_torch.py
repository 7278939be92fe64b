"""PyTorch tensors, on the CPU and on the GPU. Skipped where torch (or, for
the GPU tests, CUDA) is missing: CI has neither; the accelerator machine
runs them from the wheel built by scripts/gpu.sh."""

import json
import os
import threading

import pytest

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

import zerohop  # noqa: E402
from zerohop import checkpoint  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda:0", marks=cuda)]


def bits(t):
    """A tensor's bytes, for bit-exact comparisons of any dtype."""
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def model_tensors():
    g = torch.Generator().manual_seed(3)
    out = {
        "embed": torch.randn(1000, 64, generator=g).to(torch.bfloat16),
        "w16": torch.randn(33, 17, generator=g).half(),
        "w32": torch.randn(5, 7, 3, generator=g),
        "ids": torch.randint(-(2**40), 2**40, (77,), generator=g),
        "mask": torch.rand(19, generator=g) > 0.5,
        "e4m3": torch.randn(64, 3, generator=g).to(torch.float8_e4m3fn),
        "e5m2": torch.randn(10, generator=g).to(torch.float8_e5m2),
        "empty": torch.empty(0, 8, dtype=torch.bfloat16),
        "scalar": torch.tensor(1.25),
    }
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_load_file_matches_safetensors(tmp_path, device):
    tensors = model_tensors()
    path = tmp_path / "m.safetensors"
    st_torch.save_file(tensors, str(path))
    loaded = zerohop.load_file(path, device=device)
    for name, t in tensors.items():
        got = loaded[name]
        assert got.dtype == t.dtype and got.shape == t.shape and got.device == torch.device(device)
        assert bits(got) == bits(t), name


@cuda
def test_tensors_belong_to_torch_and_are_ready_on_the_current_stream(tmp_path):
    big = torch.randn(64 << 20 // 4)  # 64 MiB
    path = tmp_path / "big.safetensors"
    st_torch.save_file({"big": big}, str(path))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        # Busy the stream first: the load must wait for it, and the sum
        # queued right after on the same stream must see the loaded bytes.
        busy = torch.ones(4096, 4096, device="cuda")
        for _ in range(20):
            busy = busy @ busy / 4096
        base = torch.cuda.memory_allocated()  # cuBLAS's workspace included
        out = zerohop.load_file(path, device="cuda:0")
        total = out["big"].double().sum()
    stream.synchronize()
    assert abs(total.item() - big.double().sum().item()) < 1e-3
    assert torch.cuda.memory_allocated() >= base + big.nbytes
    del out, total
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base  # freed like any tensor


@pytest.mark.parametrize("device", DEVICES)
def test_save_file_is_read_by_safetensors(tmp_path, device):
    tensors = {k: v.to(device) for k, v in model_tensors().items()}
    path = tmp_path / "out.safetensors"
    zerohop.save_file(tensors, path, metadata={"k": "v"})
    back = st_torch.load_file(str(path))
    assert all(bits(back[k]) == bits(v) for k, v in tensors.items())


@pytest.mark.parametrize("device", DEVICES)
def test_safe_open_slices(tmp_path, device):
    w = torch.randn(50, 8).to(torch.bfloat16)
    path = tmp_path / "m.safetensors"
    st_torch.save_file({"w": w}, str(path), metadata={"a": "b"})
    with zerohop.safe_open(path, framework="pt", device=device) as f:
        assert f.metadata() == {"a": "b"}
        part = f.get_slice("w")[10:20, 2:5]
        assert part.device == torch.device(device) and bits(part) == bits(w[10:20, 2:5])
        assert bits(f.get_tensor("w")) == bits(w)


@pytest.mark.parametrize("device", DEVICES)
def test_read_into_and_write_from_tensors(tmp_path, device):
    data = torch.randint(0, 255, (3 << 20,), dtype=torch.uint8).to(device)
    path = tmp_path / "raw.bin"
    zerohop.write_from(data, path, offset=512)
    back = torch.empty_like(data)
    zerohop.read_into(back, path, offset=512)
    assert torch.equal(back, data)
    with pytest.raises(ValueError, match="contiguous"):
        zerohop.read_into(torch.empty(8, 8, device=device).t(), path)


def test_packed_and_recent_dtypes_round_trip_with_safetensors(tmp_path):
    names = ["float4_e2m1fn_x2", "float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz"]
    if not all(hasattr(torch, n) for n in names):
        pytest.skip("torch < 2.8 lacks some of " + ", ".join(names))
    raw = torch.arange(24, dtype=torch.uint8).reshape(4, 6)
    tensors = {n: raw.clone().view(getattr(torch, n)) for n in names}
    ours, theirs = tmp_path / "zerohop.safetensors", tmp_path / "safetensors.safetensors"
    zerohop.save_file(tensors, ours)
    st_torch.save_file(tensors, str(theirs))
    with zerohop.safe_open(ours) as f:
        # A header gives F4 shapes in F4 values, two to a torch element.
        assert f.get_slice("float4_e2m1fn_x2").get_shape() == [4, 12]
        assert f.get_slice("float4_e2m1fn_x2").get_dtype() == "F4"
    for loaded in (zerohop.load_file(theirs), st_torch.load_file(str(ours))):
        for n, t in tensors.items():
            assert loaded[n].dtype == t.dtype and loaded[n].shape == t.shape, n
            assert bits(loaded[n]) == bits(t), n
    assert bits(zerohop.load_file(ours)["float4_e2m1fn_x2"][1:3]) == bits(raw[1:3])


def test_save_refuses_meta_sparse_and_shared_tensors_as_safetensors_does(tmp_path):
    path = tmp_path / "m.safetensors"
    with pytest.raises(RuntimeError, match="Cannot copy out of meta tensor"):
        zerohop.save_file({"m": torch.zeros(4, device="meta")}, path)
    with pytest.raises(ValueError, match=r"sparse tensors: `\['s'\]`"):
        zerohop.save_file({"s": torch.sparse_coo_tensor(size=(2, 3)), "d": torch.ones(2)}, path)
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for b in (a[:1], a[1:], a):
        with pytest.raises(RuntimeError, match=r"\['A', 'B'\]"):
            zerohop.save_file({"A": a, "B": b}, path)
    assert not path.exists()


@cuda
def test_dlpack_producers(tmp_path):
    cupy = pytest.importorskip("cupy")
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(range(256)) * 4)
    arr = cupy.zeros(1024, dtype=cupy.uint8)
    zerohop.read_into(arr, path)
    assert bytes(cupy.asnumpy(arr)) == path.read_bytes()


@cuda
def test_model_and_adamw_state_round_trip_bit_exactly(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512), torch.nn.Linear(512, 10)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        loss = model(torch.randn(32, 256, device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}
    expected = {k: bits(v) for k, v in model.state_dict().items()}
    expected_opt = {(i, k): bits(v) for i, s in opt.state_dict()["state"].items() for k, v in s.items()}
    saved = checkpoint.save(state, tmp_path / "ck", progress=True)
    assert saved["written_bytes"] > 0

    for _ in range(2):  # drift away from the saved state
        step()
    checkpoint.restore_into({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 0},
                            tmp_path / "ck")
    assert {k: bits(v) for k, v in model.state_dict().items()} == expected
    assert {(i, k): bits(v) for i, s in opt.state_dict()["state"].items() for k, v in s.items()} == expected_opt

    loaded = checkpoint.load(tmp_path / "ck")
    assert loaded["epoch"] == 3
    assert loaded["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]
    step_t = loaded["optimizer"]["state"][0]["step"]
    assert step_t.device == opt.state_dict()["state"][0]["step"].device  # where it was saved from
    fresh = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512), torch.nn.Linear(512, 10)
    ).cuda()
    fresh.load_state_dict(loaded["model"])
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_opt.load_state_dict(loaded["optimizer"])
    assert {k: bits(v) for k, v in fresh.state_dict().items()} == expected

    # Incremental: nothing changed since, so (almost) nothing is written.
    again = checkpoint.save(state | {"model": model.state_dict(), "optimizer": opt.state_dict()},
                            tmp_path / "ck2", parent=tmp_path / "ck")
    assert again["written_bytes"] < saved["written_bytes"] // 10
    assert checkpoint.verify(tmp_path / "ck2")[0] > 0


@cuda
def test_cuda_driver_errors_are_runtime_errors(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"\0" * 4096)
    with pytest.raises(RuntimeError, match="CUDA"):
        # Address 16 is no device memory: the driver refuses the copy.
        zerohop._native.read("cuda:0", [str(path)], [(0, 0, 4096, 16)])
    assert os.path.exists(path)


@cuda
def test_small_tensors_share_blocks_and_save_like_any_tensors(tmp_path):
    tensors = model_tensors()
    path = tmp_path / "m.safetensors"
    st_torch.save_file(tensors, str(path))
    loaded = zerohop.load_file(path, device="cuda:0")
    storages = {t.untyped_storage().data_ptr() for t in loaded.values() if t.numel()}
    assert len(storages) == 1, "the small tensors, of every dtype, are views of one block"
    # Disjoint views save as separate tensors, with safetensors and zerohop.
    for save in (st_torch.save_file, zerohop.save_file):
        again = tmp_path / "again.safetensors"
        save(loaded, str(again))
        back = st_torch.load_file(str(again))
        assert all(bits(back[n]) == bits(t) for n, t in tensors.items())


def test_tensors_in_shared_blocks_load_exactly(tmp_path, monkeypatch):
    """The block layout GPU loads use, on the CPU: tensors of every dtype
    packed into one block and read as pieces that span several of them."""
    monkeypatch.setattr(zerohop._buffers, "shares_blocks", lambda framework, device: framework == "pt")
    tensors = model_tensors()
    # Whole multiples of the block alignment, next to each other in the
    # file: read as one piece.
    tensors.update({f"run.{i}": torch.full((128,), float(i)) for i in range(4)})
    path = tmp_path / "m.safetensors"
    st_torch.save_file(tensors, str(path))
    loaded = zerohop.load_file(path, device="cpu")
    assert len({t.untyped_storage().data_ptr() for t in loaded.values() if t.numel()}) == 1
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape
        assert bits(loaded[name]) == bits(t), name


def test_shards_load_through_the_native_layout_in_many_blocks(tmp_path, monkeypatch):
    """load_file of shards into shared blocks, planned natively: small blocks,
    so that tensors fill several, the large ones and the empty one stand
    alone, and every byte and name comes back; a name in two shards is
    refused, naming both."""
    monkeypatch.setattr(zerohop._buffers, "shares_blocks", lambda framework, device: framework == "pt")
    monkeypatch.setattr(zerohop._buffers, "BLOCK_BYTES", 4096)
    planned = []
    layout = zerohop._native.safetensors_layout
    monkeypatch.setattr(zerohop._native, "safetensors_layout", lambda *a: planned.append(a) or layout(*a))
    tensors = {**model_tensors(), **{f"x.{i}": torch.full((100 + i,), float(i)) for i in range(20)}}
    names = sorted(tensors)
    paths = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    st_torch.save_file({n: tensors[n] for n in names[::2]}, str(paths[0]))
    st_torch.save_file({n: tensors[n] for n in names[1::2]}, str(paths[1]))
    loaded = zerohop.load_file(paths, device="cpu")
    assert len(planned) == 1 and sorted(loaded) == names
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape
        assert bits(loaded[name]) == bits(t), name
    storages = {t.untyped_storage().data_ptr() for t in loaded.values() if t.numel()}
    assert 2 < len(storages) < len(tensors) // 2, "several blocks, each shared"
    st_torch.save_file({names[0]: tensors[names[0]]}, str(tmp_path / "again.safetensors"))
    with pytest.raises(ValueError, match=f"{names[0]}.* is in both .*a.safetensors and .*again.safetensors"):
        zerohop.load_file([paths[0], tmp_path / "again.safetensors"], device="cpu")


def many_tensors():
    """More tensors than `_buffers.OVERLAP_MIN`: loads make their views while the
    engine reads."""
    g = torch.Generator().manual_seed(5)
    dtypes = [torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int64]
    out = {
        f"t{i}": torch.randn(3 + i % 5, 64 + i, generator=g).to(dtypes[i % len(dtypes)])
        for i in range(zerohop._buffers.OVERLAP_MIN + 36)
    }
    assert len(out) >= zerohop._buffers.OVERLAP_MIN
    return out


@pytest.mark.parametrize("blocks", [False, True], ids=["alone", "blocks"])
@pytest.mark.parametrize("device", DEVICES)
def test_many_tensors_load_exactly_while_their_views_are_made(tmp_path, monkeypatch, device, blocks):
    if device == "cpu":  # the GPU packs blocks as it chooses
        monkeypatch.setattr(zerohop._buffers, "shares_blocks", lambda framework, device: blocks)
    tensors = many_tensors()
    path = tmp_path / "m.safetensors"
    st_torch.save_file(tensors, str(path))
    loaded = zerohop.load_file(path, device=device)
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape
        assert bits(loaded[name]) == bits(t), name


@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_loads_into_shared_blocks_exactly(tmp_path, monkeypatch, device):
    """checkpoint.load allocates as load_file does: on a GPU (and here on
    the CPU, told to) small tensors share blocks, and every byte and the
    structure come back; restore_into into such tensors works too."""
    if device == "cpu":
        monkeypatch.setattr(zerohop._buffers, "shares_blocks", lambda framework, device: framework == "pt")
    tensors = {k: v.to(device) for k, v in many_tensors().items()}
    state = {"layers": list(tensors.values()), "named": {"first": tensors["t0"]}, "step": 7}
    checkpoint.save(state, tmp_path / "ck")
    loaded = checkpoint.load(tmp_path / "ck")
    assert loaded["step"] == 7 and len(loaded["layers"]) == len(tensors)
    for got, want in zip(loaded["layers"], tensors.values()):
        assert got.device == want.device and got.dtype == want.dtype and got.shape == want.shape
        assert bits(got) == bits(want)
    assert bits(loaded["named"]["first"]) == bits(tensors["t0"])
    storages = {t.untyped_storage().data_ptr() for t in loaded["layers"]}
    assert len(storages) < len(tensors) // 4, "small tensors share blocks"
    for t in loaded["layers"]:
        t.zero_()
    checkpoint.restore_into(loaded, tmp_path / "ck")
    assert all(bits(got) == bits(want) for got, want in zip(loaded["layers"], tensors.values()))


def test_a_failed_read_of_many_tensors_raises_once_the_views_are_made(tmp_path, monkeypatch):
    monkeypatch.setattr(zerohop._buffers, "shares_blocks", lambda framework, device: framework == "pt")
    path = tmp_path / "m.safetensors"
    st_torch.save_file(many_tensors(), str(path))
    _, infos = zerohop._file_tensors._headers([str(path)])
    # The file loses its second half after its header was read.
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(Exception, match="shrank|end of file|past the end"):
        zerohop._file_tensors._load([str(path)], infos.values(), "cpu", "pt", False)
    assert not [t for t in threading.enumerate() if t.name == "zerohop-load"], "the read ended"


@pytest.mark.parametrize("device", DEVICES)
def test_safe_open_reads_small_tensors_ahead_even_unaligned(tmp_path, device):
    # Small tensors of several dtypes, one at an offset that is no multiple
    # of its size (a writer may place it so), read from the read-ahead
    # window; one read on a stream of its own reads the window again.
    g = torch.Generator().manual_seed(5)
    tensors = {"a": torch.arange(3, dtype=torch.uint8)}
    for i, dtype in enumerate([torch.float32, torch.bfloat16, torch.int64, torch.float16] * 10):
        tensors[f"t{i:02d}"] = torch.randn(int(torch.randint(1, 30, (1,), generator=g)), 33, generator=g).to(dtype)
    header, data = {}, b""
    for name, t in tensors.items():
        raw = bits(t)
        dtype = {torch.uint8: "U8", torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.float16: "F16"}[t.dtype]
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    blob = json.dumps(header).encode()
    path = tmp_path / "small.safetensors"
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)
    with zerohop.safe_open(path, framework="pt", device=device) as f:
        for name in f.offset_keys():
            t = tensors[name]
            index = (slice(max(1, t.shape[0] // 2)),) + ((slice(1, None),) if t.dim() > 1 else ())
            part = f.get_slice(name)[index]
            assert part.device == torch.device(device) and bits(part) == bits(t[index]), name
            assert bits(f.get_tensor(name)) == bits(t), name
        if device.startswith("cuda"):
            with torch.cuda.stream(torch.cuda.Stream()):
                again = f.get_tensor("t05")
            torch.cuda.synchronize()
            assert bits(again) == bits(tensors["t05"])


def test_out_of_memory_is_told_from_other_errors():
    assert zerohop._buffers.out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert zerohop._buffers.out_of_memory(MemoryError())
    assert not zerohop._buffers.out_of_memory(RuntimeError("CUDA error: an illegal memory access"))


@pytest.mark.parametrize("device", DEVICES)
def test_safe_open_gives_out_parts_of_a_window_while_reads_take_them_all(tmp_path, device, monkeypatch):
    # On the CPU too, tensors share blocks here, as they do in GPU memory.
    monkeypatch.setattr(zerohop._buffers, "shares_blocks", lambda framework, device: framework == "pt")
    g = torch.Generator().manual_seed(9)
    tensors = {f"w{i:03d}": torch.randn(8, 64, generator=g) for i in range(60)}
    path = tmp_path / "w.safetensors"
    st_torch.save_file(tensors, str(path))

    def storage(t):
        return t.untyped_storage().data_ptr()

    with zerohop.safe_open(path, framework="pt", device=device) as f:
        names = f.offset_keys()
        every = [f.get_slice(n)[:4] for n in names]
        assert all(bits(t) == bits(tensors[n][:4]) for t, n in zip(every, names))
        # One block for the window's parts, from the first read on.
        assert len({storage(t) for t in every}) == 1
        every[5].fill_(0)
        assert bits(f.get_slice(names[5])[:4]) == bits(tensors[names[5]][:4]), "read anew"
    with zerohop.safe_open(path, framework="pt", device=device) as f:
        # Every other tensor: what is given out is a copy, so no tensor
        # skipped stays alive in the block of one kept.
        some = [f.get_slice(n)[:4] for n in names[::2]]
        assert all(bits(t) == bits(tensors[n][:4]) for t, n in zip(some, names[::2]))
        assert len({storage(t) for t in some}) == len(some)
