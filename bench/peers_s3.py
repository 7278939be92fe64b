"""The s3 section of bench/peers.py: the model as one object of an
S3-compatible server on this machine (s3s-fs or Garage, over tmpfs:
--s3-server, --s3-root), loaded into the device by zerohop and by the peers that read
object stores, against the server's raw parallel ranged GETs
(`zerohop-lab raw-read s3://...`, a threads x block grid), rounds
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str, seconds: float = 20) -> None:
    deadline = time.time() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the S3 server {what} did not start")
            time.sleep(0.05)


class S3Server:
    """An S3-compatible server on a free loopback port over a fresh
    directory under `root_dir`, with one bucket; stopped (and its data
    removed) by `stop`. `open_server` picks the kind by the binary's name."""

    key_id = "zerohop-peers"
    secret = "zerohop-peers-secret"

    def __init__(self, binary: str, root_dir: str):
        self.binary, self.port = binary, free_port()
        self.root = os.path.join(root_dir, f"zerohop-peers-s3-{os.getpid()}")
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(self.root)
        self.proc = None
        try:
            self.start()
        except BaseException:
            self.stop()
            raise

    def start(self) -> None:
        """s3s-fs: a bucket is a directory of the root."""
        os.makedirs(os.path.join(self.root, BUCKET))
        self.proc = subprocess.Popen(
            [self.binary, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", self.key_id,
             "--secret-key", self.secret, self.root], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, self.proc, self.binary)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        """What clients (children inherit it) need to find the server:
        the AWS variables, path-style addressing for Run:ai's streamer."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0", "AWS_EC2_METADATA_DISABLED": "true"}

    def upload(self, path: str, key: str) -> str:
        """PUTs the file as `key` (through the API, so the server keeps
        its ETag); returns its s3:// URL."""
        cmd = ["curl", "-sS", "--fail", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{self.key_id}:{self.secret}",
               "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T", path, f"{self.endpoint}/{BUCKET}/{key}"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"uploading {path}: curl exit {out.returncode}: {out.stderr.strip()}")
        return f"s3://{BUCKET}/{key}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


class GarageServer(S3Server):
    """Garage (a distributed object store) as one node with one copy of
    each object, blocks uncompressed, metadata and data under the root."""

    # Garage's formats: "GK" and 24 hex digits, and 64 hex digits.
    key_id = "GK" + "0123456789abcdef01234567"
    secret = "0123456789abcdef" * 4

    def garage(self, *args: str) -> str:
        out = subprocess.run([self.binary, "-c", self.config, *args], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"garage {' '.join(args[:2])}: {out.stderr.strip()[-500:]}")
        return out.stdout

    def start(self) -> None:
        rpc = free_port()
        self.config = os.path.join(self.root, "garage.toml")
        with open(os.open(self.config, os.O_CREAT | os.O_WRONLY, 0o600), "w") as f:
            f.write(f"""metadata_dir = "{self.root}/meta"
data_dir = "{self.root}/data"
db_engine = "lmdb"
replication_factor = 1
compression_level = "none"
rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{os.urandom(32).hex()}"
[s3_api]
s3_region = "us-east-1"
api_bind_addr = "127.0.0.1:{self.port}"
""")
        self.proc = subprocess.Popen([self.binary, "-c", self.config, "server"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, self.proc, self.binary)
        wait_for_port(rpc, self.proc, self.binary)
        node = self.garage("node", "id", "-q").strip().split("@")[0]
        self.garage("layout", "assign", "-z", "dc1", "-c", "1TB", node)
        self.garage("layout", "apply", "--version", "1")
        self.garage("key", "import", "--yes", "-n", "peers", self.key_id, self.secret)
        self.garage("bucket", "create", BUCKET)
        self.garage("bucket", "allow", "--read", "--write", "--owner", BUCKET, "--key", self.key_id)


def open_server(binary: str, root_dir: str) -> S3Server:
    """The server `binary` is: Garage by its name, else s3s-fs."""
    kind = GarageServer if "garage" in os.path.basename(binary) else S3Server
    return kind(binary, root_dir)


def raw_get_grid(args) -> list[dict]:
    return [{"block": b, "threads": t, "direct": "get"} for t in args.s3_sweep_threads for b in args.s3_sweep_blocks]


def section_s3(ctx, model: list[str], peers) -> None:
    """See the module's docstring; `peers` is bench/peers.py (its loaders,
    raw reads, rotation and records)."""
    args = ctx.args
    if shutil.which("curl") is None:
        raise RuntimeError("the s3 section uploads with curl, which is not installed")
    server = open_server(args.s3_server, args.s3_root)
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


def serve(argv: list[str]) -> int:
    """`python3 bench/peers_s3.py SERVER_BINARY ROOT_DIR -- COMMAND...`:
    runs COMMAND with the AWS variables of a fresh server (bucket
    `models`), then stops the server; exits as COMMAND did."""
    if len(argv) < 4 or argv[2] != "--":
        print(__doc__.split("\n\n")[0], "\n\nusage: peers_s3.py SERVER_BINARY ROOT_DIR -- COMMAND...")
        return 2
    server = open_server(argv[0], argv[1])
    try:
        return subprocess.run(argv[3:], env={**os.environ, **server.env()}).returncode
    finally:
        server.stop()


if __name__ == "__main__":
    import sys
    sys.exit(serve(sys.argv[1:]))
