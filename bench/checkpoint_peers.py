#!/usr/bin/env python3
"""Time saving GPU memory to storage: zerohop against its peers, same bytes,
same target directory, one run.

Every peer runs in its own child process. A child first warms host memory
(touches SIZE bytes once: on the reference VM the first use of fresh memory
costs seconds) and reports how long that took, then fills SIZE bytes of GPU
memory in 256 MiB uint8 tensors, then times the save until the data is
durable (fsync of the file and its directory):

  torch            torch.save(dict) + fsync
  safetensors      safetensors.torch.save_file(dict) + fsync
  kvikio           kvikio.CuFile.pwrite of every tensor (compat mode, 16
                   threads) + fsync
  cuda-checkpoint  the CUDA driver's process checkpoint of a child process
                   holding SIZE bytes of GPU memory: cuCheckpointProcessLock +
                   cuCheckpointProcessCheckpoint (device memory staged into
                   host RAM; nothing reaches storage), then
                   cuCheckpointProcessRestore + Unlock; the child checks its
                   data afterwards
  zerohop          `zerohop-lab checkpoint --size SIZE --dir DIR --json` (beside ZEROHOP):
                   save (durable), restore, and the raw write/read rates of
                   DIR measured in the same run

GB/s is decimal. The parent needs only the standard library (--help works
without torch).

Example:
  python3 bench/checkpoint_peers.py --size-gib 16 --dir /var/tmp/ckpt \\
      --zerohop target/release/zerohop --json-out checkpoint-peers.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

from lab_binary import lab_binary

PEERS = ("torch", "safetensors", "kvikio", "cuda-checkpoint", "zerohop")
REGION = 256 << 20


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def warm_host(size):
    import torch
    t0 = time.perf_counter()
    t = torch.empty(size, dtype=torch.uint8)
    t.fill_(1)
    del t
    return time.perf_counter() - t0


def gpu_regions(size):
    import torch
    out = {}
    left, i = size, 0
    while left > 0:
        n = min(left, REGION)
        out["region.%05d" % i] = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:0")
        left -= n
        i += 1
    torch.cuda.synchronize()
    return out


def child(peer, size, directory, threads):
    """Runs one timed save; prints one JSON line."""
    import torch
    torch.zeros(1, device="cuda:0")
    warm = warm_host(size)
    tensors = gpu_regions(size)
    path = os.path.join(directory, "peer-%s-%d" % (peer, os.getpid()))
    extra = {}
    t0 = time.perf_counter()
    if peer == "torch":
        torch.save(tensors, path)
    elif peer == "safetensors":
        from safetensors.torch import save_file
        save_file(tensors, path)
    elif peer == "kvikio":
        import kvikio
        import kvikio.defaults
        kvikio.defaults.set({"compat_mode": kvikio.CompatMode.ON, "num_threads": threads})
        extra["compat_mode"] = str(kvikio.defaults.get("compat_mode"))
        with kvikio.CuFile(path, "w") as f:
            futures, off = [], 0
            for t in tensors.values():
                futures.append(f.pwrite(t, t.nbytes, file_offset=off))
                off += t.nbytes
            for fu in futures:
                fu.get()
    fsync_path(path)
    fsync_path(directory)
    secs = time.perf_counter() - t0
    written = os.path.getsize(path)
    os.remove(path)
    print(json.dumps({"peer": peer, "seconds": secs, "bytes": size, "file_bytes": written,
                      "warm_host_seconds": warm, "extra": extra}))


HOLDER = r"""
import sys, torch
size = int(sys.argv[1])
left, ts = size, []
while left > 0:
    n = min(left, %d)
    ts.append(torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:0"))
    left -= n
torch.cuda.synchronize()
sums = [int(t[::4099].sum()) for t in ts]
print("ready", flush=True)
sys.stdin.readline()
same = sums == [int(t[::4099].sum()) for t in ts]
print("intact" if same else "changed", flush=True)
""" % REGION


def cuda_checkpoint(size):
    import ctypes
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(size)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            raise RuntimeError("the holder process did not start")
        cuda = ctypes.CDLL("libcuda.so.1")
        for fn in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                   "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"):
            if not hasattr(cuda, fn):
                raise RuntimeError("this driver has no %s" % fn)

        def call(fn, *args):
            rc = getattr(cuda, fn)(*args)
            if rc != 0:
                raise RuntimeError("%s failed with CUresult %d" % (fn, rc))

        call("cuInit", 0)
        pid = ctypes.c_int(holder.pid)
        t0 = time.perf_counter()
        call("cuCheckpointProcessLock", pid, None)
        call("cuCheckpointProcessCheckpoint", pid, None)
        t1 = time.perf_counter()
        call("cuCheckpointProcessRestore", pid, None)
        call("cuCheckpointProcessUnlock", pid, None)
        t2 = time.perf_counter()
        holder.stdin.write("go\n")
        holder.stdin.flush()
        verdict = holder.stdout.readline().strip()
        return {"peer": "cuda-checkpoint", "seconds": t1 - t0, "restore_seconds": t2 - t1,
                "bytes": size, "extra": {"data_after_restore": verdict,
                                         "note": "device memory staged into host RAM; nothing written to storage"}}
    finally:
        holder.kill()
        holder.wait()


def run_zerohop(binary, size, directory):
    out = subprocess.run([lab_binary(binary), "checkpoint", "--size", str(size), "--dir", directory,
                          "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed")
    r = json.loads(out.stdout)
    return {"peer": "zerohop", "seconds": r["seconds_to_durable"], "bytes": size,
            "restore_gbps": r["restore_gbps"], "report": r}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=16.0)
    ap.add_argument("--dir", required=False, default="/var/tmp/zerohop-ckpt-peers")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--zerohop", default="zerohop", help="path of the zerohop binary")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--json-out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    size = int(a.size_gib * (1 << 30))
    os.makedirs(a.dir, exist_ok=True)
    if a.child:
        child(a.child, size, a.dir, a.threads)
        return
    rows = []
    for peer in a.peers.split(","):
        try:
            if peer == "cuda-checkpoint":
                row = cuda_checkpoint(size)
            elif peer == "zerohop":
                row = run_zerohop(a.zerohop, size, a.dir)
            elif peer in PEERS:
                out = subprocess.run([sys.executable, __file__, "--child", peer, "--size-gib",
                                      str(a.size_gib), "--dir", a.dir, "--threads", str(a.threads)],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError((out.stderr.strip().splitlines() or ["failed"])[-1])
                row = json.loads(out.stdout.strip().splitlines()[-1])
            else:
                raise RuntimeError("unknown peer")
        except Exception as e:  # a failing peer is reported, the rest go on
            row = {"peer": peer, "error": str(e)}
        rows.append(row)
        if "error" in row:
            print("%-16s error: %s" % (peer, row["error"]), flush=True)
        else:
            print("%-16s %7.2f s  %6.2f GB/s  %s" % (peer, row["seconds"], size / row["seconds"] / 1e9,
                  {k: v for k, v in row.items() if k not in ("peer", "seconds", "bytes", "report")}), flush=True)
    z = next((r for r in rows if r["peer"] == "zerohop" and "error" not in r), None)
    print("\n%.1f GiB to %s\n" % (a.size_gib, a.dir))
    print("| peer | seconds until durable (cuda-checkpoint: until staged in host RAM) | GB/s | zerohop speed-up |")
    print("|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print("| %s | error: %s | | |" % (r["peer"], r["error"]))
            continue
        up = "%.2fx" % (r["seconds"] / z["seconds"]) if z else ""
        print("| %s | %.2f | %.2f | %s |" % (r["peer"], r["seconds"], size / r["seconds"] / 1e9, up))
    if z:
        rep = z["report"]
        print("\nzerohop: save %.2f GB/s = %.0f%% of the raw write (%s), restore %.2f GB/s = %.0f%% of the raw read (%s)"
              % (rep["save_gbps"], 100 * rep["save_ratio_to_raw_write"],
                 ", ".join("%s %.2f" % (x["how"], x["gbps"]) for x in rep["raw_write"]),
                 rep["restore_gbps"], 100 * rep["restore_ratio_to_raw_read"],
                 ", ".join("%s %.2f" % (x["how"], x["gbps"]) for x in rep["raw_read"])))
    cc = next((r for r in rows if r["peer"] == "cuda-checkpoint" and "error" not in r), None)
    if cc:
        print("cuda-checkpoint: staged into host RAM in %.2f s, restored in %.2f s; data after restore: %s"
              % (cc["seconds"], cc["restore_seconds"], cc["extra"]["data_after_restore"]))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"size": size, "dir": a.dir, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
