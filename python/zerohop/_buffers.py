"""Tensors and arrays as the engine sees them: an address, a length, and the
device (and CUDA stream) they belong to; and allocation of results through
the framework that will own them."""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import _native

try:  # Both frameworks are optional: numpy for host arrays, torch for tensors.
    import numpy as np
except ImportError:  # pragma: no cover - exercised only without numpy
    np = None  # type: ignore[assignment]


_torch_module: Any = None


def _torch():
    """torch, imported if it is not yet (None where it is not installed)."""
    global _torch_module
    if _torch_module is None:
        try:
            import torch
        except ImportError:
            return None
        _torch_module = torch
    return _torch_module


def _torch_if_loaded():
    """torch where something imported it already, else None: an object can
    be a torch tensor only then, and asking must not import torch (over a
    second) for a numpy user."""
    return _torch_module or sys.modules.get("torch")


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` says an allocation found no memory: numpy's
    MemoryError, or torch's OutOfMemoryError (a RuntimeError)."""
    torch = _torch_if_loaded()
    oom = torch is not None and getattr(torch.cuda, "OutOfMemoryError", None)
    return isinstance(error, MemoryError) or bool(oom and isinstance(error, oom))


# safetensors dtype names -> torch attribute names; absent ones (older
# torch) are skipped. F6_E2M3 and F6_E3M2 have no torch type: such tensors
# load only as raw bytes (zerohop.read_into).
_TORCH_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F4": "float4_e2m1fn_x2",
}

# numpy spells the types it has as torch does; it lacks bf16, fp8 and fp4.
_NUMPY_DTYPES = {
    name: attr
    for name, attr in _TORCH_DTYPES.items()
    if name != "BF16" and not name.startswith(("F8_", "F4"))
}

# Elements per torch element of the packed types: a safetensors header gives
# an F4 tensor's shape in F4 values, torch's float4_e2m1fn_x2 holds two to
# an element, so the last dimension differs by that factor.
_PACKED = {"F4": 2}


def header_shape(dtype: str, shape: Sequence[int]) -> Tuple[int, ...]:
    """The shape a safetensors header gives a tensor of `dtype` that torch
    or numpy holds with `shape`."""
    per = _PACKED.get(dtype, 1)
    if per == 1 or not shape:
        return tuple(shape)
    return tuple(shape[:-1]) + (shape[-1] * per,)


def storage_shape(dtype: str, shape: Sequence[int]) -> Tuple[int, ...]:
    """The shape torch gives a tensor whose header says `dtype` and
    `shape`: the inverse of `header_shape`."""
    per = _PACKED.get(dtype, 1)
    if per == 1:
        return tuple(shape)
    if not shape or shape[-1] % per:
        raise ValueError(
            f"a {dtype} tensor of shape {list(shape)} does not fill whole torch elements: "
            f"its last dimension must be a multiple of {per}"
        )
    return tuple(shape[:-1]) + (shape[-1] // per,)


def torch_dtype(name: str):
    torch = _torch()
    attr = _TORCH_DTYPES.get(name)
    if torch is None or attr is None or not hasattr(torch, attr):
        raise ValueError(f"dtype {name} has no torch equivalent here")
    return getattr(torch, attr)


def numpy_dtype(name: str):
    if np is None:
        raise ValueError("framework='np' needs numpy")
    if name not in _NUMPY_DTYPES:
        raise ValueError(f"numpy has no {name} dtype: load it with framework='pt'")
    return np.dtype(_NUMPY_DTYPES[name])


_names_of_torch_dtypes: Dict[Any, str] = {}


def dtype_name(dtype) -> str:
    """The safetensors name of a torch or numpy dtype."""
    torch = _torch_if_loaded()
    if torch is not None and isinstance(dtype, torch.dtype):
        if not _names_of_torch_dtypes:
            for name, attr in _TORCH_DTYPES.items():
                if hasattr(torch, attr):
                    _names_of_torch_dtypes.setdefault(getattr(torch, attr), name)
        if dtype in _names_of_torch_dtypes:
            return _names_of_torch_dtypes[dtype]
    elif np is not None:
        for name, attr in _NUMPY_DTYPES.items():
            if np.dtype(attr) == dtype:
                return name
    raise ValueError(f"dtype {dtype} cannot be stored in safetensors")


def device_name(device: Any) -> str:
    """Normalizes a device argument to 'cpu', 'cuda:N' or 'sim' (host memory
    moved through the simulated device: for tests without a GPU, in builds
    with the `sim` feature only, as scripts/test.sh makes). Takes the
    words of every zerohop interface ('auto', 'cuda', 'cuda:N', 'host' or
    'cpu', 'sim'), parsed natively, plus an int or a torch.device; as in
    torch, a bare 'cuda' is torch's current GPU."""
    name = f"cuda:{device}" if isinstance(device, int) else str(device)
    torch = _torch()
    if name != "cuda":
        name = _native.device_name(name)
    if not name.startswith("cuda") or torch is None:
        return "cuda:0" if name == "cuda" else name
    # torch would fail on its first use of a missing GPU with no hint.
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise RuntimeError(f"device {name!r}: no CUDA GPU is available here (torch sees none); "
                           "use device='cpu' for host memory, or 'auto' for a GPU where there is one")
    if name == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    if int(name.split(":")[1]) >= count:
        raise RuntimeError(f"device {name!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    return name


def current_stream(device: str) -> Optional[int]:
    """The CUDA stream torch queues work on for `device`: transfers wait for
    it first, and its later work sees what they moved."""
    torch = _torch()
    if not device.startswith("cuda") or torch is None:
        return None
    # The raw handle, as torch's own compiled code asks for it: the public
    # call makes a Stream object first (tens of microseconds, which a small
    # get_slice notices). Once torch has set CUDA up only: before, the
    # public call sets it up.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None and torch.cuda.is_initialized():
        return raw(int(device[len("cuda:"):]))
    return torch.cuda.current_stream(torch.device(device)).cuda_stream


class Buffer(NamedTuple):
    """One contiguous range of memory, kept alive by `owner`."""

    addr: int
    nbytes: int
    device: str  # 'cpu' or 'cuda:N'
    dtype: str  # safetensors name; 'U8' for untyped buffers
    shape: Tuple[int, ...]
    owner: Any


class NotMemoryError(TypeError):
    """`describe` was given an object of a type that holds no memory it
    can address; errors about a tensor or array of the right type are
    other exceptions, so callers can tell the two apart."""


# torch devices -> 'cpu' or 'cuda:N', as met: checkpoints describe
# thousands of tensors, and a device's `type` takes a call each time.
_device_names: Dict[Any, str] = {}


def _torch_device_name(on: Any) -> str:
    if on.type == "meta":
        # RuntimeError, as torch and safetensors raise for it.
        raise RuntimeError("Cannot copy out of meta tensor: it holds no data")
    if on.type not in ("cpu", "cuda"):
        raise ValueError(f"tensors on {on} are not supported")
    name = "cpu" if on.type == "cpu" else f"cuda:{on.index}"
    _device_names[on] = name
    return name


def _dtype_name_or_bytes(dtype: Any, typed: bool) -> str:
    """`dtype_name(dtype)`; with `typed=False`, 'U8' for a dtype that
    safetensors cannot name."""
    try:
        return dtype_name(dtype)
    except ValueError:
        if typed:
            raise
        return "U8"


def _describe_tensor(torch: Any, obj: Any, writable: bool, typed: bool) -> Buffer:
    """`describe` of a torch tensor, the common case (a checkpoint's
    thousands): asked first, with no closure made per call."""
    if obj.layout != torch.strided:
        raise ValueError(f"the tensor is {obj.layout}, not dense: call .to_dense() first")
    device = _device_names.get(obj.device) or _torch_device_name(obj.device)
    if not obj.is_contiguous():
        raise ValueError("the tensor is not contiguous: call .contiguous() first")
    if obj.is_conj() or obj.is_neg():
        # A lazy view: its memory does not hold the values it shows.
        if writable:
            raise ValueError("the tensor is a lazy conj/neg view: call resolve_conj()/resolve_neg() first")
        obj = obj.resolve_conj().resolve_neg()
    dtype = _names_of_torch_dtypes.get(obj.dtype) or _dtype_name_or_bytes(obj.dtype, typed)
    return Buffer(obj.data_ptr(), obj.nbytes, device, dtype, header_shape(dtype, tuple(obj.shape)), obj)


def describe(obj: Any, writable: bool, typed: bool = True) -> Buffer:
    """The memory of a torch tensor, a numpy array, any DLPack producer, or
    any object with the buffer protocol. It must be contiguous; `writable`
    also requires that it may be written. `typed=False` is for raw byte
    moves: a dtype safetensors cannot name is then just bytes ('U8')."""
    torch = _torch_if_loaded()
    if torch is not None and isinstance(obj, torch.Tensor):
        return _describe_tensor(torch, obj, writable, typed)
    if np is not None and isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ValueError("the array is not C-contiguous: use numpy.ascontiguousarray")
        if writable and not obj.flags.writeable:
            raise ValueError("the array is read-only")
        if obj.dtype.hasobject:
            raise ValueError("arrays of Python objects hold no plain bytes")
        return Buffer(
            obj.__array_interface__["data"][0],
            obj.nbytes,
            "cpu",
            _dtype_name_or_bytes(obj.dtype, typed),
            tuple(obj.shape),
            obj,
        )
    if hasattr(obj, "__dlpack__"):
        # The imported tensor keeps the producer alive and is what device
        # copies work on (torch, imported for it where need be, takes GPU
        # memory too).
        torch = _torch()
        if torch is not None:
            return describe(torch.from_dlpack(obj), writable, typed)
        if np is not None:
            return describe(np.from_dlpack(obj), writable, typed)
    try:
        view = memoryview(obj)
    except TypeError:
        raise NotMemoryError(
            f"{type(obj).__name__} is not a tensor, array, DLPack producer or buffer"
        ) from None
    if not view.c_contiguous:
        raise ValueError("the buffer is not contiguous")
    if view.readonly:
        if writable:
            raise ValueError("the buffer is read-only")
        if np is None:
            raise TypeError("read-only buffers need numpy to be addressed")
        return describe(np.frombuffer(view, dtype=np.uint8), False)
    flat = view.cast("B")
    addr = ctypes.addressof(ctypes.c_char.from_buffer(flat)) if flat.nbytes else 0
    return Buffer(addr, flat.nbytes, "cpu", "U8", (flat.nbytes,), flat)


def empty(framework: str, dtype: str, shape: Sequence[int], device: str):
    """A new tensor or array owned by its framework, for the engine to fill."""
    if framework == "pt":
        torch = _torch()
        if torch is None:
            raise ImportError("framework='pt' needs torch; use framework='np' for numpy arrays")
        if device == "sim":
            raise ValueError("device='sim' holds numpy arrays: use framework='np'")
        return torch.empty(storage_shape(dtype, shape), dtype=torch_dtype(dtype), device=device)
    if framework == "np":
        if device.startswith("cuda"):
            raise ValueError("numpy arrays live in host memory: use device='cpu'")
        return np.empty(tuple(shape), dtype=numpy_dtype(dtype))
    raise ValueError(f"unknown framework {framework!r}: expected 'pt' or 'np'")


# Tensors loaded into GPU memory share blocks of up to this many bytes (a
# larger one has its own): every allocation is on the load's critical path
# (in a fresh process, an 8 GiB model of 174 tensors spent 3.5 ms on 33
# blocks of 256 MiB and 1.6 ms on 9 of 1 GiB before its transfer could
# start, on the H200; one tensor each had cost ~10 ms), and a tensor freed
# alone keeps at most one block alive. The tensors of one dtype in a block
# are made by one split of it (each torch call costs microseconds, which
# add up over a model of thousands of small tensors).
BLOCK_BYTES = 1 << 30
# Block lengths are a multiple of this (the largest element size), so a
# block can be viewed as any dtype. Each tensor starts at a multiple of 512
# bytes in its block, as torch's allocator aligns (`_native.plan_blocks`).
_BLOCK_ROUND = 16


def plan_blocks(sizes: Sequence[int], block_bytes: int) -> List[Optional[Tuple[int, int]]]:
    """Where each of `sizes` (bytes) goes: (block number, offset), blocks
    filled in order, each start aligned, no block over `block_bytes`; None
    for a size of 0 or of at least `block_bytes`, and for a tensor asked
    for alone (allocated alone)."""
    return _native.plan_blocks(list(sizes), block_bytes)


def shares_blocks(framework: str, device: str) -> bool:
    """Whether `allocate` packs tensors into blocks: torch tensors in GPU
    memory (host memory is cheap to allocate tensor by tensor)."""
    return framework == "pt" and device.startswith("cuda") and _torch() is not None


class Allocation:
    """Memory for tensors, from `allocate`: each one's address and block
    (None: allocated alone) at once, the tensors themselves from
    `tensors()`. A load makes them while the engine already fills the
    memory: a model of thousands of small tensors spends tens of
    milliseconds on torch calls that make views (about 18 ms for 3,000 on
    the H200 machine). From `allocate_layout`, `addresses` and `blocks` are
    empty: its pieces come with it."""

    def __init__(self, addresses: List[int], blocks: List[Optional[int]], owners: List[Any], make: Any,
                 regions: Optional[List[Tuple[int, int]]] = None, count: Optional[int] = None):
        self.addresses = addresses
        self.blocks = blocks
        # The shared blocks, (address, bytes): the engine may fill the
        # tensors of one block with one copy where they follow each other.
        self.regions = regions or []
        # What owns the memory: it must outlive any transfer into it.
        self.owners = owners
        self._make = make
        # How many tensors `tensors()` makes.
        self.count = len(addresses) if count is None else count

    def tensors(self) -> List[Any]:
        return self._make()


# From this many tensors on, a load makes the tensors' views while the
# engine fills their memory (a thread costs about 0.1 ms; views about 5 µs
# each on the H200 machine).
OVERLAP_MIN = 64


def tensors_while(fill: Callable[[], Any], memories: Sequence[Allocation],
                  meanwhile: Callable[[], Any] = lambda: None) -> List[List[Any]]:
    """The tensors of each of `memories`, made while `fill()` fills their
    memory: on a thread of its own (a native call that lets go of the GIL)
    when there are `OVERLAP_MIN` tensors or more, else before making them.
    `meanwhile()` runs after them on the calling thread, while `fill` may
    still run. Returned once `fill` is done; its error is raised first."""
    if sum(m.count for m in memories) < OVERLAP_MIN:
        fill()
        meanwhile()
        return [m.tensors() for m in memories]
    failed: List[BaseException] = []

    def run(keep: Sequence[Allocation]) -> None:
        # `keep` holds the memory until the fill is over, even if the
        # caller stops waiting (Ctrl-C) and drops it.
        try:
            fill()
        except BaseException as e:  # re-raised by the caller
            failed.append(e)

    filler = threading.Thread(target=run, args=(memories,), name="zerohop-load", daemon=True)
    filler.start()
    besides: List[BaseException] = []
    try:
        tensors = [m.tensors() for m in memories]
        try:
            meanwhile()
        except Exception as e:  # raised after fill's own
            besides.append(e)
    finally:
        filler.join()
    if failed or besides:
        raise (failed + besides)[0]
    return tensors


def allocate(framework: str, specs: Sequence[Tuple[str, Sequence[int], int]], device: str) -> Allocation:
    """Memory for a tensor or array of each (dtype, shape, bytes) of
    `specs`, in order, as `empty` makes them. Torch tensors in GPU memory
    share blocks of up to `BLOCK_BYTES` (disjoint views of one allocation
    each); everything else, and a tensor asked for alone, is allocated
    alone."""
    if not shares_blocks(framework, device):
        alone = [empty(framework, dtype, shape, device) for dtype, shape, _ in specs]
        return Allocation([address(t) for t in alone], [None] * len(specs), alone, lambda: alone)
    places = plan_blocks([n for _, _, n in specs], BLOCK_BYTES)
    # Each block's members by dtype, as (index, offset) in order.
    members: Dict[int, Dict[str, List[Tuple[int, int]]]] = {}
    for i, place in enumerate(places):
        if place is not None:
            members.setdefault(place[0], {}).setdefault(specs[i][0], []).append((i, place[1]))
    ends = [max(at + specs[i][2] for group in by_dtype.values() for i, at in group) for by_dtype in members.values()]
    raws = _blocks(ends, device)
    alone = {i: empty(framework, specs[i][0], specs[i][1], device) for i, place in enumerate(places) if place is None}
    addresses = [0] * len(specs)
    for raw, by_dtype in zip(raws, members.values()):
        base = raw.data_ptr()
        for group in by_dtype.values():
            for i, offset in group:
                addresses[i] = base + offset
    for i, t in alone.items():
        addresses[i] = address(t)
    blocks = [None if place is None else place[0] for place in places]
    return Allocation(addresses, blocks, raws + list(alone.values()),
                      lambda: _views(raws, [list(m.items()) for m in members.values()], specs, alone),
                      _regions(raws))


def allocate_layout(layout: Any, device: str) -> Tuple[Allocation, List[Tuple[int, int, int, int]]]:
    """Memory for every tensor of a `_native.safetensors_layout` (torch
    tensors in GPU memory: see `shares_blocks`), and the engine's pieces
    that fill it. Only the blocks and the tensors allocated alone are made
    here; the per-tensor work waits for `tensors()`, which a load calls
    while the engine fills the memory."""
    raws = _blocks(layout.block_ends(), device)
    alone = {i: empty("pt", dtype, shape, device) for i, dtype, shape in layout.alone()}
    pieces = layout.pieces([raw.data_ptr() for raw in raws], [address(t) for t in alone.values()])
    memory = Allocation([], [], raws + list(alone.values()),
                        lambda: _views(raws, layout.members(), layout.specs(), alone), _regions(raws), len(layout))
    return memory, pieces


def _blocks(ends: Sequence[int], device: str) -> List[Any]:
    """A block of GPU memory of at least each of `ends` bytes."""
    torch = _torch()
    return [torch.empty(-(-end // _BLOCK_ROUND) * _BLOCK_ROUND, dtype=torch.uint8, device=device) for end in ends]


def _regions(raws: Sequence[Any]) -> List[Tuple[int, int]]:
    """The blocks as the engine's regions, (address, bytes): it may fill
    the tensors of one block with one copy where they follow each other."""
    return [(raw.data_ptr(), raw.numel()) for raw in raws]


def _views(raws: Sequence[Any], members: Sequence[Sequence[Tuple[str, List[Tuple[int, int]]]]],
           specs: Sequence[Tuple[str, Sequence[int], int]], alone: Dict[int, Any]) -> List[Any]:
    """Every tensor, in order: views of the blocks (`members`: each block's
    (dtype, [(index, offset)])), and those allocated alone."""
    out: List[Any] = [None] * len(specs)
    for raw, by_dtype in zip(raws, members):
        for name, group in by_dtype:
            views_of(raw, name, group, specs, out)
    for i, t in alone.items():
        out[i] = t
    return out


def views_of(raw: Any, name: str, members: List[Tuple[int, int]], specs: Sequence[Tuple[str, Sequence[int], int]], out: List[Any]) -> None:
    """Puts into `out` the tensors of dtype `name` that `members` (index,
    offset) place in block `raw`, made by one split of it."""
    typed = raw.view(torch_dtype(name))
    size = typed.element_size()
    packed = name in _PACKED
    # Element counts of the members and of what lies between them, so that
    # one split covers the whole block.
    parts: List[int] = []
    kept: List[int] = []  # which parts are members
    at = 0
    for i, offset in members:
        if offset > at:
            parts.append((offset - at) // size)
        kept.append(len(parts))
        parts.append(specs[i][2] // size)
        at = offset + specs[i][2]
    if raw.numel() > at:
        parts.append((raw.numel() - at) // size)
    pieces = typed.split(parts)
    for (i, _), k in zip(members, kept):
        shape = specs[i][1]
        if packed:
            shape = storage_shape(name, shape)
        # A split part is one-dimensional already (one torch call less per
        # bias or norm).
        out[i] = pieces[k] if len(shape) == 1 else pieces[k].view(shape)


def address(t: Any) -> int:
    """The address of a tensor or array made by `empty`."""
    if np is not None and isinstance(t, np.ndarray):
        return t.__array_interface__["data"][0]
    return t.data_ptr()


def sharing_memory(buffers: Dict[str, Buffer]) -> List[List[str]]:
    """The groups of names whose bytes overlap (views of one memory), each
    sorted; empty buffers share nothing."""
    spans = sorted((b.device, b.addr, b.addr + b.nbytes, name) for name, b in buffers.items() if b.nbytes)
    groups: List[List[str]] = []
    group_end = None
    last_device = None
    for device, start, end, name in spans:
        if device == last_device and group_end is not None and start < group_end:
            groups[-1].append(name)
            group_end = max(group_end, end)
        else:
            groups.append([name])
            group_end, last_device = end, device
    return [sorted(g) for g in groups if len(g) > 1]


def on_one_device(buffers: Dict[str, Buffer]) -> Tuple[Dict[str, Buffer], str]:
    """The buffers on the device holding most of their bytes ('cpu' when
    there are none), those elsewhere copied there: a save or restore runs on
    one device's engine. The copies live as long as the returned dict."""
    by_device: Dict[str, int] = {}
    for b in buffers.values():
        by_device[b.device] = by_device.get(b.device, 0) + b.nbytes
    device = max(by_device, key=lambda d: by_device[d]) if by_device else "cpu"
    if len(by_device) <= 1:
        return buffers, device  # nothing to copy (a checkpoint's thousands of tensors)
    return {n: moved_to(b, device) for n, b in buffers.items()}, device


def as_torch(b: Buffer):
    """A torch tensor sharing `b`'s memory (for copies between devices)."""
    torch = _torch()
    if isinstance(b.owner, torch.Tensor):
        return b.owner
    if np is not None and isinstance(b.owner, np.ndarray):
        return torch.from_numpy(b.owner)
    return torch.frombuffer(b.owner, dtype=torch.uint8)


def moved_to(b: Buffer, device: str) -> Buffer:
    """`b` itself when it is on `device`, else a copy of it there."""
    if b.device == device:
        return b
    return describe(as_torch(b).to(device).contiguous(), writable=False)
