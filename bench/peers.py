#!/usr/bin/env python3
"""zerohop against peer safetensors loaders, into cuda:0, in one run.

Sections (--modes, in this order, each timed and separately callable):
  hot     FILE (on tmpfs) loaded by every loader, --rounds rounds, the
          loaders' order rotated each round.
  shapes  hot loads of three more models generated with `zerohop gen` on
          tmpfs: 4 shards, 3,000+ small tensors, FP8; each against the same
          loader's rate on FILE in the same rounds.  Deleted afterwards.
  cold    per round, a fresh copy of the model (`zerohop gen`, a seed of
          its own) for every loader and every raw-read configuration, all
          written and synced before any is read; the page cache dropped
          before each; the order rotated between rounds; the round's files
          deleted after it.  The raw-read sweep (`zerohop-lab raw-read`:
          block size x threads x O_DIRECT or buffered) runs in full in the
          first round and its best --sweep-keep configurations later.
  s3      FILE as one object of an S3-compatible server on this machine
          (--s3-server, over --s3-root), loaded by zerohop and the peers
          that read object stores (--s3-loaders: zerohop-py, zerohop-cli,
          runai with its S3 backend, boto3 download + safetensors), against
          the server's raw parallel ranged GETs; see bench/peers_s3.py.

Before any section the parent touches --warm-gib GiB of fresh anonymous
memory once and frees it (the VM grows its memory on first touch), then
measures the pinned host->device copy rate in a child (the H2D limit).

Loaders, each in a fresh child process with its own CUDA context per load,
warmed up on a tiny file before the clock starts; the clock runs from the
call until the tensors are usable on cuda:0 (torch.cuda.synchronize()):
  zerohop-py       zerohop.load_file(paths, device="cuda:0")
  zerohop-cli      `ZEROHOP load FILE... --device cuda:0 --json`, run by the
                   parent: two rows, the CLI's own transfer timer, and the
                   wall time of the whole process ("process")
  instanttensor    instanttensor.safe_open(..., copy=False).tensors(), as its
                   own benchmark runs it (the default copy=True clones)
  fastsafetensors  SafeTensorsFileLoader(nogds=True) + copy_files_to_device()
  safetensors      safetensors.torch.load_file(FILE, device="cuda:0")
  runai            runai_model_streamer.SafetensorsStreamer
  kvikio           kvikio.CuFile.read() of each whole file into a cupy buffer
  boto3            (s3) boto3 download_file to tmpfs, safetensors.torch.load_file
Cold runs use each loader's own default I/O (fastsafetensors and
InstantTensor: O_DIRECT); hot and shapes runs switch fastsafetensors to
buffered reads, and InstantTensor too off tmpfs (on tmpfs it maps the file
by default).  Every load is checked against the headers (bytes, tensor
count).  A loader that is missing or fails is reported in one line and the
run carries on.

CPU s/GB: user + system CPU seconds of the loading process around the
timed region (getrusage), over GB loaded; for the CLI, its own report
(own timer) and the parent's RUSAGE_CHILDREN delta (process).

Output: one table per section (best and median GB/s, ratio to pinned H2D,
to the best peer or, for shapes, to the single file, CPU s/GB), then the
targets and whether each was met; JSON with every run (--json-out, written
after every round), a PNG chart (--chart; needs matplotlib) and, on a GPU,
every figure as a line of the results ledger (--ledger).  GB/s is
decimal.  The parent needs only the standard library.

Time: no round starts that would end past --time-limit, and no load starts
past it (the device tool allows 600 s a call).  On the H200 (child start
with torch ~4-5 s), 3 rounds: hot ~2.5 min, shapes ~3 min, cold ~5 min
(3 GiB copies, disk ~2 GB/s; the full 40-configuration sweep is most of it).

Examples (the GPU machine: scripts/gpu.sh device peers / peers-cold):
  python3 bench/peers.py /dev/shm/model.safetensors --modes hot,shapes \\
      --zerohop .stage/bin/zerohop --json-out hot.json --chart hot.png
  python3 bench/peers.py --modes cold --zerohop .stage/bin/zerohop \\
      --json-out cold.json --chart cold.png
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import glob
import json
import mmap
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Beside this file: the report (tables, targets, JSON, chart) and the child
# side (the loaders), whose helpers need only the standard library.
import ledger  # noqa: E402
import peers_report as report  # noqa: E402
import peers_s3  # noqa: E402
from lab_binary import lab_binary  # noqa: E402
from peers_child import (PEER_CLASSES, check, cpu_seconds, describe, drop_page_cache,  # noqa: E402
                         fs_type, one_line, read_headers, write_warmup_file)

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers_child.py")
LOADERS = ("zerohop-py", "zerohop-cli", "instanttensor", "fastsafetensors", "safetensors", "runai", "kvikio", "boto3")
# Loaders of local files: boto3 reads objects only.
FILE_LOADERS = tuple(x for x in LOADERS if x != "boto3")
assert set(LOADERS) == set(PEER_CLASSES) | {"zerohop-cli"}
MODES = ("hot", "shapes", "cold", "s3")
SHAPES = {  # name: extra `zerohop gen` options
    "shards": ["--shards", "4"],
    "small": ["--small-tensors"],
    "fp8": ["--dtype", "fp8"],
}
SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
              "g": 1 << 30, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


# --------------------------------------------------------------------------
# Parent: sizes, running loads, generating models, the sections.
# --------------------------------------------------------------------------

def parse_size(text: str) -> int:
    """`8GiB`, `256KiB`, `1M`, `4096` -> bytes."""
    t = text.strip()
    digits = len(t) - len(t.lstrip("0123456789."))
    unit = t[digits:].strip().lower()
    if not digits or unit not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (try 3GiB, 512MiB, 4096)")
    return int(float(t[:digits]) * SIZE_UNITS[unit])



class Run:
    """What the parent keeps across sections: options, scratch space, the
    records of every load, facts about the machine, the clock."""

    def __init__(self, args: argparse.Namespace, tmp: str):
        self.args, self.tmp = args, tmp
        self.start = time.perf_counter()
        self.runs: list[dict] = []
        self.versions: dict = {}
        self.env: dict = {}
        self.h2d: dict = {}
        self.sections: dict = {}
        self.warm: dict = {}
        self.children = 0
        self.stopped = False
        self.facts: dict | None = None
        self.warm_file = os.path.join(tmp, "warmup.safetensors")
        write_warmup_file(self.warm_file)
        self.shim = cudart_shim(tmp)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def over_time(self, what: str) -> bool:
        """True (said once) once the run has passed --time-limit."""
        if self.elapsed() <= self.args.time_limit:
            return False
        if not self.stopped:
            print(f"{what}: stopping at {self.elapsed():.0f} s, past --time-limit {self.args.time_limit:.0f} s",
                  flush=True)
        self.stopped = True
        return True

    def save(self, model: list[str] | None) -> None:
        """Writes the JSON so far (after every round: a run cut short keeps it)."""
        if self.args.json_out:
            report.write_json(self.args.json_out, document(self, model))

    def h2d_gbps(self) -> float | None:
        return self.h2d.get("best_gbps")


def cudart_shim(tmp: str) -> str | None:
    """A directory holding `libcudart.so`, linked to pip's libcudart.so.N
    (fastsafetensors dlopen()s the bare name, which pip's wheel lacks)."""
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


def spawn(ctx: Run, spec: dict) -> dict:
    """Runs one child on `spec`; returns its result or a one-line error."""
    ctx.children += 1
    spec = dict(spec, result=os.path.join(ctx.tmp, f"result-{ctx.children}.json"))
    spec_path = os.path.join(ctx.tmp, f"spec-{ctx.children}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ)
    if spec["loader"] == "fastsafetensors" and ctx.shim:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [ctx.shim, env.get("LD_LIBRARY_PATH")]))
    cmd = [sys.executable, CHILD, spec_path]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=ctx.args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {ctx.args.timeout} s"}
    if not os.path.exists(spec["result"]):  # died before writing (a signal, say)
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited {proc.returncode}"
        return {"error": f"worker {how}: {one_line(proc.stderr) or one_line(proc.stdout)}".rstrip(": ")}
    with open(spec["result"]) as f:
        return json.load(f)


SEQUENCE = iter(range(1, 1 << 30))


def record(mode: str, shape: str, loader: str, rnd: int, **fields) -> dict:
    """A run record (see peers_report); `seq` numbers the loads in the
    order they ran."""
    r = {"mode": mode, "shape": shape, "loader": loader, "round": rnd, "seq": next(SEQUENCE), **fields}
    if "error" not in r:
        r["gbps"] = r["bytes"] / r["seconds"] / 1e9
    return r


def load_in_child(ctx: Run, loader: str, mode: str, shape: str, rnd: int,
                  paths: list[str], expect: dict, warm: dict | None = None) -> list[dict]:
    # The child knows hot (shapes and s3 are hot loads too) and cold.
    spec = {"loader": loader, "mode": "cold" if mode == "cold" else "hot", "paths": paths, "expect": expect,
            "device": ctx.args.device, "warm_file": ctx.warm_file, "threads": ctx.args.threads}
    if warm:  # an object to warm up on: its headers come from the local copy
        spec.update(warm_file=warm["file"], warm_expect=warm["expect"])
    res = spawn(ctx, spec)
    if res.get("version"):
        ctx.versions[loader] = res["version"]
    if res.get("env"):
        ctx.env = res["env"]
    if "error" in res:
        return [record(mode, shape, loader, rnd, error=res["error"])]
    s = res["sample"]
    extra = dict(res.get("extra", {}), peak_rss_growth_mib=round(s["peak_rss_growth_mib"], 1))
    if res.get("cache"):
        extra["cache"] = res["cache"]
    return [record(mode, shape, loader, rnd, seconds=s["seconds"], bytes=s["bytes"],
                   tensors=s["tensors"], cpu_seconds=s["cpu_seconds"], extra=extra)]


def load_with_cli(ctx: Run, mode: str, shape: str, rnd: int, paths: list[str], expect: dict) -> list[dict]:
    """The zerohop binary, as a whole process: its own timer and the wall time."""
    extra = {}
    if mode == "cold":
        extra["cache"] = drop_page_cache(paths)
    device = "host" if ctx.args.device == "cpu" else ctx.args.device
    cmd = [ctx.args.zerohop, "load", *paths, "--device", device, "--json"]
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=ctx.args.timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [record(mode, shape, n, rnd, error=describe(exc)) for n in ("zerohop-cli", "zerohop-cli-process")]
    wall = time.perf_counter() - start
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - cpu
    try:
        if out.returncode != 0:
            raise RuntimeError(f"exit {out.returncode}: {one_line(out.stderr) or one_line(out.stdout)}")
        rep = json.loads(one_line(out.stdout, limit=1 << 20))
        sample = {"bytes": int(rep["bytes"]), "tensors": rep.get("tensors")}
        check(sample, expect, "tensor_bytes")
    except (RuntimeError, ValueError, KeyError) as exc:
        return [record(mode, shape, n, rnd, error=describe(exc)) for n in ("zerohop-cli", "zerohop-cli-process")]
    extra.update({k: rep.get(k) for k in ("path", "backend", "staging_bytes", "io_threads",
                                          "direct_bytes", "buffered_bytes", "notes")})
    return [record(mode, shape, "zerohop-cli", rnd, seconds=float(rep["seconds"]), bytes=sample["bytes"],
                   tensors=sample["tensors"], cpu_seconds=rep.get("cpu_seconds"), extra=extra),
            record(mode, shape, "zerohop-cli-process", rnd, seconds=wall, bytes=sample["bytes"],
                   tensors=sample["tensors"], cpu_seconds=cpu, extra={"wall": True})]


def load(ctx: Run, loader: str, mode: str, shape: str, rnd: int, paths: list[str], expect: dict,
         warm: dict | None = None) -> list[dict]:
    """One timed load; prints a line per record and keeps the records.
    `warm`: the file a child warms up on, and its header figures, where
    not the local warm-up file (object stores)."""
    if loader == "zerohop-cli":
        recs = load_with_cli(ctx, mode, shape, rnd, paths, expect)
    else:
        recs = load_in_child(ctx, loader, mode, shape, rnd, paths, expect, warm)
    for r in recs:
        say_record(r)
    ctx.runs.extend(recs)
    return recs


def say_record(r: dict) -> None:
    what = f"{r['mode']:6} {r['shape']:6} r{r['round']} {report.run_key(r):28}"
    if "error" in r:
        print(f"{what} FAILED  {r['error']}", flush=True)
        return
    cpu = report.cpu_per_gb(r)
    facts = " ".join(f"{k}={v}" for k, v in r.get("extra", {}).items() if v not in (None, [], True))
    print(f"{what} {r['gbps']:7.2f} GB/s  {r['seconds']:7.3f} s  CPU "
          f"{'n/a' if cpu is None else f'{cpu:.3f}'} s/GB  {facts}".rstrip(), flush=True)


def raw_read(ctx: Run, path: str, config: dict, rnd: int, mode: str = "cold",
             expect_bytes: int | None = None) -> dict:
    """`zerohop-lab raw-read` on one fresh file (or an object: ranged
    GETs, `direct` "get"), one configuration."""
    direct = "never" if config["direct"] == "get" else config["direct"]
    cmd = [lab_binary(ctx.args.zerohop), "raw-read", path, "--block", config["block"],
           "--threads", str(config["threads"]), "--direct", direct, "--json"]
    base = {"mode": mode, "shape": "single", "loader": "raw-read", "round": rnd, "seq": next(SEQUENCE),
            "config": config}
    expect_bytes = os.path.getsize(path) if expect_bytes is None else expect_bytes
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=ctx.args.timeout)
        if out.returncode != 0:
            raise RuntimeError(f"exit {out.returncode}: {one_line(out.stderr) or one_line(out.stdout)}")
        rep = json.loads(one_line(out.stdout, limit=1 << 20))
        if rep["bytes"] != expect_bytes:
            raise RuntimeError(f"read {rep['bytes']} bytes of {expect_bytes}")
        r = dict(base, seconds=rep["seconds"], bytes=rep["bytes"], gbps=rep["gbps"],
                 cpu_seconds=rep["cpu_seconds"], extra={"cache": rep["cache_drop"]})
    except (OSError, subprocess.TimeoutExpired, RuntimeError, ValueError, KeyError) as exc:
        r = dict(base, error=describe(exc))
    say_record(r)
    ctx.runs.append(r)
    return r


def generate(ctx: Run, jobs: list[tuple[str, str, int, list[str]]]) -> float:
    """Runs `zerohop gen` for (out, size, seed, options) jobs, --gen-jobs
    at a time; returns the seconds taken.  Raises on the first failure."""
    start = time.perf_counter()
    pending, running = list(jobs), []
    while pending or running:
        while pending and len(running) < ctx.args.gen_jobs:
            out, size, seed, opts = pending.pop(0)
            cmd = [ctx.args.zerohop, "gen", "--size", size, "--seed", str(seed), *opts, out]
            running.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), out))
        proc, out = running.pop(0)
        _, err = proc.communicate()
        if proc.returncode != 0:
            for p, _ in running:
                p.kill()
                p.wait()
            raise RuntimeError(f"zerohop gen {out} failed: {one_line(err)}")
    return time.perf_counter() - start


def shard_paths(out: str, n: int) -> list[str]:
    """The files `zerohop gen --shards n OUT` writes (see its --help)."""
    stem = out[: -len(".safetensors")] if out.endswith(".safetensors") else out
    return [f"{stem}-{k:05}-of-{n:05}.safetensors" for k in range(1, n + 1)]


def rotated(items: list, rnd: int, rounds: int) -> list:
    """Round `rnd` (from 1) of `rounds`: the list rotated by about
    len/rounds places per round, so every item moves through the order."""
    if not items:
        return items
    k = ((rnd - 1) * len(items) // max(rounds, 1)) % len(items)
    return items[k:] + items[:k]


def rounds_fit(ctx: Run, rnd: int, last_round_s: float, what: str) -> bool:
    """False (and says so) when another round would pass --time-limit."""
    if rnd == 1 or ctx.elapsed() + last_round_s <= ctx.args.time_limit:
        return True
    print(f"{what}: stopping after {rnd - 1} round(s): another (~{last_round_s:.0f} s) would pass "
          f"--time-limit {ctx.args.time_limit:.0f} s at {ctx.elapsed():.0f} s", flush=True)
    return False


def warm_host_memory(gib: float) -> dict:
    """Touches `gib` GiB of fresh anonymous memory once, page by page
    (memset in parallel slices), and frees it: the VM grows its memory on
    first touch (~0.6 s per GiB), and no timed load should pay for that."""
    size = int(gib * (1 << 30))
    if size <= 0:
        return {"gib": 0, "seconds": 0.0}
    start = time.perf_counter()
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf = (ctypes.c_char * size).from_buffer(mm)
        base = ctypes.addressof(buf)
        parts = min(8, os.cpu_count() or 1)
        step = -(-size // parts)
        # ctypes releases the GIL around memset, so the slices fault in parallel.
        threads = [threading.Thread(target=ctypes.memset, args=(base + off, 1, min(step, size - off)))
                   for off in range(0, size, step)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        del buf
    finally:
        mm.close()
    return {"gib": gib, "seconds": time.perf_counter() - start}


def measure_h2d(ctx: Run) -> None:
    if ctx.args.device == "cpu":
        print("pinned H2D: not measured (--device cpu)")
        return
    res = spawn(ctx, {"loader": "h2d", "h2d_bytes": 1 << 30, "h2d_copies": ctx.args.h2d_copies})
    if "error" in res:
        ctx.h2d = {"error": res["error"]}
        print(f"pinned H2D: FAILED  {res['error']}", flush=True)
        return
    s = sorted(res["samples_gbps"])
    ctx.h2d = {"best_gbps": s[-1], "median_gbps": s[len(s) // 2], "samples_gbps": res["samples_gbps"]}
    ctx.env = ctx.env or res["env"]
    print(f"pinned H2D (1 GiB, {len(s)} copies): best {s[-1]:.2f} GB/s, median {s[len(s) // 2]:.2f} GB/s "
          f"on {res['env']['gpu']}", flush=True)


def section_hot(ctx: Run, model: list[str]) -> None:
    args, expect = ctx.args, read_headers(model)
    last = 0.0
    for rnd in range(1, args.rounds + 1):
        if not rounds_fit(ctx, rnd, last, "hot"):
            break
        t = time.perf_counter()
        for loader in rotated(args.hot_loaders, rnd, args.rounds):
            if ctx.over_time("hot"):
                return
            load(ctx, loader, "hot", "single", rnd, model, expect)
        last = time.perf_counter() - t
        ctx.save(model)


def section_shapes(ctx: Run, model: list[str]) -> None:
    """Shards, small tensors and FP8 against the single file, same rounds."""
    args = ctx.args
    size = args.shape_size or same_size(read_headers(model)["file_bytes"])
    need = len(SHAPES) * parse_size(size) * 1.05
    free = shutil.disk_usage(args.shape_dir).free
    if free < need:
        raise RuntimeError(f"{args.shape_dir} has {free / 2**30:.1f} GiB free; the shapes need "
                           f"{need / 2**30:.1f} GiB (choose --shape-dir or a smaller --shape-size)")
    base = os.path.join(args.shape_dir, f"zerohop-peers-{os.getpid()}")
    models = {"single": model}
    jobs = []
    for name, opts in SHAPES.items():
        out = f"{base}-{name}.safetensors"
        jobs.append((out, size, 11 + len(jobs), opts))
        models[name] = shard_paths(out, int(opts[1])) if opts[0] == "--shards" else [out]
    try:
        took = generate(ctx, jobs)
        for name, paths in models.items():
            h = read_headers(paths)
            print(f"shape {name:6} {len(paths)} file(s), {h['n_tensors']} tensors, {h['tensor_bytes'] / 1e9:.2f} GB"
                  + ("" if name == "single" else f" (generated in {took:.0f} s, all three)"), flush=True)
        expects = {name: read_headers(paths) for name, paths in models.items()}
        last = 0.0
        for rnd in range(1, args.rounds + 1):
            if not rounds_fit(ctx, rnd, last, "shapes"):
                break
            t = time.perf_counter()
            for name in rotated(list(models), rnd, args.rounds):
                for loader in rotated(args.shape_loaders, rnd, args.rounds):
                    if ctx.over_time("shapes"):
                        return
                    load(ctx, loader, "shapes", name, rnd, models[name], expects[name])
            last = time.perf_counter() - t
            ctx.save(model)
    finally:
        for name, paths in models.items():
            if name != "single":
                for p in paths + [f"{base}-{name}.safetensors.index.json"]:
                    if os.path.exists(p):
                        os.remove(p)


def same_size(file_bytes: int) -> str:
    """The `zerohop gen --size` of a model like one of `file_bytes`: gen
    lands a little below its size, so whole GiB (MiB) rounded up."""
    unit, name = (1 << 30, "GiB") if file_bytes >= 1 << 30 else (1 << 20, "MiB")
    return f"{-(-file_bytes // unit)}{name}"


def sweep_grid(args: argparse.Namespace) -> list[dict]:
    return [{"block": b, "threads": t, "direct": d}
            for b in args.sweep_blocks for t in args.sweep_threads for d in args.sweep_direct]


def best_configs(ctx: Run, keep: int) -> list[dict]:
    """The raw-read configurations with the highest best GB/s so far."""
    rows = report.group([r for r in ctx.runs if r["loader"] == "raw-read"]).values()
    ranked = sorted((r for r in rows if "best_gbps" in r), key=lambda r: -r["best_gbps"])
    return [r["config"] for r in ranked[:keep]]


def cold_batches(items: list, file_bytes: int, directory: str) -> list[list]:
    """Items grouped so that each group's fresh files fit the free space."""
    spare = shutil.disk_usage(directory).free - max(2 << 30, file_bytes)
    per = int(spare // (file_bytes * 1.02))
    if per < 1:
        raise RuntimeError(f"{directory} has no room for one {file_bytes / 2**30:.1f} GiB copy "
                           f"(and 2 GiB spare): free some, or choose --cold-dir or --cold-size")
    return [items[i:i + per] for i in range(0, len(items), per)]


def section_cold(ctx: Run) -> None:
    args = ctx.args
    os.makedirs(args.cold_dir, exist_ok=True)
    fs = fs_type(args.cold_dir)
    if fs in ("tmpfs", "ramfs"):
        print(f"warning: --cold-dir {args.cold_dir} is on {fs}, which no cache drop evicts: cold equals hot here")
    try:
        cold_rounds(ctx)
    finally:
        try:
            os.rmdir(args.cold_dir)  # only if empty: ours, or nothing left in it
        except OSError:
            pass


def cold_rounds(ctx: Run) -> None:
    args = ctx.args
    grid, last, last_items = sweep_grid(args), 0.0, 1
    for rnd in range(1, args.cold_rounds + 1):
        configs = grid if rnd == 1 or not args.sweep_keep else best_configs(ctx, args.sweep_keep) or grid
        items = rotated([("loader", n) for n in args.cold_loaders] + [("raw", c) for c in configs],
                        rnd, args.cold_rounds)
        if not rounds_fit(ctx, rnd, last * len(items) / last_items, "cold"):
            break
        last_items, t = len(items), time.perf_counter()
        batches = cold_batches(items, parse_size(args.cold_size), args.cold_dir)
        print(f"cold round {rnd}: {len(args.cold_loaders)} loader(s), {len(configs)} raw-read configuration(s), "
              f"a fresh {args.cold_size} copy each" + (f", in {len(batches)} batches (disk space)" if len(batches) > 1 else ""),
              flush=True)
        for b, batch in enumerate(batches):
            if ctx.over_time("cold"):
                return
            cold_batch(ctx, rnd, b, batch)
        last = time.perf_counter() - t
        ctx.save(None)


COLD_SEEDS = iter(range(100, 1 << 30))  # a seed of its own for every cold copy (gen's default is 1)


def cold_batch(ctx: Run, rnd: int, b: int, batch: list) -> None:
    """Writes a fresh copy per item, syncs, then runs each on its own copy."""
    args = ctx.args
    paths = [os.path.join(args.cold_dir, f"r{rnd}-b{b}-{i}.safetensors") for i in range(len(batch))]
    try:
        jobs = [(p, args.cold_size, next(COLD_SEEDS), []) for p in paths]
        took = generate(ctx, jobs)
        start = time.perf_counter()
        os.sync()
        print(f"cold round {rnd}: wrote {len(paths)} copies in {took:.1f} s, synced in "
              f"{time.perf_counter() - start:.1f} s", flush=True)
        for (kind, what), path in zip(batch, paths):
            if ctx.over_time("cold"):
                return
            if kind == "raw":
                raw_read(ctx, path, what, rnd)
            else:
                load(ctx, what, "cold", "single", rnd, [path], read_headers([path]))
    finally:
        for p in paths:
            if os.path.exists(p):
                os.remove(p)


# --------------------------------------------------------------------------
# The whole run.
# --------------------------------------------------------------------------

def machine_facts(ctx: Run, model: list[str] | None) -> dict:
    commit = None
    stage = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".stage", "commit")
    if os.path.exists(stage):
        with open(stage) as f:
            commit = f.read().strip()
    facts = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "commit": commit, "cpus": os.cpu_count(), "kernel": platform.release(),
             "python": platform.python_version(), **ctx.env,
             "hot_fs": fs_type(model[0]) if model else None,
             "cold_fs": fs_type(ctx.args.cold_dir) if "cold" in ctx.args.modes else None}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        facts["nvidia_smi"] = one_line(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        facts["nvidia_smi"] = None
    return facts


def zerohop_version(path: str | None) -> str | None:
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return one_line(out.stdout) if out.returncode == 0 else None


def document(ctx: Run, model: list[str] | None) -> dict:
    if ctx.facts is None:
        ctx.facts = machine_facts(ctx, model)
        ctx.versions["zerohop-cli"] = zerohop_version(ctx.args.zerohop)
    ctx.facts.update(ctx.env)  # the GPU's name, once a child has reported it
    opts = {k: v for k, v in vars(ctx.args).items() if k != "warm_only"}
    return {"schema": 1, "machine": ctx.facts, "versions": ctx.versions,
            "options": opts, "model": model, "warm": ctx.warm, "h2d": ctx.h2d,
            "sections": ctx.sections, "runs": ctx.runs,
            "summary": report.summary(ctx.runs, ctx.h2d_gbps())}


def finish_section(ctx: Run, mode: str, started: float, model: list[str] | None, error: str | None) -> None:
    took = time.perf_counter() - started
    ctx.sections[mode] = {"seconds": round(took, 1), **({"error": error} if error else {})}
    rows = report.summary(ctx.runs, ctx.h2d_gbps())["rows"]
    print()
    if mode in rows:
        print(report.format_table(mode, rows[mode], ctx.h2d_gbps()))
    if error:
        print(f"{mode}: stopped: {error}")
    print(f"=== {mode} took {took:.0f} s (run so far {ctx.elapsed():.0f} s)\n", flush=True)
    ctx.save(model)


def run_all(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="zerohop-peers-") as tmp:
        ctx = Run(args, tmp)
        print(f"peers.py: modes {', '.join(args.modes)}, {args.rounds} round(s) (cold {args.cold_rounds}), "
              f"zerohop {args.zerohop or '(none)'}, time limit {args.time_limit:.0f} s", flush=True)
        ctx.warm = warm_host_memory(args.warm_gib)
        print(f"warmed host memory: touched {args.warm_gib:g} GiB once and freed it, "
              f"in {ctx.warm['seconds']:.1f} s", flush=True)
        measure_h2d(ctx)
        model = None
        if args.file:
            model = [args.file]
            h = read_headers(model)
            print(f"model {args.file}: {h['n_tensors']} tensors, {h['tensor_bytes'] / 1e9:.2f} GB, "
                  f"on {fs_type(args.file)}", flush=True)
        sections = {"hot": section_hot, "shapes": section_shapes, "cold": lambda ctx, _: section_cold(ctx),
                    "s3": lambda ctx, model: peers_s3.section_s3(ctx, model, sys.modules[__name__])}
        for mode in args.modes:
            started, error = time.perf_counter(), None
            print(f"\n=== {mode} ({ctx.elapsed():.0f} s into the run)", flush=True)
            try:
                sections[mode](ctx, model)
            except Exception as exc:  # the next section and the report still run
                if not isinstance(exc, (OSError, RuntimeError, subprocess.SubprocessError)):
                    traceback.print_exc()
                error = describe(exc)
            finish_section(ctx, mode, started, model, error)
        final_report(ctx, model)


def ledger_lines(ctx: Run, s: dict) -> list:
    """Every row's best and median GB/s, the pinned H2D rate and every
    target's ratio, as lines of the results ledger."""
    command = "python3 bench/peers.py " + " ".join(sys.argv[1:])
    lines = []

    def add(figure: str, value: float) -> None:
        lines.append(ledger.line(ctx.args.commit, ctx.args.machine, command, figure, value))

    if ctx.h2d_gbps():
        add("peers: pinned host-to-device copies GB/s (best)", ctx.h2d_gbps())
    for mode, rows in s["rows"].items():
        for r in (r for r in rows if "best_gbps" in r):
            add(f"peers {mode}: {r['label']} GB/s (best of {r['runs']})", r["best_gbps"])
            add(f"peers {mode}: {r['label']} GB/s (median of {r['runs']})", r["median_gbps"])
    for t in (t for t in s["targets"] if t["value"] is not None):
        add(f"peers {t['mode']}: {t['name']}", t["value"])
    return lines


def final_report(ctx: Run, model: list[str] | None) -> None:
    s = report.summary(ctx.runs, ctx.h2d_gbps())
    if ctx.args.device.startswith("cuda"):  # a dry run on host memory measures nothing
        ledger.append(ctx.args.ledger, ledger_lines(ctx, s))
    print("targets:")
    for t in s["targets"]:
        print("  " + report.target_line(t))
    if not s["targets"]:
        print("  none measured")
    if s["cold_by_round"]:
        print("  " + report.cold_by_round_line(s["cold_by_round"]))
    if ctx.args.json_out:
        ctx.save(model)
        print(f"wrote {ctx.args.json_out}")
    if ctx.args.chart:
        title = f"{ctx.env.get('gpu') or ''} {datetime.date.today()}".strip()
        try:
            print(report.write_chart(ctx.args.chart, s["rows"], ctx.h2d_gbps(), title))
        except Exception as exc:  # a chart is not worth the run's other output
            print(f"chart failed: {describe(exc)}")
    print(f"total {ctx.elapsed():.0f} s")


def csv_list(choices: tuple | None = None, convert=str):
    def parse(text: str) -> list:
        items = [convert(x.strip()) for x in text.split(",") if x.strip()]
        bad = [x for x in items if choices and x not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list" +
                                             (f" from {', '.join(choices)}" if choices else ""))
        return items
    return parse


def size_text(text: str) -> str:
    """A size as given (`3GiB`), once it is known to parse."""
    parse_size(text)
    return text


def sizes_list(text: str) -> list[str]:
    items = csv_list()(text)
    for x in items:
        parse_size(x)
    return items


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].strip(), epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", nargs="?",
                   help="the model for hot and shapes: a safetensors file on tmpfs (e.g. `zerohop gen --size 8GiB`)")
    p.add_argument("--modes", type=csv_list(MODES), default=["hot"], help="sections to run, from hot, shapes, cold, s3 (default: hot)")
    p.add_argument("--zerohop", default=shutil.which("zerohop"),
                   help="the zerohop binary: the CLI loader, gen, bench raw-read (default: zerohop on PATH)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of hot and shapes; one fresh child per loader per round (default: 3)")
    p.add_argument("--hot-loaders", type=csv_list(FILE_LOADERS), default=list(FILE_LOADERS),
                   help=f"(default: all: {','.join(FILE_LOADERS)})")
    p.add_argument("--shape-loaders", type=csv_list(FILE_LOADERS), default=["zerohop-py", "zerohop-cli", "instanttensor"],
                   help="(default: zerohop-py,zerohop-cli,instanttensor)")
    p.add_argument("--shape-size", type=size_text,
                   help="size of each generated shape model (default: FILE's size rounded up to whole GiB)")
    p.add_argument("--shape-dir", default="/dev/shm", help="where the shape models go, tmpfs (default: /dev/shm)")
    p.add_argument("--cold-loaders", type=csv_list(FILE_LOADERS), default=["zerohop-py", "zerohop-cli", "fastsafetensors", "instanttensor"],
                   help="(default: zerohop-py,zerohop-cli,fastsafetensors,instanttensor; safetensors is slow)")
    p.add_argument("--cold-rounds", type=int, help="rounds of cold (default: --rounds)")
    p.add_argument("--cold-size", default="3GiB", type=size_text,
                   help="size of each fresh cold copy (default: 3GiB)")
    p.add_argument("--cold-dir", default="/var/tmp/zerohop-peers-cold",
                   help="where the cold copies go, on the disk (default: /var/tmp/zerohop-peers-cold)")
    p.add_argument("--sweep-blocks", type=sizes_list, default="256KiB,512KiB,1MiB,4MiB,8MiB",
                   help="raw-read block sizes (default: 256KiB,512KiB,1MiB,4MiB,8MiB)")
    p.add_argument("--sweep-threads", type=csv_list(convert=int), default="8,16,32,64",
                   help="raw-read threads, i.e. reads in flight (default: 8,16,32,64)")
    p.add_argument("--sweep-direct", type=csv_list(("always", "never")), default="always,never",
                   help="raw-read O_DIRECT: always, never (default: always,never)")
    p.add_argument("--sweep-keep", type=int, default=3,
                   help="cold rounds after the first run only the best N configurations; 0: the full grid every round (default: 3)")
    p.add_argument("--s3-server", default=shutil.which("s3s-fs"),
                   help="s3: the S3-compatible server binary, s3s-fs or garage (by its name; default: s3s-fs on PATH)")
    p.add_argument("--s3-root", default="/dev/shm", help="s3: where the server keeps its objects (default: /dev/shm)")
    p.add_argument("--s3-loaders", type=csv_list(("zerohop-py", "zerohop-cli", "runai", "boto3")),
                   default=["zerohop-py", "zerohop-cli", "runai", "boto3"],
                   help="(default: zerohop-py,zerohop-cli,runai,boto3)")
    p.add_argument("--s3-sweep-blocks", type=sizes_list, default="4MiB,16MiB",
                   help="s3: raw GET sizes (default: 4MiB,16MiB)")
    p.add_argument("--s3-sweep-threads", type=csv_list(convert=int), default="16,32,64",
                   help="s3: raw GETs in flight (default: 16,32,64)")
    p.add_argument("--gen-jobs", type=int, default=4, help="`zerohop gen` processes at once (default: 4)")
    p.add_argument("--threads", type=int, default=16,
                   help="threads for loaders that take a count: fastsafetensors, runai, kvikio (default: 16)")
    p.add_argument("--warm-gib", type=float, default=24, help="host memory to touch once before anything, GiB (default: 24)")
    p.add_argument("--warm-only", action="store_true", help="only warm host memory, then exit")
    p.add_argument("--h2d-copies", type=int, default=10, help="timed 1 GiB pinned H2D copies (default: 10)")
    p.add_argument("--time-limit", type=float, default=540,
                   help="start no round that would end after this many seconds of the run (default: 540)")
    p.add_argument("--timeout", type=int, default=120, help="seconds allowed per load or raw read (default: 120)")
    p.add_argument("--device", default="cuda:0",
                   help="cuda:0, or cpu for a dry run of this script where there is no GPU (default: cuda:0)")
    p.add_argument("--json-out", metavar="PATH", help="write every run, versions and machine facts here (default: none)")
    p.add_argument("--chart", metavar="PATH", help="write a PNG bar chart here; needs matplotlib (default: none)")
    p.add_argument("--ledger", help="append every figure to this results ledger (JSON lines)")
    p.add_argument("--machine", default=platform.node(), help="the machine, for the ledger")
    p.add_argument("--commit", help="the commit measured, for the ledger (default: git's HEAD)")
    args = p.parse_args(argv)
    if args.warm_only:
        return args
    args.cold_rounds = args.cold_rounds or args.rounds
    args.modes = [m for m in MODES if m in args.modes]
    if args.rounds < 1 or args.cold_rounds < 1:
        p.error("--rounds and --cold-rounds must be at least 1")
    if any(m in args.modes for m in ("hot", "shapes", "s3")) and not args.file:
        p.error("hot, shapes and s3 need FILE (e.g. /dev/shm/zerohop-bench.safetensors from `zerohop gen --size 8GiB`)")
    if "s3" in args.modes and not (args.s3_server and os.access(args.s3_server, os.X_OK)):
        p.error("s3 needs an S3 server binary (--s3-server PATH to s3s-fs or garage)")
    if args.file and not os.path.isfile(args.file):
        p.error(f"FILE {args.file} is not a file")
    needs_bin = any(m in args.modes for m in ("shapes", "cold", "s3")) or "zerohop-cli" in args.hot_loaders
    if needs_bin and not (args.zerohop and os.access(args.zerohop, os.X_OK)):
        if any(m in args.modes for m in ("shapes", "cold", "s3")):
            p.error("shapes, cold and s3 need the zerohop binary (--zerohop PATH): models, raw reads")
        print("note: no zerohop binary (--zerohop): the CLI loader is left out")
        args.hot_loaders = [x for x in args.hot_loaders if x != "zerohop-cli"]
    if args.zerohop:
        args.zerohop = os.path.abspath(args.zerohop)
    if args.file:
        args.file = os.path.abspath(args.file)
    return args


def main() -> None:
    args = parse_args()
    if args.warm_only:
        w = warm_host_memory(args.warm_gib)
        print(f"warmed host memory: touched {args.warm_gib:g} GiB once and freed it, in {w['seconds']:.1f} s")
        return
    run_all(args)


if __name__ == "__main__":
    main()
