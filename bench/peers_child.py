#!/usr/bin/env python3
"""The child side of bench/peers.py: one timed load into the GPU by one
loader (or the pinned H2D probe), in a process of its own.

    python3 bench/peers_child.py SPEC.json

SPEC names the loader, the files, the mode (cold: the page cache is dropped
after the warm-up, right before the timed load), what the headers say the
load must deliver, and where to write the result (JSON: the sample, the
library's version, or a one-line error).  The helpers at the top need only
the standard library and are shared with the parent; torch and the loaders
are imported inside the child alone.
"""

from __future__ import annotations

import abc
import gc
import json
import mmap
import os
import resource
import struct
import sys
import time
from importlib import metadata

# Where the tensors go: cuda:0, or "cpu" for a dry run of the script on a
# machine without a GPU (the spec says which).
DEVICE = "cuda:0"

# --------------------------------------------------------------------------
# Standard-library helpers, shared by the parent and the children.
# --------------------------------------------------------------------------

def read_headers(paths: list[str]) -> dict:
    """File bytes, tensor count and tensor bytes of safetensors files."""
    out = {"file_bytes": 0, "n_tensors": 0, "tensor_bytes": 0}
    for path in paths:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        out["file_bytes"] += os.path.getsize(path)
        out["n_tensors"] += len(header)
        out["tensor_bytes"] += sum(e - b for b, e in (t["data_offsets"] for t in header.values()))
    return out


def touch_fresh_memory(nbytes: int = 256 << 10) -> None:
    """Faults in `nbytes` of new anonymous memory, a page at a time: what
    any next step of the caller does, and what waits for whoever holds
    the memory-map lock (about 0.2 ms when nobody does)."""
    with mmap.mmap(-1, nbytes) as m:
        for at in range(0, nbytes, mmap.PAGESIZE):
            m[at] = 1


def write_warmup_file(path: str) -> None:
    """A tiny valid safetensors file: two 1 MiB float32 tensors."""
    shape, nbytes = [512, 512], 512 * 512 * 4
    header = {
        "warmup.a": {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]},
        "warmup.b": {"dtype": "F32", "shape": shape, "data_offsets": [nbytes, 2 * nbytes]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + bytes(2 * nbytes))


def fs_type(path: str) -> str:
    """File-system type of the mount holding `path`, from /proc/mounts."""
    real = os.path.realpath(path)
    best, best_type = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                _, mnt, typ = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, best_type = mnt, typ
    except OSError:
        pass
    return best_type


def drop_page_cache(paths: list[str]) -> str:
    """Evicts files from the page cache; says which way it was done."""
    os.sync()  # only clean pages can be dropped
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise(DONTNEED)"


def one_line(text: str, limit: int = 300) -> str:
    """The last non-empty line of some text, capped, for one-line reports."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError):
        return f"not installed: {one_line(exc)}"
    return f"{type(exc).__name__}: {one_line(exc)}"


def dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def cpu_seconds(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------
# Loaders.  Each runs inside a child process of its own (see run_worker).
# --------------------------------------------------------------------------

class Peer(abc.ABC):
    """A loader that yields torch tensors on cuda:0.

    init() imports the library and creates the CUDA context; load() is the
    timed part; count(), close() and free_memory() run after the clock.
    """

    dists: tuple[str, ...] = ()
    expect = "tensor_bytes"  # which header figure the loaded bytes must equal

    def __init__(self, spec: dict):
        path = spec["paths"][0]
        self.spec, self.mode = spec, spec["mode"]
        self.fs = "s3" if path.startswith("s3://") else fs_type(path)
        self.extra: dict = {}

    def init(self) -> dict:
        import torch

        self.torch = torch
        torch.zeros(1, device=DEVICE)  # creates the CUDA context
        self.sync()
        self.import_library()
        return torch_facts(torch)

    def sync(self) -> None:
        """Waits until the tensors are usable and the process can go on:
        the device's work is done, and fresh host memory can be faulted in
        (work a loader leaves behind, such as unmapping a large mapping on
        a thread, holds the process's memory-map lock and stalls that)."""
        if DEVICE != "cpu":
            self.torch.cuda.synchronize()
        touch_fresh_memory()

    @abc.abstractmethod
    def import_library(self) -> None:
        """Imports the loader's library (each subclass its own)."""

    def version(self) -> str | None:
        return dist_version(*self.dists)

    @abc.abstractmethod
    def load(self, paths: list[str]):
        """Loads every tensor of `paths` onto the device: the timed part."""

    def timed_load(self, paths: list[str]) -> dict:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        cpu = cpu_seconds(resource.RUSAGE_SELF)
        start = time.perf_counter()
        loaded = self.load(paths)
        self.sync()
        seconds = time.perf_counter() - start
        cpu = cpu_seconds(resource.RUSAGE_SELF) - cpu
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
        nbytes, ntensors = self.count(loaded)
        self.close(loaded)
        del loaded  # the last reference: the tensors are freed here
        self.free_memory()
        return {"seconds": seconds, "bytes": nbytes, "tensors": ntensors, "cpu_seconds": cpu,
                "peak_rss_growth_mib": grown / 1024}

    def count(self, tensors: dict) -> tuple[int, int]:
        """Bytes and number of the tensors, all of which must be on cuda:0."""
        device = self.torch.device(DEVICE)
        total = 0
        for name, t in tensors.items():
            if t.device != device:
                raise RuntimeError(f"tensor {name} is on {t.device}, not {DEVICE}")
            total += t.numel() * t.element_size()
        return total, len(tensors)

    def close(self, loaded) -> None:
        """Closes whatever handles the loader keeps besides the tensors."""

    def free_memory(self) -> None:
        gc.collect()
        if DEVICE != "cpu":
            self.torch.cuda.empty_cache()


class ZerohopPythonPeer(Peer):
    dists = ("zerohop",)

    def import_library(self):
        import zerohop

        self.zerohop = zerohop

    def load(self, paths):
        return self.zerohop.load_file(paths if len(paths) > 1 else paths[0], device=DEVICE)


class SafetensorsPeer(Peer):
    dists = ("safetensors",)

    def import_library(self):
        import safetensors.torch

        self.st = safetensors.torch

    def load(self, paths):
        out = {}
        for p in paths:
            out.update(self.st.load_file(p, device=DEVICE))
        return out


class FastsafetensorsPeer(Peer):
    """fastsafetensors without GDS: pread() into pinned bounce buffers.

    Cold: its default (O_DIRECT where the file system allows it).  Hot,
    off tmpfs: FASTSAFETENSORS_ODIRECT=0, to read the page cache.  Its
    native part dlopen()s "libcudart.so", which pip's CUDA wheels lack: the
    parent points LD_LIBRARY_PATH at a shim (see cudart_shim).
    """

    dists = ("fastsafetensors",)

    def import_library(self):
        if self.mode == "hot":
            os.environ["FASTSAFETENSORS_ODIRECT"] = "0"
        self.extra["FASTSAFETENSORS_ODIRECT"] = os.environ.get("FASTSAFETENSORS_ODIRECT", "default")
        from fastsafetensors import SafeTensorsFileLoader

        self.loader_class = SafeTensorsFileLoader

    def load(self, paths):
        loader = self.loader_class(None, DEVICE, nogds=True, max_threads=self.spec["threads"])
        loader.add_filenames({0: list(paths)})
        files = loader.copy_files_to_device()
        tensors = {name: files.get_tensor(name) for name in loader.get_keys()}
        return loader, files, tensors

    def count(self, loaded):
        return super().count(loaded[2])

    def close(self, loaded):
        loader, files, _ = loaded
        files.close()
        loader.close()


class InstanttensorPeer(Peer):
    """InstantTensor with copy=False, as its own benchmark times it: the
    tensors are views of its ring buffer, counted as they come and not kept.

    Its default backend (mmap on tmpfs; direct I/O on disk), except hot
    loads off tmpfs, which use its BUFFERED policy to read the page cache.
    """

    dists = ("instanttensor",)

    def import_library(self):
        import instanttensor

        self.it = instanttensor
        buffered = self.mode == "hot" and self.fs not in ("tmpfs", "ramfs")
        self.options = {"copy": False}
        if buffered:
            self.options["backend"] = instanttensor.BackendPolicy.BUFFERED

    def open(self, paths):
        try:
            return self.it.safe_open(list(paths), framework="pt", device=DEVICE, **self.options)
        except TypeError as exc:  # a version without copy= (and without cloning)
            if "copy" not in str(exc):
                raise
            self.options.pop("copy")
            self.extra["copy"] = "not an option of this version"
            return self.it.safe_open(list(paths), framework="pt", device=DEVICE, **self.options)

    def load(self, paths):
        device = self.torch.device(DEVICE)
        total = count = 0
        with self.open(paths) as f:
            backend = getattr(f, "backend", None)
            self.extra["backend"] = getattr(backend, "name", str(backend))
            for name, t in f.tensors():
                if t.device != device:
                    raise RuntimeError(f"tensor {name} is on {t.device}, not {DEVICE}")
                total += t.numel() * t.element_size()
                count += 1
        return total, count

    def count(self, loaded):
        return loaded


class RunaiPeer(Peer):
    """Run:ai Model Streamer; RUNAI_STREAMER_CONCURRENCY = --threads unless set."""

    dists = ("runai-model-streamer",)

    def import_library(self):
        os.environ.setdefault("RUNAI_STREAMER_CONCURRENCY", str(self.spec["threads"]))
        self.extra["RUNAI_STREAMER_CONCURRENCY"] = os.environ["RUNAI_STREAMER_CONCURRENCY"]
        from runai_model_streamer import SafetensorsStreamer

        self.streamer_class = SafetensorsStreamer

    def load(self, paths):
        tensors = {}
        with self.streamer_class() as streamer:
            for p in paths:
                streamer.stream_file(p, device=DEVICE)
                for name, tensor in streamer.get_tensors():
                    tensors[name] = tensor
        return tensors


class KvikioPeer(Peer):
    """KvikIO (compat mode: POSIX reads) reading each whole file into one
    device buffer of the file's size."""

    dists = ("kvikio-cu13", "kvikio-cu12", "kvikio")
    expect = "file_bytes"

    def import_library(self):
        import cupy
        import kvikio
        import kvikio.defaults

        self.cupy, self.kvikio = cupy, kvikio
        kvikio.defaults.set({"compat_mode": kvikio.CompatMode.ON, "num_threads": self.spec["threads"]})
        self.extra["compat_mode"] = str(kvikio.defaults.get("compat_mode"))
        self.extra["num_threads"] = kvikio.defaults.get("num_threads")

    def load(self, paths):
        out = []
        for p in paths:
            buf = self.cupy.empty(os.path.getsize(p), dtype=self.cupy.uint8)
            with self.kvikio.CuFile(p, "r") as f:
                out.append((buf, f.read(buf)))
        return out

    def count(self, loaded):
        for buf, nread in loaded:
            if buf.nbytes != nread:
                raise RuntimeError(f"read {nread} bytes into a {buf.nbytes}-byte buffer")
        return sum(n for _, n in loaded), None

    def free_memory(self):
        gc.collect()
        self.cupy.get_default_memory_pool().free_all_blocks()


class Boto3Peer(Peer):
    """What users without a streaming loader do with an object: boto3
    downloads it to a local file (tmpfs, the fastest there is), then
    safetensors.torch.load_file reads it onto the device."""

    dists = ("boto3",)

    def import_library(self):
        import boto3
        import safetensors.torch

        self.client = boto3.client("s3")
        self.st = safetensors.torch

    def load(self, paths):
        out, self.downloads = {}, []
        try:
            for i, p in enumerate(paths):
                bucket, key = p.removeprefix("s3://").split("/", 1)
                local = os.path.join("/dev/shm", f"zerohop-peers-boto3-{os.getpid()}-{i}.safetensors")
                self.downloads.append(local)
                self.client.download_file(bucket, key, local)
                out.update(self.st.load_file(local, device=DEVICE))
        except BaseException:
            self.close(None)
            raise
        return out

    def close(self, loaded):
        # After the clock: a user keeps the download, so deleting it (which
        # takes a while for gigabytes of tmpfs) is not part of the load.
        for local in getattr(self, "downloads", []):
            if os.path.exists(local):
                os.remove(local)


PEER_CLASSES = {
    "zerohop-py": ZerohopPythonPeer,
    "instanttensor": InstanttensorPeer,
    "fastsafetensors": FastsafetensorsPeer,
    "safetensors": SafetensorsPeer,
    "runai": RunaiPeer,
    "kvikio": KvikioPeer,
    "boto3": Boto3Peer,
}


def torch_facts(torch) -> dict:
    gpu = torch.cuda.get_device_name(DEVICE) if DEVICE != "cpu" else None
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "gpu": gpu}


def h2d_probe(spec: dict) -> dict:
    """Pinned host -> cuda:0 copies of one buffer: the H2D limit."""
    import torch

    n = spec["h2d_bytes"]
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
    dst = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    samples = []
    for _ in range(spec["h2d_copies"]):
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        samples.append(n / (time.perf_counter() - start) / 1e9)
    return {"samples_gbps": samples, "env": torch_facts(torch)}


def check(sample: dict, expect: dict, figure: str) -> None:
    """Raises unless the load delivered exactly what the headers say."""
    if sample["bytes"] != expect[figure]:
        raise RuntimeError(f"loaded {sample['bytes']} bytes, expected {expect[figure]} ({figure})")
    if sample.get("tensors") is not None and sample["tensors"] != expect["n_tensors"]:
        raise RuntimeError(f"loaded {sample['tensors']} tensors, expected {expect['n_tensors']}")


def run_worker(spec_path: str) -> None:
    """The child: one load by one loader (or the H2D probe), result to JSON."""
    global DEVICE
    with open(spec_path) as f:
        spec = json.load(f)
    DEVICE = spec.get("device", DEVICE)
    result: dict = {"loader": spec["loader"]}
    try:
        if spec["loader"] == "h2d":
            result.update(h2d_probe(spec))
        else:
            peer = PEER_CLASSES[spec["loader"]](spec)
            result["env"] = peer.init()
            result["version"] = peer.version()
            warm = peer.timed_load([spec["warm_file"]])  # first-use costs, untimed
            check(warm, spec.get("warm_expect") or read_headers([spec["warm_file"]]), peer.expect)
            if spec["mode"] == "cold":
                result["cache"] = drop_page_cache(spec["paths"])
            sample = peer.timed_load(spec["paths"])
            check(sample, spec["expect"], peer.expect)
            result["sample"] = sample
            result["extra"] = peer.extra
    except BaseException as exc:  # everything, SystemExit from libraries included
        result["error"] = describe(exc)
    with open(spec["result"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    run_worker(sys.argv[1])
