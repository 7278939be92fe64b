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
    pieces: List[List[int]] = []
    last_block = None
    for t, addr, block in zip(wanted, memory.addresses, memory.blocks):
        n = t.end - t.begin
        # Tensors of one block that follow each other in the file and in
        # memory are one piece for the engine (a copy never spans two
        # allocations).
        if pieces and block is not None and block == last_block and pieces[-1][0] == t.file \
                and pieces[-1][1] + pieces[-1][2] == t.begin and pieces[-1][3] + pieces[-1][2] == addr:
            pieces[-1][2] += n
        elif n:
            pieces.append([t.file, t.begin, n, addr])
        last_block = block
    return memory, [tuple(p) for p in pieces]


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
    args = (device, sources, pieces, _buffers.current_stream(device), progress)
    if pieces:
        tensors = _buffers.tensors_while(lambda: _native.read(*args, stats=False, regions=memory.regions), [memory])[0]
    else:
        tensors = memory.tensors()
    return {t.name: x for t, x in zip(wanted, tensors)}
