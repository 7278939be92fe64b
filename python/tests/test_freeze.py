"""`zerohop.freeze` / `thaw`: against a fake CRIU everywhere (the arguments,
the manifest, the checks before a restore), and against the real CRIU 4
where ZEROHOP_CRIU names one and this runs as root: a CPU process here, a
PyTorch process with its GPU state on a GPU machine."""

import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import zerohop

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAKE_CRIU = os.path.join(REPO, "crates", "zerohop-process", "tests", "fake-criu")
REAL_CRIU = os.environ.get("ZEROHOP_CRIU")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEROHOP_CRIU", FAKE_CRIU)
    monkeypatch.setenv("FAKE_CRIU_LOG", str(tmp_path / "calls"))
    for name in ("FAKE_CRIU_FAIL", "FAKE_CRIU_VERSION", "FAKE_CRIU_RESTORE_PID", "FAKE_CRIU_NO_TRACK"):
        monkeypatch.delenv(name, raising=False)
    sleeper = subprocess.Popen(["sleep", "600"])
    yield sleeper
    sleeper.kill()
    sleeper.wait()


def calls(tmp_path):
    with open(tmp_path / "calls") as f:
        return f.read().splitlines()


def test_a_freeze_goes_through_criu_and_its_manifest_comes_back(fake, tmp_path):
    frozen = tmp_path / "frozen"
    manifest = zerohop.freeze(fake.pid, frozen, shell_job=True, file_locks=True, criu_args=["--link-remap"])
    assert fake.wait(timeout=10) == -signal.SIGKILL  # what CRIU's dump does
    with open(frozen / "FREEZE.json") as f:
        assert json.load(f) == manifest
    assert (manifest["pid"], manifest["gpu"], manifest["leave_running"]) == (fake.pid, "none", False)
    assert manifest["criu"]["shell_job"] and manifest["criu"]["extra"] == ["--link-remap"]
    assert manifest["image_bytes"] == sum(f["size"] for f in manifest["images"]) > 3_000_000
    dump = calls(tmp_path)[-1]
    assert dump.startswith(f"dump -t {fake.pid} ") and dump.endswith("--shell-job --file-locks --link-remap"), dump

    back = zerohop.thaw(frozen, criu_args=["--log-pid"])
    assert (back["pid"], back["gpu"], back["gpu_bytes"]) == (fake.pid, "none", 0)
    assert calls(tmp_path)[-1].endswith("--shell-job --file-locks --link-remap --log-pid")


def test_a_damaged_image_is_named_and_nothing_is_restored(fake, tmp_path):
    frozen = tmp_path / "frozen"
    zerohop.freeze(fake.pid, frozen)
    fake.wait(timeout=10)
    pages = frozen / "images" / "pages-1.img"
    with open(pages, "r+b") as f:
        f.seek(2_500_000)
        byte = f.read(1)
        f.seek(2_500_000)
        f.write(bytes([byte[0] ^ 1]))
    restores = len(calls(tmp_path))
    with pytest.raises(zerohop.IntegrityError, match="pages-1.img is damaged"):
        zerohop.thaw(frozen)
    pages.unlink()
    with pytest.raises(FileNotFoundError, match="pages-1.img"):
        zerohop.thaw(frozen)
    assert not any(c.startswith("restore") for c in calls(tmp_path)[restores:])


def test_a_failed_freeze_leaves_the_process_running_and_bad_requests_are_refused(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CRIU_FAIL", "dump")
    with pytest.raises(OSError, match="fake dump failure"):
        zerohop.freeze(fake.pid, tmp_path / "f")
    assert fake.poll() is None and not (tmp_path / "f").exists()
    monkeypatch.delenv("FAKE_CRIU_FAIL")
    with pytest.raises(FileNotFoundError, match="no process 999999999"):
        zerohop.freeze(999999999, tmp_path / "f")
    with pytest.raises(ValueError, match="lock_timeout"):
        zerohop.freeze(fake.pid, tmp_path / "f", lock_timeout=-1)
    with pytest.raises(FileNotFoundError, match="holds no finished freeze"):
        zerohop.thaw(tmp_path / "nothing")
    monkeypatch.setenv("FAKE_CRIU_VERSION", "3.17")
    with pytest.raises(FileNotFoundError, match="3.17"):
        zerohop.freeze(fake.pid, tmp_path / "f")
    assert fake.poll() is None and not (tmp_path / "f").exists()


# workers.py "spool", started detached from the test and asked things through
# files, which survive its freeze and thaw (a pipe to the test would not).
_numbers = itertools.count()


def start_worker(spool, mode, mib, timeout=120):
    """Starts workers.py "spool" in `spool` (a new directory) and waits until
    it is ready. Returns its Popen."""
    os.makedirs(spool)
    out = open(os.path.join(spool, "output"), "w")
    worker = os.path.join(os.path.dirname(__file__), "workers.py")
    p = subprocess.Popen([sys.executable, worker, "spool", str(spool), mode, str(mib)],
                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    wait_for(spool, "ready", timeout, p)
    return p


def wait_for(spool, name, timeout, p=None):
    path = os.path.join(spool, name + ".ans")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if p is not None and p.poll() is not None:
            raise AssertionError(f"the worker exited ({p.returncode}): {output(spool)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {name} from the worker in {timeout} s: {output(spool)}")
        time.sleep(0.005)
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    return text


def ask(spool, command, timeout=60):
    name = f"{next(_numbers):06d}"
    tmp = os.path.join(spool, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(command)
    os.rename(tmp, os.path.join(spool, name + ".req"))
    return wait_for(spool, name, timeout)


def output(spool):
    with open(os.path.join(spool, "output")) as f:
        return f.read()[-2000:]


def gone(pid, timeout):
    """Waits until process `pid` is gone or a zombie; whether it is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


def real_criu():
    if not REAL_CRIU:
        pytest.skip("ZEROHOP_CRIU does not name a CRIU 4 (scripts/build-criu.sh builds one)")
    if os.geteuid() != 0:
        pytest.skip("CRIU needs root")


def freeze_and_thaw(tmp_path, mode, mib):
    """A worker snapshotted, frozen incrementally against the snapshot and
    thawed, intact at every step and quick to stop after the thaw."""
    real_criu()
    work = tmp_path / "spool"
    p = start_worker(work, mode, mib)
    try:
        assert ask(work, "check") == "intact"
        snapshot = zerohop.freeze(p.pid, tmp_path / "snap", leave_running=True)
        assert snapshot["leave_running"] and ask(work, "check") == "intact"
        frozen = zerohop.freeze(p.pid, tmp_path / "frozen", parent=tmp_path / "snap")
        assert frozen["parent"] == ("../snap" if snapshot["track_mem"] else None)
        # Its pid must be free for the thaw: reap what the dump ended.
        assert p.wait(timeout=30) == -signal.SIGKILL
        back = zerohop.thaw(tmp_path / "frozen")
        assert back["pid"] == p.pid and back["gpu"] == frozen["gpu"]
        assert ask(work, "pid") == str(p.pid)
        assert ask(work, "check") == "intact"
        assert ask(work, "stop") == "stopping"
        # A thawed process is no child of this one: it is seen to end, not reaped here.
        assert gone(p.pid, 10), "the thawed process did not exit within 10 s of being told to"
        return snapshot, frozen, back
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        elif not gone(p.pid, 0):
            os.kill(p.pid, signal.SIGKILL)


def test_real_criu_freezes_and_thaws_a_process(tmp_path):
    snapshot, frozen, back = freeze_and_thaw(tmp_path, "cpu", 64)
    assert (snapshot["gpu"], frozen["gpu"], back["gpu_bytes"]) == ("none", "none", 0)
    assert frozen["image_bytes"] > 64 << 20 or not snapshot["track_mem"]


def gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")


def test_real_criu_freezes_and_thaws_a_gpu_process_through_zerohop(tmp_path):
    gpu()
    snapshot, frozen, back = freeze_and_thaw(tmp_path, "zerohop", 512)
    assert frozen["gpu"] == "zerohop" and back["gpu_bytes"] >= 512 << 20
    # The GPU memory went to zerohop's files, not into CRIU's images.
    assert frozen["gpu_checkpoint"]["zerohop_bytes"] >= 512 << 20
    assert frozen["image_bytes"] < snapshot["image_bytes"] + (512 << 20)


def test_real_criu_freezes_and_thaws_a_gpu_process_through_the_driver(tmp_path):
    gpu()
    snapshot, frozen, back = freeze_and_thaw(tmp_path, "driver", 512)
    assert frozen["gpu"] == "driver" and back["gpu_bytes"] == 0


def test_a_snapshot_of_a_gpu_process_outlives_the_process(tmp_path):
    gpu()
    real_criu()
    work = tmp_path / "spool"
    p = start_worker(work, "zerohop", 256)
    try:
        zerohop.freeze(p.pid, tmp_path / "snap", leave_running=True)
        p.kill()  # the machine loses the process after the freeze returned
        p.wait()
        back = zerohop.thaw(tmp_path / "snap")
        assert back["pid"] == p.pid and back["gpu_bytes"] >= 256 << 20
        assert ask(work, "check") == "intact"
        assert ask(work, "stop") == "stopping" and gone(p.pid, 10)
    finally:
        if not gone(p.pid, 0):
            os.kill(p.pid, signal.SIGKILL)
