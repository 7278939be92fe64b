"""Small files written whole or not at all: the commit files of
checkpoints (DCP's `.metadata`, a sharded checkpoint's `SHARDS.json`)."""

import os


def write_durably(path: str, data: bytes) -> None:
    """Writes `path` whole or not at all, durably: a temporary file synced,
    renamed into place, and the directory synced."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
