#!/usr/bin/env python3
"""How many bytes `safe_open`'s read-ahead reads for what a program asks,
by the way it reads: the bytes its windows and its reads alone move, over
the bytes the program's reads need (the rows asked; every row where it
asks columns). Counts, not times: it runs on any machine (host memory,
numpy), with a model scaled down and the read-ahead's window sizes scaled
with it (1/64).

Programs:
- `keys-unsorted` / `offset-unsorted`: the first half of every tensor
  through `keys()` / `offset_keys()`, of 4 shards written as their tensors
  came (`zerohop.save_file`), whose data order is not their names';
- `keys-sorted`: the same through `keys()`, the shards written by
  safetensors (sorted by name);
- `tp`: a tensor-parallel rank (1 of 4) of a Llama-8B-like model in 4
  shards written by safetensors: its rows of q, k, v, gate and up, its
  columns of o and down (every row), the norms and embeddings whole.

    python3 bench/probe/read_ahead_bytes.py [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

SCALE = 64  # the model's bytes and the windows' are both divided by it


def shards_state(shard: int) -> dict:
    return {f"shard{shard}.layer.{i}": np.full((128, 1024), i, np.uint16) for i in range(16)}


def llama_state(shard: int) -> dict:
    """Layers 8 x shard .. 8 x shard + 7 of a Llama-8B, each dimension / 8."""
    h, inter, kv = 512, 1792, 128
    state = {}
    if shard == 0:
        state["model.embed_tokens.weight"] = np.zeros((16000, h), np.uint16)
    for layer in range(8 * shard, 8 * shard + 8):
        p = f"model.layers.{layer}."
        shapes = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
                  "self_attn.o_proj": (h, h), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
                  "mlp.down_proj": (h, inter)}
        for name, shape in shapes.items():
            state[p + name + ".weight"] = np.full(shape, layer, np.uint16)
        state[p + "input_layernorm.weight"] = np.ones(h, np.uint16)
        state[p + "post_attention_layernorm.weight"] = np.ones(h, np.uint16)
    return state


def half(name: str, part, shape) -> tuple:
    rows = max(1, shape[0] // 2)
    got = part[:rows]
    return got, got.nbytes


def tp_rank(name: str, part, shape, rank: int = 1, ranks: int = 4) -> tuple:
    """What a tensor-parallel rank reads of `name`, and the bytes that
    needs read (columns need every row)."""
    whole = int(np.prod(shape)) * 2
    if len(shape) == 1 or "embed" in name or "norm" in name:
        return part[:], whole
    if "o_proj" in name or "down_proj" in name:
        n = shape[1]
        return part[:, rank * n // ranks:(rank + 1) * n // ranks], whole
    n = shape[0]
    got = part[rank * n // ranks:(rank + 1) * n // ranks]
    return got, got.nbytes


def count(paths: list, order: str, ask) -> tuple:
    """(bytes read, bytes needed) of a program reading `paths` in turn."""
    import zerohop
    from zerohop import _native

    read = [0]

    def counted(real):
        def call(device, sources, pieces, *a, **kw):
            read[0] += sum(n for _, _, n, _ in pieces)  # (file, offset, bytes, address)
            return real(device, sources, pieces, *a, **kw)
        return call

    # Reads alone, and windows.
    reals = _native.read, _native.read_queued
    _native.read, _native.read_queued = map(counted, reals)
    needed = 0
    try:
        for path in paths:
            with zerohop.safe_open(path, framework="np") as f:
                for name in (f.keys() if order == "keys" else f.offset_keys()):
                    part = f.get_slice(name)
                    _, n = ask(name, part, part.get_shape())
                    needed += n
    finally:
        _native.read, _native.read_queued = reals
    return read[0], needed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/dev/shm")
    args = ap.parse_args()
    import safetensors.numpy
    import zerohop
    from zerohop import _read_ahead

    for name in ("READ_AHEAD_FIRST", "READ_AHEAD_MOST", "READ_AHEAD_DENSE_MOST", "READ_AHEAD_LAST",
                 "READ_AHEAD_TENSOR_BYTES"):
        setattr(_read_ahead, name, getattr(_read_ahead, name) // SCALE)

    programs = {
        "keys-unsorted": (shards_state, zerohop.save_file, "keys", half),
        "offset-unsorted": (shards_state, zerohop.save_file, "offset_keys", half),
        "keys-sorted": (shards_state, safetensors.numpy.save_file, "keys", half),
        "tp": (llama_state, safetensors.numpy.save_file, "keys", tp_rank),
    }
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for label, (state, save, order, ask) in programs.items():
            paths = [os.path.join(tmp, f"{label}-{s}.safetensors") for s in range(4)]
            for s, path in enumerate(paths):
                save(state(s), path)
            read, needed = count(paths, order, ask)
            print(f"{label}: read {read / needed:.2f} x the bytes needed ({read >> 20} of {needed >> 20} MiB)")
            for path in paths:
                os.unlink(path)


if __name__ == "__main__":
    main()
