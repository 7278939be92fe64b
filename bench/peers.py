#!/usr/bin/env python3
"""Time peer safetensors loaders against zerohop on one file, into cuda:0.

Each (peer, mode) pair runs in a fresh child process of this script, so every
peer gets its own CUDA context and nothing is shared between peers.  Inside
the child, CUDA is initialised and the peer loads a tiny warm-up file once
before anything is timed; the timed region then covers the peer loading ALL
tensors of FILE into cuda:0 and ends with torch.cuda.synchronize().

Peers (the API each one is driven through is in its class below):
  safetensors      safetensors.torch.load_file(FILE, device="cuda:0")
  fastsafetensors  SafeTensorsFileLoader(nogds=True) + copy_files_to_device()
  instanttensor    instanttensor.safe_open(...).tensors()
  runai            runai_model_streamer.SafetensorsStreamer, device="cuda:0"
  kvikio           kvikio.CuFile.read() of the whole file into one cupy buffer,
                   compat mode (POSIX reads, no GDS)
  zerohop          `ZEROHOP load FILE --device cuda:0 --json`, one process per
                   run; its self-reported transfer time and the wall time of
                   the whole process are both reported
  zerohop-py       zerohop.load_file(FILE, device="cuda:0"), the Python
                   package (its target: >= 95 % of the zerohop binary)

Modes:
  hot   the file is read once first, so it sits in the page cache (or tmpfs)
  cold  the page cache is dropped before every timed run: through
        /proc/sys/vm/drop_caches when writable, otherwise with
        posix_fadvise(POSIX_FADV_DONTNEED) on FILE; the one used is printed
Peers that read with O_DIRECT by default (fastsafetensors, instanttensor)
keep that default in cold mode and are switched to buffered reads in hot
mode, so that hot measures loading from the page cache for every peer.

GB/s is decimal: bytes / seconds / 1e9.  Every run checks the bytes that
landed on the GPU against the header (sum of tensor sizes; the file size for
KvikIO, which reads the raw file).  A peer that is not installed or fails is
reported with a one-line error; the script itself carries on.

This parent process needs only the standard library, so `--help` and the
argument handling work where torch is absent.

Example:
  python3 bench/peers.py /dev/shm/model.safetensors --modes hot,cold \\
      --repeat 3 --zerohop target/release/zerohop --json-out peers.json
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from importlib import metadata

PEERS = ("safetensors", "fastsafetensors", "instanttensor", "runai", "kvikio", "zerohop", "zerohop-py")
MODES = ("hot", "cold")
DEVICE = "cuda:0"
READ_CHUNK = 64 << 20  # bytes per read() when warming the page cache


# --------------------------------------------------------------------------
# Standard-library helpers, shared by the parent and the children.
# --------------------------------------------------------------------------

def read_header(path: str) -> dict:
    """Parse a safetensors header: file size, tensor count, tensor bytes."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    header.pop("__metadata__", None)
    sizes = [end - start for start, end in (t["data_offsets"] for t in header.values())]
    return {
        "file_bytes": os.path.getsize(path),
        "header_bytes": 8 + header_len,
        "n_tensors": len(sizes),
        "tensor_bytes": sum(sizes),
    }


def write_warmup_file(path: str) -> None:
    """Write a tiny valid safetensors file: two 1 MiB float32 tensors."""
    shape, nbytes = [512, 512], 512 * 512 * 4
    header = {
        "warmup.a": {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]},
        "warmup.b": {"dtype": "F32", "shape": shape, "data_offsets": [nbytes, 2 * nbytes]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
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
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) > len(best):
                    best, best_type = mnt, typ
    except OSError:
        pass
    return best_type


def warm_page_cache(path: str) -> str:
    """Read the whole file once so that it is resident in the page cache."""
    buf = bytearray(READ_CHUNK)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            total += n
    return f"warmed (read {total} bytes)"


def drop_page_cache(path: str) -> str:
    """Evict the file from the page cache; say which way it was done."""
    os.sync()  # only clean pages can be dropped
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return "fadvise(DONTNEED)"


def one_line(text: str) -> str:
    """The last non-empty line of some text, for one-line error reports."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def squash(text: str, limit: int = 300) -> str:
    """All non-empty lines of some text joined into one, capped in length."""
    joined = " | ".join(ln.strip() for ln in str(text).splitlines() if ln.strip())
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


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


# --------------------------------------------------------------------------
# Peers.  Each runs inside its own child process (see run_worker).
# --------------------------------------------------------------------------

class Peer:
    """A loader that runs inside this process and yields torch tensors.

    init() imports the library and initialises CUDA, load() is the timed
    part; count(), close() and free_memory() run after the clock has stopped.
    """

    dists: tuple[str, ...] = ()
    expect = "tensor_bytes"  # which header figure the loaded bytes must equal

    def __init__(self, args: argparse.Namespace, mode: str, file_fs: str):
        self.args, self.mode, self.file_fs = args, mode, file_fs
        self.extra: dict = {}  # peer-specific facts, copied into the result

    def init(self) -> dict:
        import torch

        self.torch = torch
        torch.zeros(1, device=DEVICE)  # creates the CUDA context
        torch.cuda.synchronize()
        self.import_library()
        return {
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(DEVICE),
        }

    def import_library(self) -> None:
        raise NotImplementedError

    def version(self) -> str | None:
        return dist_version(*self.dists)

    def load(self, path: str):
        raise NotImplementedError

    def timed_load(self, path: str) -> dict:
        start = time.perf_counter()
        loaded = self.load(path)
        self.torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        nbytes, ntensors = self.count(loaded)
        self.close(loaded)
        del loaded  # the last reference: the tensors are freed here
        self.free_memory()
        return {"seconds": seconds, "bytes": nbytes, "tensors": ntensors}

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
        """Close whatever handles the peer keeps besides the tensors."""

    def free_memory(self) -> None:
        """Hand cached GPU memory back, so that every run allocates afresh."""
        gc.collect()
        self.torch.cuda.empty_cache()


class SafetensorsPeer(Peer):
    dists = ("safetensors",)

    def import_library(self):
        import safetensors.torch

        self.st = safetensors.torch

    def load(self, path):
        return self.st.load_file(path, device=DEVICE)


class FastsafetensorsPeer(Peer):
    """fastsafetensors without GDS: pread() into pinned bounce buffers.

    Cold: its default, O_DIRECT on local disks (buffered on tmpfs).  Hot:
    FASTSAFETENSORS_ODIRECT=0, so that it reads from the page cache.

    Its native part dlopen()s "libcudart.so", which pip's CUDA wheels do not
    ship; the parent points LD_LIBRARY_PATH at a shim (see cudart_shim).
    """

    dists = ("fastsafetensors",)

    def import_library(self):
        if self.mode == "hot":
            os.environ["FASTSAFETENSORS_ODIRECT"] = "0"
        self.extra["FASTSAFETENSORS_ODIRECT"] = os.environ.get("FASTSAFETENSORS_ODIRECT", "default")
        from fastsafetensors import SafeTensorsFileLoader

        self.loader_class = SafeTensorsFileLoader

    def load(self, path):
        loader = self.loader_class(None, DEVICE, nogds=True, max_threads=self.args.threads)
        loader.add_filenames({0: [path]})
        files = loader.copy_files_to_device()
        tensors = {name: files.get_tensor(name) for name in loader.get_keys()}
        return loader, files, tensors

    def count(self, loaded):
        return super().count(loaded[2])

    def close(self, loaded):
        loader, files, _ = loaded
        files.close()  # the tensors keep their storage alive until freed
        loader.close()


class InstanttensorPeer(Peer):
    """InstantTensor with its own tuning.

    Cold: its default backend (direct I/O through io_uring or libaio on disk,
    mmap on tmpfs).  Hot: the BUFFERED policy on disk, so that it reads from
    the page cache instead of bypassing it; on tmpfs the default (mmap).
    """

    dists = ("instanttensor",)

    def import_library(self):
        import instanttensor

        self.it = instanttensor
        buffered = self.mode == "hot" and self.file_fs not in ("tmpfs", "ramfs")
        self.backend = instanttensor.BackendPolicy.BUFFERED if buffered else None

    def load(self, path):
        tensors = {}
        with self.it.safe_open(path, framework="pt", device=DEVICE, backend=self.backend) as f:
            self.extra["backend"] = f.backend.name
            for name, tensor in f.tensors():
                tensors[name] = tensor
        return tensors


class RunaiPeer(Peer):
    """Run:ai Model Streamer, which copies each tensor to cuda:0 itself.

    Its reader concurrency comes from RUNAI_STREAMER_CONCURRENCY, set here
    to --threads unless the environment already sets it.
    """

    dists = ("runai-model-streamer",)

    def import_library(self):
        os.environ.setdefault("RUNAI_STREAMER_CONCURRENCY", str(self.args.threads))
        self.extra["RUNAI_STREAMER_CONCURRENCY"] = os.environ["RUNAI_STREAMER_CONCURRENCY"]
        from runai_model_streamer import SafetensorsStreamer

        self.streamer_class = SafetensorsStreamer

    def load(self, path):
        tensors = {}
        with self.streamer_class() as streamer:
            streamer.stream_file(path, device=DEVICE)
            for name, tensor in streamer.get_tensors():
                tensors[name] = tensor
        return tensors


class KvikioPeer(Peer):
    """KvikIO reading the raw file into one device buffer of the file size."""

    dists = ("kvikio-cu13", "kvikio-cu12", "kvikio")
    expect = "file_bytes"

    def import_library(self):
        import cupy
        import kvikio
        import kvikio.defaults

        self.cupy, self.kvikio = cupy, kvikio
        kvikio.defaults.set({"compat_mode": kvikio.CompatMode.ON, "num_threads": self.args.threads})
        self.extra["compat_mode"] = str(kvikio.defaults.get("compat_mode"))
        self.extra["num_threads"] = kvikio.defaults.get("num_threads")
        self.extra["auto_direct_io_read"] = kvikio.defaults.get("auto_direct_io_read")

    def load(self, path):
        buf = self.cupy.empty(os.path.getsize(path), dtype=self.cupy.uint8)
        with self.kvikio.CuFile(path, "r") as f:
            nread = f.read(buf)
        return buf, nread

    def count(self, loaded):
        buf, nread = loaded
        if buf.nbytes != nread:
            raise RuntimeError(f"read {nread} bytes into a {buf.nbytes}-byte buffer")
        return nread, None

    def free_memory(self):
        gc.collect()
        self.cupy.get_default_memory_pool().free_all_blocks()


class ZerohopPeer(Peer):
    """The zerohop binary, run as a whole process per load.

    `seconds` is the transfer time zerohop reports; `wall_seconds` is the
    whole process, including its CUDA context creation (and, in cold mode
    after drop_caches, re-reading its own binary and the CUDA libraries).
    """

    def init(self):
        if not os.access(self.args.zerohop, os.X_OK):
            raise FileNotFoundError(f"zerohop binary not executable: {self.args.zerohop}")
        return {}

    def version(self):
        try:
            out = subprocess.run([self.args.zerohop, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return one_line(out.stdout) if out.returncode == 0 else None

    def timed_load(self, path):
        cmd = [self.args.zerohop, "load", path, "--device", DEVICE, "--json"]
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.timeout)
        wall = time.perf_counter() - start
        if out.returncode != 0:
            raise RuntimeError(f"exit {out.returncode}: {squash(out.stderr) or squash(out.stdout)}")
        try:
            report = json.loads(out.stdout)
        except json.JSONDecodeError:
            report = json.loads(one_line(out.stdout))  # tolerate log lines before the JSON
        self.extra["path"] = report.get("path")
        return {
            "seconds": float(report["seconds"]),
            "wall_seconds": wall,
            "bytes": int(report["bytes"]),
            "tensors": None,
            "report": report,
        }


class ZerohopPythonPeer(Peer):
    """The zerohop Python package, a drop-in for safetensors.torch.load_file."""

    dists = ("zerohop",)

    def import_library(self):
        import zerohop

        self.zerohop = zerohop

    def load(self, path):
        return self.zerohop.load_file(path, device=DEVICE)


PEER_CLASSES = {
    "safetensors": SafetensorsPeer,
    "fastsafetensors": FastsafetensorsPeer,
    "instanttensor": InstanttensorPeer,
    "runai": RunaiPeer,
    "kvikio": KvikioPeer,
    "zerohop": ZerohopPeer,
    "zerohop-py": ZerohopPythonPeer,
}


# --------------------------------------------------------------------------
# Child process: one peer, one mode, all repeats.
# --------------------------------------------------------------------------

def check(sample: dict, header: dict, expect: str, what: str) -> None:
    """Raise unless the run loaded exactly what the header says."""
    if sample["bytes"] != header[expect]:
        raise RuntimeError(f"{what}: loaded {sample['bytes']} bytes, expected {header[expect]} ({expect})")
    if sample["tensors"] is not None and sample["tensors"] != header["n_tensors"]:
        raise RuntimeError(f"{what}: loaded {sample['tensors']} tensors, expected {header['n_tensors']}")


def run_worker(args: argparse.Namespace) -> None:
    mode = args.modes[0]
    result: dict = {"peer": args.worker, "mode": mode, "samples": [], "cache": []}
    try:
        peer = PEER_CLASSES[args.worker](args, mode, fs_type(args.file))
        result["env"] = peer.init()
        result["version"] = peer.version()
        header = read_header(args.file)

        warm = peer.timed_load(args.warm_file)  # untimed: first-use costs
        check(warm, read_header(args.warm_file), peer.expect, "warm-up")

        if mode == "hot":
            result["cache"].append(warm_page_cache(args.file))
        for run in range(args.repeat):
            if mode == "cold":
                result["cache"].append(drop_page_cache(args.file))
            sample = peer.timed_load(args.file)
            check(sample, header, peer.expect, f"run {run + 1}")
            result["samples"].append(sample)
        result["extra"] = peer.extra
    except BaseException as exc:  # report everything, including SystemExit from libraries
        result["error"] = describe(exc)
    with open(args.result, "w") as f:
        json.dump(result, f)


# --------------------------------------------------------------------------
# Parent process: spawn the children, summarise, print the table.
# --------------------------------------------------------------------------

def cudart_shim(tmp: str) -> str | None:
    """A directory holding `libcudart.so`, linked to pip's libcudart.so.N.

    pip's CUDA runtime wheel (which torch uses) ships only the versioned
    name; fastsafetensors dlopen()s the bare name, so it finds no GPU unless
    LD_LIBRARY_PATH leads it to one.  Picks the highest major version.
    """
    found = []
    for entry in sys.path:
        found += glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib", "libcudart.so.[0-9]*"))
    if not found:
        return None
    target = max(found, key=lambda p: int(p.rsplit(".so.", 1)[1].split(".")[0]))
    shim = os.path.join(tmp, "cudart-shim")
    os.makedirs(shim, exist_ok=True)
    os.symlink(os.path.realpath(target), os.path.join(shim, "libcudart.so"))
    return shim


def spawn(args: argparse.Namespace, peer: str, mode: str, tmp: str, warm_file: str, shim: str | None) -> dict:
    """Run one child and return its result, or a one-line error."""
    result_path = os.path.join(tmp, f"{peer}-{mode}.json")
    cmd = [sys.executable, os.path.abspath(__file__), args.file,
           "--worker", peer, "--modes", mode, "--repeat", str(args.repeat),
           "--threads", str(args.threads), "--timeout", str(args.timeout),
           "--warm-file", warm_file, "--result", result_path]
    if args.zerohop:
        cmd += ["--zerohop", args.zerohop]
    env = dict(os.environ)
    if peer == "fastsafetensors" and shim:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [shim, env.get("LD_LIBRARY_PATH")]))
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=args.timeout * (args.repeat + 1))
    except subprocess.TimeoutExpired:
        return {"peer": peer, "mode": mode, "error": f"timed out after {args.timeout * (args.repeat + 1)} s"}
    if not os.path.exists(result_path):  # crashed before writing (e.g. a signal)
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited {proc.returncode}"
        why = one_line(proc.stderr) or one_line(proc.stdout)
        return {"peer": peer, "mode": mode, "error": f"worker {how}: {why}".rstrip(": ")}
    with open(result_path) as f:
        result = json.load(f)
    result["log_tail"] = proc.stderr.splitlines()[-20:]
    if peer == "fastsafetensors" and shim:
        result.setdefault("extra", {})["cudart_shim"] = os.readlink(os.path.join(shim, "libcudart.so"))
    return result


def summarise(result: dict, key: str = "seconds") -> dict:
    """Best and median GB/s over the samples, timing with `key`."""
    gbps = [s["bytes"] / s[key] / 1e9 for s in result["samples"]]
    return {
        "best_gbps": max(gbps),
        "median_gbps": statistics.median(gbps),
        "best_seconds": min(s[key] for s in result["samples"]),
    }


def table_rows(results: list[dict]) -> list[dict]:
    """One row per result; zerohop gets a second row for its wall time."""
    rows = []
    for r in results:
        if "error" in r:
            rows.append({"peer": r["peer"], "mode": r["mode"], "error": r["error"]})
            continue
        rows.append({"peer": r["peer"], "mode": r["mode"], **summarise(r)})
        if r["peer"] == "zerohop":
            rows.append({"peer": "zerohop (wall)", "mode": r["mode"], **summarise(r, "wall_seconds")})
    return rows


def print_table(rows: list[dict], limit_gbps: float | None) -> None:
    zerohop = {r["mode"]: r["best_gbps"] for r in rows if r["peer"] == "zerohop" and "error" not in r}
    head = ["peer", "mode", "best GB/s", "median GB/s", "seconds", "zerohop / peer"]
    if limit_gbps:
        head.append(f"best / {limit_gbps:g} GB/s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        if "error" in r:
            cells = [r["peer"], r["mode"], "failed", "", "", ""] + ([""] if limit_gbps else [])
        else:
            ratio = zerohop.get(r["mode"])
            cells = [r["peer"], r["mode"], f"{r['best_gbps']:.2f}", f"{r['median_gbps']:.2f}",
                     f"{r['best_seconds']:.3f}", f"{ratio / r['best_gbps']:.2f}x" if ratio else "n/a"]
            if limit_gbps:
                cells.append(f"{r['best_gbps'] / limit_gbps:.2f}")
        print("| " + " | ".join(cells) + " |")
    print()
    print("seconds: best run.  zerohop / peer: zerohop's best GB/s (its own transfer time) over the")
    print("peer's best GB/s, same mode.  zerohop (wall) times its whole process, CUDA start-up included.")
    for r in rows:
        if "error" in r:
            print(f"- {r['peer']} ({r['mode']}): {r['error']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time peer safetensors loaders against zerohop, loading all tensors into cuda:0.",
        epilog=f"Peers: {', '.join(PEERS)}.  zerohop runs only with --zerohop.")
    parser.add_argument("file", metavar="FILE", help="safetensors file to load")
    parser.add_argument("--modes", default="hot,cold", help="comma-separated, from: hot, cold (default: hot,cold)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per peer and mode (default: 3)")
    parser.add_argument("--peers", help="comma-separated peers (default: all; zerohop only with --zerohop)")
    parser.add_argument("--zerohop", metavar="PATH", help="zerohop binary, run as: PATH load FILE --device cuda:0 --json")
    parser.add_argument("--json-out", metavar="PATH", help="write every result, with versions, to this JSON file")
    parser.add_argument("--limit-gbps", type=float, metavar="X", help="reference bandwidth to print ratios against")
    parser.add_argument("--threads", type=int, default=16,
                        help="threads for peers that take a count: fastsafetensors, runai, kvikio (default: 16)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds allowed per load (default: 900)")
    # Internal: how the parent starts a child for one peer and one mode.
    parser.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)
    parser.add_argument("--warm-file", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--modes takes a comma-separated list from: {', '.join(MODES)}")
    if args.peers is None:
        args.peers = [p for p in PEERS if p != "zerohop" or args.zerohop]
    else:
        args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
        unknown = [p for p in args.peers if p not in PEERS]
        if unknown or not args.peers:
            parser.error(f"unknown peer(s) {unknown}; choose from: {', '.join(PEERS)}")
        if "zerohop" in args.peers and not args.zerohop:
            parser.error("peer zerohop needs --zerohop PATH")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.zerohop:
        args.zerohop = os.path.abspath(args.zerohop)
    args.file = os.path.abspath(args.file)
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args)
        return

    header = read_header(args.file)
    file_fs = fs_type(args.file)
    print(f"file: {args.file} ({header['file_bytes']} bytes, {header['n_tensors']} tensors, "
          f"{header['tensor_bytes']} tensor bytes, on {file_fs})")
    print(f"python {platform.python_version()}, peers: {', '.join(args.peers)}, modes: {', '.join(args.modes)}, "
          f"repeat {args.repeat}, threads {args.threads}")
    if "cold" in args.modes and file_fs in ("tmpfs", "ramfs"):
        print("warning: FILE is on tmpfs/ramfs, which no cache drop evicts: cold equals hot here")

    results = []
    with tempfile.TemporaryDirectory(prefix="zerohop-peers-") as tmp:
        warm_file = os.path.join(tmp, "warmup.safetensors")
        write_warmup_file(warm_file)
        shim = cudart_shim(tmp) if "fastsafetensors" in args.peers else None
        for mode in args.modes:
            for peer in args.peers:
                r = spawn(args, peer, mode, tmp, warm_file, shim)
                results.append(r)
                if "error" in r:
                    print(f"{peer:16} {mode:4}  FAILED  {r['error']}", flush=True)
                else:
                    s = summarise(r)
                    cache = ", ".join(sorted(set(r["cache"])))
                    extra = " ".join(f"{k}={v}" for k, v in r.get("extra", {}).items())
                    print(f"{peer:16} {mode:4}  best {s['best_gbps']:7.2f} GB/s  median {s['median_gbps']:7.2f} GB/s"
                          f"  cache: {cache}  {extra}", flush=True)

    env = next((r["env"] for r in results if r.get("env")), {})
    versions = {r["peer"]: r["version"] for r in results if r.get("version")}
    print()
    print(f"python {platform.python_version()}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
          f"GPU {env.get('gpu')}")
    print("versions: " + (", ".join(f"{p} {v}" for p, v in versions.items()) or "none"))
    print()
    rows = table_rows(results)
    print_table(rows, args.limit_gbps)

    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({
                "file": args.file, **header, "fs_type": file_fs,
                "python": platform.python_version(), "env": env, "versions": versions,
                "modes": args.modes, "repeat": args.repeat, "threads": args.threads,
                "limit_gbps": args.limit_gbps, "rows": rows, "results": results,
            }, f, indent=2)
        print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
