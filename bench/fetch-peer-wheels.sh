#!/usr/bin/env bash
# Download the wheels that bench/peers.py (and pytest) need on the GPU machine, which has
# no network.  Run this on a machine that reaches the package registry; the
# wheels land in .whl/ at the repository root (git-ignored) and travel with the
# working tree.  On the GPU machine bench/gpu-steps.sh installs them
# (install_wheels), compiled to bytecode as pip leaves them for a user.
#
# Target: CPython 3.12, manylinux x86_64.  --no-deps is deliberate: the GPU
# machine already has torch 2.11 (cu130), numpy, cupy-cuda13x, safetensors,
# nvidia-cufile, nvidia-cuda-runtime, nvidia-nvjitlink, packaging,
# typing-extensions, pyyaml, requests, psutil, filelock and fsspec, so only
# the loaders and their missing runtime dependencies are listed below.
#
# Declared dependencies that are deliberately NOT downloaded, because the GPU
# machine's image already holds them (cupy-cuda13x 14 and torch's
# cuda-bindings pull in cuda-pathfinder and cuda-toolkit there):
#   humanize         runai-model-streamer
#   typer            fastsafetensors (declared, but no module imports it)
#   cuda-pathfinder  libkvikio-cu13 (locates libcufile from nvidia-cufile)
#   cuda-toolkit     libkvikio-cu13's "cuda-toolkit[cufile]", a metapackage
#   cupy-cuda13x, numpy, packaging, torch: kvikio-cu13, instanttensor, runai
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=.whl
mkdir -p "$dest"

# `fetch-peer-wheels.sh s3`: the object-store peers of bench/peers.py's s3
# section instead, into .whl-s3/ (carried with .stage alone: with .whl the
# tree would pass the 64 MiB limit). botocore is most of it.
if [ "${1:-}" = s3 ]; then
  dest=.whl-s3
  mkdir -p "$dest"
  pins=(
    runai-model-streamer==0.17.1     # peer: SafetensorsStreamer ...
    runai-model-streamer-s3==0.17.1  #   ... with its S3 backend
    humanize==4.17.0                 #   for runai-model-streamer
    boto3==1.44.8                    # peer: download_file + safetensors
    botocore==1.44.8                 #   for boto3
    s3transfer==0.19.3               #   for boto3
    jmespath==1.1.0                  #   for boto3
    python-dateutil==2.9.0.post0     #   for botocore
    six==1.17.0                      #   for python-dateutil
  )
else
pins=(
  fastsafetensors==0.5.0        # peer: SafeTensorsFileLoader(nogds=True)
  instanttensor==0.2.2          # peer: instanttensor.safe_open
  runai-model-streamer==0.17.1  # peer: SafetensorsStreamer
  kvikio-cu13==26.10.0          # peer: kvikio.CuFile (CUDA 13 build)
  libkvikio-cu13==26.10.0       #   libkvikio.so for kvikio-cu13
  rapids-logger==0.3.0          #   librapids_logger.so for libkvikio-cu13
  torch-memory-saver==0.0.10    # peer: pause/resume of GPU memory (bench/suspend.py)
  pytest==8.4.2                 # runs python/tests (zerohop's own GPU tests)
  pluggy==1.6.0                 #   for pytest
  iniconfig==2.1.0              #   for pytest
  pygments==2.19.2              #   for pytest
)
fi

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done

for pin in "${pins[@]}"; do
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d "$dest" "$pin"
done

# Report what is in .whl/ and its total size (the travelling tree must stay
# under 64 MiB, wheels included).
total=0
for f in "$dest"/*.whl; do
  size=$(stat -c %s "$f")
  total=$((total + size))
  printf '%10d  %s\n' "$size" "$(basename "$f")"
done
printf '%10d  total bytes (%s MiB)\n' "$total" \
  "$(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }')"
