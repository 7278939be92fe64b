"""Worker processes that tests drive by lines: a command on stdin, one
answer line on stdout."""

import os
import subprocess
import sys

HERE = os.path.dirname(__file__)


def start(script, *args, env=None):
    """Starts the Python file `script` (beside this one) with `args` and
    waits for its first line, which must start with "ready". Returns the
    process and `ask(command) -> answer`."""
    p = subprocess.Popen([sys.executable, os.path.join(HERE, script), *map(str, args)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    first = p.stdout.readline()
    assert first.startswith("ready"), first

    def ask(command):
        p.stdin.write(command + "\n")
        p.stdin.flush()
        return p.stdout.readline().strip()

    return p, ask


def stop(p, timeout=60):
    """Closes the worker's stdin, which ends it; it must exit cleanly."""
    p.stdin.close()
    assert p.wait(timeout=timeout) == 0
