"""Whole processes to a directory and back: `freeze` and `thaw`, for the
tooling that manages GPU processes (an inference server's supervisor, a
scheduler). They act on another process, named by its pid, and need CRIU
4 (`ZEROHOP_CRIU` or PATH) and, as CRIU does, root."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Sequence, Union

from . import _native

PathLike = Union[str, "os.PathLike[str]"]


def freeze(
    pid: int,
    dir: PathLike,
    *,
    leave_running: bool = False,
    parent: Optional[PathLike] = None,
    shell_job: bool = False,
    tcp_established: bool = False,
    file_locks: bool = False,
    ext_unix_sk: bool = False,
    criu_args: Sequence[str] = (),
    lock_timeout: float = 30.0,
) -> Dict[str, Any]:
    """Freezes process `pid` into `dir`, a new directory, as `zerohop
    freeze` does: its GPU state through zerohop (memory it serves with
    `serve_suspend`, or the preloaded library) and the driver (the rest),
    then CRIU's dump of everything else; durable when this returns, with
    `dir/FREEZE.json` written last. The process is gone afterwards unless
    `leave_running` (a snapshot, which a later freeze can name as its
    `parent`: CRIU then writes only the host memory pages changed since,
    where the kernel tracks them; GPU memory is written whole). `shell_job`, `tcp_established`,
    `file_locks`, `ext_unix_sk` and `criu_args` go to CRIU's dump and, from
    the manifest, to the thaw's restore. On failure the process runs on as
    it was and `dir` is removed. Returns the manifest."""
    report = _native.freeze(
        int(pid),
        os.fspath(dir),
        bool(leave_running),
        os.fspath(parent) if parent is not None else None,
        bool(shell_job),
        bool(tcp_established),
        bool(file_locks),
        bool(ext_unix_sk),
        [str(a) for a in criu_args],
        float(lock_timeout),
    )
    return json.loads(report)


def thaw(dir: PathLike, *, criu_args: Sequence[str] = ()) -> Dict[str, Any]:
    """Brings the process frozen in `dir` back under its own pid: every
    image checked against its sums first (a damaged or missing one is named,
    an `IntegrityError` or `FileNotFoundError`, and nothing runs), CRIU's
    restore, then its GPU state, verified. On failure no restored process is
    left running. Returns the seconds of each step and the GPU bytes
    verified."""
    return json.loads(_native.thaw(os.fspath(dir), [str(a) for a in criu_args]))
