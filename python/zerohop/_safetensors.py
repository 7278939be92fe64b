"""safetensors files, as `safetensors.torch` (and `safetensors.numpy`) read
and write them, through the zerohop engine."""

from __future__ import annotations

import operator
import os
import threading
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _buffers, _native
from ._calls import without_cycle_collection

PathLike = Union[str, "os.PathLike[str]"]
Progress = Any  # False/None, True (a line on stderr), or a callable(done, total)


class _Tensor:
    """A tensor's place in its file."""

    def __init__(self, file: int, name: str, dtype: str, shape: List[int], begin: int, end: int):
        self.file, self.name, self.dtype, self.shape = file, name, dtype, shape
        self.begin, self.end = begin, end


def _headers(paths: Sequence[str]) -> Tuple[Optional[Dict[str, str]], Dict[str, _Tensor]]:
    metadata = None
    tensors: Dict[str, _Tensor] = {}
    for i, path in enumerate(paths):
        meta, infos = _native.safetensors_header(path)
        metadata = metadata or meta
        for name, dtype, shape, begin, end in infos:
            if name in tensors:
                raise ValueError(f"tensor {name!r} is in both {paths[tensors[name].file]} and {path}")
            tensors[name] = _Tensor(i, name, dtype, shape, begin, end)
    return metadata, tensors


def _load(
    sources: Any,
    wanted: Iterable[_Tensor],
    device: str,
    framework: str,
    progress: Progress,
) -> Dict[str, Any]:
    """Allocates the wanted tensors through their framework (in GPU memory,
    small ones share blocks: see `_buffers.allocate`), then fills them all
    in one engine call from `sources` (paths, or a `_native.Sources`)."""
    wanted = list(wanted)
    memory = _buffers.allocate(framework, [(t.dtype, t.shape, t.end - t.begin) for t in wanted], device)
    pieces: List[List[int]] = []
    last_block = None
    for t, addr, block in zip(wanted, memory.addresses, memory.blocks):
        n = t.end - t.begin
        # Tensors of one block that follow each other in the file and in
        # memory are one piece for the engine (a copy never spans two
        # allocations).
        if block is not None and block == last_block and pieces[-1][0] == t.file \
                and pieces[-1][1] + pieces[-1][2] == t.begin and pieces[-1][3] + pieces[-1][2] == addr:
            pieces[-1][2] += n
        else:
            pieces.append([t.file, t.begin, n, addr])
        last_block = block
    args = (device, sources, [tuple(p) for p in pieces], _buffers.current_stream(device), progress)
    if pieces:
        tensors = _buffers.tensors_while(lambda: _native.read(*args, stats=False), [memory])[0]
    else:
        tensors = memory.tensors()
    return {t.name: x for t, x in zip(wanted, tensors)}


@without_cycle_collection
def load_file(
    filename: Union[PathLike, Sequence[PathLike]],
    device: Any = "cpu",
    framework: str = "pt",
    progress: Progress = False,
) -> Dict[str, Any]:
    """Loads every tensor of a safetensors file, or of a list of shards, as
    `safetensors.torch.load_file` does, straight into `device` ('cpu' or
    'host', 'cuda', 'cuda:N', an index, or 'auto': the first GPU, else host
    memory). Tensors are allocated by torch and ready
    on the current CUDA stream on return; on a GPU, tensors under 1 GiB
    share blocks of up to 1 GiB (disjoint views of one allocation, freed
    when all of them are). `framework="np"` gives numpy arrays instead (host
    memory only; torch need not be installed), as
    `safetensors.numpy.load_file` does. A name may be an object in an
    S3-compatible store, `s3://bucket/key`, or stand for several:
    `s3://bucket/dir/` (every .safetensors object there) or
    `s3://bucket/dir/*.safetensors`; the AWS_* settings say where and who
    (see the README)."""
    paths = [os.fspath(filename)] if isinstance(filename, (str, os.PathLike)) else [os.fspath(p) for p in filename]
    if any(_native.is_object(p) for p in paths):
        paths = _native.expand_names(paths)
    device = _buffers.device_name(device)
    _, tensors = _headers(paths)
    return _load(list(paths), tensors.values(), device, framework, progress)


def _stamp(path: str) -> Tuple[Any, ...]:
    if _native.is_object(path):
        return _native.object_stamp(path)
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class safe_open:
    """Opens a safetensors file to read what is asked, as
    `safetensors.safe_open` does: `keys()`, `metadata()`,
    `get_tensor(name)`, `get_slice(name)[rows, ...]`. Usable as a context
    manager. `framework="pt"` gives torch tensors, `framework="np"` numpy
    arrays (host memory only). A tensor over 16 MiB is read alone, only the
    rows asked. Once reads of smaller ones go forward through the file or
    through its names, the small tensors that come next are read with
    them, whole, in windows of up to 128 MiB (two held while the file is
    open: the one in use, and the next, read meanwhile), and reads of those
    are copies out of them. `filename` may be an
    object, `s3://bucket/key`: then each read fetches only the bytes asked
    (ranged requests)."""

    def __init__(self, filename: PathLike, framework: str = "pt", device: Any = "cpu"):
        if framework in ("torch", "pytorch"):
            framework = "pt"
        if framework in ("numpy",):
            framework = "np"
        self._path = os.fspath(filename)
        self._framework = framework
        self._device = _buffers.device_name(device)
        self._metadata, self._tensors = _headers([self._path])
        self._stamp = _stamp(self._path)
        # Opened (and mapped) once for all the reads to come.
        self._sources = _native.Sources([self._path])
        self._read_ahead = _ReadAhead(self._tensors.values()) if not _native.is_object(self._path) else None

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        # The file's descriptors and mapping go now, not when the object
        # does; a read after this opens the file again.
        self._sources = None
        if self._read_ahead is not None:
            self._read_ahead.close()
        return None

    def _opened(self) -> Any:
        if self._sources is None:
            self._sources = _native.Sources([self._path])
        return self._sources

    def keys(self) -> List[str]:
        return sorted(self._tensors)

    def offset_keys(self) -> List[str]:
        """Names in the order their bytes lie in the file."""
        return [t.name for t in sorted(self._tensors.values(), key=lambda t: t.begin)]

    def metadata(self) -> Optional[Dict[str, str]]:
        return self._metadata

    def _info(self, name: str) -> _Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in {self._path}") from None

    def _check_unchanged(self) -> None:
        if _stamp(self._path) != self._stamp:
            raise RuntimeError(f"{self._path} changed since it was opened: open it again")

    def get_tensor(self, name: str) -> Any:
        """Reads this one tensor."""
        info = self._info(name)
        part, shared = self._read(info, info.begin, info.end, info.shape)
        return _own(part) if shared else part

    def _read(self, info: _Tensor, begin: int, end: int, shape: List[int]) -> Tuple[Any, bool]:
        """The bytes [begin, end) of `info` as a tensor of its dtype and
        `shape`, and whether it is a view of the read-ahead window (which
        the caller copies before giving it out)."""
        self._check_unchanged()
        if self._read_ahead is not None:
            window = self._read_ahead.window_for(info, self._opened(), self._device, self._framework)
            if window is not None:
                return _typed(window, info, begin, end, shape, self._framework)
        rows = _Tensor(0, info.name, info.dtype, shape, begin, end)
        return _load(self._opened(), [rows], self._device, self._framework, False)[info.name], False

    def get_slice(self, name: str) -> "TensorSlice":
        """A handle that reads only the rows an index asks for."""
        return TensorSlice(self, self._info(name))


class TensorSlice:
    """`get_slice(name)`: its shape and dtype without reading, and indexing
    that reads just the rows (first dimension) the index selects, then
    applies the rest of the index in memory."""

    def __init__(self, file: safe_open, info: _Tensor):
        self._file, self._info = file, info

    def get_shape(self) -> List[int]:
        return list(self._info.shape)

    def get_dtype(self) -> str:
        return self._info.dtype

    def __getitem__(self, index: Any) -> Any:
        shape = self._info.shape
        if not shape:
            return self._file.get_tensor(self._info.name)[index]
        first, rest = _first_index(index, len(shape))
        if isinstance(first, int):
            row = first + shape[0] if first < 0 else first
            if not 0 <= row < shape[0]:
                raise IndexError(f"index {first} is out of range for {shape[0]} rows")
            start, stop, step = row, row + 1, 1
        else:
            start, stop, step = first.indices(shape[0])
        if step < 0:
            raise ValueError("negative slice steps are not supported")
        stop = max(start, stop)
        row_bytes = (self._info.end - self._info.begin) // shape[0] if shape[0] else 0
        part, shared = self._file._read(
            self._info,
            self._info.begin + start * row_bytes,
            self._info.begin + stop * row_bytes,
            [stop - start] + list(shape[1:]),
        )
        if step == 1 and not isinstance(first, int) and all(isinstance(r, slice) and r == slice(None) for r in rest):
            return _own(part) if shared else part  # just the rows: no view to make
        # The rows read, then the rest of the index on the dimensions after.
        # A part of them comes back as a fresh copy, as safetensors returns
        # it, so the bytes read but not kept are freed.
        picked = part[(0 if isinstance(first, int) else slice(None, None, step),) + rest]
        size = getattr(picked, "size", None)
        smaller = (picked.numel() < part.numel()) if hasattr(picked, "numel") else (size is not None and size < part.size)
        return _own(picked) if shared or smaller else picked


# A read of a small tensor through `safe_open` costs its call (about half
# a millisecond for 1 MiB into a GPU on the H200 machine) more than its
# bytes, and a program reading them in order reads the ones after too (a
# tensor-parallel rank takes its part of every tensor). So once two reads
# go forward in the file's order or the names' (keys()), the small tensors
# that come next in that order are read with the second, whole, in one
# engine call: a window of READ_AHEAD_FIRST bytes, twice as many each time
# up to READ_AHEAD_MOST, and the window after it is read on a thread while
# this one is used. Reads of what a window holds are copies out of it.
# Reads that jump about get no window. A tensor over
# READ_AHEAD_TENSOR_BYTES is read alone, only the rows asked, and windows
# pass over it; objects in a store are never read ahead.
READ_AHEAD_TENSOR_BYTES = 16 << 20
READ_AHEAD_FIRST = 16 << 20
READ_AHEAD_MOST = 128 << 20
# How far ahead in an order the next read may land and still count as
# going forward (a program may skip a few tensors of each layer).
READ_AHEAD_STRIDE = 4


class _Window(NamedTuple):
    at: Dict[str, int]  # where each tensor's bytes start in `raw`
    stream: Optional[int]
    raw: Any  # uint8 tensor or array
    order: int  # which of _ReadAhead.orders it follows
    after: int  # the place in that order after its last tensor

    def holds(self, name: str, stream: Optional[int]) -> bool:
        # Only on the stream it was read on: torch may hand its memory out
        # again once it is dropped, ordered after that stream only.
        return name in self.at and self.stream == stream


class _WindowRead:
    """A window's tensors, whole, one after another in one buffer, read in
    one engine call on a thread of its own (the call lets go of the GIL).
    The buffer is allocated here, on the caller's thread and stream."""

    def __init__(self, sources: Any, tensors: List[_Tensor], device: str, framework: str,
                 stream: Optional[int], order: int, after: int):
        at: Dict[str, int] = {}
        total = 0
        for t in tensors:
            at[t.name] = total
            total += t.end - t.begin
        raw = _buffers.empty(framework, "U8", [total], device)
        base = _buffers.address(raw)
        pieces: List[List[int]] = []
        for t in tensors:
            n, addr = t.end - t.begin, base + at[t.name]
            # Neighbours in the file are one piece.
            if pieces and pieces[-1][1] + pieces[-1][2] == t.begin and pieces[-1][3] + pieces[-1][2] == addr:
                pieces[-1][2] += n
            elif n:
                pieces.append([0, t.begin, n, addr])
        self.window = _Window(at, stream, raw, order, after)
        self._failed: List[BaseException] = []
        self._thread = threading.Thread(target=self._read, args=(device, sources, [tuple(p) for p in pieces], stream),
                                        name="zerohop-read-ahead", daemon=True)
        self._thread.start()

    def _read(self, device: str, sources: Any, pieces: List[Tuple[int, ...]], stream: Optional[int]) -> None:
        try:
            if pieces:
                _native.read(device, sources, pieces, stream, False, stats=False)
        except BaseException as e:  # raised by wait()
            self._failed.append(e)

    def wait(self) -> _Window:
        self._thread.join()
        if self._failed:
            raise self._failed[0]
        return self.window


class _ReadAhead:
    """One file's read-ahead: the window in use, the one being read after
    it, and the reads that decide the next."""

    def __init__(self, tensors: Iterable[_Tensor]):
        tensors = list(tensors)
        self.orders = (sorted(tensors, key=lambda t: t.begin), sorted(tensors, key=lambda t: t.name))
        self.places = [{t.name: i for i, t in enumerate(order)} for order in self.orders]
        self.window: Optional[_Window] = None
        self.next: Optional[_WindowRead] = None
        self.last: Optional[str] = None
        self.windows = 0

    def window_for(self, info: _Tensor, sources: Any, device: str, framework: str) -> Optional[_Window]:
        """The window that holds `info`, read now if reads go forward;
        None when `info` is read alone."""
        stream = _buffers.current_stream(device)
        last, self.last = self.last, info.name
        if info.end - info.begin > READ_AHEAD_TENSOR_BYTES:
            return None  # and the windows stay: small tensors may follow
        if self.window is not None and self.window.holds(info.name, stream):
            return self.window
        self.window = None  # freed before the next is allocated
        if self.next is not None and self.next.window.holds(info.name, stream):
            taken, self.next = self.next, None
            self.window = taken.wait()
        else:
            self.close()
            forward = [k for k, place in enumerate(self.places)
                       if last is not None and 0 < place[info.name] - place[last] <= READ_AHEAD_STRIDE]
            if not forward:
                return None
            k = forward[0]
            first = self._read(k, self.places[k][info.name], sources, device, framework, stream)
            assert first is not None  # `info` itself is small
            self.window = first.wait()
        self.next = self._read(self.window.order, self.window.after, sources, device, framework, stream)
        return self.window

    def _read(self, k: int, i: int, sources: Any, device: str, framework: str,
              stream: Optional[int]) -> Optional[_WindowRead]:
        """Starts reading the window of order `k` from place `i` on: the
        small tensors there (large ones are skipped: they are read alone),
        up to the next budget. None when none are left."""
        order = self.orders[k]
        picked: List[_Tensor] = []
        budget = min(READ_AHEAD_MOST, READ_AHEAD_FIRST << min(self.windows, 8))
        total = 0
        while i < len(order):
            n = order[i].end - order[i].begin
            if n <= READ_AHEAD_TENSOR_BYTES:
                if picked and total + n > budget:
                    break
                picked.append(order[i])
                total += n
            i += 1
        if not picked:
            return None
        self.windows += 1
        return _WindowRead(sources, picked, device, framework, stream, k, i)

    def close(self) -> None:
        """Lets the windows go, once a read under way is over."""
        self.window = None
        if self.next is not None:
            self.next._thread.join()
            self.next = None


def _typed(window: _Window, info: _Tensor, begin: int, end: int, shape: List[int], framework: str) -> Tuple[Any, bool]:
    """Bytes [begin, end) of `info` out of `window`, as its dtype and
    `shape`: a view of the window, or a copy where torch cannot view the
    bytes as the dtype in place (a start not a multiple of its size)."""
    at = window.at[info.name] + begin - info.begin
    part = window.raw[at:at + end - begin]
    if framework == "np":
        return part.view(_buffers.numpy_dtype(info.dtype)).reshape(shape), True
    typed = _buffers.torch_dtype(info.dtype)
    shared = at % typed.itemsize == 0
    if not shared:
        part = part.clone()
    return part.view(typed).view(_buffers.storage_shape(info.dtype, shape)), shared


def _own(x: Any) -> Any:
    """A copy of a view, in memory of its own."""
    return x.clone() if hasattr(x, "clone") else x.copy()


def _first_index(index: Any, ndim: int) -> Tuple[Any, Tuple[Any, ...]]:
    """Splits an index into its first-dimension part (an int or a slice)
    and the rest, expanding an Ellipsis as numpy does."""
    parts = index if isinstance(index, tuple) else (index,)
    ellipses = [i for i, p in enumerate(parts) if p is Ellipsis]
    if len(ellipses) > 1:
        raise IndexError("an index can only have a single ellipsis")
    if ellipses:
        at = ellipses[0]
        fill = ndim - (len(parts) - 1)
        if fill < 0:
            raise IndexError(f"too many indices for a {ndim}-dimensional tensor")
        parts = parts[:at] + (slice(None),) * fill + parts[at + 1:]
    if len(parts) > ndim:
        raise IndexError(f"too many indices for a {ndim}-dimensional tensor")
    first = parts[0] if parts else slice(None)
    if isinstance(first, bool) or first is None:
        raise TypeError("get_slice indexes with ints, slices and Ellipsis")
    if not isinstance(first, slice):
        try:
            first = operator.index(first)
        except TypeError:
            raise TypeError("get_slice indexes with ints, slices and Ellipsis") from None
    return first, tuple(parts[1:])


@without_cycle_collection
def save_file(
    tensors: Dict[str, Any],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    progress: Progress = False,
) -> None:
    """Saves tensors (torch, numpy, or any contiguous buffer) as one
    safetensors file, as `safetensors.torch.save_file` (or
    `safetensors.numpy.save_file`) does; the file is written under a
    temporary name, made durable and renamed into place before this
    returns. Tensors on other devices than the one holding most bytes are
    copied to it first.

    Refused as safetensors refuses them, with its exception types: a value
    that is not a tensor or a sparse tensor (ValueError), tensors that share
    memory (RuntimeError naming them), a meta tensor (RuntimeError). The
    header is padded to 4 KiB, so the data can be written with O_DIRECT:
    the file's bytes differ from safetensors' (each reads the other's)."""
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError("metadata must map str to str")
    buffers, device = _buffers.on_one_device(_savable(tensors))
    specs = [(name, b.dtype, list(b.shape), b.addr, b.nbytes) for name, b in buffers.items()]
    _native.save_safetensors(
        device, os.fspath(filename), specs, metadata, _buffers.current_stream(device), progress
    )


def _savable(tensors: Any) -> Dict[str, "_buffers.Buffer"]:
    """Each tensor's memory, after the checks (and exception types and
    messages) of `safetensors.torch.save_file`, which user code relies on."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    torch = _buffers._torch_if_loaded()
    sparse = [
        name for name, t in tensors.items()
        if torch is not None and isinstance(t, torch.Tensor) and t.layout != torch.strided
    ]
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support."
            " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
            " make a much larger file than needed."
        )
    buffers = {}
    for name, t in tensors.items():
        try:
            buffers[name] = _buffers.describe(t, writable=False)
        except _buffers.NotMemoryError:
            # Only a value of the wrong type: any other error is about a
            # real tensor and keeps its own message.
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(t)}") from None
    shared = _buffers.sharing_memory(buffers)
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, which a safetensors file would store twice and load back as"
            f" separate tensors: {shared}. Save one tensor of each group, or clone the others."
        )
    return buffers
