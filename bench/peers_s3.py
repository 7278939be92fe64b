"""The s3 section of bench/peers.py: the model as one object of an
S3-compatible server on this machine (s3s-fs, over tmpfs: --s3-server,
--s3-root), loaded into the device by zerohop and by the peers that read
object stores, against the server's raw parallel ranged GETs
(`zerohop bench raw-read s3://...`, a threads x block grid), rounds
rotated.  The objects are uploaded with curl (SigV4): the parent needs
only the standard library.

Loaders: zerohop-py (`load_file("s3://...")`), zerohop-cli (`zerohop load
s3://...`), runai (its S3 backend, `runai-model-streamer-s3`), boto3
(`download_file` to tmpfs, then `safetensors.torch.load_file`, as users
without a streaming loader do).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

BUCKET = "models"
KEY_ID, SECRET = "zerohop-peers", "zerohop-peers-secret"


class S3Server:
    """An s3s-fs process on a free loopback port over a fresh directory
    under `root_dir`, with one bucket; stopped (and its data removed) by
    `stop`."""

    def __init__(self, binary: str, root_dir: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.root = os.path.join(root_dir, f"zerohop-peers-s3-{os.getpid()}")
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(os.path.join(self.root, BUCKET))
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", KEY_ID,
             "--secret-key", SECRET, self.root], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    raise RuntimeError(f"the S3 server {binary} did not start")
                time.sleep(0.05)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        """What clients (children inherit it) need to find the server:
        the AWS variables, path-style addressing for Run:ai's streamer."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": KEY_ID,
                "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0", "AWS_EC2_METADATA_DISABLED": "true"}

    def upload(self, path: str, key: str) -> str:
        """PUTs the file as `key` (through the API, so the server keeps
        its ETag); returns its s3:// URL."""
        cmd = ["curl", "-sS", "--fail", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{KEY_ID}:{SECRET}",
               "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T", path, f"{self.endpoint}/{BUCKET}/{key}"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"uploading {path}: curl exit {out.returncode}: {out.stderr.strip()}")
        return f"s3://{BUCKET}/{key}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def raw_get_grid(args) -> list[dict]:
    return [{"block": b, "threads": t, "direct": "get"} for t in args.s3_sweep_threads for b in args.s3_sweep_blocks]


def section_s3(ctx, model: list[str], peers) -> None:
    """See the module's docstring; `peers` is bench/peers.py (its loaders,
    raw reads, rotation and records)."""
    args = ctx.args
    if shutil.which("curl") is None:
        raise RuntimeError("the s3 section uploads with curl, which is not installed")
    server = S3Server(args.s3_server, args.s3_root)
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        started = time.perf_counter()
        url = server.upload(model[0], "model.safetensors")
        print(f"s3: {server.endpoint}, {os.path.getsize(model[0]) / 1e9:.2f} GB uploaded in "
              f"{time.perf_counter() - started:.1f} s as {url}", flush=True)
        warm = {"file": server.upload(ctx.warm_file, "warmup.safetensors"),
                "expect": peers.read_headers([ctx.warm_file])}
        expect = peers.read_headers(model)
        size = os.path.getsize(model[0])
        last = 0.0
        for rnd in range(1, args.rounds + 1):
            if not peers.rounds_fit(ctx, rnd, last, "s3"):
                break
            t = time.perf_counter()
            for config in peers.rotated(raw_get_grid(args), rnd, args.rounds):
                if ctx.over_time("s3"):
                    return
                peers.raw_read(ctx, url, config, rnd, mode="s3", expect_bytes=size)
            for loader in peers.rotated(args.s3_loaders, rnd, args.rounds):
                if ctx.over_time("s3"):
                    return
                peers.load(ctx, loader, "s3", "single", rnd, [url], expect, warm=warm)
            last = time.perf_counter() - t
            ctx.save(model)
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
