"""Drives spool_worker.py: starts it detached from the test, and asks it
things through files, which survive its freeze and thaw (a pipe to the
test would not)."""

import itertools
import os
import subprocess
import sys
import time

HERE = os.path.dirname(__file__)
_numbers = itertools.count()


def start(spool, mode, mib, timeout=120):
    """Starts spool_worker.py in `spool` (a new directory) and waits until
    it is ready. Returns its Popen."""
    os.makedirs(spool)
    out = open(os.path.join(spool, "output"), "w")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "spool_worker.py"), str(spool), mode, str(mib)],
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
