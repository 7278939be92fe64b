"""A client of the zerohop I/O agent (`zerohop agent`): another process that
reads and writes files for you, straight into your host memory or your GPU
tensors, through a shared-memory ring.

    with zerohop.agent.Client() as agent:
        f = agent.register_file(open("model.safetensors", "rb"))
        weights = torch.empty(n, dtype=torch.uint8, device="cuda")
        buf = agent.register(weights)            # by CUDA IPC handle (or VMM descriptor)
        ring = agent.ring(64)
        ring.read(f, 0, buf, 0, n, user_data=1)
        ring.submit()
        [(1, result)] = ring.wait()              # result: bytes, or -errno

The agent checks every entry; a bad one completes with a negative errno
(EBADF, EFAULT, EINVAL, E2BIG, EIO, ENOSPC). Whatever a client registered is
released when it closes, or when its process dies.
"""

from __future__ import annotations

import ctypes
import json
import os
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _buffers, _native

READ, WRITE = 1, 2


class HostBuffer:
    """Host memory shared with the agent. `array` is a writable numpy uint8
    view (when numpy is installed) and `view` a memoryview of it; both keep
    the memory alive."""

    def __init__(self, native: Any):
        self._native = native
        raw = (ctypes.c_char * native.size).from_address(native.address)
        raw._owner = native  # the mapping lives as long as any view of it
        self.view = memoryview(raw).cast("B")
        np = _buffers.np
        self.array = np.frombuffer(raw, dtype=np.uint8) if np is not None else None

    @property
    def id(self) -> int:
        return self._native.id

    @property
    def size(self) -> int:
        return self._native.size


BufferLike = Union[int, HostBuffer]


class Ring:
    """A submission/completion ring: queue I/Os, submit them together, wait."""

    def __init__(self, native: Any):
        self._native = native

    def _prepare(self, op: int, file: int, file_offset: int, buf: BufferLike, buf_offset: int,
                 length: int, user_data: int) -> None:
        buf_id = buf.id if isinstance(buf, HostBuffer) else int(buf)
        if not self._native.prepare(op, file, file_offset, buf_id, buf_offset, length, user_data):
            raise BlockingIOError("the ring is full: submit() and wait() first")

    def read(self, file: int, file_offset: int, buf: BufferLike, buf_offset: int, length: int,
             user_data: int = 0) -> None:
        """Queues a read of `length` bytes of `file` at `file_offset` into
        `buf` (a HostBuffer or a registered buffer id) at `buf_offset`."""
        self._prepare(READ, file, file_offset, buf, buf_offset, length, user_data)

    def write(self, file: int, file_offset: int, buf: BufferLike, buf_offset: int, length: int,
              user_data: int = 0) -> None:
        """Queues a write; durable (fsync) when it completes."""
        self._prepare(WRITE, file, file_offset, buf, buf_offset, length, user_data)

    def submit(self) -> None:
        self._native.submit()

    def wait(self, min: int = 1, timeout: Optional[float] = None) -> List[Tuple[int, int]]:
        """At least `min` completions (fewer after `timeout` seconds), as
        (user_data, result); result is the byte count or -errno. The GIL is
        released while waiting."""
        return self._native.wait(min, timeout)

    @property
    def in_flight(self) -> int:
        return self._native.in_flight


class Client:
    """A session with the agent at `socket` (default: $XDG_RUNTIME_DIR/zerohop.sock,
    else /tmp/zerohop-UID.sock)."""

    def __init__(self, socket: Optional[Union[str, "os.PathLike[str]"]] = None):
        self._native = _native.AgentClient(os.fspath(socket) if socket is not None else None)
        self._kept: Dict[int, Any] = {}
        self._rings: List[Ring] = []

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Waits for the I/O still in flight (the agent may be writing into
        registered tensors), then ends the session: the agent releases
        everything registered, and the tensors are let go."""
        for ring in self._rings:
            try:
                ring.submit()  # prepared entries are in flight only once submitted
                while ring.in_flight:
                    ring.wait(ring.in_flight)
            except OSError:
                break  # the agent is gone: nothing is in flight any more
        self._rings.clear()
        self._native = None
        self._kept.clear()

    def register_file(self, f: Any) -> int:
        """Registers an open file (object with fileno(), or a descriptor)."""
        fd = f if isinstance(f, int) else f.fileno()
        return self._native.register_file(fd)

    def deregister_file(self, file_id: int) -> None:
        self._native.deregister_file(file_id)

    def host_buffer(self, size: int) -> HostBuffer:
        """`size` bytes of host memory shared with the agent."""
        return HostBuffer(self._native.create_host_buffer(size))

    def register(self, tensor: Any) -> int:
        """Registers a contiguous CUDA tensor (torch, or any DLPack
        producer) as a buffer; returns its id. The tensor is kept alive
        until `deregister` or `close`; finish GPU work on it (e.g.
        torch.cuda.synchronize()) before submitting I/O on it."""
        b = _buffers.describe(tensor, writable=True, typed=False)
        if not b.device.startswith("cuda:"):
            raise ValueError("register() takes GPU memory; use host_buffer() for host memory")
        buf_id = self._native.register_device_buffer(int(b.device[5:]), b.addr, b.nbytes)
        self._kept[buf_id] = b.owner
        return buf_id

    def deregister(self, buf: BufferLike) -> None:
        buf_id = buf.id if isinstance(buf, HostBuffer) else int(buf)
        self._native.deregister_buffer(buf_id)
        self._kept.pop(buf_id, None)

    def ring(self, entries: int = 64) -> Ring:
        """A ring of `entries` (a power of two up to 4096)."""
        ring = Ring(self._native.create_ring(entries))
        self._rings.append(ring)
        return ring

    def status(self) -> Dict[str, Any]:
        """The agent's counters: clients, buffers, rings, bytes, I/Os, errors."""
        return json.loads(self._native.status())
