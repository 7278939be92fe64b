"""zerohop.agent against a real agent process (the `zerohop` binary, found
through ZEROHOP_BIN; scripts/test.sh sets it). GPU tensors where torch and a
GPU exist."""

import errno
import os
import subprocess
import time

import numpy as np
import pytest

import zerohop
from zerohop import agent

BIN = os.environ.get("ZEROHOP_BIN")


@pytest.fixture
def agent_socket(tmp_path):
    if not BIN or not os.path.exists(BIN):
        pytest.skip("ZEROHOP_BIN does not name the zerohop binary")
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen([BIN, "agent", "--socket", str(sock), "--log-level", "warn"])
    deadline = time.time() + 30
    while not sock.exists():
        assert time.time() < deadline and proc.poll() is None, "the agent did not start"
        time.sleep(0.01)
    yield sock
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_host_buffers_round_trip(agent_socket, tmp_path, rng):
    data = rng.integers(0, 256, size=(2 << 20) + 11, dtype=np.uint8)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(data.tobytes())
    with agent.Client(agent_socket) as c, open(src, "rb") as fs, open(dst, "wb+") as fd:
        s, d = c.register_file(fs), c.register_file(fd)
        buf = c.host_buffer(data.nbytes)
        ring = c.ring(8)
        half = data.nbytes // 2
        ring.read(s, 0, buf, 0, half, user_data=1)
        ring.read(s, half, buf, half, data.nbytes - half, user_data=2)
        ring.submit()
        assert sorted(ring.wait(2, timeout=30)) == [(1, half), (2, data.nbytes - half)]
        assert (buf.array == data).all()
        ring.write(d, 0, buf, 0, data.nbytes, user_data=3)
        ring.submit()
        assert ring.wait(1, timeout=30) == [(3, data.nbytes)]
        assert dst.read_bytes() == data.tobytes()
        st = c.status()
        assert st["clients"][0]["host_buffers"] == 1 and st["bytes_written"] == data.nbytes


def test_bad_entries_complete_with_errors(agent_socket, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with agent.Client(agent_socket) as c, open(path, "rb") as f:
        fid = c.register_file(f)
        buf = c.host_buffer(64)
        ring = c.ring(4)
        ring.read(fid, 0, buf, 32, 64, user_data=1)  # past the buffer's end
        ring.read(fid + 100, 0, buf, 0, 8, user_data=2)  # unknown file
        ring.submit()
        assert sorted(ring.wait(2, timeout=30)) == [(1, -errno.EFAULT), (2, -errno.EBADF)]
        for i in range(4):
            ring.read(fid, 0, buf, 0, 1, user_data=i)
        with pytest.raises(BlockingIOError):
            ring.read(fid, 0, buf, 0, 1)
        ring.submit()
        assert len(ring.wait(4, timeout=30)) == 4
    with pytest.raises(OSError):
        agent.Client(tmp_path / "no-agent.sock")


def test_gpu_tensors_by_ipc_handle(agent_socket, tmp_path, rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    data = rng.integers(0, 256, size=8 << 20, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    block = torch.zeros(10 << 20, dtype=torch.uint8, device="cuda")
    target = block[(1 << 20) + 512:][: data.nbytes]  # a view at a non-zero offset
    torch.cuda.synchronize()
    with agent.Client(agent_socket) as c, open(path, "rb") as f:
        fid = c.register_file(f)
        bid = c.register(target)
        ring = c.ring(4)
        ring.read(fid, 0, bid, 0, data.nbytes, user_data=9)
        ring.submit()
        assert ring.wait(1, timeout=60) == [(9, data.nbytes)]
    assert bytes(target.cpu().numpy()) == data.tobytes()
    assert int(block[: (1 << 20) + 512].sum()) == 0  # nothing written before the view
