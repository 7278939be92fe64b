"""A PyTorch program that knows nothing of zerohop, run with
libzerohop_preload.so preloaded (test_preload.py): its tensors come from
torch's own caching allocator, which calls cudaMalloc. A thread steps (a
matmul, then torch.cuda.synchronize: its quiet point) until stdin closes;
lines on stdin: "check" (are the weights and the step's output as they
were?), "steps" (how many steps so far).
"""

import sys
import threading

import torch

torch.manual_seed(9)
w = torch.randn(4096, 4096, device="cuda")
big = torch.randn(256 << 20, device="cuda")  # 1 GiB
x = torch.randn(64, 4096, device="cuda")
want_y = x @ w
want_big = int(big.view(torch.int32).sum(dtype=torch.int64))
torch.cuda.synchronize()
steps = 0
stop = threading.Event()


def step_loop():
    global steps
    while not stop.is_set():
        y = x @ w
        torch.cuda.synchronize()
        steps += 1
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
        print(steps, flush=True)
stop.set()
stepper.join()
