"""The flat form of a checkpoint's state, shared by whole and sharded
checkpoints: nested state (dicts, lists, tuples, tensors, plain values)
split into named tensors and a structure that names them, saved as one
checkpoint directory and restored from one."""

from __future__ import annotations

import base64
import functools
import json
import os
import sys
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _buffers, _native

PathLike = Union[str, "os.PathLike[str]"]
Progress = Any

# How the checkpoint's loader keys DTensors among the entries it loaded.
DTENSOR_PREFIX = "\0dtensor:"


def is_dtensor(value: Any) -> bool:
    torch = _buffers._torch_if_loaded()
    if torch is None or not isinstance(value, torch.Tensor):
        return False
    # A DTensor exists only once its module is imported: asked before that,
    # the answer is no, without importing it (about 1 s on a first save).
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, getattr(module, "DTensor", ()))


# The manifest metadata key holding the structure.
STATE_KEY = "zerohop.state"


class _Flattener:
    """Walks a state, collecting its tensors (each storage range once, so
    tied weights stay tied) and encoding everything else as JSON."""

    def __init__(self, writable: bool = False) -> None:
        self.writable = writable
        self.buffers: Dict[str, _buffers.Buffer] = {}
        self.frameworks: Dict[str, str] = {}
        # DTensors, by entry name: saved by a sharded save (`group=`) only.
        self.dtensors: Dict[str, Any] = {}
        self._seen: Dict[Tuple[int, int, str, str, Tuple[int, ...]], str] = {}
        # The types of the common case, asked first: `()` matches nothing.
        # Neither module is imported by a walk, so neither changes during one.
        torch = _buffers._torch_if_loaded()
        self._tensor_type: Any = torch.Tensor if torch is not None else ()
        self._dtensor_type: Any = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", ())

    def encode(self, value: Any, path: List[str]) -> Any:
        if isinstance(value, self._tensor_type) and not isinstance(value, self._dtensor_type):
            return self._tensor(value, path, "pt")
        np = _buffers.np
        if np is not None and isinstance(value, np.generic) and not isinstance(value, np.ndarray):
            value = value.item()  # numpy scalars come back as Python ones
        if value is None:
            return {"none": None}
        if isinstance(value, bool):
            return {"bool": value}
        if isinstance(value, int):
            return {"int": str(int(value))}  # int() also for IntEnum members
        if isinstance(value, float):
            return {"float": float(value).hex()}
        if isinstance(value, str):
            return {"str": value}
        if isinstance(value, bytes):
            return {"bytes": base64.b64encode(value).decode()}
        if isinstance(value, dict):
            kind = "ordered_dict" if isinstance(value, OrderedDict) else "dict"
            return {kind: [[self._key(k, path), self.encode(v, path + [str(k)])] for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            items = [self.encode(v, path + [str(i)]) for i, v in enumerate(value)]
            return {"list" if isinstance(value, list) else "tuple": items}
        if is_dtensor(value):
            name = ".".join(path) or "tensor"
            self.dtensors[name] = value
            return {"dtensor": name, "device": _buffers.describe(value.to_local(), writable=False).device}
        if _is_tensor(value):
            return self._tensor(value, path, "np" if _is_numpy(value) else "pt")
        raise TypeError(f"{'.'.join(path) or 'state'}: cannot checkpoint a {type(value).__name__}")

    def _key(self, key: Any, path: List[str]) -> Any:
        # Keys are strings but for rare states: answered before the walk
        # through every kind (a state dict of thousands of tensors).
        if type(key) is str:
            return {"str": key}
        return self.encode(key, path + ["key"])

    def _tensor(self, value: Any, path: List[str], framework: str) -> Dict[str, Any]:
        b = _buffers.describe(value, writable=self.writable)
        key = (b.addr, b.nbytes, b.device, b.dtype, b.shape)
        name = self._seen.get(key) if b.nbytes else None
        if name is None:
            name = ".".join(path) or "tensor"
            while name in self.buffers:
                name += "#"
            self.buffers[name] = b
            self.frameworks[name] = framework
            self._seen[key] = name
        else:
            framework = self.frameworks[name]
        return {"tensor": name, "device": b.device, "framework": framework}


def _is_numpy(value: Any) -> bool:
    np = _buffers.np
    return np is not None and isinstance(value, np.ndarray)


def _is_tensor(value: Any) -> bool:
    torch = _buffers._torch_if_loaded()
    return _is_numpy(value) or (torch is not None and isinstance(value, torch.Tensor))



def _save_flat(flat: _Flattener, skeleton: Any, dir: PathLike, parent: Optional[PathLike], progress: Progress) -> Dict[str, Any]:
    """Saves the tensors `flat` collected, with `skeleton` as the structure."""
    _refuse_partial_overlaps(flat.buffers)
    buffers, device = _buffers.on_one_device(flat.buffers)  # alive through the save
    entries = [(name, b.dtype, list(b.shape), b.addr, b.nbytes) for name, b in buffers.items()]
    # The skeleton is a tree `encode` just made: no cycle to look for.
    metadata = {STATE_KEY: json.dumps(skeleton, separators=(",", ":"), check_circular=False)}
    stats, seconds, written, phases = _native.checkpoint_save(
        device,
        os.fspath(dir),
        entries,
        os.fspath(parent) if parent is not None else None,
        metadata,
        _buffers.current_stream(device),
        progress,
    )
    return {"seconds": seconds, "written_bytes": written, "stats": json.loads(stats), "phases": json.loads(phases)}


def _refuse_partial_overlaps(buffers: Dict[str, "_buffers.Buffer"]) -> None:
    """Tensors reachable twice are stored once; different views of one
    memory (`w` and `w[:2]`) cannot be, and would not come back as views."""
    shared = _buffers.sharing_memory(buffers)
    if shared:
        raise ValueError(f"{' and '.join(shared[0])} share memory (views of one tensor): save one, or clone the others")


def _open(dir: PathLike) -> Tuple[Any, Dict[str, Tuple[Optional[str], Optional[List[int]], int]]]:
    """The checkpoint at `dir` with its manifest read once, and its entries
    by name."""
    opened = _native.checkpoint_open(os.fspath(dir))
    return opened, {name: (dtype, shape, nbytes) for name, dtype, shape, nbytes in opened.entries()}


def _structure(opened: Any) -> Any:
    """The saved state's structure, or None (saved by the CLI or the Rust
    API: entries by name)."""
    metadata = opened.metadata()
    return json.loads(metadata[STATE_KEY]) if STATE_KEY in metadata else None


def _decode_state(dir: PathLike, skeleton: Any, tensors: Dict[str, Any]) -> Any:
    try:
        return _decode(skeleton, tensors)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"{os.fspath(dir)}: the saved state structure is malformed ({e!r})") from None


def _load_tensors(dir: PathLike, device: Any, progress: Progress) -> Tuple[Any, Dict[str, Any]]:
    """A checkpoint's structure and all its tensors, by entry name."""
    opened, entries = _open(dir)
    target = _buffers.device_name(device) if device is not None else None
    # Read once, when first needed: into a GPU every tensor is torch's, so
    # the structure, which says where each was saved from and as what, is
    # read while the data moves (thousands of tensors' take milliseconds).
    skeleton = functools.cache(lambda: _structure(opened))

    devices: Dict[str, str] = {}
    frameworks: Dict[str, str] = {}
    if target is None or not target.startswith("cuda"):
        _tensor_places(skeleton(), devices, frameworks)
    # The entries by where they go, allocated together: on a GPU, small
    # ones share blocks, as a load_file's tensors do (one allocation each
    # is a torch call, and often a driver one, per tensor). In the order
    # their bytes lie in the data files: neighbours there are neighbours in
    # a block, and one device copy fills them.
    groups: Dict[Tuple[str, str], List[str]] = {}
    for name in opened.file_order():
        framework = frameworks.get(name, "pt" if _buffers._torch() is not None else "np")
        place = target or devices.get(name, "cpu")
        if framework == "np" and place.startswith("cuda"):
            framework = "pt"
        if framework == "np" and place == "sim":
            place = "cpu"
        groups.setdefault((framework, place), []).append(name)
    allocated = []
    for (framework, place), names in groups.items():
        specs = []
        for name in names:
            dtype, shape, nbytes = entries[name]
            specs.append((dtype or "U8", shape if shape is not None else [nbytes], nbytes))
        allocated.append((names, place, _buffers.allocate(framework, specs, place)))
    # The simulated device's tensors are host memory: restored as such.
    devices_used = {place if place.startswith("cuda") else "cpu" for _, place, _ in allocated}
    memories = [memory for _, _, memory in allocated]
    if len(devices_used) == 1:
        # One engine call, the tensors' views made while it fills them.
        device = devices_used.pop()
        targets = [(name, addr, entries[name][2]) for names, _, memory in allocated
                   for name, addr in zip(names, memory.addresses)]
        regions = [r for memory in memories for r in memory.regions]
        made = _buffers.tensors_while(lambda: opened.restore(
            device, targets, _buffers.current_stream(device), progress, regions), memories, meanwhile=skeleton)
    else:
        made = [memory.tensors() for memory in memories]
    by_name = {name: t for (names, _, _), ts in zip(allocated, made) for name, t in zip(names, ts)}
    tensors = {name: by_name[name] for name in entries}
    if len(devices_used) > 1:
        _restore(opened, {n: _buffers.describe(t, writable=True) for n, t in tensors.items()}, progress)
    return skeleton(), tensors


def _tensor_places(node: Any, devices: Dict[str, str], frameworks: Dict[str, str]) -> None:
    if not isinstance(node, dict):
        return
    if "tensor" in node:
        devices[node["tensor"]] = node["device"]
        frameworks[node["tensor"]] = node["framework"]
        return
    if "dtensor" in node:  # its local shard, in a sharded checkpoint's part
        devices[node["dtensor"]] = node["device"]
        frameworks[node["dtensor"]] = "pt"
        return
    for items in node.values():
        if isinstance(items, list):
            for item in items:
                for part in item if isinstance(item, list) else [item]:
                    _tensor_places(part, devices, frameworks)


def _decode(node: Any, tensors: Dict[str, Any]) -> Any:
    if not isinstance(node, dict) or len(node) < 1:
        raise ValueError("the checkpoint's state structure is malformed")
    if "tensor" in node:
        return tensors[node["tensor"]]
    if "dtensor" in node:
        return tensors[DTENSOR_PREFIX + node["dtensor"]]
    (kind, value), = node.items()
    if kind == "none":
        return None
    if kind == "bool":
        return bool(value)
    if kind == "int":
        return int(value)
    if kind == "float":
        return float.fromhex(value)
    if kind == "str":
        return str(value)
    if kind == "bytes":
        return base64.b64decode(value)
    if kind == "list":
        return [_decode(v, tensors) for v in value]
    if kind == "tuple":
        return tuple(_decode(v, tensors) for v in value)
    if kind == "dict":
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value}
    if kind == "ordered_dict":
        return OrderedDict((_decode(k, tensors), _decode(v, tensors)) for k, v in value)
    raise ValueError(f"the checkpoint's state structure has an unknown node {kind!r}")



def _restore_flat(flat: _Flattener, mine: Any, dir: PathLike, progress: Progress) -> None:
    """Restores `dir` into the tensors `flat` collected from a state whose
    structure is `mine`."""
    opened, entries = _open(dir)
    skeleton = _structure(opened)
    if skeleton is None:
        raise ValueError(f"{os.fspath(dir)} holds no saved structure: use load()")
    if _shape_of(mine) != _shape_of(skeleton):
        raise ValueError("the state's structure differs from the checkpoint's")
    for name, b in flat.buffers.items():
        dtype, shape, _ = entries[name]
        if (dtype, shape) != (b.dtype, list(b.shape)):
            raise ValueError(
                f"{name}: the checkpoint holds {dtype} {shape}, the state {b.dtype} {list(b.shape)}"
            )
    _restore(opened, flat.buffers, progress)


def _shape_of(node: Any) -> Any:
    """The structure with tensors reduced to their entry names and plain
    values dropped: what must match for an in-place restore."""
    if isinstance(node, dict) and "tensor" in node:
        return node["tensor"]
    if isinstance(node, dict) and "dtensor" in node:
        return ["dtensor", node["dtensor"]]
    if isinstance(node, dict):
        (kind, value), = node.items()
        if kind in ("list", "tuple"):
            return [kind, [_shape_of(v) for v in value]]
        if kind in ("dict", "ordered_dict"):
            # By key, not by order: an optimizer's state may fill in another
            # order than the saved one had.
            items = sorted(value, key=lambda kv: json.dumps(kv[0], sort_keys=True))
            return ["dict", [[json.dumps(k, sort_keys=True), _shape_of(v)] for k, v in items]]
    return None


def _restore(opened: Any, buffers: Dict[str, "_buffers.Buffer"], progress: Progress) -> None:
    """Restores the checkpoint `opened` (`_native.checkpoint_open`) into
    `buffers` on the device holding most bytes; the others go through a
    temporary there and are copied back."""
    staged, device = _buffers.on_one_device(buffers)
    targets = [(n, b.addr, b.nbytes) for n, b in staged.items()]
    opened.restore(device, targets, _buffers.current_stream(device), progress)
    for name, b in staged.items():
        if b is not buffers[name]:
            _buffers.as_torch(buffers[name]).copy_(b.owner)
