"""load_file and safe_open on s3:// names, against a real S3-compatible
server (s3s-fs, which scripts/test.sh installs and names in
ZEROHOP_S3_SERVER) started here on the loopback address."""

import itertools
import os
import shutil
import socket
import subprocess
import time

import pytest

import zerohop

np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

KEY_ID, SECRET, BUCKET = "zerohop-test", "zerohop-test-secret", "models"
_ports = itertools.count()


def _free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (32768 on),
    which no outgoing connection or bind to port 0 takes before the server
    binds it; from a base of this process's own."""
    base = 10_000 + os.getpid() % 200 * 100
    for _ in range(100):
        port = base + next(_ports) % 100
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {base}..{base + 100}")


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """The bucket's directory (the server keeps each object as a file
    there); the AWS_* settings point at the server."""
    binary = os.environ.get("ZEROHOP_S3_SERVER") or shutil.which("s3s-fs")
    if not binary:
        pytest.fail("no S3 server: run scripts/test.sh, which installs s3s-fs, or set ZEROHOP_S3_SERVER")
    root = tmp_path / "s3"
    (root / BUCKET).mkdir(parents=True)
    port = _free_port()
    server = subprocess.Popen(
        [binary, "--host", "127.0.0.1", "--port", str(port), "--access-key", KEY_ID, "--secret-key", SECRET, str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.time() < deadline, "the S3 server did not start"
            time.sleep(0.02)
    # What answered is this server, not a listener that had the port first.
    time.sleep(0.02)
    assert server.poll() is None, f"the S3 server exited ({server.returncode}): port {port} taken?"
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    yield root / BUCKET
    server.kill()
    server.wait()


def _model(rng, tensors=5, rows=64):
    return {f"layer.{i}.weight": rng.standard_normal((rows + i, 48)).astype(np.float32) for i in range(tensors)}


def test_load_file_reads_an_object_as_its_file(bucket, rng):
    model = _model(rng)
    safetensors_numpy.save_file(model, str(bucket / "model.safetensors"), metadata={"format": "np"})
    got = zerohop.load_file(f"s3://{BUCKET}/model.safetensors", framework="np")
    assert sorted(got) == sorted(model)
    for name, array in model.items():
        assert np.array_equal(got[name], array), name


def test_prefixes_and_patterns_load_every_shard(bucket, rng):
    (bucket / "sharded").mkdir()
    shards = [_model(rng, 2), {f"head.{i}": rng.standard_normal((8, 8)).astype(np.float32) for i in range(2)}]
    for i, shard in enumerate(shards):
        safetensors_numpy.save_file(shard, str(bucket / "sharded" / f"model-0000{i + 1}-of-00002.safetensors"))
    (bucket / "sharded" / "config.json").write_text("{}")
    want = {**shards[0], **shards[1]}
    for name in (f"s3://{BUCKET}/sharded/", f"s3://{BUCKET}/sharded/model-*-of-00002.safetensors"):
        got = zerohop.load_file(name, framework="np")
        assert sorted(got) == sorted(want), name
        assert all(np.array_equal(got[k], want[k]) for k in want)


def test_safe_open_reads_only_the_rows_asked_and_sees_a_replaced_object(bucket, rng):
    model = _model(rng, rows=100)
    path = bucket / "model.safetensors"
    safetensors_numpy.save_file(model, str(path))
    with zerohop.safe_open(f"s3://{BUCKET}/model.safetensors", framework="np") as f:
        assert f.keys() == sorted(model)
        assert np.array_equal(f.get_slice("layer.2.weight")[10:20], model["layer.2.weight"][10:20])
        assert np.array_equal(f.get_tensor("layer.0.weight"), model["layer.0.weight"])
        safetensors_numpy.save_file(_model(rng, rows=100), str(path))
        with pytest.raises(RuntimeError, match="changed since it was opened"):
            f.get_tensor("layer.1.weight")


def test_bad_names_and_credentials_get_clear_errors(bucket, rng, monkeypatch):
    (bucket / "notes.safetensors").write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(FileNotFoundError, match="no such object"):
        zerohop.load_file(f"s3://{BUCKET}/missing.safetensors", framework="np")
    with pytest.raises(FileNotFoundError, match='no bucket "absent-bucket"'):
        zerohop.load_file("s3://absent-bucket/m.safetensors", framework="np")
    with pytest.raises(ValueError, match="notes.safetensors"):
        zerohop.load_file(f"s3://{BUCKET}/notes.safetensors", framework="np")
    with pytest.raises(FileNotFoundError, match="no object matches"):
        zerohop.load_file(f"s3://{BUCKET}/nothing-*.safetensors", framework="np")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(PermissionError, match="refused these credentials"):
        zerohop.load_file(f"s3://{BUCKET}/notes.safetensors", framework="np")


def test_checkpoints_save_load_list_and_remove_in_an_object_store(bucket, rng):
    from zerohop import checkpoint

    big = rng.standard_normal(6 << 20).astype(np.float32)  # 24 MiB: several parts
    state = {"model": {"w": big, "b": np.arange(7, dtype=np.int64)}, "step": 7}
    first = checkpoint.save(state, f"s3://{BUCKET}/ck/step-7")
    assert first["written_bytes"] == big.nbytes + 7 * 8
    # Against a parent: unchanged parts are copied by the server, not sent.
    big[-5:] += 1.0
    second = checkpoint.save(state, f"s3://{BUCKET}/ck/step-8", parent=f"s3://{BUCKET}/ck/step-7")
    assert second["stats"]["skipped_bytes"] > 0
    assert [c.name for c in checkpoint.ls(f"s3://{BUCKET}/ck/")] == ["step-7", "step-8"]
    assert checkpoint.ls(f"s3://{BUCKET}/ck/")[1].parent == "step-7"
    back = checkpoint.load(f"s3://{BUCKET}/ck/step-8", device="cpu")
    assert back["step"] == 7 and np.array_equal(back["model"]["w"], big)
    ok = checkpoint.verify(f"s3://{BUCKET}/ck/step-8")
    assert ok.bytes == big.nbytes + 7 * 8
    with pytest.raises(FileExistsError, match="still needed"):
        checkpoint.remove(f"s3://{BUCKET}/ck/step-7")
    with pytest.raises(FileExistsError, match="already exists"):
        checkpoint.save(state, f"s3://{BUCKET}/ck/step-8")
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        checkpoint.load(f"s3://{BUCKET}/ck/step-9")
    checkpoint.remove(f"s3://{BUCKET}/ck/step-8")
    checkpoint.remove(f"s3://{BUCKET}/ck/step-7")
    assert checkpoint.ls(f"s3://{BUCKET}/ck/") == []


def test_sharded_checkpoints_refuse_object_stores(bucket):
    from zerohop import checkpoint

    with pytest.raises(ValueError, match="not yet to an object store"):
        checkpoint.save({"a": np.ones(3)}, f"s3://{BUCKET}/ck/sharded", group=object())


def test_gpu_tensors_checkpoint_to_an_object_store_and_back(bucket):
    """CUDA tensors go up through the device's upload engine (8 MiB parts
    straight from pinned slots) and come back into GPU memory, bit for bit."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from zerohop import checkpoint

    gen = torch.Generator(device="cuda:0").manual_seed(3)
    state = {
        "w": torch.randn(5 << 20, device="cuda:0", generator=gen),  # 20 MiB: three parts
        "b": torch.arange(9, device="cuda:0", dtype=torch.bfloat16),
    }
    saved = checkpoint.save(state, f"s3://{BUCKET}/gpu/step-1")
    assert saved["written_bytes"] == (5 << 20) * 4 + 9 * 2
    back = checkpoint.load(f"s3://{BUCKET}/gpu/step-1", device="cuda:0")
    assert back["w"].device.type == "cuda" and torch.equal(back["w"], state["w"])
    assert torch.equal(back["b"], state["b"])
    into = {name: torch.zeros_like(t) for name, t in state.items()}
    checkpoint.restore_into(into, f"s3://{BUCKET}/gpu/step-1")
    assert all(torch.equal(into[n], state[n]) for n in state)
    assert checkpoint.verify(f"s3://{BUCKET}/gpu/step-1").bytes == saved["written_bytes"]
