"""`torch.distributed.checkpoint` storage through zerohop's engine:

    dcp.save(state_dict, storage_writer=zerohop.dcp.StorageWriter(dir))
    dcp.load(state_dict, storage_reader=zerohop.dcp.StorageReader(dir))

DCP plans what each rank saves and loads (sharded tensors, DTensors,
resharding to another world size); these classes move the bytes. Each rank
writes its items as one safetensors file (`__RANK_0.safetensors`, through
the engine's bounded staging, written durably under a temporary name and
renamed); the coordinator then commits the checkpoint by writing DCP's
`.metadata` under a temporary name, syncing it and renaming it into place,
so a save that dies before that leaves no `.metadata` and no checkpoint.
Loads read each stored chunk straight into the tensor DCP asks to fill
when the chunk is that whole tensor, else into a temporary on the same
device that is narrowed and copied.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader as _Reader
from torch.distributed.checkpoint.storage import StorageWriter as _Writer
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _buffers, _native
from ._durable import write_durably
from ._file_tensors import _headers
from ._safetensors import PathLike, save_file

__all__ = ["StorageReader", "StorageWriter"]

METADATA = ".metadata"


class Stored(NamedTuple):
    """Where an item's bytes are: a file of the checkpoint (relative),
    their offset and length in it, and what they hold."""

    file: str
    offset: int
    length: int
    dtype: Optional[str]  # safetensors name; None for a byte stream
    shape: Tuple[int, ...]
    # XXH3-64 of the bytes, as zerohop's checkpoint manifests write it
    # (hashed on the GPU for GPU tensors); checked by every load.
    xxh3: Optional[str] = None


class StorageWriter(_Writer):
    """Writes a DCP checkpoint into directory `path` (created if missing)."""

    def __init__(self, path: PathLike):
        super().__init__()
        self.path = os.fspath(path)
        self.is_coordinator = False

    def reset(self, checkpoint_id: Union[str, "os.PathLike[str]", None] = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, "os.PathLike[str]"]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        # Overwriting a committed checkpoint's files would leave its
        # metadata naming bytes half replaced if the save died midway.
        if os.path.exists(os.path.join(self.path, METADATA)):
            raise FileExistsError(f"{self.path} holds a committed checkpoint already: save into a new directory")
        os.makedirs(self.path, exist_ok=True)

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.path)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        # Each rank's file name, by its place among the plans.
        return [dataclasses.replace(plan, storage_data=f"__{i}_0.safetensors") for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        file = plan.storage_data
        tensors: Dict[str, Any] = {}
        byte_items = set()
        for n, item in enumerate(plan.items):
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                byte_items.add(str(n))
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                data = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            tensors[str(n)] = data.detach().contiguous()
        tensors = _unshared(tensors)
        sums = _checksums(tensors)
        save_file(tensors, os.path.join(self.path, file))
        _, infos = _headers([os.path.join(self.path, file)])
        results = []
        for n, item in enumerate(plan.items):
            t = infos[str(n)]
            dtype = None if str(n) in byte_items else t.dtype
            stored = Stored(file, t.begin, t.end - t.begin, dtype, tuple(t.shape), sums[str(n)])
            results.append(WriteResult(index=item.index, size_in_bytes=t.end - t.begin, storage_data=stored))
        done: Future = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        # Called on the coordinator once every rank's data is durable.
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        metadata.storage_meta = self.storage_meta()
        write_durably(os.path.join(self.path, METADATA), pickle.dumps(metadata))


class StorageReader(_Reader):
    """Reads a DCP checkpoint written by `StorageWriter` from `path`."""

    def __init__(self, path: PathLike):
        super().__init__()
        self.path = os.fspath(path)
        self.storage_data: Dict[MetadataIndex, Stored] = {}

    def reset(self, checkpoint_id: Union[str, "os.PathLike[str]", None] = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, "os.PathLike[str]"]) -> bool:
        return os.path.isfile(os.path.join(os.fspath(checkpoint_id), METADATA))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = os.path.join(self.path, METADATA)
        try:
            with open(path, "rb") as f:
                metadata = pickle.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} holds no committed checkpoint (no {METADATA})") from None
        if not isinstance(metadata, Metadata):
            raise ValueError(f"{path} is not a DCP checkpoint's metadata")
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        files = sorted({self.storage_data[item.storage_index].file for item in plan.items})
        index = {f: i for i, f in enumerate(files)}
        paths = [os.path.join(self.path, f) for f in files]
        direct: Dict[str, List[Tuple[int, int, int, int]]] = {}  # by device
        later: List[Tuple[ReadItem, Any, Any]] = []  # (item, whole stored chunk, target)
        byte_items: List[Tuple[ReadItem, Any]] = []
        for item in plan.items:
            stored = self.storage_data[item.storage_index]
            if item.type == LoadItemType.BYTE_IO:
                buf = torch.empty(stored.length, dtype=torch.uint8)
                _add(direct, "cpu", index[stored.file], stored, buf)
                byte_items.append((item, buf))
                continue
            target = planner.resolve_tensor(item).detach()
            device = _buffers.device_name(target.device) if target.device.type == "cuda" else "cpu"
            whole = list(item.storage_offsets) == [0] * len(stored.shape) and tuple(item.lengths) == stored.shape
            if whole and target.is_contiguous() and _buffers.dtype_name(target.dtype) == stored.dtype and stored.length:
                _add(direct, device, index[stored.file], stored, target)
                later.append((item, None, target))
            else:
                chunk = _buffers.empty("pt", stored.dtype, stored.shape, device)
                if stored.length:
                    _add(direct, device, index[stored.file], stored, chunk)
                later.append((item, chunk, target))
        for device, pieces in direct.items():
            _native.read(device, paths, pieces, _buffers.current_stream(device), False, stats=False)
        read = byte_items + [(item, target if chunk is None else chunk) for item, chunk, target in later]
        _check(self.path, [(self.storage_data[item.storage_index], item.storage_index.fqn, buf) for item, buf in read])
        for item, buf in byte_items:
            planner.load_bytes(item, io.BytesIO(buf.numpy().tobytes()))
        for item, chunk, target in later:
            if chunk is not None:
                part = chunk
                for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                    part = part.narrow(dim, start, length)
                target.copy_(part)
            planner.commit_tensor(item, target)
        done: Future = Future()
        done.set_result(None)
        return done


def _checksums(tensors: Dict[str, Any]) -> Dict[str, str]:
    """Each (contiguous) tensor's checksum, hashed where it lies."""
    by_device: Dict[str, List[Tuple[str, _buffers.Buffer]]] = {}
    for name, t in tensors.items():
        b = _buffers.describe(t, writable=False, typed=False)
        by_device.setdefault(b.device, []).append((name, b))
    sums: Dict[str, str] = {}
    for device, buffers in by_device.items():
        hashed = _native.checksums(device, [(b.addr, b.nbytes) for _, b in buffers], _buffers.current_stream(device))
        sums.update((name, h) for (name, _), h in zip(buffers, hashed))
    return sums


def _check(path: str, read: List[Tuple[Stored, str, Any]]) -> None:
    """Raises IntegrityError for the first item whose bytes, as read into
    its buffer, do not match the checksum saved with them."""
    checked = [(stored, fqn, buf) for stored, fqn, buf in read if stored.xxh3 is not None]
    sums = _checksums({str(i): buf for i, (_, _, buf) in enumerate(checked)})
    for i, (stored, fqn, _) in enumerate(checked):
        if sums[str(i)] != stored.xxh3:
            raise _native.IntegrityError(
                f"{os.path.join(path, stored.file)}: {fqn!r} ({stored.length} bytes at offset {stored.offset}) "
                f"does not match its checksum (xxh3 {sums[str(i)]}, saved {stored.xxh3})"
            )


def _add(direct: Dict[str, List[Tuple[int, int, int, int]]], device: str, file: int, stored: Stored, into: Any) -> None:
    direct.setdefault(device, []).append((file, stored.offset, stored.length, into.data_ptr()))


def _unshared(tensors: Dict[str, Any]) -> Dict[str, Any]:
    """Items that are views of one memory (DCP may hand out several) are
    cloned, as a safetensors file stores each tensor apart."""
    buffers = {n: _buffers.describe(t, writable=False, typed=False) for n, t in tensors.items()}
    for group in _buffers.sharing_memory(buffers):
        for name in group[1:]:
            tensors[name] = tensors[name].clone()
    return tensors
