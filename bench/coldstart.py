"""An inference server's cold start: a fresh start against `zerohop thaw`
of a frozen one, and zerohop's freeze against NVIDIA's flow, same run.

The server is a PyTorch process that loads a GIB GiB bf16 model (`zerohop
gen`) with zerohop.load_file, captures its forward pass (a chain of every
weight matrix, each output normalized) as a CUDA graph, and answers
requests from a spool directory: "infer" replays the graph and answers the
output's SHA-256, "digest" a sum over every weight's bits. It leads its own
session, reads nothing from the terminal and writes to a file: what CRIU
freezes and thaws whole.

Each row is a fresh server (its start timed from the spawn to its first
answer) frozen into a new directory by `zerohop freeze PID DIR` and thawed
by `zerohop thaw DIR` with an "infer" request already waiting:

  zerohop   the server keeps its weights in zerohop's suspendable heap and
            serves zerohop.serve_suspend: the GPU memory goes to storage
            through zerohop, the driver stages only what is left (context,
            graph, PyTorch's own pool), CRIU writes the rest
  nvidia    the same server serving nothing: the driver stages all GPU
            memory in the process's host RAM (what cuda-checkpoint does)
            and CRIU writes it with the rest: NVIDIA's documented flow, with
            zerohop's checksums over CRIU's images on both rows

to tmpfs and to disk (the page cache dropped before a thaw from disk). Per
row: time to durable, time from the thaw's call to the first answer, the
thaw's steps, bytes written, the host memory the freeze added (the
server's and the freezing tools' resident memory at their peak over what
the server held before), whether every answer after the thaw is the one
before, and how long the thawed server takes to exit when told to.

  python3 bench/coldstart.py --zerohop .stage/bin/zerohop [--gib 16]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

# --- the server --------------------------------------------------------------


def serve(spool: str, model: str, mode: str) -> None:
    import contextlib

    import torch

    import zerohop

    lock = threading.Lock()
    heap = zerohop.suspendable() if mode == "zerohop" else contextlib.nullcontext()
    with heap:
        weights = zerohop.load_file(model, device="cuda:0")
        tokens = torch.arange(16, device="cuda:0")
    layers = sorted({int(k.split(".")[2]) for k in weights if k.startswith("model.layers.")})
    F = torch.nn.functional

    def forward():
        y = weights["model.embed_tokens.weight"][tokens]
        for i in layers:
            w = {k.rsplit(".", 2)[-2]: v for k, v in weights.items() if k.startswith(f"model.layers.{i}.")}
            h = F.rms_norm(y, y.shape[-1:], w["input_layernorm"])
            a = (h @ w["q_proj"].t() + h @ w["k_proj"].t() + h @ w["v_proj"].t()) @ w["o_proj"].t()
            y = F.normalize(y + a, dim=-1)
            h = F.rms_norm(y, y.shape[-1:], w["post_attention_layernorm"])
            m = (F.silu(h @ w["gate_proj"].t()) * (h @ w["up_proj"].t())) @ w["down_proj"].t()
            y = F.normalize(y + m, dim=-1)
        return y @ weights["lm_head.weight"].t()

    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()  # warm-up before capture, as CUDA graphs need
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = forward()
    torch.cuda.synchronize()
    server = zerohop.serve_suspend(lock=lock) if mode == "zerohop" else None

    def infer():
        graph.replay()
        return hashlib.sha256(out.reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()

    def digest():
        # In pieces, and the cache emptied after: a verification leaves no
        # blocks behind for a freeze to stage (a whole tensor's int64 sum
        # takes a temporary of 4 times its size).
        total = sum(int(piece.sum(dtype=torch.int64)) for t in weights.values() if t.element_size() == 2
                    for piece in t.view(torch.int16).reshape(-1).split(1 << 22))
        torch.cuda.empty_cache()
        return str(total)

    def answer(name, text):
        tmp = os.path.join(spool, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, os.path.join(spool, name + ".ans"))

    while True:
        for name in sorted(n for n in os.listdir(spool) if n.endswith(".req")):
            path = os.path.join(spool, name)
            with open(path) as f:
                command = f.read().strip()
            os.unlink(path)
            with lock, torch.no_grad():
                if command == "infer":
                    answer(name[:-4], infer())
                elif command == "digest":
                    answer(name[:-4], digest())
                elif command == "stop":
                    answer(name[:-4], "stopping")
                    if server is not None:
                        server.close()
                    sys.exit(0)
        time.sleep(0.001)


# --- the driver of the runs ----------------------------------------------------


def request(spool: str, name: str, command: str) -> None:
    tmp = os.path.join(spool, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(command)
    os.rename(tmp, os.path.join(spool, name + ".req"))


def answer(spool: str, name: str, timeout: float, proc=None) -> str:
    path = os.path.join(spool, name + ".ans")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}): {tail(spool)}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no answer {name} in {timeout} s: {tail(spool)}")
        time.sleep(0.0005)
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    return text


def ask(spool: str, name: str, command: str, timeout: float = 120, proc=None) -> str:
    request(spool, name, command)
    return answer(spool, name, timeout, proc)


def tail(spool: str) -> str:
    with open(os.path.join(spool, "output")) as f:
        return f.read()[-3000:]


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmRSS:"))
    except (FileNotFoundError, StopIteration, ProcessLookupError):
        return 0


def tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            pass
    return found


class PeakMemory:
    """Samples the resident memory of a server and of a tool's process tree
    every 5 ms; the peak of their sum."""

    def __init__(self, server: int):
        self.server, self.tool, self.peak, self.done = server, None, 0, False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done:
            total = rss(self.server) + (sum(rss(p) for p in tree(self.tool)) if self.tool else 0)
            self.peak = max(self.peak, total)
            time.sleep(0.005)

    def stop(self) -> int:
        self.done = True
        self.thread.join()
        return self.peak


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.stat(p).st_blocks * 512
    return total


def gone(pid: int, timeout: float) -> float | None:
    """Seconds until `pid` is gone or a zombie; None past `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return time.monotonic() - start
        except FileNotFoundError:
            return time.monotonic() - start
        time.sleep(0.001)
    return None


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def row(args, flow: str, where: str, base: str, model: str, n: int) -> dict:
    spool = os.path.join(base, f"spool-{n}")
    frozen = os.path.join(base, f"frozen-{n}")
    for stale in (spool, frozen):  # an interrupted run's
        shutil.rmtree(stale, ignore_errors=True)
    os.makedirs(spool)
    out = open(os.path.join(spool, "output"), "w")
    mode = "zerohop" if flow == "zerohop" else "driver"
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", spool, model, mode],
                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    first = ask(spool, "first", "infer", timeout=600, proc=proc)
    fresh = time.perf_counter() - started
    want_digest = ask(spool, "digest", "digest", proc=proc)
    before = rss(proc.pid)

    peak = PeakMemory(proc.pid)
    freezing = time.perf_counter()
    tool = subprocess.Popen([args.zerohop, "freeze", str(proc.pid), frozen, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak.tool = tool.pid
    stdout, stderr = tool.communicate()
    durable = time.perf_counter() - freezing
    peak_rss = peak.stop()
    if tool.returncode != 0:
        proc.kill()
        raise SystemExit(f"zerohop freeze failed: {stderr}")
    manifest = json.loads(stdout)
    proc.wait()  # the dump ended it; its pid must be free for the thaw
    written = du(frozen)
    if where == "disk":
        drop_caches()

    request(spool, "again", "infer")  # waiting when the server comes back
    thawing = time.perf_counter()
    thawed = subprocess.run([args.zerohop, "thaw", frozen, "--json"], capture_output=True, text=True)
    if thawed.returncode != 0:
        raise SystemExit(f"zerohop thaw failed: {thawed.stderr}")
    again = answer(spool, "again", 120)
    back = time.perf_counter() - thawing
    thaw = json.loads(thawed.stdout)
    same_digest = ask(spool, "digest2", "digest") == want_digest
    request(spool, "stop", "stop")
    exit_s = gone(proc.pid, 60)
    if exit_s is None:
        os.kill(proc.pid, 9)
    shutil.rmtree(frozen)
    shutil.rmtree(spool)
    ckpt = manifest.get("gpu_checkpoint") or {}
    return {
        "flow": flow, "where": where, "fresh_start_s": fresh, "durable_s": durable,
        "freeze_gpu_s": manifest["seconds"]["gpu"], "freeze_criu_dump_s": manifest["seconds"]["criu_dump"],
        "freeze_seal_s": manifest["seconds"]["seal"], "thaw_to_answer_s": back, "thaw_s": thaw["seconds"],
        "thaw_check_s": thaw["check_seconds"], "thaw_criu_restore_s": thaw["criu_restore_seconds"],
        "thaw_gpu_s": thaw["gpu_seconds"], "written_bytes": written, "image_bytes": manifest["image_bytes"],
        "zerohop_gpu_bytes": ckpt.get("zerohop_bytes", 0), "driver_staged_bytes": ckpt.get("driver_host_bytes", 0),
        "host_added_bytes": max(0, peak_rss - before), "server_rss_bytes": before,
        "same_answer": again == first, "same_digest": same_digest, "exit_after_thaw_s": exit_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zerohop", default="target/release/zerohop")
    ap.add_argument("--gib", type=int, default=16, help="the model's size (default 16)")
    ap.add_argument("--tmpfs", default="/dev/shm/zerohop-coldstart")
    ap.add_argument("--disk", default="/var/tmp/zerohop-coldstart")
    ap.add_argument("--where", default="tmpfs,disk", help="tmpfs, disk or both (default)")
    ap.add_argument("--json-out")
    ap.add_argument("--serve", nargs=3, metavar=("SPOOL", "MODEL", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    if os.geteuid() != 0:
        raise SystemExit("CRIU needs root: run this as root")
    model = os.path.join(args.tmpfs, "model.safetensors")
    os.makedirs(args.tmpfs, exist_ok=True)
    if not os.path.exists(model):
        subprocess.run([args.zerohop, "gen", "--size", f"{args.gib}GiB", model], check=True,
                       stdout=subprocess.DEVNULL)
    print(f"model: {os.path.getsize(model) / 2**30:.2f} GiB bf16 in {model} (tmpfs: the fresh start reads it "
          "from memory)", flush=True)
    rows = []
    n = 0
    for where in args.where.split(","):
        base = args.tmpfs if where == "tmpfs" else args.disk
        os.makedirs(base, exist_ok=True)
        for flow in ("zerohop", "nvidia") if len(rows) % 4 == 0 else ("nvidia", "zerohop"):
            n += 1
            r = row(args, flow, where, base, model, n)
            rows.append(r)
            print(json.dumps(r), flush=True)
    report(rows)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)


def report(rows: list[dict]) -> None:
    gib = 2**30
    fresh = [r["fresh_start_s"] for r in rows]
    print(f"\nfresh start to first answer: median {statistics.median(fresh):.2f} s, best {min(fresh):.2f} s "
          f"({len(fresh)} starts)")
    print(f"{'flow':8} {'to':6} {'durable s':>9} {'thaw→answer s':>13} {'written GiB':>11} {'host added GiB':>14} "
          f"{'× fresh':>7} {'same':>5} {'exit s':>6}")
    for r in rows:
        exit_s = "hang" if r["exit_after_thaw_s"] is None else f"{r['exit_after_thaw_s']:.2f}"
        print(f"{r['flow']:8} {r['where']:6} {r['durable_s']:9.2f} {r['thaw_to_answer_s']:13.2f} "
              f"{r['written_bytes'] / gib:11.2f} {r['host_added_bytes'] / gib:14.2f} "
              f"{r['thaw_to_answer_s'] / statistics.median(fresh):7.2f} "
              f"{str(r['same_answer'] and r['same_digest']):>5} {exit_s:>6}")
    for where in sorted({r["where"] for r in rows}):
        z = next((r for r in rows if r["where"] == where and r["flow"] == "zerohop"), None)
        v = next((r for r in rows if r["where"] == where and r["flow"] == "nvidia"), None)
        if z and v:
            print(f"{where}: freeze {v['durable_s'] / z['durable_s']:.1f} × faster to durable than NVIDIA's flow, "
                  f"thaw {v['thaw_to_answer_s'] / z['thaw_to_answer_s']:.1f} × faster back")


if __name__ == "__main__":
    main()
