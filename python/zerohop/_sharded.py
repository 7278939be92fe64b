"""Sharded checkpoints: `zerohop.checkpoint.save/load/restore_into(...,
group=)`, every rank of a torch.distributed process group at once.

A sharded checkpoint is a directory of ordinary zerohop checkpoints, each
written by one rank in parallel, and a commit file written last:

    DIR/rank-00000-of-00002/   rank 0's tensors and DTensor shards
    DIR/rank-00001-of-00002/   rank 1's
    DIR/replicated/            replicated DTensors, written once (by rank 0)
    DIR/SHARDS.json            the commit: world size, the DTensors' layout

Rank 0 writes SHARDS.json (durably, by rename) only after every rank
reported its part durable, so a save that any rank did not finish (killed,
out of space) never commits: `load` refuses the directory and
`checkpoint.latest` passes it by. Every collective is one
`all_gather_object` on the group, so a rank that dies makes the others'
next collective fail (gloo, NCCL) or time out (the group's own timeout),
never wait forever.

DTensors on a one-dimensional mesh, sharded on dim 0 (`Shard(0)`) or
replicated, load at any world size: each rank reads the old ranks' parts
that overlap its new rows (whole: a part is read and checksummed as
saved) and keeps its rows. Everything else loads at the world size it was
saved at.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from . import _buffers, _flat, _native
from ._durable import write_durably
from ._flat import DTENSOR_PREFIX

COMMIT = "SHARDS.json"
FORMAT = "zerohop-sharded-checkpoint/1"
REPLICATED_DIR = "replicated"
# The largest commit file `load` reads.
MAX_COMMIT_BYTES = 64 << 20


def is_sharded(dir: Any) -> bool:
    return os.path.isfile(os.path.join(os.fspath(dir), COMMIT))


def rank_dir(dir: str, rank: int, world: int) -> str:
    return os.path.join(dir, f"rank-{rank:05}-of-{world:05}")


def parts(dir: Any) -> List[str]:
    """The ordinary checkpoints a committed sharded one is made of."""
    dir = os.fspath(dir)
    commit = _read_commit(dir)
    out = [rank_dir(dir, r, commit["world_size"]) for r in range(commit["world_size"])]
    if commit["replicated"]:
        out.append(os.path.join(dir, REPLICATED_DIR))
    return out


def _placement(name: str, value: Any) -> str:
    """'shard0' or 'replicate': the layouts a sharded checkpoint keeps."""
    from torch.distributed.tensor import Replicate, Shard

    placements = tuple(value.placements)
    if value.device_mesh.ndim == 1 and len(placements) == 1:
        (p,) = placements
        if isinstance(p, Replicate):
            return "replicate"
        if isinstance(p, Shard) and p.dim == 0:
            return "shard0"
    raise ValueError(
        f"{name}: a DTensor placed {placements} on a {value.device_mesh.ndim}-dimensional mesh: "
        "sharded checkpoints keep Shard(0) or Replicate() on a one-dimensional mesh"
    )


def save(state: Any, dir: Any, group: Any, progress: Any) -> Dict[str, Any]:
    from .distributed import _agree, _Group

    world = _Group(group)
    dir = os.fspath(dir)
    layout: Dict[str, Any] = {}
    result: Dict[str, Any] = {}
    failure: Optional[BaseException] = None
    try:
        flat = _flat._Flattener()
        skeleton = flat.encode(state, [])
        replicated = _flat._Flattener()
        for name, value in flat.dtensors.items():
            place = _placement(name, value)
            layout[name] = {
                "placement": place,
                "shape": list(value.shape),
                "dtype": _buffers.dtype_name(value.dtype),
                "rows": value.to_local().shape[0] if value.dim() else 0,
            }
            if place == "shard0":
                flat.buffers[name] = _buffers.describe(value.to_local(), writable=False)
            elif world.rank == 0:
                replicated.buffers[name] = _buffers.describe(value.to_local(), writable=False)
        if world.rank == 0:
            os.mkdir(dir)  # refuses an existing directory, before anyone writes
    except Exception as e:  # raised on every rank by the agreement below
        failure = e
    every = _gather(world, failure, layout)
    try:
        commit = _commit_of(every, world.size)
        result = _flat._save_flat(flat, skeleton, rank_dir(dir, world.rank, world.size), None, progress)
        if replicated.buffers:
            nodes = [{"tensor": n, "device": b.device, "framework": "pt"} for n, b in sorted(replicated.buffers.items())]
            _flat._save_flat(replicated, {"list": nodes}, os.path.join(dir, REPLICATED_DIR), None, progress)
    except Exception as e:  # as above
        failure = e
    # Every rank's data is durable (or some rank failed) past this point.
    _agree(world, failure)
    if world.rank == 0:
        try:
            write_durably(os.path.join(dir, COMMIT), json.dumps(commit, indent=1).encode())
        except Exception as e:  # as above
            failure = e
    _agree(world, failure)
    return result


def _gather(world: Any, failure: Optional[BaseException], layout: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every rank's DTensor layout; raises on every rank if any failed."""
    from .distributed import _agree, _all_gather

    _agree(world, failure)
    return _all_gather(world, layout)


def _commit_of(every: List[Dict[str, Any]], world_size: int) -> Dict[str, Any]:
    """The commit file's contents from every rank's DTensor layout, which
    must name the same DTensors, placed alike, of the same global shape."""
    def kept(lay: Dict[str, Any]) -> Dict[str, Any]:
        return {n: (v["placement"], v["shape"], v["dtype"]) for n, v in lay.items()}

    first = every[0]
    for rank, layout in enumerate(every):
        if kept(layout) != kept(first):
            raise ValueError(f"rank {rank}'s DTensors differ from rank 0's (names, placements, shapes or dtypes)")
    dtensors = {
        name: {"placement": v["placement"], "shape": v["shape"], "dtype": v["dtype"], "rows": [lay[name]["rows"] for lay in every]}
        for name, v in first.items()
    }
    for name, v in dtensors.items():
        if v["placement"] == "shard0" and sum(v["rows"]) != (v["shape"][0] if v["shape"] else 0):
            raise ValueError(f"{name}: the ranks' shards hold {sum(v['rows'])} rows of {v['shape'][0]}")
    return {"format": FORMAT, "world_size": world_size, "dtensors": dtensors}


def _read_commit(dir: str) -> Dict[str, Any]:
    path = os.path.join(dir, COMMIT)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_COMMIT_BYTES + 1)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{dir} holds no committed sharded checkpoint (no {COMMIT}): a save that did not finish, "
            "or one saved without group="
        ) from None
    try:
        commit = json.loads(raw) if len(raw) <= MAX_COMMIT_BYTES else None
        ok = (
            isinstance(commit, dict) and commit.get("format") == FORMAT
            and isinstance(commit.get("world_size"), int) and commit["world_size"] >= 1
            and isinstance(commit.get("dtensors"), dict)
            and all(_layout_ok(v, commit["world_size"]) for v in commit["dtensors"].values())
        )
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{path} is not a zerohop sharded checkpoint's commit file")
    # Whether DIR/replicated/ is there: some DTensor is replicated.
    commit["replicated"] = any(v["placement"] == "replicate" for v in commit["dtensors"].values())
    return commit


def _layout_ok(v: Any, world_size: int) -> bool:
    return (
        isinstance(v, dict) and v.get("placement") in ("shard0", "replicate") and isinstance(v.get("dtype"), str)
        and isinstance(v.get("shape"), list) and all(isinstance(n, int) and n >= 0 for n in v["shape"])
        and isinstance(v.get("rows"), list) and len(v["rows"]) == world_size
        and all(isinstance(n, int) and n >= 0 for n in v["rows"])
    )


def load(dir: Any, device: Any, group: Any, progress: Any) -> Any:
    from .distributed import _agree, _Group

    world = _Group(group)
    dir = os.fspath(dir)
    state = None
    failure: Optional[BaseException] = None
    try:
        commit = _read_commit(dir)
        old = commit["world_size"]
        same = world.size == old
        skeleton, tensors = _flat._load_tensors(rank_dir(dir, world.rank if same else 0, old), device, progress)
        if not same:
            _refuse_plain_tensors(skeleton, old, world.size)
        dtensors = commit["dtensors"]
        replicated = {}
        if commit["replicated"]:
            _, replicated = _flat._load_tensors(os.path.join(dir, REPLICATED_DIR), device, progress)
        # The old ranks' parts this rank's new rows need, loaded once each.
        old_parts: Dict[int, Dict[str, Any]] = {world.rank: tensors} if same else {}
        place = _place(device, tensors, replicated)
        mesh = _mesh(world, place)
        for name, v in dtensors.items():
            if v["placement"] == "replicate":
                local = replicated[name]
            else:
                local = _rows(dir, name, v, world, old_parts, place, progress)
            tensors[DTENSOR_PREFIX + name] = _as_dtensor(local, mesh, v)
        state = tensors if skeleton is None else _flat._decode_state(dir, skeleton, tensors)
    except Exception as e:  # raised on every rank by the agreement below
        failure = e
    _agree(world, failure)
    return state


def _refuse_plain_tensors(node: Any, old: int, new: int) -> None:
    """At another world size only DTensors can be resharded."""
    if isinstance(node, dict) and "tensor" in node:
        raise ValueError(
            f"{node['tensor']} is a plain per-rank tensor, saved by {old} ranks: "
            f"it cannot be resharded to {new} (load at {old} ranks, or save it as a DTensor)"
        )
    for items in node.values() if isinstance(node, dict) else []:
        for item in items if isinstance(items, list) else []:
            for part in item if isinstance(item, list) else [item]:
                _refuse_plain_tensors(part, old, new)


def _rows(dir: str, name: str, v: Dict[str, Any], world: Any, old_parts: Dict[int, Dict[str, Any]], place: str, progress: Any) -> Any:
    """This rank's rows of a Shard(0) DTensor, cut from the old ranks'
    shards that hold them."""

    torch = _buffers._torch()
    shape = v["shape"]
    # The rows torch's Shard(0) gives each rank: torch.chunk's split.
    sizes = [c.shape[0] for c in torch.empty(shape, device="meta").chunk(world.size, dim=0)] if shape[0] else []
    sizes += [0] * (world.size - len(sizes))
    begin = sum(sizes[: world.rank])
    end = begin + sizes[world.rank]
    pieces = []
    at = 0
    for r, n in enumerate(v["rows"]):
        lo, hi = max(begin, at), min(end, at + n)
        if lo < hi:
            if r not in old_parts:
                _, old_parts[r] = _flat._load_tensors(rank_dir(dir, r, len(v["rows"])), place, progress)
            pieces.append(old_parts[r][name][lo - at : hi - at])
        at += n
    if len(pieces) == 1 and pieces[0].shape[0] == end - begin:
        return pieces[0]
    if pieces:
        return torch.cat(pieces)
    return _buffers.empty("pt", v["dtype"], [0] + shape[1:], place)  # more ranks than rows


def _place(device: Any, *loaded: Dict[str, Any]) -> str:
    """Where the DTensors go: `device`, else where the loaded tensors went
    (each where it was saved from)."""
    if device is not None:
        return _buffers.device_name(device)
    for tensors in loaded:
        for t in tensors.values():
            return str(t.device)
    return "cpu"


def _mesh(world: Any, place: str) -> Any:
    """A one-dimensional device mesh over the group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(world.handle or dist.group.WORLD, place.split(":")[0])


def _as_dtensor(local: Any, mesh: Any, v: Dict[str, Any]) -> Any:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    torch = _buffers._torch()
    placement = Shard(0) if v["placement"] == "shard0" else Replicate()
    shape = torch.Size(v["shape"])
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local.contiguous(), mesh, [placement], run_check=False, shape=shape, stride=stride)


def restore_into(state: Any, dir: Any, group: Any, progress: Any) -> None:
    """In place, at the world size the checkpoint was saved at."""
    from .distributed import _agree, _Group

    world = _Group(group)
    dir = os.fspath(dir)
    failure: Optional[BaseException] = None
    try:
        commit = _read_commit(dir)
        if commit["world_size"] != world.size:
            raise ValueError(
                f"{dir} was saved by {commit['world_size']} ranks; restore_into needs as many "
                f"(this group has {world.size}): load() reshards DTensors"
            )
        flat = _flat._Flattener(writable=True)
        mine = flat.encode(state, [])
        replicated = _flat._Flattener(writable=True)
        for name, value in flat.dtensors.items():
            v = commit["dtensors"].get(name)
            if v is None or v["placement"] != _placement(name, value) or v["shape"] != list(value.shape):
                raise ValueError(f"{name}: the DTensor differs from the checkpoint's (placement or shape)")
            target = flat if v["placement"] == "shard0" else replicated
            target.buffers[name] = _buffers.describe(value.to_local(), writable=True)
        _flat._restore_flat(flat, mine, rank_dir(dir, world.rank, world.size), progress)
        if replicated.buffers:
            _flat._restore(_native.checkpoint_open(os.path.join(dir, REPLICATED_DIR)), replicated.buffers, progress)
    except Exception as e:  # raised on every rank by the agreement below
        failure = e
    _agree(world, failure)

