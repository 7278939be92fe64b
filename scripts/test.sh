#!/usr/bin/env bash
# The whole test suite, as the README gives it: the Rust workspace (GPU tests
# are reported as ignored without a GPU), then the Python package, installed
# from this checkout into a virtual environment of its own (.venv/, created
# on first use: the system's Python is never changed) and tested with pytest
# (torch and GPU tests say "skipped" where those are missing), then
# safetensors' own PyTorch tests pointed at zerohop (python/compat/).
#
#   scripts/test.sh [CARGO TEST OPTIONS]   # CI passes --locked
#   ZEROHOP_TEST_EXTRAS=torch scripts/test.sh
#                                          # more packages into .venv/ first
#                                          # (pip requirement specifiers,
#                                          # space-separated; CI adds torch)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="$PWD/.venv"
py="$venv/bin/python"
# Without Debian's and Ubuntu's python3-venv, `python3 -m venv` fails at
# ensurepip and leaves a python without pip behind: what is tested is pip.
if ! "$py" -m pip --version > /dev/null 2>&1; then
    rm -rf "$venv"
    if ! python3 -m venv "$venv" || ! "$py" -m pip --version > /dev/null 2>&1; then
        rm -rf "$venv"
        echo "scripts/test.sh: cannot make a virtual environment with pip in .venv/;" \
            "install Python's venv module (Debian, Ubuntu: apt-get install python3-venv)" >&2
        exit 1
    fi
fi
# The venv first on PATH: maturin's build backend runs `maturin` by name
# (1.16 does), and a Rust test runs `python3` with safetensors and numpy.
export PATH="$venv/bin:$PATH"
pip=("$py" -m pip install --quiet --disable-pip-version-check)
# maturin here builds zerohop without fetching it again for every install.
read -ra extras <<< "${ZEROHOP_TEST_EXTRAS:-}"
"${pip[@]}" "maturin>=1.9,<2" "${extras[@]}"
# The package with its `test` extra (pyproject.toml: pytest, numpy and the
# safetensors version whose own tests python/compat runs), before
# `cargo test`: the Rust interoperability test runs `python3` with
# safetensors and numpy. A debug build with the simulated device (feature
# `sim`, which the Python tests use): maturin's --features replaces
# pyproject.toml's list, so that one is named again here.
MATURIN_PEP517_ARGS="--profile dev --features sim,pyo3/extension-module" \
    "${pip[@]}" --no-build-isolation ".[test]"
# The S3-compatible server that the object storage tests start on the
# loopback address (s3s-fs, a Rust crate; it keeps objects as files, so
# a test can kill it and start it again over the same data), built once
# into .tools/ (about 3 minutes on 2 cores).
s3_server="$PWD/.tools/bin/s3s-fs"
if [ ! -x "$s3_server" ]; then
    cargo install s3s-fs@0.14.1 --features binary --locked --root "$PWD/.tools"
fi
export ZEROHOP_S3_SERVER="$s3_server"

cargo test --workspace "$@"
# The preloaded library and the USRBIO library are cdylibs, which `cargo
# test` does not link.
cargo build -p zerohop-preload -p zerohop-usrbio

# From outside the checkout, so `import zerohop` is the installed package;
# the agent tests run the binary `cargo test` built.
export ZEROHOP_BIN="$PWD/target/debug/zerohop"
export ZEROHOP_PRELOAD="$PWD/target/debug/libzerohop_preload.so"
export ZEROHOP_USRBIO_LIB_DIR="$PWD/target/debug"
(cd python/tests && "$py" -m pytest -q -rs -p no:cacheprovider .)
"$py" python/compat/run.py
