"""`zerohop suspend PID DIR` / `zerohop resume PID DIR` against a real
process serving its heap (workers.py "heap", host memory)."""

import os
import subprocess
import time

import workers
import pytest

BIN = os.environ.get("ZEROHOP_BIN")


@pytest.fixture
def worker():
    if not BIN:
        pytest.skip("ZEROHOP_BIN does not name the zerohop binary")
    p, ask = workers.start("heap")
    yield p, ask
    workers.stop(p)


def zerohop(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def test_a_process_is_suspended_and_resumed_from_outside(worker, tmp_path, damaged_copy):
    p, ask = worker
    pid = str(p.pid)
    done = zerohop("suspend", pid, str(tmp_path / "s1"))
    assert done.returncode == 0, done.stderr
    assert "released" in done.stdout and "written" in done.stdout, done.stdout
    assert ask("state") == f"0 {tmp_path / 's1'}"
    assert ask("work") == "paused"  # the lock is held until the resume

    # A damaged copy is refused; the process stays suspended and paused.
    bad = damaged_copy(tmp_path / "s1", tmp_path / "bad")
    refused = zerohop("resume", pid, str(bad))
    assert refused.returncode != 0 and "does not match its checksum" in refused.stderr, refused.stderr
    assert ask("work") == "paused"

    resumed = zerohop("resume", pid, str(tmp_path / "s1"))
    assert resumed.returncode == 0, resumed.stderr
    assert ask("work") == "worked" and ask("check") == "intact"
    assert ask("state").endswith(" None")

    # Incremental against the first suspend.
    again = zerohop("suspend", pid, str(tmp_path / "s2"), "--parent", str(tmp_path / "s1"))
    assert again.returncode == 0, again.stderr
    assert zerohop("resume", pid, str(tmp_path / "s2")).returncode == 0
    assert ask("check") == "intact"


def test_a_process_that_serves_nothing_is_a_clear_error(tmp_path):
    if not BIN:
        pytest.skip("ZEROHOP_BIN does not name the zerohop binary")
    done = zerohop("suspend", "999999999", str(tmp_path / "s"))
    assert done.returncode != 0 and "serves no suspend requests" in done.stderr, done.stderr


def test_checkpoint_process_refuses_clearly_and_creates_nothing(tmp_path):
    if not BIN:
        pytest.skip("ZEROHOP_BIN does not name the zerohop binary")
    gone = zerohop("checkpoint-process", "999999999", str(tmp_path / "c"))
    assert gone.returncode != 0 and "no process 999999999" in gone.stderr, gone.stderr
    idle = subprocess.Popen(["sleep", "60"])
    try:
        # Without a driver (CI) it says so; with one, that this is no CUDA
        # process (test_suspend_gpu.py checkpoints a real one).
        done = zerohop("checkpoint-process", str(idle.pid), str(tmp_path / "c"))
        assert done.returncode != 0, done.stdout
        assert "no NVIDIA driver" in done.stderr or "not a CUDA process" in done.stderr, done.stderr
        back = zerohop("restore-process", str(idle.pid), str(tmp_path / "c"))
        assert back.returncode != 0 and "no finished process checkpoint" in back.stderr, back.stderr
    finally:
        idle.kill()
        idle.wait()
    assert not (tmp_path / "c").exists()


def test_killing_the_command_mid_suspend_leaves_a_whole_checkpoint_or_none(tmp_path):
    # The command is only a client: the process finishes the suspend it
    # asked for, and commits it whole, or not at all; it resumes from it.
    if not BIN:
        pytest.skip("ZEROHOP_BIN does not name the zerohop binary")
    p, ask = workers.start("heap", 256)
    try:
        client = subprocess.Popen([BIN, "suspend", str(p.pid), str(tmp_path / "s")])
        time.sleep(0.05)
        client.kill()
        client.wait()
        deadline = time.monotonic() + 60
        while ask("state").endswith(" None") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ask("state") == f"0 {tmp_path / 's'}", "the process finished the suspend"
        assert zerohop("checkpoint", "verify", str(tmp_path / "s")).returncode == 0
        resumed = zerohop("resume", str(p.pid), str(tmp_path / "s"))
        assert resumed.returncode == 0, resumed.stderr
        assert ask("check") == "intact"
    finally:
        workers.stop(p)
