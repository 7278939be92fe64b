import os

import pytest

np = pytest.importorskip("numpy")


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@pytest.fixture
def damaged_copy():
    """`copy(src, dst)`: checkpoint directory `src` copied to `dst` with the
    last byte of each data file flipped (for the tests that must refuse
    it); returns `dst`."""

    def copy(src, dst):
        os.mkdir(dst)
        for name in os.listdir(src):
            with open(os.path.join(src, name), "rb") as f:
                content = bytearray(f.read())
            if name.endswith(".safetensors"):
                content[-1] ^= 1
            with open(os.path.join(dst, name), "wb") as f:
                f.write(bytes(content))
        return dst

    return copy
