"""The worker processes of the tests, each run as `python workers.py KIND
ARGS...`. Most are driven by lines, a command on stdin and one answer
line on stdout (`start(KIND, ...)` runs one):

- "heap": serves suspend requests for its heap of host memory (the test
  drives it with `zerohop suspend/resume PID DIR`), with MiB more of it
  than the small allocations (first argument, default 0). Lines: "check"
  (are the bytes intact?), "state" (bytes of memory behind the heap, and
  where it is suspended to), "work" (takes the lock, as a process's step
  would).
- "gpu": a PyTorch process whose tensors live in zerohop's suspendable
  heap and which serves suspend requests (test_suspend_gpu.py drives it
  with `zerohop suspend/resume/checkpoint-process/restore-process`): the
  `gpu_workload` below with MiB of filler (first argument). Lines:
  "check" (do the eager pass, the graph's replay and the filler give
  exactly what they gave before?), "work", "mib" (MiB of device memory
  behind its heap).
- "preload": a PyTorch program that knows nothing of zerohop, run with
  libzerohop_preload.so preloaded (test_preload.py): its tensors come from
  torch's own caching allocator, which calls cudaMalloc. A thread steps (a
  matmul, then torch.cuda.synchronize: its quiet point) until stdin
  closes. Lines: "check" (are the weights and the step's output as they
  were?), "steps" (how many steps so far).

Each prints a first line starting with "ready" and ends when stdin closes.
One is driven by files instead:

- "spool" SPOOL MODE MIB: a process CRIU can freeze and thaw whole
  (test_freeze.py): nothing ties it to the test (stdin is /dev/null, its
  output goes to a file, it leads its own session), and it takes requests
  as files in the spool directory. MODE "cpu": MIB MiB of random host memory. MODE
  "zerohop": the `gpu_workload` with MIB MiB of filler in zerohop's
  suspendable heap, served to `zerohop suspend` (what a freeze uses). MODE
  "driver": the same in PyTorch's own memory, serving nothing (the driver
  then checkpoints all of it). Requests: "check" (is every value what it
  was at the start? "intact" or what changed), "pid", "stop".

Ranks of a worker script (dist_worker.py, dcp_worker.py, ckpt_worker.py)
start as torchrun would start them (`run_ranks`), for the tests that talk
gloo over loopback sockets; the ranks leave their group with
`leave_group`.
"""

import gc
import json
import os
import socket
import subprocess
import sys
import threading
import time
import weakref

HERE = os.path.dirname(__file__)


def start(kind, *args, env=None):
    """Starts this file as worker `kind` with `args` and waits for its
    first line, which must start with "ready". Returns the process and
    `ask(command) -> answer`."""
    p = subprocess.Popen([sys.executable, __file__, kind, *map(str, args)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    first = p.stdout.readline()
    assert first.startswith("ready"), first

    def ask(command):
        p.stdin.write(command + "\n")
        p.stdin.flush()
        return p.stdout.readline().strip()

    return p, ask


def stop(p, timeout=60):
    """Closes the worker's stdin, which ends it; it must exit cleanly."""
    p.stdin.close()
    assert p.wait(timeout=timeout) == 0


def run_ranks(worker, argv, out_dir, world=2, timeout=120):
    """Runs `world` ranks of `worker` with `argv` plus an output path each;
    returns what each wrote (JSON), or {"rank", "exit"} for a rank that
    wrote nothing (killed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = os.path.join(out_dir, f"rank{rank}.json")
        if os.path.exists(out):
            os.remove(out)
        procs.append((subprocess.Popen([sys.executable, os.path.join(HERE, worker), *argv, out], env=env), out))
    results = []
    for rank, (p, out) in enumerate(procs):
        code = p.wait(timeout=timeout)
        if os.path.exists(out):
            assert code == 0, f"rank {rank} wrote its result but exited with {code}"
            with open(out) as f:
                results.append(json.load(f))
        else:
            results.append({"rank": rank, "exit": code})
    return results


def leave_group():
    """Destroys this rank's process group and checks that it is gone, its
    gloo threads joined; a worker calls it last, once nothing of its own
    holds a DeviceMesh or DTensor.

    A group that outlives this keeps its threads running into the
    interpreter's exit. There, a gloo worker that drops a finished
    collective's last reference to a tensor needs the GIL to free it;
    CPython ends a thread that takes the GIL while it finalizes, the
    unwinding runs into a C++ destructor and std::terminate aborts the
    rank ("terminate called without an active exception", exit -6) now and
    then. Held, it is an error every time instead. Holders seen: torch's
    cache of DTensor redistribute plans (DTensor.full_tensor()), which keeps
    the mesh and its groups, and torch modules first imported after
    init_process_group, whose functions take group.WORLD as a default."""
    import torch.distributed as dist

    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    gc.collect()  # meshes and DTensors sit in reference cycles
    if group() is not None:
        raise SystemExit("the process group outlived destroy_process_group(): "
                         "something still holds it, and its gloo threads would run into the exit")


def gpu_workload(where, mib):
    """A transformer layer run eagerly and captured in a CUDA graph, plus
    `mib` MiB of filler tensors, allocated inside the context `where`
    (zerohop.suspendable(), or a null context for PyTorch's own memory);
    the graph is captured outside it. Returns `check() -> [what changed]`
    and what `where` yielded (zerohop's MemPool: keep it while the tensors
    live)."""
    import torch

    torch.manual_seed(3)
    with where as pool:
        layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True,
                                                 device="cuda").eval()
        x = torch.randn(4, 64, 256, device="cuda")
        filler = [torch.randn(64 << 18, device="cuda") for _ in range(mib // 64)]  # 64 MiB each
    with torch.no_grad():
        want_eager = layer(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(x)  # warm-up before capture, as CUDA graphs need
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(x)
        graph.replay()
        want_graph = out.clone()
    sums = [int(t.view(torch.int32).sum(dtype=torch.int64)) for t in filler]
    torch.cuda.synchronize()

    def check():
        with torch.no_grad():
            out.zero_()
            graph.replay()
            same = {
                "eager": torch.equal(layer(x), want_eager),
                "graph": torch.equal(out, want_graph),
                "filler": [int(t.view(torch.int32).sum(dtype=torch.int64)) for t in filler] == sums,
            }
        return [k for k, v in same.items() if not v]

    return check, pool


def took(lock):
    """Whether `lock` could be taken within half a second (a process's step)."""
    got = lock.acquire(timeout=0.5)
    if got:
        lock.release()
    return "worked" if got else "paused"


def heap(extra_mib=0):
    import ctypes

    import zerohop
    from zerohop import _native

    lock = threading.Lock()
    allocations = []
    extra = int(extra_mib) << 20
    for i, n in enumerate([(1 << 20) + 3, 3 << 20] + ([extra] if extra else [])):
        addr = _native.heap_alloc("cpu", n)
        period = bytes((j * 13 + i) % 251 for j in range(251))  # the pattern repeats every 251 bytes
        data = (period * (n // 251 + 1))[:n]
        ctypes.memmove(addr, data, n)
        allocations.append((addr, data))
    server = zerohop.serve_suspend(device="cpu", lock=lock)
    print("ready", server.path, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "check":
            with lock:
                ok = all(ctypes.string_at(a, len(d)) == d for a, d in allocations)
            print("intact" if ok else "damaged", flush=True)
        elif command == "state":
            _, backed, suspended_to = _native.heap_state("cpu")
            print(backed, suspended_to, flush=True)
        elif command == "work":
            print(took(lock), flush=True)
    server.close()


def gpu(mib):
    import zerohop
    from zerohop import _native

    lock = threading.Lock()
    check, pool = gpu_workload(zerohop.suspendable(), int(mib))
    server = zerohop.serve_suspend(lock=lock)
    print("ready", server.path, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "check":
            with lock:
                bad = check()
            print("intact" if not bad else "changed: " + ",".join(bad), flush=True)
        elif command == "work":
            print(took(lock), flush=True)
        elif command == "mib":
            _, backed, _ = _native.heap_state("cuda:0")
            print(backed >> 20, flush=True)
    server.close()
    del pool


def preload():
    import torch

    torch.manual_seed(9)
    w = torch.randn(4096, 4096, device="cuda")
    big = torch.randn(256 << 20, device="cuda")  # 1 GiB
    x = torch.randn(64, 4096, device="cuda")
    want_y = x @ w
    want_big = int(big.view(torch.int32).sum(dtype=torch.int64))
    torch.cuda.synchronize()
    steps = [0]
    done = threading.Event()

    def step_loop():
        while not done.is_set():
            y = x @ w
            torch.cuda.synchronize()
            steps[0] += 1
            del y

    stepper = threading.Thread(target=step_loop)
    stepper.start()
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "check":
            same = torch.equal(x @ w, want_y) and int(big.view(torch.int32).sum(dtype=torch.int64)) == want_big
            print("intact" if same else "changed", flush=True)
        elif command == "steps":
            print(steps[0], flush=True)
    done.set()
    stepper.join()


def spool(directory, mode, mib):
    import hashlib

    mib = int(mib)
    lock = threading.Lock()
    if mode == "cpu":
        state = bytearray(os.urandom(mib << 20))
        want = hashlib.sha256(state).hexdigest()

        def check():
            return [] if hashlib.sha256(state).hexdigest() == want else ["memory"]
    else:
        import contextlib

        import zerohop

        where = zerohop.suspendable() if mode == "zerohop" else contextlib.nullcontext()
        # Both stay referenced while the worker runs: the pool keeps the
        # tensors' memory, the server answers suspend requests.
        check, pool = gpu_workload(where, mib)
        server = zerohop.serve_suspend(lock=lock) if mode == "zerohop" else None

    def answer(name, text):
        tmp = os.path.join(directory, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, os.path.join(directory, name + ".ans"))

    answer("ready", str(os.getpid()))
    while True:
        requests = sorted(n for n in os.listdir(directory) if n.endswith(".req"))
        for name in requests:
            path = os.path.join(directory, name)
            with open(path) as f:
                command = f.read().strip()
            os.unlink(path)
            with lock:
                if command == "check":
                    bad = check()
                    answer(name[:-4], "intact" if not bad else "changed: " + ",".join(bad))
                elif command == "pid":
                    answer(name[:-4], str(os.getpid()))
                elif command == "stop":
                    answer(name[:-4], "stopping")
                    sys.exit(0)
                else:
                    answer(name[:-4], f"unknown request {command!r}")
        time.sleep(0.005)


if __name__ == "__main__":
    {"heap": heap, "gpu": gpu, "preload": preload, "spool": spool}[sys.argv[1]](*sys.argv[2:])
