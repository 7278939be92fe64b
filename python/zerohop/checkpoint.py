"""Checkpoints of nested training state (a model's and an optimizer's
`state_dict()`, or any dict/list/tuple of tensors and plain values):
tensors go to checksummed data files, plain values and the structure to the
manifest, and both come back identical.

A checkpoint is a directory, or `s3://bucket/[prefix/]NAME` in an object
store (configured as AWS tools are: see the README). A save is atomic and
durable: the checkpoint appears whole or not at all. With `parent=` (a
sibling), chunks unchanged since that checkpoint are referenced, not
rewritten."""

from __future__ import annotations

import os
from typing import Any, Dict, List, NamedTuple, Optional

from . import _native, _sharded
from ._calls import without_cycle_collection
from ._flat import PathLike, Progress, _decode_state, _Flattener, _load_tensors, _restore_flat, _save_flat


@without_cycle_collection
def save(
    state: Any,
    dir: PathLike,
    parent: Optional[PathLike] = None,
    progress: Progress = False,
    group: Any = None,
) -> Dict[str, Any]:
    """Saves `state` as a new checkpoint directory `dir` (which must not
    exist). Returns what the save did: seconds until durable, bytes written
    (fewer than the total when `parent` let chunks be referenced), the
    engine's transfer stats, and `phases`: the seconds before the data
    moved (layout), waiting for the device's checksums after it, and
    committing the manifest.

    With `group` (a torch.distributed process group, e.g.
    `torch.distributed.group.WORLD`), every rank of it calls `save` with
    its own state and the same `dir`: each writes its own tensors and the
    local shards of its DTensors, in parallel, and the checkpoint is
    committed once every rank's data is durable (see `zerohop._sharded`);
    each rank gets what its own part's save did."""
    if group is not None:
        _refuse_object_store(dir)
        return _sharded.save(state, dir, group, progress)
    flat = _Flattener()
    skeleton = flat.encode(state, [])
    if flat.dtensors:
        raise TypeError(f"{next(iter(flat.dtensors))} is a DTensor: save it with group= (every rank saving its shards)")
    return _save_flat(flat, skeleton, dir, parent, progress)


@without_cycle_collection
def load(
    dir: PathLike,
    device: Any = None,
    progress: Progress = False,
    group: Any = None,
) -> Any:
    """Loads a checkpoint into new tensors, allocated by torch (numpy
    arrays for arrays saved from numpy, and for everything when torch is
    not installed), with the structure it was saved with.
    `device=None` puts each tensor where it was saved from; a device puts
    them all there. On a GPU, tensors under 1 GiB share blocks of up to
    1 GiB, as `load_file`'s do (disjoint views of one allocation, freed
    when all of them are). Every chunk's checksum is checked on the way.

    A checkpoint saved with `group=` is loaded with `group=` too, by every
    rank: each gets its own state back, its DTensors as DTensors; at
    another world size, DTensors sharded on dim 0 or replicated are
    resharded (and nothing else may be in the state)."""
    if group is not None:
        _refuse_object_store(dir)
        return _sharded.load(dir, device, group, progress)
    _refuse_sharded(dir)
    skeleton, tensors = _load_tensors(dir, device, progress)
    if skeleton is None:  # saved by the CLI or the Rust API: entries by name
        return tensors
    return _decode_state(dir, skeleton, tensors)


def _refuse_object_store(dir: PathLike) -> None:
    if _native.is_object(os.fspath(dir)):
        raise ValueError(f"{os.fspath(dir)}: sharded checkpoints (group=) are written to a shared directory, not yet to an object store")


def _refuse_sharded(dir: PathLike) -> None:
    if _sharded.is_sharded(dir):
        raise ValueError(f"{os.fspath(dir)} is a sharded checkpoint: every rank loads it with group=")


@without_cycle_collection
def restore_into(state: Any, dir: PathLike, progress: Progress = False, group: Any = None) -> None:
    """Restores a checkpoint in place into the tensors of `state` (a live
    model's and optimizer's state, say), which must have the structure,
    shapes and dtypes it was saved with. Plain values in `state` are not
    changed. Every chunk's checksum is checked; on any mismatch nothing is
    reported restored and the error names the first bad chunk. A checkpoint
    saved with `group=` is restored with `group=`, at the same world size."""
    if group is not None:
        _refuse_object_store(dir)
        return _sharded.restore_into(state, dir, group, progress)
    _refuse_sharded(dir)
    flat = _Flattener(writable=True)
    mine = flat.encode(state, [])
    if flat.dtensors:
        raise TypeError(f"{next(iter(flat.dtensors))} is a DTensor: restore it with group=")
    _restore_flat(flat, mine, dir, progress)


class Verified(NamedTuple):
    """What `verify` checked: every chunk's checksum matched."""

    chunks: int
    bytes: int


def verify(dir: PathLike, progress: Progress = False) -> Verified:
    """Checks every checksum of a checkpoint on disk (no GPU needed), every
    rank's of a sharded one. Returns the chunks and bytes checked
    (`.chunks`, `.bytes`), or raises IntegrityError naming the first bad
    chunk."""
    parts = _sharded.parts(dir) if _sharded.is_sharded(dir) else [os.fspath(dir)]
    chunks = nbytes = 0
    for part in parts:
        c, n = _native.checkpoint_verify(part, progress)
        chunks, nbytes = chunks + c, nbytes + n
    return Verified(chunks=chunks, bytes=nbytes)


class Listed(NamedTuple):
    """A committed checkpoint, as `ls` lists it."""

    name: str
    parent: Optional[str]
    entries: int
    bytes: int


def ls(where: PathLike) -> List[Listed]:
    """The committed checkpoints in `where` (a directory, or
    `s3://bucket/[prefix/]`), sorted by name. Saves that never committed
    are not listed."""
    return [Listed(*row) for row in _native.checkpoint_list(os.fspath(where))]


def remove(at: PathLike) -> None:
    """Deletes the checkpoint `at`; refused (FileExistsError) while another
    checkpoint still needs its chunks."""
    _native.checkpoint_remove(os.fspath(at))


def latest(root: PathLike) -> Optional[str]:
    """The most recently committed checkpoint directly under the local
    directory `root` (a single-process or sharded one; the path), or None.
    A save that never committed (a rank killed meanwhile, say) is not one."""
    if _native.is_object(os.fspath(root)):
        raise ValueError(f"{os.fspath(root)}: latest() reads local directories; list an object store with ls()")
    found = []
    for entry in os.scandir(root):
        for marker in (_sharded.COMMIT, "manifest.json"):
            try:
                found.append((os.stat(os.path.join(entry.path, marker)).st_mtime_ns, entry.path))
                break
            except (FileNotFoundError, NotADirectoryError):
                continue
    return max(found)[1] if found else None
