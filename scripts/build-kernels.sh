#!/usr/bin/env bash
# Regenerates the PTX that zerohop-cuda embeds from its CUDA C sources.
# Needs clang 14 or later (its NVPTX back end); no CUDA toolkit. The PTX is
# checked in, so building zerohop never needs this; run it after editing a
# kernel, then run the tests (they check the source on the host).
set -euo pipefail
cd "$(dirname "$0")/../crates/zerohop-cuda/kernels"
clang="${CLANG:-$(command -v clang-14 || command -v clang)}"
for src in *.cu; do
    "$clang" -x cuda --cuda-device-only --cuda-gpu-arch=sm_70 -nocudainc -nocudalib \
        -Xclang -target-feature -Xclang +ptx64 -O3 -S -o "${src%.cu}.ptx" "$src"
    echo "wrote kernels/${src%.cu}.ptx"
done
