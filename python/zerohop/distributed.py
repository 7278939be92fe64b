"""Loading into the GPUs of a distributed job, through its own process group
(`torch.distributed`: NCCL between GPUs, or gloo on host memory).

Each rank gets the tensors, or the slices of tensors, that a plan gives
it, and reads from storage only those bytes. Tensors that every rank needs
whole ("replicated") are read once: the ranks read disjoint shares of them
and an all-gather completes every rank's copy, so the job reads one model
from storage, not one per GPU. Without a process group (or in a group of
one) this loads as `zerohop.load_file` does.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import os
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _buffers, _native
from ._file_tensors import Progress, _headers, _Tensor
from ._safetensors import PathLike

__all__ = ["REPLICATED", "Split", "load_file"]

REPLICATED = "replicated"


class Split(NamedTuple):
    """Rank r of the group gets part `r % parts` of the tensor along `dim`,
    the parts as `torch.tensor_split` makes them (sizes differ by at most
    one). `parts=None` is the group's size."""

    dim: int = 0
    parts: Optional[int] = None


# What a plan gives a tensor: REPLICATED, a Split, or None (not loaded on
# this rank).
Spec = Union[str, Split, None]
Plan = Union[None, Mapping[str, Spec], Callable[[str, List[int], str], Spec]]

# A slice along a dimension after the first is read as one piece per outer
# index when that moves fewer bytes than reading the covering range and
# narrowing it on the device; each piece counts as this many bytes more
# (a piece is a copy of its own through staging).
PIECE_COST_BYTES = 64 << 10
# Shares of replicated blocks start at multiples of this.
_SHARE_ALIGN = 512


class _Group:
    """The process group a load runs in: rank, size and the group handle
    (None: the default group, or no group at all when size is 1)."""

    def __init__(self, group: Any):
        self.handle = group
        self.rank, self.size = 0, 1
        try:
            import torch.distributed as dist
        except ImportError:
            if group is not None:
                raise
            return
        if dist.is_available() and dist.is_initialized():
            self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        elif group is not None:
            raise RuntimeError("a group was given but torch.distributed is not initialized")


def load_file(
    filename: Union[PathLike, Sequence[PathLike]],
    device: Any = "cuda",
    plan: Plan = None,
    group: Any = None,
    progress: Progress = False,
) -> Dict[str, Any]:
    """Loads this rank's part of a safetensors file or shards into `device`.

    `plan` says what each tensor is on this rank: a mapping from names or
    shell-style patterns (`fnmatch`; the first that matches wins) to
    `REPLICATED`, a `Split(dim, parts)`, or None (not loaded here), or a
    callable `plan(name, shape, dtype)` returning one of those. Tensors no
    entry names are replicated. Every rank of `group` (default: the whole
    job) must call this with the same files and give the same tensors as
    replicated; the replicated ones are checked to agree.

    Returns a dict of torch tensors on `device`: whole tensors for
    replicated ones, this rank's slice for split ones. `progress` counts
    the bytes this rank reads from storage."""
    paths = [os.fspath(filename)] if isinstance(filename, (str, os.PathLike)) else [os.fspath(p) for p in filename]
    device = _buffers.device_name(device)
    torch = _buffers._torch()
    if torch is None:
        raise ImportError("zerohop.distributed needs torch")
    world = _Group(group)
    # A rank that fails alone would leave the others waiting in a
    # collective until its timeout: each step that can fail (headers, the
    # plan, allocation; then the read) ends in one small all-gather that
    # raises on every rank if any failed.
    failure = None
    replicated: List[_Tensor] = []
    try:
        _, tensors = _headers(paths)
        own: List[Tuple[_Tensor, Split]] = []
        for t in tensors.values():
            spec = _spec_of(plan, t)
            if spec == REPLICATED:
                replicated.append(t)
            elif isinstance(spec, Split):
                own.append((t, spec))
            elif spec is not None:
                raise TypeError(f"the plan gave {t.name!r} {spec!r}: expected REPLICATED, a Split or None")
        replicated.sort(key=lambda t: (t.file, t.begin))
        pieces: List[Tuple[int, int, int, int]] = []
        made = {t.name: _plan_slice(t, split, world, device, pieces) for t, split in own}
        blocks = _plan_shares(replicated, world, device, pieces)
    except Exception as e:
        failure = e
    _agree(world, failure, _digest(replicated))
    try:
        if pieces:
            _native.read(device, paths, pieces, _buffers.current_stream(device), progress, stats=False)
    except Exception as e:
        failure = e
    _agree(world, failure)
    if world.size > 1:
        import torch.distributed as dist

        for b in blocks:
            dist.all_gather_into_tensor(b.memory, b.memory[b.share], group=world.handle)
    whole = _replicated_tensors(replicated, blocks, device)
    return {name: whole[name] if name in whole else made[name]() for name in tensors if name in whole or name in made}


def _spec_of(plan: Plan, t: _Tensor) -> Spec:
    if plan is None:
        return REPLICATED
    if callable(plan):
        return plan(t.name, list(t.shape), t.dtype)
    for pattern, spec in plan.items():
        if pattern == t.name or fnmatch.fnmatchcase(t.name, pattern):
            return spec
    return REPLICATED


def _digest(replicated: List[_Tensor]) -> str:
    """What the ranks must agree on: the replicated tensors, which they
    share out (different ones would mix different tensors' bytes)."""
    digest = hashlib.sha256()
    for t in replicated:
        digest.update(f"{t.name}\0{t.dtype}\0{t.shape}\0{t.end - t.begin}\n".encode())
    return f"{len(replicated)} tensors, {digest.hexdigest()[:16]}"


def _agree(world: _Group, failure: Optional[BaseException], digest: Optional[str] = None) -> None:
    """Raises on every rank if any rank failed (its own error there, a
    RuntimeError naming it elsewhere), or if the ranks' digests differ."""
    if world.size > 1:
        mine = (None if failure is None else f"{type(failure).__name__}: {failure}", digest)
        every = _all_gather(world, mine)
        failed = [r for r, (error, _) in enumerate(every) if error]
        if failure is None and failed:
            raise RuntimeError(f"rank {failed[0]} of the group failed: {every[failed[0]][0]}")
        if failure is None and len({d for _, d in every}) > 1:
            raise ValueError(
                "the ranks disagree on which tensors are replicated "
                f"(by rank: {[d for _, d in every]}): give every rank the same files and plan"
            )
    if failure is not None:
        raise failure


def _all_gather(world: _Group, mine: Any) -> List[Any]:
    """Every rank's `mine`, in rank order."""
    if world.size == 1:
        return [mine]
    import torch.distributed as dist

    every: List[Any] = [None] * world.size
    try:
        dist.all_gather_object(every, mine, group=world.handle)
    except RuntimeError as e:  # the backend's error, or its timeout
        raise RuntimeError(f"the ranks could not compare results (did a rank die or hang?): {e}") from e
    return every


def _element_bytes(t: _Tensor) -> int:
    numel = math.prod(t.shape)
    size = t.end - t.begin
    if numel == 0:
        return _buffers.torch_dtype(t.dtype).itemsize
    if size % numel:
        raise ValueError(f"{t.name!r} is {t.dtype}, whose elements are not whole bytes: it cannot be split")
    return size // numel


def _part_bounds(n: int, parts: int, part: int) -> Tuple[int, int]:
    """Start and length of `part` of `n`, as torch.tensor_split cuts."""
    q, rem = divmod(n, parts)
    return part * q + min(part, rem), q + (1 if part < rem else 0)


def _plan_slice(t: _Tensor, split: Split, world: _Group, device: str, pieces: List[Tuple[int, int, int, int]]) -> Callable[[], Any]:
    """Adds the reads of this rank's slice of `t` to `pieces`; returns what
    makes the tensor once they are done."""
    torch = _buffers._torch()
    ndim = len(t.shape)
    if not isinstance(split.dim, int) or not -ndim <= split.dim < ndim:
        raise ValueError(f"{t.name!r} has {ndim} dimensions: it cannot be split along dimension {split.dim}")
    dim = split.dim % ndim
    parts = world.size if split.parts is None else split.parts
    if not isinstance(parts, int) or parts < 1:
        raise ValueError(f"a Split needs a positive number of parts, not {parts!r}")
    start, length = _part_bounds(t.shape[dim], parts, world.rank % parts)
    dtype = _buffers.torch_dtype(t.dtype)
    shape = list(t.shape)
    shape[dim] = length
    inner = math.prod(t.shape[dim + 1:]) * _element_bytes(t)
    outer = math.prod(t.shape[:dim])
    row, seg = t.shape[dim] * inner, length * inner
    out = torch.empty(shape, dtype=dtype, device=device)
    if seg == 0 or outer == 0:
        return lambda: out
    cover = (outer - 1) * row + seg
    if outer == 1 or outer * (seg + PIECE_COST_BYTES) <= cover:
        base = out.data_ptr()
        for i in range(outer):
            pieces.append((t.file, t.begin + i * row + start * inner, seg, base + i * seg))
        return lambda: out
    # The covering range into a whole-tensor buffer (the bytes around it
    # stay unread), then the slice copied out on the device.
    whole = torch.empty(t.end - t.begin, dtype=torch.uint8, device=device)
    pieces.append((t.file, t.begin + start * inner, cover, whole.data_ptr() + start * inner))

    def narrow() -> Any:
        out.copy_(whole.view(dtype).view(t.shape).narrow(dim, start, length))
        return out

    return narrow


class _Block(NamedTuple):
    """Memory of replicated tensors shared out among the ranks: its
    members (index, offset) by dtype, and this rank's share of it."""

    memory: Any
    members: Dict[str, List[Tuple[int, int]]]
    share: slice


def _plan_shares(
    replicated: List[_Tensor], world: _Group, device: str, pieces: List[Tuple[int, int, int, int]]
) -> List[_Block]:
    """Packs the replicated tensors into blocks, as `load_file` packs GPU
    tensors (a large one has a block of its own), and adds the reads of
    this rank's share of each block to `pieces`."""
    torch = _buffers._torch()
    sizes = [t.end - t.begin for t in replicated]
    places = _buffers.plan_blocks(sizes, _buffers.BLOCK_BYTES)
    grouped: Dict[Any, List[int]] = {}
    for i, place in enumerate(places):
        if sizes[i]:  # empty tensors are made apart, with nothing to read
            grouped.setdefault(("block", place[0]) if place else ("alone", i), []).append(i)
    blocks = []
    for members in grouped.values():
        offsets = {i: (places[i][1] if places[i] else 0) for i in members}
        length = max(offsets[i] + sizes[i] for i in members)
        share = -(-length // (world.size * _SHARE_ALIGN)) * _SHARE_ALIGN
        memory = torch.empty(share * world.size, dtype=torch.uint8, device=device)
        lo, hi = world.rank * share, min((world.rank + 1) * share, length)
        for i in members:
            begin, end = max(lo, offsets[i]), min(hi, offsets[i] + sizes[i])
            if begin < end:
                t = replicated[i]
                pieces.append((t.file, t.begin + begin - offsets[i], end - begin, memory.data_ptr() + begin))
        by_dtype: Dict[str, List[Tuple[int, int]]] = {}
        for i in members:
            by_dtype.setdefault(replicated[i].dtype, []).append((i, offsets[i]))
        blocks.append(_Block(memory, by_dtype, slice(world.rank * share, (world.rank + 1) * share)))
    return blocks


def _replicated_tensors(replicated: List[_Tensor], blocks: List[_Block], device: str) -> Dict[str, Any]:
    """The replicated tensors: views of their blocks, and the empty ones."""
    specs = [(t.dtype, t.shape, t.end - t.begin) for t in replicated]
    made: List[Any] = [None] * len(replicated)
    for b in blocks:
        for name, members in b.members.items():
            _buffers.views_of(b.memory, name, members, specs, made)
    for i, t in enumerate(replicated):
        if made[i] is None:
            made[i] = _buffers.empty("pt", t.dtype, t.shape, device)
    return {t.name: x for t, x in zip(replicated, made)}
