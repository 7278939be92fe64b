"""GPU memory of a PyTorch process to storage and back, zerohop against the
driver's process checkpoint and torch_memory_saver, same run.

Every row is a fresh process holding SIZE GiB of GPU tensors (256 MiB each,
or --tensor-mib: one tensor of SIZE GiB is the shape of a KV cache or a
flat optimizer buffer) that pauses and resumes twice; the row's times are what its user waits
for, the first call's apart from the second's (warm), and each resume is checked against a
digest of every tensor. With --mlp, the process also holds a bf16 MLP whose
forward pass is captured as a CUDA graph; every check replays the graph and
compares its output with the one before the first pause:

  zerohop         zerohop.suspend(dir) (durable checkpoint) / resume(dir),
                  called inside the process
  checkpoint-process  `zerohop checkpoint-process PID DIR` / `restore-process`
                  from outside (the process serves zerohop.serve_suspend)
  preload         the same, for a process that knows nothing of zerohop,
                  run with libzerohop_preload.so preloaded: all its
                  cudaMalloc'd memory suspendable; a thread of it
                  synchronizes every millisecond (its quiet points)
  preload-suspend `zerohop suspend PID DIR` / `zerohop resume PID DIR` of
                  that process: its memory only, its CUDA context stays
  driver          cuCheckpointProcessLock + Checkpoint / Restore + Unlock
                  from outside: what `cuda-checkpoint --toggle` does, to the
                  process's host RAM only (nothing durable)
  tms-cpu         torch_memory_saver pause/resume, pinned host backup
  tms-disk        torch_memory_saver pause/resume, disk backup (disk only)

With --reuse, another process takes the GPU memory the paused process
freed, writes it and frees it again before every resume: what a server's
sleep mode meets, where the GPU serves someone else in between.

plus the raw write and read rates of each directory (`zerohop bench
checkpoint`; on disk one round per row, 8 GiB for the raw rates). For each
row: GPU memory the process holds while paused (nvidia-smi) and the host
memory it gained.

  python3 bench/suspend.py --zerohop target/release/zerohop [--size-gib 16] [--tensor-mib 256]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import ledger
from lab_binary import lab_binary

# Rows whose process knows nothing of zerohop: libzerohop_preload.so serves it.
PRELOADED = ("preload", "preload-suspend")

# --- the child: a process holding the tensors -----------------------------

def child(mode: str, size_gib: int, tensor_mib: int, disk_dir: str, mlp: bool) -> None:
    import torch

    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmRSS:"))

    def make() -> list:
        g = torch.Generator(device="cuda").manual_seed(7)
        tensor = tensor_mib << 20
        made = [torch.randn(tensor // 4, generator=g, device="cuda") for _ in range(size_gib * (1 << 30) // tensor)]
        if mlp:  # four 4096 x 4096 bf16 layers and their input
            made += [torch.randn(4096, 4096, generator=g, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(4)]
            made.append(torch.randn(64, 4096, generator=g, device="cuda", dtype=torch.bfloat16))
        return made

    tms = server = None
    if mode in ("zerohop", "checkpoint-process"):
        import zerohop

        with zerohop.suspendable() as pool:
            tensors = make()
        server = zerohop.serve_suspend() if mode == "checkpoint-process" else None
    elif mode.startswith("tms"):
        from torch_memory_saver import torch_memory_saver as tms

        tms.hook_mode = "torch"
        if mode == "tms-disk":
            tms.set_disk_backup_dir(os.path.join(disk_dir, "zerohop-bench-tms-disk"))
        with tms.region(enable_cpu_backup=mode == "tms-cpu", enable_disk_backup=mode == "tms-disk"):
            tensors = make()
    else:
        tensors = make()
    torch.cuda.synchronize()
    graph = captured(torch, tensors[-5:]) if mlp else None
    stop = threading.Event()
    stepper = threading.Thread(target=quiet_points, args=(torch, stop))
    if mode in PRELOADED:  # after the capture, which a synchronize would break
        stepper.start()

    def digest() -> list:
        out = [int(t.view(torch.int64).sum()) for t in tensors]
        if graph is not None:
            g, y = graph
            g.replay()
            out.append(int(y.view(torch.int16).to(torch.int64).sum()))
        return out

    want = digest()
    backing = None  # seconds zerohop's resume spent getting the memory back
    print(json.dumps({"ready": os.getpid(), "rss": rss()}), flush=True)
    for line in sys.stdin:
        op, *arg = line.split()
        t0 = time.perf_counter()
        if op == "pause":
            torch.cuda.synchronize()
            if tms is not None:
                tms.pause()
            else:
                zerohop.suspend(arg[0])
        elif op == "resume":
            if tms is not None:
                tms.resume()
            else:
                resumed = zerohop.resume(arg[0])
                backing = resumed["backing_seconds"]
                print(f"  resume: {resumed['gbps']:.1f} GB/s via {resumed['path']}", file=sys.stderr)
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        intact = digest() == want if op == "check" else None
        print(json.dumps({"seconds": seconds, "rss": rss(), "intact": intact, "backing_s": backing}), flush=True)
        backing = None
    stop.set()
    if stepper.is_alive():
        stepper.join()
    del server, tensors


def captured(torch, made: list):
    """The MLP's forward pass (`made`: four layers, then the input) as a
    CUDA graph, and its output tensor; the graph's own memory is torch's."""
    *layers, x = made

    def forward():
        y = x
        for w in layers:
            y = torch.relu(y @ w)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # cuBLAS's workspace, before capture
        forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = forward()
    torch.cuda.synchronize()
    return graph, y


def quiet_points(torch, stop) -> None:
    """A thread that synchronizes every millisecond, as a serving loop's
    steps would: the preloaded library's quiet points."""
    while not stop.is_set():
        torch.cuda.synchronize()
        time.sleep(0.001)


# --- the parent ------------------------------------------------------------

class Child:
    def __init__(self, mode: str, args) -> None:
        env = {**os.environ, "LD_PRELOAD": args.preload} if mode in PRELOADED else None
        self.p = subprocess.Popen([sys.executable, __file__, "--child", mode, "--size-gib", str(args.size_gib),
                                   "--tensor-mib", str(args.tensor_mib), "--disk", args.disk]
                                  + (["--mlp"] if args.mlp else []), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        ready = self.reply()
        self.pid, self.rss0 = ready["ready"], ready["rss"]

    def reply(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"the child process ended (exit {self.p.wait()})")
        return json.loads(line)

    def ask(self, *words) -> dict:
        self.p.stdin.write(" ".join(map(str, words)) + "\n")
        self.p.stdin.flush()
        return self.reply()

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmRSS:"))

    def gpu_mib(self) -> int:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return sum(int(m) for p, m in (l.split(", ") for l in out.splitlines() if l) if int(p) == self.pid)

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=120)


class DriverCheckpoint:
    """The driver's process checkpoint, called from this process."""

    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.call("cuInit", 0)

    def call(self, name: str, *args) -> None:
        status = getattr(self.cuda, name)(*args)
        if status:
            raise RuntimeError(f"{name}: CUDA error {status}")

    def pause(self, pid: int) -> None:
        self.call("cuCheckpointProcessLock", pid, None)
        self.call("cuCheckpointProcessCheckpoint", pid, None)

    def resume(self, pid: int) -> None:
        self.call("cuCheckpointProcessRestore", pid, None)
        self.call("cuCheckpointProcessUnlock", pid, None)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def use_freed_memory(size_gib: int) -> None:
    """Another process takes `size_gib` GiB of GPU memory, writes all of it
    and exits: the memory a paused process freed has served someone else."""
    code = ("import torch; x = torch.empty(%d << 30, dtype=torch.uint8, device='cuda'); "
            "x.fill_(0x5a); torch.cuda.synchronize()" % size_gib)
    subprocess.run([sys.executable, "-c", code], check=True)


def actions(mode: str, c: Child, d: str, zerohop: str, driver: DriverCheckpoint):
    """The row's pause and resume of process `c` to and from `d`; the
    resume returns what zerohop says of its parts: the seconds spent getting
    the memory back (`backing_s`, in the process), or those the command
    says the resume took (`served_s`; `driver_s`, the driver's part)."""
    if mode in ("checkpoint-process", *PRELOADED):
        def cli(verb: str) -> dict:
            out = subprocess.run([zerohop, verb, str(c.pid), d], check=True, capture_output=True, text=True).stdout
            if verb not in ("resume", "restore-process"):
                return {}
            said = {}
            for key, pattern in (("served_s", r" in ([0-9.]+) s\b"), ("driver_s", r"\(driver ([0-9.]+) s")):
                found = re.search(pattern, out)
                if found:
                    said[key] = float(found.group(1))
            return said

        pause, resume = (("suspend", "resume") if mode == "preload-suspend"
                         else ("checkpoint-process", "restore-process"))
        return lambda: cli(pause), lambda: cli(resume)
    if mode == "driver":
        return lambda: driver.pause(c.pid), lambda: driver.resume(c.pid) or {}
    return lambda: c.ask("pause", d), lambda: {"backing_s": c.ask("resume", d)["backing_s"]}


def run_row(mode: str, where: str, target: str, args, driver: DriverCheckpoint, rounds: int) -> dict:
    """Pause/resume rounds of a fresh process, each to a fresh dir."""
    c = Child("plain" if mode == "driver" else mode, args)
    gpu_before = c.gpu_mib()
    done = []
    for r in range(rounds):
        d = os.path.join(target, f"zerohop-suspend-{mode}-{r}")
        do_pause, do_resume = actions(mode, c, d, args.zerohop, driver)
        rss = c.rss()
        t0 = time.perf_counter()
        do_pause()
        pause = time.perf_counter() - t0
        held_gpu, gained = c.gpu_mib(), c.rss() - rss
        if where == "disk":
            drop_caches()  # the resume reads the disk, not the page cache
        if args.reuse:
            use_freed_memory(args.size_gib)
        t0 = time.perf_counter()
        parts = do_resume()
        resume = time.perf_counter() - t0
        intact = c.ask("check")["intact"]
        done.append({"pause_s": pause, "resume_s": resume, "gpu_mib_paused": held_gpu,
                     "host_gained_bytes": gained, "intact": intact, **parts})
        shutil.rmtree(d, ignore_errors=True)
    c.close()
    shutil.rmtree(os.path.join(args.disk, "zerohop-bench-tms-disk"), ignore_errors=True)
    return {"mode": mode, "where": where, "gpu_mib_running": gpu_before, "rounds": done}


def raw_rates(zerohop: str, target: str, size_gib: int) -> dict:
    out = subprocess.run([lab_binary(zerohop), "checkpoint", "--size", f"{size_gib}GiB", "--dir", target, "--json"],
                         capture_output=True, text=True, check=True).stdout
    b = json.loads(out)
    return {"raw_write_gbps": max(r["gbps"] for r in b["raw_write_from_ram"]),
            "raw_read_gbps": max(r["gbps"] for r in b["raw_read"])}


def resume_note(row: dict) -> str:
    """What zerohop said of the first resume's parts."""
    said = row["rounds"][0]
    if said.get("backing_s") is not None:
        return f"  (first resume: {said['backing_s']:.3f} s getting the memory back)"
    if "served_s" in said:
        driver = f", the driver {said['driver_s']:.2f} s of it" if "driver_s" in said else ""
        return f"  (first resume: {said['served_s']:.2f} s as zerohop timed it{driver})"
    return ""


def report(rows: list, limits: dict, size: int) -> None:
    gb = size / 1e9
    driver = {r["where"]: r for r in rows if r["mode"] == "driver"}.get("tmpfs")
    first = lambda r, k: r["rounds"][0][k]  # noqa: E731
    warm = lambda r, k: min(x[k] for x in r["rounds"][1:]) if len(r["rounds"]) > 1 else float("nan")  # noqa: E731
    for where in ("tmpfs", "disk"):
        lim = limits.get(where)
        if lim:
            print(f"\n{where}: raw write {lim['raw_write_gbps']:.2f} GB/s ({gb / lim['raw_write_gbps']:.2f} s), "
                  f"raw read {lim['raw_read_gbps']:.2f} GB/s ({gb / lim['raw_read_gbps']:.2f} s) for {gb:.2f} GB")
        print("first call in the process; warm: the best later call")
        print(f"{'row':<20} {'pause s':>8} {'resume s':>9} {'GB/s':>11} {'warm pause':>11} {'warm resume':>12}"
              f" {'GPU MiB':>15} {'host gained':>12} {'vs driver':>16}  verified")
        for r in (r for r in rows if r["where"] == where):
            p, s = first(r, "pause_s"), first(r, "resume_s")
            vs = (f"{first(driver, 'pause_s') / p:5.1f}x/{first(driver, 'resume_s') / s:4.1f}x"
                  if driver else "-")
            gpu = f"{r['gpu_mib_running']}->{max(x['gpu_mib_paused'] for x in r['rounds'])}"
            host = max(x["host_gained_bytes"] for x in r["rounds"]) / (1 << 20)
            ok = all(x["intact"] for x in r["rounds"])
            print(f"{r['mode']:<20} {p:8.3f} {s:9.3f} {gb / p:5.1f}/{gb / s:5.1f}"
                  f" {warm(r, 'pause_s'):11.3f} {warm(r, 'resume_s'):12.3f} {gpu:>15} {host:9.0f} MiB"
                  f" {vs:>16}  {'yes' if ok else 'NO'}{resume_note(r)}")


def ledger_lines(args, rows: list, limits: dict) -> list:
    """Each row's first and warm pause and resume, its ratios to the
    driver's, and the raw rates, as lines of the results ledger."""
    command = "python3 bench/suspend.py " + " ".join(sys.argv[1:])
    shape = "one tensor" if args.tensor_mib << 20 >= args.size_gib << 30 else f"{args.tensor_mib} MiB tensors"
    driver = next((r for r in rows if r["mode"] == "driver" and r["where"] == "tmpfs"), None)
    lines = []

    def add(figure: str, value: float) -> None:
        lines.append(ledger.line(args.commit, args.machine, command, figure, value))

    for where, lim in limits.items():
        add(f"{where} raw write GB/s {args.size_gib} GiB (suspend.py)", lim["raw_write_gbps"])
        add(f"{where} raw read GB/s {args.size_gib} GiB (suspend.py)", lim["raw_read_gbps"])
    for r in rows:
        name = f"suspend {args.size_gib} GiB {shape}, {r['mode']} row" + (", to disk" if r["where"] == "disk" else "")
        first, later = r["rounds"][0], r["rounds"][1:]
        for step in ("pause", "resume"):
            add(f"{name}, first {step} s", first[f"{step}_s"])
            if later:
                add(f"{name}, warm {step} s (best later call)", min(x[f"{step}_s"] for x in later))
            if driver and r is not driver and r["where"] == "tmpfs":
                add(f"{name}, first {step}: the driver's over this", driver["rounds"][0][f"{step}_s"] / first[f"{step}_s"])
        if "served_s" in first:
            add(f"{name}, first resume as zerohop timed it s", first["served_s"])
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zerohop", default="target/release/zerohop", help="the zerohop binary")
    ap.add_argument("--size-gib", type=int, default=16)
    ap.add_argument("--tensor-mib", type=int, default=256, help="bytes of each tensor (the shape), in MiB")
    ap.add_argument("--tmpfs", default="/dev/shm")
    ap.add_argument("--disk", default="/var/tmp")
    ap.add_argument("--preload", help="libzerohop_preload.so (default: beside --zerohop)")
    ap.add_argument("--rows", default="driver,zerohop,checkpoint-process,preload,preload-suspend,tms-cpu",
                    help="tmpfs rows, in order (disk: zerohop and tms-disk)")
    ap.add_argument("--no-disk", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="another process uses the freed GPU memory before each resume")
    ap.add_argument("--mlp", action="store_true", help="the process also runs a bf16 MLP captured as a CUDA graph")
    ap.add_argument("--json-out")
    ap.add_argument("--ledger", help="append every figure to this results ledger (JSON lines)")
    ap.add_argument("--machine", default=os.uname().nodename, help="the machine, for the ledger")
    ap.add_argument("--commit", help="the commit measured, for the ledger (default: git's HEAD)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.size_gib, args.tensor_mib, args.disk, args.mlp)
    args.preload = args.preload or os.path.join(os.path.dirname(os.path.abspath(args.zerohop)), "libzerohop_preload.so")
    if shutil.which("nvidia-smi") is None:
        print("suspend bench: no NVIDIA GPU here: nothing to measure (it needs a GPU and its driver)")
        return
    driver = DriverCheckpoint()
    limits = {"tmpfs": raw_rates(args.zerohop, args.tmpfs, args.size_gib)}
    rows = [run_row(m, "tmpfs", args.tmpfs, args, driver, 2) for m in args.rows.split(",")]
    if not args.no_disk:
        limits["disk"] = raw_rates(args.zerohop, args.disk, min(args.size_gib, 8))
        rows += [run_row(m, "disk", args.disk, args, driver, 1) for m in ("zerohop", "tms-disk")]
    size = args.size_gib << 30
    report(rows, limits, size)
    ledger.append(args.ledger, ledger_lines(args, rows, limits))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"bytes": size, "limits": limits, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
