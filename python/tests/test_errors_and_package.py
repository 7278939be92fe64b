"""Errors map to Python's exceptions; progress reporting; the wheel."""

import json
import os
import pkgutil
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import zerohop
from zerohop import _native


def test_missing_files_and_directories(tmp_path):
    with pytest.raises(FileNotFoundError):
        zerohop.load_file(tmp_path / "nope.safetensors", framework="np")
    with pytest.raises(FileNotFoundError):
        zerohop.checkpoint.load(tmp_path / "nope")
    with pytest.raises((IsADirectoryError, ValueError, OSError)):
        zerohop.load_file(tmp_path, framework="np")


# In a child process: a load that blocked on the FIFO would hang the suite.
_OPEN_A_FIFO = """
import sys, zerohop
for load in (lambda p: zerohop.load_file(p, framework="np"), lambda p: zerohop.read_into(bytearray(8), p)):
    try:
        load(sys.argv[1])
    except (OSError, ValueError) as e:
        assert "regular file" in str(e), e
    else:
        raise AssertionError("a FIFO was read as a model")
"""


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    # Raises TimeoutExpired (and kills the child) if the open blocks.
    done = subprocess.run([sys.executable, "-c", _OPEN_A_FIFO, str(fifo)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr


def test_permission_denied(tmp_path):
    if os.geteuid() != 0:
        path = tmp_path / "locked.safetensors"
        path.write_bytes(b"\0" * 16)
        path.chmod(0)
    else:
        # Root bypasses file modes, but not a write-only sysfs attribute.
        path = "/sys/bus/pci/rescan"
        if not os.path.exists(path):
            pytest.skip("running as root, and no write-only sysfs file to try")
    with pytest.raises(PermissionError):
        zerohop.load_file(path, framework="np")


@pytest.mark.parametrize(
    "content",
    [b"", b"\x05\0\0\0\0\0\0\0{}", b"\x02\0\0\0\0\0\0\0{}" + b"garbage",
     b"\x40\0\0\0\0\0\0\0" + b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'.ljust(64)],
)
def test_malformed_files_are_value_errors(tmp_path, content):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        zerohop.load_file(path, framework="np")


def test_device_names_are_the_cli_s(tmp_path):
    path = tmp_path / "m.safetensors"
    zerohop.save_file({"a": np.arange(4.0)}, path)
    for device in ("cpu", "host", "sim"):
        out = zerohop.load_file(path, device=device, framework="np")
        assert out["a"].tolist() == [0.0, 1.0, 2.0, 3.0], device
    with pytest.raises(ValueError, match="unknown device .none.: expected auto"):
        zerohop.load_file(path, device="none")


def test_a_gpu_that_is_not_there_is_named_with_what_to_use_instead(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "m.safetensors"
    zerohop.save_file({"a": np.arange(4.0)}, path)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    want = "no CUDA GPU is available here.*device='cpu'" if count == 0 else f"has {count} CUDA GPU"
    for device in (f"cuda:{count + 6}", count + 6):
        with pytest.raises(RuntimeError, match=want):
            zerohop.load_file(path, device=device)
        with pytest.raises(RuntimeError, match=want):
            zerohop.safe_open(path, "pt", device=device)


def test_bad_arguments_are_value_errors(tmp_path):
    path = tmp_path / "m.safetensors"
    zerohop.save_file({"a": np.ones(2)}, path)
    with pytest.raises(ValueError, match="unknown device"):
        zerohop.load_file(path, device="tpu")
    with pytest.raises(ValueError, match="framework"):
        zerohop.load_file(path, framework="jax")
    with pytest.raises(ValueError, match="metadata"):
        zerohop.save_file({"a": np.ones(2)}, tmp_path / "n.safetensors", metadata={"k": 1})
    with pytest.raises(ValueError, match="unknown device"):
        _native.read("gpu", [str(path)], [])


def test_driver_errors_are_runtime_errors(tmp_path):
    if zerohop.info()["gpus"]:
        pytest.skip("a GPU is present (the GPU suite covers CUDA errors)")
    path = tmp_path / "f"
    path.write_bytes(b"\0" * 8)
    with pytest.raises(RuntimeError, match="(?i)cuda|driver"):
        _native.read("cuda:0", [str(path)], [(0, 0, 8, 4096)])


def test_progress_callbacks_run_on_worker_threads_with_the_gil_released(tmp_path, rng):
    data = rng.integers(0, 256, size=48 << 20, dtype=np.uint8)
    path = tmp_path / "m.safetensors"
    zerohop.save_file({"a": data}, path)
    calls = []
    main = threading.get_ident()

    def report(done, total):
        calls.append((done, total, threading.get_ident()))

    out = zerohop.load_file(path, device="sim", framework="np", progress=report)
    assert out["a"].tobytes() == data.tobytes()
    assert calls and calls[-1][:2] == (data.nbytes, data.nbytes)
    # Called from engine threads while the caller waited: the GIL was free.
    assert any(t != main for _, _, t in calls)
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))


def test_progress_true_draws_a_line(tmp_path, capfd):
    zerohop.save_file({"a": np.ones(1 << 20)}, tmp_path / "m.safetensors", progress=True)
    assert "saving" in capfd.readouterr().err


def test_a_failing_callback_raises_after_the_work(tmp_path):
    def boom(done, total):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        zerohop.save_file({"a": np.ones(1 << 20)}, tmp_path / "m.safetensors", progress=boom)
    assert (tmp_path / "m.safetensors").exists()


def test_info_describes_the_machine():
    info = zerohop.info("/")
    assert set(info) >= {"driver", "gpus", "gds", "io_uring", "o_direct", "staging"}
    assert info["staging"]["total_bytes"] > 0


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not installed")
def test_the_extension_does_not_link_cuda():
    needed = subprocess.run(["readelf", "-d", _native.__file__], capture_output=True, text=True).stdout
    assert "NEEDED" in needed
    assert "cuda" not in needed.lower() and "libpython" not in needed


def test_prepare_makes_the_engine_once_and_names_the_device():
    first = zerohop.prepare("cpu")
    assert "host" in first.lower(), first
    assert zerohop.prepare("host") == first
    with pytest.raises(ValueError):
        zerohop.prepare("nonsense")


# In a child process: what import does depends on its environment. The
# simulated device stages its copies as a GPU does (host memory needs none).
_FIRST_READ_AFTER_IMPORT = """
import json, sys, threading, numpy as np, zerohop
from zerohop import _native
for t in threading.enumerate():
    if t.name == "zerohop-prepare":
        t.join()
out = np.empty(1 << 20, dtype=np.uint8)
stats = json.loads(_native.read("sim", [sys.argv[1]], [(0, 0, out.nbytes, out.ctypes.data)], 0, False))
assert bytes(out[:4]) == b"\\x07" * 4
print(json.dumps(stats))
"""


def test_import_prepares_the_named_device_in_the_background(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(b"\x07" * (1 << 20))

    def first_read(prepare):
        env = dict(os.environ, ZEROHOP_PREPARE=prepare)
        done = subprocess.run([sys.executable, "-c", _FIRST_READ_AFTER_IMPORT, str(data)],
                              capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    prepared = first_read("sim")
    assert prepared["staging_seconds"] == 0, prepared
    assert prepared["engine_setup_seconds"] == 0, prepared
    cold = first_read("0")
    assert cold["staging_seconds"] > 0, cold
    assert cold["engine_setup_seconds"] > 0, cold


_DESCRIPTOR_TABLE_AFTER_IMPORT = """
import threading, zerohop
for t in threading.enumerate():
    if t.name in ("zerohop-prepare", "zerohop-descriptors"):
        t.join()
status = open("/proc/self/status").read()
print(next(int(line.split()[1]) for line in status.splitlines() if line.startswith("FDSize:")))
"""


def test_import_grows_the_descriptor_table_in_the_background():
    # Growing it inside a checkpoint's opens waits for an RCU grace period
    # in a process with threads; at import it is done on the side, also
    # where no device is known yet (no torch here).
    import resource

    def table_size(prepare):
        env = {k: v for k, v in os.environ.items() if k != "ZEROHOP_PREPARE"}
        if prepare is not None:
            env["ZEROHOP_PREPARE"] = prepare
        done = subprocess.run([sys.executable, "-c", _DESCRIPTOR_TABLE_AFTER_IMPORT], capture_output=True,
                              text=True, env=env)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip().splitlines()[-1])

    want = min(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    assert table_size(None) >= want
    assert table_size("cpu") >= want
    assert table_size("0") < want


def test_a_debug_build_says_so_when_imported():
    code = "import warnings; warnings.simplefilter('always'); import zerohop"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    said = "DebugBuildWarning" in done.stderr
    assert said == zerohop._native.DEBUG_BUILD, done.stderr


# Every module of the package imported first in a fresh interpreter (a
# circle between them shows as a half-initialised module here), and the
# package's names: those it imports at first use are not imported by
# `import zerohop`, and each is there when asked for.
_IMPORT_FIRST = """
import importlib, sys
name = sys.argv[1]
importlib.import_module(name)
import zerohop
for public in zerohop.__all__:
    getattr(zerohop, public)
"""

_AT_FIRST_USE = """
import sys, zerohop
late = ("zerohop.agent", "zerohop.checkpoint", "zerohop._process", "zerohop._suspend", "zerohop._flat")
assert not [m for m in late if m in sys.modules], [m for m in late if m in sys.modules]
assert set(zerohop._AT_FIRST_USE) <= set(dir(zerohop)) and set(zerohop._AT_FIRST_USE) <= set(zerohop.__all__)
assert zerohop.checkpoint is sys.modules["zerohop.checkpoint"] and callable(zerohop.checkpoint.save)
assert zerohop.suspend is sys.modules["zerohop._suspend"].suspend
try:
    zerohop.no_such_name
except AttributeError as e:
    assert "no_such_name" in str(e), e
else:
    raise AssertionError("an unknown name was found")
"""


@pytest.mark.parametrize("module", ["zerohop"] + [f"zerohop.{m.name}" for m in pkgutil.iter_modules(zerohop.__path__)])
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    if module in ("zerohop.dcp", "zerohop.distributed"):
        pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", _IMPORT_FIRST, module], capture_output=True, text=True,
                          env=dict(os.environ, ZEROHOP_PREPARE="0"))
    assert done.returncode == 0, done.stderr


def test_import_leaves_what_only_some_programs_use_until_first_use():
    done = subprocess.run([sys.executable, "-c", _AT_FIRST_USE], capture_output=True, text=True,
                          env=dict(os.environ, ZEROHOP_PREPARE="0"))
    assert done.returncode == 0, done.stderr
