"""Tensors of safetensors files: where each lies in its file, and reads of
them into memory their framework allocates."""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from . import _buffers, _native

Progress = Any  # False/None, True (a line on stderr), or a callable(done, total)


class _Tensor:
    """A tensor's place in its file (or a run of its rows: `begin`, `end`
    and `shape` then say which)."""

    __slots__ = ("file", "name", "dtype", "shape", "begin", "end", "_kind")

    def __init__(self, file: int, name: str, dtype: str, shape: List[int], begin: int, end: int):
        self.file, self.name, self.dtype, self.shape = file, name, dtype, shape
        self.begin, self.end = begin, end
        self._kind: Optional[str] = None

    @property
    def kind(self) -> str:
        """The name with its numbers left out: the same weight of every
        layer (`layers.#.mlp.up.weight`) is one kind."""
        if self._kind is None:
            self._kind = re.sub(r"\d+", "#", self.name)
        return self._kind

    def rows(self, start: int, stop: int) -> "_Tensor":
        """Rows [start, stop) of the first dimension (of a tensor with one)."""
        row_bytes = (self.end - self.begin) // self.shape[0] if self.shape and self.shape[0] else 0
        return _Tensor(self.file, self.name, self.dtype, [stop - start] + list(self.shape[1:]),
                       self.begin + start * row_bytes, self.begin + stop * row_bytes)


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


def _placed(wanted: List[_Tensor], device: str, framework: str) -> Tuple[_buffers.Allocation, List[Tuple[int, ...]]]:
    """Memory for the wanted tensors, allocated through their framework (in
    GPU memory, small ones share blocks: see `_buffers.allocate`), and the
    engine's pieces (file, offset, bytes, address) that fill it."""
    memory = _buffers.allocate(framework, [(t.dtype, t.shape, t.end - t.begin) for t in wanted], device)
    pieces = _native.pieces_of([(t.file, t.begin, t.end - t.begin, addr, block)
                                for t, addr, block in zip(wanted, memory.addresses, memory.blocks)])
    return memory, pieces


def _load(
    sources: Any,
    wanted: Iterable[_Tensor],
    device: str,
    framework: str,
    progress: Progress,
) -> Dict[str, Any]:
    """The wanted tensors, filled in one engine call from `sources` (paths,
    or a `_native.Sources`); their views are made while it runs."""
    wanted = list(wanted)
    memory, pieces = _placed(wanted, device, framework)
    return dict(zip((t.name for t in wanted), _filled(sources, memory, pieces, device, progress)))


def _load_files(paths: List[str], device: str, framework: str, progress: Progress) -> Dict[str, Any]:
    """Every tensor of safetensors files, as `_load` reads them. Where they
    share blocks of GPU memory, the layout is planned natively and the
    transfer starts before a Python object is made per tensor."""
    if not _buffers.shares_blocks(framework, device):
        _, tensors = _headers(paths)
        return _load(paths, tensors.values(), device, framework, progress)
    layout = _native.safetensors_layout(paths, _buffers.BLOCK_BYTES)
    memory, pieces = _buffers.allocate_layout(layout, device)
    return dict(zip(layout.names(), _filled(paths, memory, pieces, device, progress)))


def _filled(sources: Any, memory: _buffers.Allocation, pieces: List[Tuple[int, ...]], device: str,
            progress: Progress) -> List[Any]:
    """`memory`'s tensors, once the engine has filled it with `pieces`."""
    if not pieces:
        return memory.tensors()
    args = (device, sources, pieces, _buffers.current_stream(device), progress)
    return _buffers.tensors_while(lambda: _native.read(*args, stats=False, regions=memory.regions), [memory])[0]
