"""Damaged copies of checkpoints, for the tests that must refuse them."""

import os


def damaged_copy(src, dst):
    """Copies checkpoint directory `src` to `dst` with the last byte of each
    data file flipped; returns `dst`."""
    os.mkdir(dst)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f:
            content = bytearray(f.read())
        if name.endswith(".safetensors"):
            content[-1] ^= 1
        with open(os.path.join(dst, name), "wb") as f:
            f.write(bytes(content))
    return dst
