"""libhf3fs_api_shared.so through ctypes, as USRBIO's Python wrappers load
it (HF3FS_LIB_DIR, or LD_LIBRARY_PATH, with RTLD_GLOBAL), against a real
agent serving a directory (the `zerohop` binary in ZEROHOP_BIN; the
library's folder in ZEROHOP_USRBIO_LIB_DIR: scripts/test.sh sets both).
Device iovs where torch and a GPU exist."""

import ctypes
import errno
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import usrbio_client as usrbio

BIN = os.environ.get("ZEROHOP_BIN")
LIB_DIR = os.environ.get("ZEROHOP_USRBIO_LIB_DIR")
CLIENT = os.path.join(os.path.dirname(__file__), "usrbio_client.py")


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(mount as bytes, the loaded library): an agent serving tmp_path/served."""
    for name, value in (("ZEROHOP_BIN", BIN), ("ZEROHOP_USRBIO_LIB_DIR", LIB_DIR)):
        if not value or not os.path.exists(value):
            pytest.skip(f"{name} does not name the built {'binary' if name == 'ZEROHOP_BIN' else 'library folder'}")
    mount = tmp_path.resolve() / "served"
    mount.mkdir()
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen([BIN, "agent", "--socket", str(sock), "--serve", str(mount), "--log-level", "warn"])
    deadline = time.time() + 30
    while not sock.exists():
        assert time.time() < deadline and proc.poll() is None, "the agent did not start"
        time.sleep(0.01)
    monkeypatch.setenv("HF3FS_LIB_DIR", LIB_DIR)
    monkeypatch.setenv("ZEROHOP_AGENT_SOCKET", str(sock))
    monkeypatch.setenv("ZEROHOP_IOV_DIR", str(tmp_path / "iovs"))
    yield mount, usrbio.load()
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_a_wrapper_reads_into_a_host_iov(served, rng):
    mount, lib = served
    data = rng.integers(0, 256, size=3_000_001, dtype=np.uint8)
    path = mount / "weights.bin"
    path.write_bytes(data.tobytes())
    out = ctypes.create_string_buffer(512)
    assert lib.hf3fs_extract_mount_point(out, 512, str(path).encode()) == len(str(mount)) + 1
    assert out.value == str(mount).encode()
    iov = usrbio.Iov()
    usrbio.check(lib.hf3fs_iovcreate(ctypes.byref(iov), str(mount).encode(), data.nbytes, 0, -1), "iovcreate")
    assert usrbio.read(lib, str(mount).encode(), iov, str(path)) == data.nbytes
    got = np.ctypeslib.as_array((ctypes.c_uint8 * data.nbytes).from_address(iov.base))
    assert (got == data).all()
    lib.hf3fs_iovdestroy(ctypes.byref(iov))


def test_the_library_is_found_through_ld_library_path_too(served, tmp_path):
    mount, _ = served
    code = ("import ctypes, os; os.environ.pop('HF3FS_LIB_DIR', None); import usrbio_client as u; lib = u.load(); "
            "b = ctypes.create_string_buffer(512); "
            f"print(lib.hf3fs_extract_mount_point(b, 512, {str(mount / 'x')!r}.encode()), b.value.decode())")
    env = dict(os.environ, LD_LIBRARY_PATH=LIB_DIR, PYTHONPATH=os.path.dirname(__file__))
    env.pop("HF3FS_LIB_DIR")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(len(str(mount)) + 1), str(mount)]


def _cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return torch


def test_device_iovs_made_wrapped_and_opened_from_another_process(served, rng):
    torch = _cuda()
    mount, lib = served
    m = str(mount).encode()
    assert lib.hf3fs_gdr_available()
    data = rng.integers(0, 256, size=(8 << 20) + 4097, dtype=np.uint8)
    path = mount / "shard.bin"
    path.write_bytes(data.tobytes())
    want = torch.from_numpy(data).cuda()

    # hf3fs_iovcreate_device: the library allocates; read into it, write
    # it out to a second file, compare.
    iov = usrbio.Iov()
    usrbio.check(lib.hf3fs_iovcreate_device(ctypes.byref(iov), m, data.nbytes, 0, 0), "iovcreate_device")
    assert lib.hf3fs_iov_mem_type(ctypes.byref(iov)) == 1 and lib.hf3fs_iov_device_id(ctypes.byref(iov)) == 0
    assert usrbio.read(lib, m, iov, str(path)) == data.nbytes
    usrbio.check(lib.hf3fs_iovsync(ctypes.byref(iov), 0), "iovsync")
    host = (ctypes.c_uint8 * data.nbytes)()
    cuda = ctypes.CDLL("libcuda.so.1")
    torch.cuda.synchronize()
    assert cuda.cuMemcpyDtoH_v2(host, ctypes.c_uint64(iov.base), ctypes.c_size_t(data.nbytes)) == 0
    assert (np.ctypeslib.as_array(host) == data).all()
    lib.hf3fs_iovdestroy(ctypes.byref(iov))

    # hf3fs_iovwrap_device: a torch tensor, at an offset inside its
    # allocation; the bytes around it stay as they were.
    block = torch.full((data.nbytes + (1 << 20),), 0xAB, dtype=torch.uint8, device="cuda:0")
    at = 12345
    ident = (ctypes.c_uint8 * 16).from_buffer_copy(os.urandom(16))
    wrapped = usrbio.Iov()
    usrbio.check(lib.hf3fs_iovwrap_device(ctypes.byref(wrapped), block.data_ptr() + at, ident, m, data.nbytes, 0, 0),
                 "iovwrap_device")
    torch.cuda.synchronize()
    assert usrbio.read(lib, m, wrapped, str(path)) == data.nbytes
    assert torch.equal(block[at:at + data.nbytes], want)
    assert (block[:at] == 0xAB).all() and (block[at + data.nbytes:] == 0xAB).all()

    # hf3fs_iovopen_device from a second process, by the id: it reads the
    # file into this process's tensor.
    block[at:at + data.nbytes].zero_()
    torch.cuda.synchronize()
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
    done = subprocess.run([sys.executable, CLIENT, "read-into-device", str(mount), str(path), bytes(ident).hex(),
                           str(data.nbytes)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert torch.equal(block[at:at + data.nbytes], want)
    lib.hf3fs_iovdestroy(ctypes.byref(wrapped))


def test_device_calls_say_enotsup_without_a_gpu(served):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is here: the device test covers these calls")
    except ImportError:
        pass
    mount, lib = served
    iov = usrbio.Iov()
    assert not lib.hf3fs_gdr_available()
    assert lib.hf3fs_iovcreate_device(ctypes.byref(iov), str(mount).encode(), 4096, 0, 0) == -errno.ENOTSUP
