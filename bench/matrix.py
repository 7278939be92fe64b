#!/usr/bin/env python3
"""Every operation, every shape, as users call them: one table per operation,
zerohop beside its peers and the machine's limit, measured in one run.

Each measured call is the first call of its kind in a fresh process: the
child imports torch, makes its CUDA context (a user's process has one) and
the tensors it saves, then times the one call from its start until the
result is usable (loads: tensors on the device, synchronized; saves: the
call returned). Nothing else of zerohop runs before it. The bytes are
checked after the clock stops: every loaded tensor against the tensors the
file was made from, every saved file read back by `safetensors` (or the
checkpoint restored by the next child).

Operations: load_file, get_slice (safe_open, then the first half of the
rows of every tensor, as a tensor-parallel rank reads), save_file, checkpoint-save, checkpoint-load.
Shapes (SIZE in all): one tensor; 4 tensors; 64 tensors; 3,280 FP8
tensors of 1 - 4 units (1 - 4 MiB at 8 GiB); 4 shard files of 16 tensors.
Peers, where installed: InstantTensor (loads, its own mode: copy=False),
safetensors (get_slice, save_file), torch.save / torch.load (saves,
checkpoints). Limits: pinned host-to-device copies (loads) and raw
parallel writes of the same bytes from host memory, 16 threads into one
file (with `pwrite`, and copying into a shared mapping of it: the faster
way into one file of a memory file system) and into 16 files (saves).

`--before DIR` measures a second build of zerohop beside this one, as the
tool "zerohop-before" (DIR holds its `zerohop` package, e.g. its wheel
installed with `pip install --target DIR`): a change against the commit
before it, in one machine start. `--tools` keeps only the tools named.

Each round takes every shape in turn, in an order that rotates from round
to round, so that the machine's drift over a run falls on all of them; the
shapes' files are made first and kept until the last round (5 x SIZE).
`--time-limit S` starts no round after S seconds.

For each operation it prints zerohop's worst shape over its best (GB/s) and,
on a GPU, fails (exit 1) when that is under 0.85. On host memory
(--device cpu, as CI runs it at a small size) it checks that every
operation and shape runs and gives back the right bytes; ratios there mean
nothing.

    python3 bench/matrix.py [--size 8GiB] [--rounds 3] [--ops load_file,...]
                            [--dir /dev/shm] [--device cuda:0] [--ledger bench/results.jsonl]
                            [--before DIR [--before-commit C]] [--tools zerohop,instanttensor,...]
                            [--time-limit S]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import ledger

SHAPES = ("one", "four", "sixty-four", "small-fp8", "shards")
OPS = ("load_file", "get_slice", "save_file", "checkpoint-save", "checkpoint-load")
TOOLS = {
    "load_file": ("zerohop", "instanttensor"),
    "get_slice": ("zerohop", "safetensors"),
    "save_file": ("zerohop", "safetensors", "torch.save", "raw-1-file", "raw-1-file-mapped", "raw-16-files"),
    "checkpoint-save": ("zerohop", "torch.save", "raw-16-files"),
    "checkpoint-load": ("zerohop", "torch.load"),
}
# zerohop built from another commit (--before), measured as a peer.
BEFORE = "zerohop-before"
# Raw writes are the limit a save is judged against, not a peer.
LIMITS = ("raw-1-file", "raw-1-file-mapped", "raw-16-files", "pinned-h2d")
WORST_OVER_BEST = 0.85


def parse_size(text: str) -> int:
    units = {"gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "g": 1 << 30, "m": 1 << 20, "k": 1 << 10}
    t = text.strip().lower()
    for u, mult in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * mult)
    return int(t)


def layout(shape: str, size: int) -> list:
    """The shape as files of tensors: [[(name, dtype, bytes), ...], ...]."""
    def even(prefix: str, count: int) -> list:
        each = size // count // 4096 * 4096
        return [(f"{prefix}{i}", "bfloat16", each) for i in range(count)]

    if shape == "one":
        return [even("weight.", 1)]
    if shape == "four":
        return [even("layer.", 4)]
    if shape == "sixty-four":
        return [even("layer.", 64)]
    if shape == "small-fp8":
        count = 3280
        unit = max(4096, size // (count * 5 // 2) // 4096 * 4096)
        return [[(f"expert.{i}", "float8_e4m3fn", unit * (1 + i % 4)) for i in range(count)]]
    if shape == "shards":
        per = size // 4 // 16 // 4096 * 4096
        return [[(f"shard{s}.layer.{i}", "bfloat16", per) for i in range(16)] for s in range(4)]
    raise ValueError(shape)


# --- the child: one fresh process, one timed call ---------------------------

def make_tensors(torch, device: str, files: list, seed: int) -> list:
    """The shape's tensors, from `seed`: the same bytes in every process."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for tensors in files:
        state = {}
        for name, dtype, n in tensors:
            raw = torch.randint(0, 256, (n,), generator=g, device=device, dtype=torch.uint8)
            t = raw.view(getattr(torch, dtype))
            cols = 4096 // t.element_size() if t.numel() % (4096 // t.element_size()) == 0 else 1
            state[name] = t.view(-1, cols)
        out.append(state)
    return out


def same(torch, got, want) -> bool:
    return got.shape == want.shape and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def raw_write(data, target: str, files: int) -> None:
    """`data` (host bytes) written by 16 threads into `files` files under
    `target` (a path prefix), then fsync'd: what a writer that knows only
    the bytes gets from the file system."""
    threads, chunk = 16, 4 << 20
    view = memoryview(data)
    per_file = -(-len(view) // files)
    fds = [os.open(f"{target}.{k}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for k in range(files)]

    def work(t: int) -> None:
        k = t % files
        sharing = threads // files
        base = k * per_file
        end = min(len(view), base + per_file)
        for at in range(base + (t // files) * chunk, end, sharing * chunk):
            os.pwrite(fds[k], view[at:min(at + chunk, end)], at - base)

    ws = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    for fd in fds:
        os.fsync(fd)
        os.close(fd)


MADV_POPULATE_WRITE = 23  # Linux 5.14


def raw_mapped_write(data: bytearray, path: str) -> None:
    """`data` copied by 16 threads into a shared mapping of one file, each
    4 MiB's pages made present first (MADV_POPULATE_WRITE), then fsync'd.
    Writes through the mapping take no file lock (bench/probe/
    write_and_pin.c); ctypes' memmove and madvise run without the GIL."""
    threads, chunk, n = 16, 4 << 20, len(data)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, n)
        mm = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        dst_buf, src_buf = (ctypes.c_char * n).from_buffer(mm), (ctypes.c_char * n).from_buffer(data)
        dst, src = ctypes.addressof(dst_buf), ctypes.addressof(src_buf)
        errors = []

        def work(t: int) -> None:
            for at in range(t * chunk, n, threads * chunk):
                m = min(chunk, n - at)
                if libc.madvise(dst + at, m, MADV_POPULATE_WRITE) != 0:
                    errors.append(os.strerror(ctypes.get_errno()))
                    return
                ctypes.memmove(dst + at, src + at, m)

        ws = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in ws:
            w.start()
        for w in ws:
            w.join()
        del dst_buf, src_buf
        mm.close()
        if errors:
            raise OSError(f"madvise(MADV_POPULATE_WRITE): {errors[0]}")
        os.fsync(fd)
    finally:
        os.close(fd)


def child(spec: dict) -> dict:
    import torch

    device, op, tool, files = spec["device"], spec["op"], spec["tool"], spec["files"]
    # The build before a change runs as zerohop does, found first on the
    # child's path (see run_child).
    tool = "zerohop" if tool == BEFORE else tool
    if device.startswith("cuda"):
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    target = spec["target"]
    if op == "make":
        import safetensors.torch

        for path, state in zip(spec["paths"], make_tensors(torch, device, files, spec["seed"])):
            safetensors.torch.save_file(state, path)
        return {}
    if op == "pinned-h2d":
        host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty_like(host, device=device)
        dev.copy_(host, non_blocking=True)
        sync()
        best = min(timed(lambda: (dev.copy_(host, non_blocking=True), sync())) for _ in range(5))
        return {"seconds": best, "bytes": host.numel()}
    def expected() -> dict:
        want = make_tensors(torch, device, files, spec["seed"])
        sync()
        return {k: v for state in want for k, v in state.items()}

    if op in ("save_file", "checkpoint-save"):
        # A saver has its tensors before it calls.
        flat = expected()
        nbytes = sum(t.numel() * t.element_size() for t in flat.values())
        seconds = save(torch, op, tool, flat, target, sync)
        return {"seconds": seconds, "bytes": nbytes, "ok": check_saved(torch, op, tool, flat, target)}
    # A loader's first call comes first; what it should have given is made
    # after the clock stops.
    if op == "load_file":
        seconds, got = load(torch, tool, spec["paths"], device, sync)
        if os.environ.get("ZEROHOP_MATRIX_CORRUPT") and tool == "zerohop":
            next(iter(got.values())).view(torch.uint8).view(-1)[0] ^= 1  # the tests' check of the check
    elif op == "get_slice":
        # A tensor-parallel rank's read: the first half of every tensor's rows.
        seconds, got = get_slices(tool, spec["paths"], device, sync)
    elif op == "checkpoint-load":
        seconds, got = checkpoint_load(torch, tool, target, device, sync)
    else:
        raise ValueError(op)
    flat = expected()
    if op == "get_slice":
        flat = {k: v[:max(1, v.shape[0] // 2)] for k, v in flat.items()}
    nbytes = sum(t.numel() * t.element_size() for t in flat.values())
    # InstantTensor's tensors are views of its ring buffer, reused as it
    # goes (its copy=False mode): their bytes cannot be checked after.
    ok = None if tool == "instanttensor" else (
        len(got) == len(flat) and all(same(torch, got[k], flat[k]) for k in flat))
    return {"seconds": seconds, "bytes": nbytes, "ok": ok if ok is None else bool(ok)}


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def load(torch, tool: str, paths: list, device: str, sync):
    t = time.perf_counter()
    if tool == "zerohop":
        import zerohop

        got = zerohop.load_file(paths, device=device)
        sync()
        return time.perf_counter() - t, got
    import instanttensor

    got = {}
    with instanttensor.safe_open(paths, framework="pt", device=device, copy=False) as f:
        for name, x in f.tensors():
            got[name] = x.shape
    sync()
    return time.perf_counter() - t, got


def get_slices(tool: str, paths: list, device: str, sync):
    t = time.perf_counter()
    if tool == "zerohop":
        from zerohop import safe_open
    else:
        from safetensors import safe_open
    parts = {}
    for path in paths:
        with safe_open(path, framework="pt", device=device) as f:
            for name in f.keys():
                s = f.get_slice(name)
                parts[name] = s[:max(1, s.get_shape()[0] // 2)]
    sync()
    return time.perf_counter() - t, parts


def save(torch, op: str, tool: str, flat: dict, target: str, sync) -> float:
    if tool.startswith("raw-"):
        blob = torch.cat([t.reshape(-1).view(torch.uint8).cpu() for t in flat.values()]).numpy()
        blob = bytearray(blob.tobytes())  # host bytes, touched before the clock
        if tool == "raw-1-file-mapped":
            return timed(lambda: raw_mapped_write(blob, target))
        return timed(lambda: raw_write(blob, target, 1 if tool == "raw-1-file" else 16))
    if tool == "torch.save":
        return timed(lambda: torch.save(flat, target))
    if op == "checkpoint-save":
        import zerohop.checkpoint

        return timed(lambda: zerohop.checkpoint.save(flat, target))
    if tool == "safetensors":
        import safetensors.torch

        return timed(lambda: safetensors.torch.save_file(flat, target))
    import zerohop

    return timed(lambda: zerohop.save_file(flat, target))


def check_saved(torch, op: str, tool: str, flat: dict, target: str) -> bool:
    if tool.startswith("raw-"):
        return None  # a limit, not a format
    if tool == "torch.save":
        back = torch.load(target, map_location="cpu")
    elif op == "checkpoint-save":
        return None  # read back by the checkpoint-load child, which checks
    else:
        import safetensors.torch

        back = safetensors.torch.load_file(target)
    return all(same(torch, back[k], flat[k].cpu()) for k in flat)


def checkpoint_load(torch, tool: str, target: str, device: str, sync):
    t = time.perf_counter()
    if tool == "zerohop":
        import zerohop.checkpoint

        got = zerohop.checkpoint.load(target, device=device)
    else:
        got = torch.load(target, map_location=device)
    sync()
    return time.perf_counter() - t, got


# --- the parent --------------------------------------------------------------

CHILD_TIMEOUT = 300


def run_child(spec: dict, before: str = "") -> dict:
    # The spec on standard input: thousands of tensors do not fit in argv.
    env = None
    if spec["tool"] == BEFORE:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (before, os.environ.get("PYTHONPATH")) if p))
    try:
        out = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(spec), capture_output=True,
                             text=True, timeout=CHILD_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer in {CHILD_TIMEOUT} s"}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(op: str, shape: str, tool: str, r: int, got: dict) -> None:
    """One line per timed call, as it comes."""
    if "error" in got:
        print(f"  {op} {shape} {tool} round {r}: ERROR {got['error']}", flush=True)
        return
    ok = {True: "bytes checked", False: "BYTES DIFFER", None: "bytes not checkable"}[got.get("ok")]
    print(f"  {op} {shape} {tool} round {r}: {gbps(got):.2f} GB/s ({got['seconds']:.3f} s), {ok}", flush=True)


@functools.lru_cache(maxsize=None)
def installed(tool: str) -> bool:
    module = {"instanttensor": "instanttensor", "safetensors": "safetensors"}.get(tool)
    if module is None:
        return True
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    for p in [path] + [f"{path}.{k}" for k in range(16)]:
        if os.path.isfile(p):
            os.remove(p)


def measure_round(args, op: str, shape: str, tools: list, paths: list, seed: int, r: int, rows: dict) -> None:
    """Round `r` of every tool on one shape, tools in an order that rotates
    with the round; each sample goes to `rows[(op, tool)]`."""
    files = layout(shape, args.size)
    order = tools[r % len(tools):] + tools[:r % len(tools)]
    # Peers and limits may take fewer rounds (--peer-rounds): the slow
    # saves of 8 GiB take most of a run otherwise.
    order = [t for t in order if t in ("zerohop", BEFORE) or r < args.peer_rounds]
    for tool in order:
        target = os.path.join(args.dir, f"zerohop-matrix-{shape}-{tool}-{r}")
        ext = {"zerohop": ".safetensors", BEFORE: ".safetensors", "safetensors": ".safetensors",
               "torch.save": ".pt"}.get(tool, "")
        spec = {"device": args.device, "op": op, "tool": tool, "files": files, "paths": paths,
                "seed": seed, "target": target + ext}
        if op == "checkpoint-save":
            spec["target"] = target + ext if tool not in ("zerohop", BEFORE) else target
            got = run_child(spec, args.before)
            # The restore, in a fresh process of its own, right after.
            load_tool = {"zerohop": "zerohop", BEFORE: BEFORE, "torch.save": "torch.load"}.get(tool)
            if load_tool and "error" not in got:
                back = run_child({**spec, "op": "checkpoint-load", "tool": load_tool}, args.before)
                show("checkpoint-load", shape, load_tool, r, back)
                rows.setdefault(("checkpoint-load", load_tool), []).append(back)
                got["ok"] = back.get("ok", False)
        else:
            got = run_child(spec, args.before)
        show(op, shape, tool, r, got)
        rows.setdefault((op, tool), []).append(got)
        remove(spec["target"])


def remove_files(paths: dict) -> None:
    """Every shape's files."""
    for each in paths.values():
        for p in each:
            remove(p)


def gbps(x: dict) -> float:
    return x["bytes"] / x["seconds"] / 1e9 if "seconds" in x and x["seconds"] > 0 else 0.0


def summary(samples: list) -> dict:
    good = [gbps(x) for x in samples if "error" not in x]
    errors = [x["error"] for x in samples if "error" in x]
    wrong = sum(1 for x in samples if x.get("ok") is False)
    return {"best": max(good, default=0.0), "median": statistics.median(good) if good else 0.0,
            "seconds": min((x["seconds"] for x in samples if "seconds" in x), default=None),
            "errors": errors, "wrong": wrong, "n": len(samples)}


def report(op: str, table: dict, limits: dict) -> tuple:
    """Prints one operation's table; returns (worst over best, failures)."""
    tools = [t for t in tool_list(op, True) if any(table[s].get(t) for s in table)]
    print(f"\n== {op} (GB/s, best / median of each tool's rounds; first call in a fresh process)")
    head = f"{'shape':<12}" + "".join(f"{t:>22}" for t in tools)
    if op in ("load_file", "get_slice") and "pinned-h2d" in limits:
        head += f"{'zerohop / H2D':>15}"
    peers = [t for t in tools if t != "zerohop" and t not in LIMITS]
    for p in peers:
        head += f"{'zerohop / ' + p:>24}"
    if any(t in LIMITS for t in tools):
        head += "".join(f"{'zerohop / ' + t:>29}" for t in tools if t in LIMITS)
    print(head)
    failures, best_of = [], {}
    for shape, cols in table.items():
        line = f"{shape:<12}"
        s = {t: summary(cols[t]) for t in tools if cols.get(t)}
        for t in tools:
            if t not in s:
                line += f"{'-':>22}"
                continue
            x = s[t]
            mark = " WRONG" if x["wrong"] else (" ERR" if x["errors"] else "")
            line += f"{x['best']:>12.2f} / {x['median']:<6.2f}{mark:>2}"
            if x["wrong"]:
                failures.append(f"{op} {shape} {t}: bytes differ")
            if x["errors"]:
                failures.append(f"{op} {shape} {t}: {x['errors'][0]}")
        z = s.get("zerohop", {}).get("best", 0.0)
        best_of[shape] = z
        if op in ("load_file", "get_slice") and "pinned-h2d" in limits:
            line += f"{z / limits['pinned-h2d']:>15.2f}"
        for p in peers:
            line += f"{(z / s[p]['best']) if p in s and s[p]['best'] else float('nan'):>24.2f}"
        for t in tools:
            if t in LIMITS:
                line += f"{(z / s[t]['best']) if t in s and s[t]['best'] else float('nan'):>29.2f}"
        print(line)
    rated = [v for v in best_of.values() if v > 0]
    ratio = min(rated) / max(rated) if rated else 0.0
    worst = min(best_of, key=best_of.get) if rated else "-"
    print(f"zerohop's worst shape ({worst}) over its best: {ratio:.2f} (target >= {WORST_OVER_BEST})")
    return ratio, failures


def tool_list(op: str, before: bool) -> list:
    """`op`'s tools: zerohop, the build before a change where `before`, its
    peers and limits."""
    return ["zerohop"] + ([BEFORE] if before else []) + list(TOOLS[op][1:])


def picked(tool: str, names: list) -> bool:
    """Whether `--tools` names `tool`: by its own name, or by its group
    ("peers": every other loader or writer; "limits": raw writes and
    pinned copies)."""
    group = "zerohop" if tool in ("zerohop", BEFORE) else "limits" if tool in LIMITS else "peers"
    return tool in names or (group != "zerohop" and group in names)


def ledger_line(args, figure: str, value: float, command: str) -> dict:
    return ledger.line(args.commit, args.machine, command, figure, value)


def write_ledger(args, lines: list, on_gpu: bool) -> None:
    """Appends figures to the ledger: measured on a GPU only (host memory
    runs check bytes, not speed)."""
    if on_gpu:
        ledger.append(args.ledger, lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="8GiB", help="bytes of every shape (8GiB; CI: 64MiB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer-rounds", type=int, help="rounds of peers and limits (default: --rounds)")
    ap.add_argument("--time-limit", type=float, help="start no round after this many seconds (the first always "
                    "runs); the tables hold the rounds that ran")
    ap.add_argument("--ops", default=",".join(OPS[:-1]), help=f"of {','.join(OPS[:-1])} (checkpoint-save "
                    "includes checkpoint-load)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--dir", default="/dev/shm", help="where files are made and saved (a tmpfs: hot)")
    ap.add_argument("--device", default="cuda:0", help="cuda:N, or cpu (host memory; what CI runs)")
    ap.add_argument("--ledger", help="append every figure to this results ledger (JSON lines)")
    ap.add_argument("--machine", default=os.uname().nodename)
    ap.add_argument("--commit", help="the commit measured (default: git's HEAD)")
    ap.add_argument("--json-out")
    ap.add_argument("--before", default="", help="a directory holding another build's zerohop package, measured "
                    f"beside this one as {BEFORE!r}")
    ap.add_argument("--before-commit", help="the commit --before was built from, for the ledger's figures")
    ap.add_argument("--tools", help="only these tools, comma-separated: names (zerohop, zerohop-before, safetensors, raw-16-files, ...) or the groups peers and limits")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.load(sys.stdin))))
        return
    args.size = parse_size(args.size)
    args.peer_rounds = args.rounds if args.peer_rounds is None else args.peer_rounds
    ops = [o for o in args.ops.split(",") if o]
    shapes = [s for s in args.shapes.split(",") if s]
    for o in ops:
        if o not in OPS[:-1]:
            raise SystemExit(f"unknown operation {o!r}: one of {', '.join(OPS[:-1])}")
    results, failures, lines = {}, [], []
    command = "python3 bench/matrix.py " + " ".join(sys.argv[1:])
    on_gpu = args.device.startswith("cuda")
    limits = {}
    if on_gpu and {"load_file", "get_slice"} & set(ops):
        h2d = run_child({"device": args.device, "op": "pinned-h2d", "tool": "-", "files": [], "target": ""})
        if "error" not in h2d:
            limits["pinned-h2d"] = gbps(h2d)
            print(f"pinned host-to-device copies: {limits['pinned-h2d']:.2f} GB/s")
            lines.append(ledger_line(args, "pinned host-to-device copies GB/s (best of 5)", limits["pinned-h2d"],
                                     command))
    # Only reads need the shapes' files, all made before the first round:
    # saves make their tensors from the seed (8 GiB of files take 12 - 14 s
    # to make on the GPU machine).
    reads = bool({"load_file", "get_slice"} & set(ops))
    seeds = {shape: seed for seed, shape in enumerate(shapes, start=1)}
    paths = {}
    for shape, seed in seeds.items():
        files = layout(shape, args.size)
        paths[shape] = [os.path.join(args.dir, f"zerohop-matrix-{shape}-{k}.safetensors") for k in range(len(files))]
        about = f"{shape}: {sum(len(f) for f in files)} tensors in {len(files)} file(s)"
        if reads:
            t = time.perf_counter()
            made = run_child({"device": args.device, "op": "make", "tool": "-", "files": files,
                              "paths": paths[shape], "seed": seed, "target": ""})
            if "error" in made:
                remove_files(paths)
                raise SystemExit(f"cannot make the {shape} files: {made['error']}")
            about += f", made in {time.perf_counter() - t:.1f} s"
        print(about, flush=True)
    tools = {}
    for op in ops:
        tools[op] = [t for t in tool_list(op, bool(args.before)) if installed(t) and (on_gpu or t != "instanttensor")]
        if args.tools:
            tools[op] = [t for t in tools[op] if picked(t, args.tools.split(","))]
    # Every shape in each round, in an order that rotates with the round:
    # the machine's drift over a run (a memory file system writes 25 GB/s
    # in one minute, 30 in the next) falls on every shape alike, not on
    # the shapes that came last.
    rows = {shape: {} for shape in shapes}
    started = time.monotonic()
    try:
        for r in range(args.rounds):
            if r and args.time_limit and time.monotonic() - started > args.time_limit:
                print(f"time limit ({args.time_limit:.0f} s): {r} of {args.rounds} rounds ran", flush=True)
                break
            for shape in shapes[r % len(shapes):] + shapes[:r % len(shapes)]:
                for op in ops:
                    measure_round(args, op, shape, tools[op], paths[shape], seeds[shape], r, rows[shape])
    finally:
        remove_files(paths)
    for shape in shapes:
        for (o, t), samples in rows[shape].items():
            results.setdefault(o, {}).setdefault(shape, {})[t] = samples
            s = summary(samples)
            if s["best"]:
                # The build before a change by its commit, where given.
                name = f"zerohop at {args.before_commit}" if t == BEFORE and args.before_commit else t
                lines.append(ledger_line(args, f"{o} {shape} {name} GB/s (best of {s['n']})", s["best"], command))
                lines.append(ledger_line(args, f"{o} {shape} {name} GB/s (median of {s['n']})", s["median"],
                                         command))
    verdicts = {}
    for op in [o for o in OPS if o in results]:
        ratio, bad = report(op, results[op], limits)
        verdicts[op] = ratio
        failures += bad
        lines.append(ledger_line(args, f"{op} zerohop worst shape / best shape", ratio, command))
    write_ledger(args, lines, on_gpu)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"size": args.size, "limits": limits, "results": results}, f)
    low = [op for op, r in verdicts.items() if r < WORST_OVER_BEST]
    if failures:
        print("\nFAILED: " + "; ".join(failures))
        sys.exit(1)
    if on_gpu and low:
        print(f"\nFAILED: worst shape under {WORST_OVER_BEST} x the best for: {', '.join(low)}")
        sys.exit(1)
    print(f"\nmatrix: {len(results)} operations x {len(shapes)} shapes ran; every byte checked")


if __name__ == "__main__":
    main()
