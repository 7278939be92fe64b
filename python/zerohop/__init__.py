"""zerohop: load and save GPU memory at storage speed.

Drop-in loading and saving of safetensors files (`load_file`, `safe_open`,
`save_file`), checkpoints of nested training state (`zerohop.checkpoint`),
raw reads and writes between files and any contiguous tensor or buffer
(`read_into`, `write_from`), and GPU memory suspended to storage and
resumed at the same addresses (`suspendable`, `suspend`, `resume`), and
whole processes to a directory and back with CRIU (`freeze`, `thaw`).
Tensors are always allocated by PyTorch (or NumPy; inside `suspendable`,
PyTorch takes the memory from zerohop); zerohop moves bytes with the GIL
released.

NumPy users pass `framework="np"` to `load_file` and `safe_open` to get
arrays instead of torch tensors (torch need not be installed);
`save_file` takes arrays as they are.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from . import _buffers, _native
from ._native import IntegrityError
from ._safetensors import TensorSlice, load_file, safe_open, save_file

if TYPE_CHECKING:
    from . import agent, checkpoint
    from ._process import freeze, thaw
    from ._suspend import resume, serve_suspend, suspend, suspendable

__version__ = _native.__version__

# Imported at first use, as (module, name in it; None: the module itself):
# a program that only loads never needs these, and its `import zerohop` may
# sit inside the wait for its first load.
_AT_FIRST_USE = {
    "agent": ("agent", None),
    "checkpoint": ("checkpoint", None),
    "freeze": ("_process", "freeze"),
    "thaw": ("_process", "thaw"),
    "resume": ("_suspend", "resume"),
    "serve_suspend": ("_suspend", "serve_suspend"),
    "suspend": ("_suspend", "suspend"),
    "suspendable": ("_suspend", "suspendable"),
}


def __getattr__(name: str) -> Any:
    if name not in _AT_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attr = _AT_FIRST_USE[name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_AT_FIRST_USE))


class DebugBuildWarning(RuntimeWarning):
    """The native module is a debug build (as scripts/test.sh installs in
    .venv/ for the tests): correct, but several times slower."""


if _native.DEBUG_BUILD:
    import warnings

    warnings.warn("zerohop: this is a debug build of the native module (scripts/test.sh's .venv/ has one): "
                  "transfers run several times slower; `pip install .` makes a release build",
                  DebugBuildWarning, stacklevel=2)

__all__ = [
    "DebugBuildWarning",
    "IntegrityError",
    "TensorSlice",
    "agent",
    "checkpoint",
    "freeze",
    "info",
    "load_file",
    "prepare",
    "read_into",
    "resume",
    "safe_open",
    "save_file",
    "serve_suspend",
    "suspend",
    "suspendable",
    "thaw",
    "write_from",
]

PathLike = Union[str, "os.PathLike[str]"]


def info(path: Optional[PathLike] = None) -> Dict[str, Any]:
    """What this machine offers, as `zerohop info --json` prints it: the CUDA
    driver and GPUs (or why there are none), whether a GDS direct path
    exists and why not, io_uring, whether `path`'s file system accepts
    O_DIRECT, and the staging settings."""
    return json.loads(_native.info(os.fspath(path) if path is not None else None))


def prepare(device: Any = "cuda") -> str:
    """Sets zerohop up for `device` now ('cuda', 'cuda:N', an index, 'cpu',
    'auto'): its engine and all its pinned staging memory, made once per
    process, and a descriptor table with room for a checkpoint's files.
    Never needed: a first transfer makes the engine and pins its
    staging itself, as its first copies start. Call this where time is free (at
    start-up, while the model is being built) to take even that off the
    first load; `import zerohop` does it in the
    background where it knows the device (`ZEROHOP_PREPARE`). Returns the
    device, described."""
    return _native.prepare(_buffers.device_name(device))


def _prepare_at_import() -> None:
    """Starts `prepare` on a background thread when the package is imported
    where a device is known: `ZEROHOP_PREPARE` names one ('cuda:N', 'cpu',
    ...), or, by default, torch's current CUDA device once torch has set up
    CUDA. A first load then finds its engine made and its staging pinned.
    The descriptor table grows on a thread of its own, also where no
    device is known yet: in a process with threads the growth waits for an
    RCU grace period (9 ms on an H100 machine), which the engine need not
    wait for, and which a checkpoint saved right after the import waits
    less for than after the engine. `ZEROHOP_PREPARE=0` turns both off. A
    failure here is left for the first call to report, which makes the
    engine again."""
    wanted = os.environ.get("ZEROHOP_PREPARE", "auto")
    if wanted == "0":
        return
    if wanted == "auto":
        torch = sys.modules.get("torch")
        cuda = torch is not None and torch.cuda.is_initialized()
        wanted = f"cuda:{torch.cuda.current_device()}" if cuda else ""

    def run() -> None:
        try:
            prepare(wanted)
        except Exception:
            pass

    threads = [threading.Thread(target=_native.grow_descriptor_table, name="zerohop-descriptors", daemon=True)]
    if wanted:
        threads.append(threading.Thread(target=run, name="zerohop-prepare", daemon=True))
    for thread in threads:
        thread.start()
        # Neither a fork (whose child would inherit the engines' lock held,
        # or a table half grown) nor the interpreter's exit happens while
        # either works.
        os.register_at_fork(before=thread.join)
        atexit.register(thread.join)


_prepare_at_import()


def read_into(
    tensor: Any, path: PathLike, offset: int = 0, progress: Any = False
) -> Dict[str, Any]:
    """Fills a contiguous tensor or buffer (torch, numpy, DLPack, or the
    buffer protocol; host or GPU memory) with its size in bytes of `path`
    from `offset`. Returns the transfer's stats (bytes, seconds, GB/s,
    route taken)."""
    _check_offset(offset)
    b = _buffers.describe(tensor, writable=True, typed=False)
    pieces = [(0, offset, b.nbytes, b.addr)] if b.nbytes else []
    stats = _native.read(
        b.device, [os.fspath(path)], pieces, _buffers.current_stream(b.device), progress
    )
    return json.loads(stats)


def write_from(
    tensor: Any, path: PathLike, offset: int = 0, progress: Any = False
) -> Dict[str, Any]:
    """Writes a contiguous tensor or buffer into `path` at `offset`: the file
    is created if missing, never truncated, and durable (data and directory
    entry synced) when this returns. Returns the transfer's stats."""
    _check_offset(offset)
    b = _buffers.describe(tensor, writable=False, typed=False)
    stats = _native.write(
        b.device,
        os.fspath(path),
        offset,
        b.addr,
        b.nbytes,
        _buffers.current_stream(b.device),
        progress,
    )
    return json.loads(stats)


def _check_offset(offset: int) -> None:
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, not {offset!r}")
