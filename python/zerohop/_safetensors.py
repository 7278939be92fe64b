"""safetensors files, as `safetensors.torch` (and `safetensors.numpy`) read
and write them, through the zerohop engine."""

from __future__ import annotations

import operator
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _buffers, _native
from ._calls import without_cycle_collection
from ._file_tensors import Progress, _headers, _load, _load_files, _Tensor
from ._read_ahead import _own, _ReadAhead

PathLike = Union[str, "os.PathLike[str]"]


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
    return _load_files(list(paths), _buffers.device_name(device), framework, progress)


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
    arrays (host memory only). A read of more than 1 GiB is read alone,
    only the rows asked. Once reads go forward through the file or
    through its names, or the first read takes its first tensor, the
    tensors that come next are read with them, in
    windows (three held while the file is open: the one in use,
    and the next two, read meanwhile): of each, the rows that the last read
    of its kind asked for (the same fraction of its rows; its kind is its
    name without the numbers). While the reads take every tensor of each
    window in turn, each one is its part of the window's memory, freed
    when all of them are (as `load_file`'s tensors share blocks), and
    windows grow to 1 GiB; else reads out of a window are copies, and
    windows hold at most 128 MiB.
    `filename` may be an object, `s3://bucket/key`: then each read fetches
    only the bytes asked (ranged requests)."""

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
        # does (the read-ahead's threads let go of them first); a read
        # after this opens the file again.
        if self._read_ahead is not None:
            self._read_ahead.close()
        if self._sources is not None:
            self._sources.wait_for_threads()
        self._sources = None
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
        return self._read(info, info)

    def _read(self, info: _Tensor, asked: _Tensor) -> Any:
        """`asked` (rows of `info`, or all of it) as a tensor of the
        caller's."""
        if self._read_ahead is not None:
            got = self._read_ahead.read(info, asked, self._opened, self._device, self._framework, self._check_unchanged)
            if got is not None:
                return got
        self._check_unchanged()
        return _load(self._opened(), [asked], self._device, self._framework, False)[info.name]

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
        part = self._file._read(self._info, self._info.rows(start, stop))
        if step == 1 and not isinstance(first, int) and all(isinstance(r, slice) and r == slice(None) for r in rest):
            return part  # just the rows: no view to make
        # The rows read, then the rest of the index on the dimensions after.
        # A part of them comes back as a fresh copy, as safetensors returns
        # it, so the bytes read but not kept are freed.
        picked = part[(0 if isinstance(first, int) else slice(None, None, step),) + rest]
        size = getattr(picked, "size", None)
        smaller = (picked.numel() < part.numel()) if hasattr(picked, "numel") else (size is not None and size < part.size)
        return _own(picked) if smaller else picked


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
