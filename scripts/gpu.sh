#!/usr/bin/env bash
# Build here, run on the accelerator machine: the one script for GPU
# tests and benchmarks.
#
#   scripts/gpu.sh stage            # here: release binary + test binaries -> .stage/
#   scripts/gpu.sh garage           # here, once: Garage for peers-s3 (see there)
#   scripts/gpu.sh device STEP...   # there: run steps, results under $OUT
#
# The steps are functions in bench/gpu-steps.sh (step_NAME for step NAME;
# bench/README.md has their table). The device tool call is:
#   run(command="bash scripts/gpu.sh device info tests hot cold", carry=[".stage"])
# (add ".whl" to carry for the peer loaders, ".before" for comparisons).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

stage() {
    rm -rf .stage && mkdir -p .stage/bin .stage/tests
    CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release -p zerohop-cli -p zerohop-lab -p zerohop-preload -p zerohop-usrbio
    cp target/release/zerohop target/release/zerohop-lab target/release/libzerohop_preload.so \
        target/release/libhf3fs_api_shared.so .stage/bin/
    # The S3-compatible server of the s3 step and the Python suite's
    # object storage tests (scripts/test.sh builds it).
    # Without it, those steps and the Python suite's S3 tests fail, saying why.
    if [ -x .tools/bin/s3s-fs ]; then
        cp .tools/bin/s3s-fs .stage/bin/
    else
        echo "stage: no .tools/bin/s3s-fs (scripts/test.sh builds it): the s3 steps and tests will not run"
    fi
    # The write and pinning probe of the write-probe step.
    mkdir -p .stage/probe
    gcc -O2 -Wall -pthread -o .stage/probe/write_and_pin bench/probe/write_and_pin.c -ldl
    [ -f .tools/garage.xz ] && cp .tools/garage.xz .stage/
    # CRIU 4 with its libraries, for freeze/thaw (scripts/build-criu.sh
    # builds it; about 6 MiB).
    if [ -x .tools/criu/criu ]; then
        cp -r .tools/criu .stage/criu
    else
        echo "stage: no .tools/criu/criu (scripts/build-criu.sh SRC builds it): freeze and thaw will not run"
    fi
    # The test targets that hold GPU tests (#[ignore = "needs an NVIDIA
    # GPU"] here); the rest run in CI. Fewer binaries keep the carried
    # tree under the device tool's size limit.
    CARGO_PROFILE_RELEASE_DEBUG=0 cargo test --locked --release -p zerohop -p zerohop-checkpoint -p zerohop-cuda -p zerohop-suspend \
        --no-run --message-format=json 2>/dev/null \
        | python3 -c '
import json, sys, shutil
gpu = {"gpu", "checkpoint_gpu", "driver", "xxh3_kernel", "suspend_gpu"}
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m["target"]["name"] in gpu:
        shutil.copy(exe, ".stage/tests/" + m["target"]["name"])
'
    strip .stage/bin/* .stage/tests/*
    [ -d .stage/criu ] && strip .stage/criu/bin/criu
    # maturin from the tests' virtual environment (never the system's
    # Python): scripts/test.sh makes it.
    local py=.venv/bin/python
    "$py" -m pip --version > /dev/null 2>&1 \
        || { echo "no .venv/ with pip: run scripts/test.sh first, which makes it"; exit 2; }
    # The Python package as an abi3 wheel (the GPU machine runs 3.12), with
    # the simulated device (feature `sim`) that its tests use; maturin's
    # --features replaces pyproject.toml's list, so that one is named again.
    $py -m maturin --version > /dev/null 2>&1 || $py -m pip install -q "maturin>=1.9,<2"
    CARGO_PROFILE_RELEASE_DEBUG=0 $py -m maturin build --release --strip --out .stage/wheel \
        --features sim,pyo3/extension-module
    # safetensors' own tests, for the python step (the GPU machine has no network).
    $py python/compat/run.py --fetch-only --cache .stage/compat
    git rev-parse --short HEAD > .stage/commit
    du -sh .stage; ls .stage/tests
}

# Garage, a second S3-compatible server for the peers-s3 step (s3s-fs
# serves GETs in 4 KiB reads and caps every client near 0.8 GB/s): about
# 15 minutes on 2 cores, once; `stage` then carries it, compressed.
garage() {
    CARGO_PROFILE_RELEASE_STRIP=true cargo install garage@2.5.0 --locked --root .tools
    xz -T2 -6 -c .tools/bin/garage > .tools/garage.xz
}

device() {
    : "${OUT:?run this on the device machine, where OUT is set}"
    # shellcheck source=bench/gpu-steps.sh
    source bench/gpu-steps.sh
    for step in "$@"; do
        echo "=== $step ($(date -u +%FT%TZ), commit $(cat .stage/commit))"
        declare -F "step_${step//-/_}" > /dev/null || { echo "unknown step $step (bench/README.md lists them)"; exit 2; }
        "step_${step//-/_}"
    done
}

case "${1:-}" in
stage) stage ;;
garage) garage ;;
device) shift; device "$@" ;;
*) sed -n '2,11p' "$0"; exit 2 ;;
esac
