"""GPU memory of this process suspended to storage and back
(`zerohop.suspendable`, `zerohop.suspend`, `zerohop.resume`).

Tensors made inside `with zerohop.suspendable():` take their memory from
zerohop's suspendable heap, through PyTorch's pluggable allocator: every
allocation is a reserved range of GPU addresses with memory behind it.
`suspend(dir)` writes all of it to a new checkpoint (checksummed, durable,
incremental against `parent=`) and gives the memory back to the driver;
`resume(dir)` takes memory again at the very same addresses and restores
it, verified, so the tensors (and whatever holds their pointers: captured
CUDA graphs, kernels' arguments) are as they were.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Dict, Iterator, Optional, Union

from . import _buffers, _native

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def suspendable(device: Any = "cuda") -> Iterator[Any]:
    """Within it, PyTorch allocates on `device` (a GPU) from zerohop's
    suspendable heap. Yields the `torch.cuda.MemPool` it uses; keep it
    while its tensors live."""
    import torch

    name = _buffers.device_name(device)
    if not name.startswith("cuda"):
        raise ValueError(f"suspendable memory is GPU memory, not {name!r}")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        _native.__file__, "zerohop_suspendable_alloc", "zerohop_suspendable_free"
    )
    pool = torch.cuda.MemPool(allocator.allocator())
    with torch.cuda.use_mem_pool(pool, device=torch.device(name)):
        yield pool


def suspend(dir: PathLike, device: Any = "cuda", parent: Optional[PathLike] = None, progress: Any = False) -> Dict[str, Any]:
    """Waits for `device`'s work, saves every allocation of its suspendable
    heap as a new checkpoint at `dir` (incrementally against `parent`, an
    earlier suspend's), and gives the memory back, with the memory CUDA
    keeps aside for kernels' stacks (the per-thread stack size is 0 until
    the resume; kernels still get what they are compiled to need). Until
    `resume` returns, the heap's tensors must not be used. Returns the
    seconds until durable, the bytes written and released, and the save's
    stats."""
    name = _buffers.device_name(device)
    if name.startswith("cuda"):
        import torch

        torch.cuda.synchronize(name)
    stats, seconds, written, released = _native.heap_suspend(
        name, os.fspath(dir), os.fspath(parent) if parent is not None else None, progress
    )
    return {"seconds": seconds, "written_bytes": written, "released_bytes": released, "stats": json.loads(stats)}


def resume(dir: PathLike, device: Any = "cuda", progress: Any = False) -> Dict[str, Any]:
    """Takes the memory back at the same addresses and restores it from
    `dir`, every chunk verified. On an error (the memory is held by another
    process, the checkpoint is missing or damaged) the heap stays suspended
    and can be resumed later. Returns the restore's stats, with the seconds
    spent getting the memory back first (`backing_seconds`)."""
    stats, backing = _native.heap_resume(_buffers.device_name(device), os.fspath(dir), progress)
    return {**json.loads(stats), "backing_seconds": backing}


def serve_suspend(device: Any = "cuda", lock: Any = None, path: Optional[PathLike] = None) -> Any:
    """Lets `zerohop suspend PID DIR` and `zerohop resume PID DIR` (another
    process, the same user) suspend and resume this process's heap on
    `device`. A suspend first takes `lock` (any object with `acquire` and
    `release`, such as the `threading.Lock` the process holds while it uses
    the GPU) and waits for the device's work; it keeps the lock until a
    resume succeeds. Without a lock the process promises to leave its
    suspendable tensors alone whenever such a request may come. Serves at
    `path` (default: `zerohop suspend` finds it by PID) until the object
    returned is closed (`.close()`) or dropped."""
    name = _buffers.device_name(device)

    def pause() -> None:
        if lock is not None:
            lock.acquire()
        if name.startswith("cuda"):
            import torch

            torch.cuda.synchronize(name)

    def unpause() -> None:
        if lock is not None:
            lock.release()

    where = os.fspath(path) if path is not None else _native.suspend_socket_path(os.getpid())
    return _native.serve_suspend(name, where, pause, unpause)
