"""The results ledger (bench/results.jsonl): one measured figure a line,
with the date, the commit measured, the machine and the command."""

from __future__ import annotations

import json
import subprocess
import time


def line(commit: str | None, machine: str, command: str, figure: str, value: float) -> dict:
    """One figure; `commit` None: git's HEAD here."""
    if not commit:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit, "machine": machine,
            "command": command, "figure": figure, "value": round(value, 4)}


def append(path: str | None, lines: list) -> None:
    if path and lines:
        with open(path, "a") as f:
            f.writelines(json.dumps(x) + "\n" for x in lines)
