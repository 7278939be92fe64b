#!/usr/bin/env bash
# Regenerates the kernels that zerohop-cuda embeds from its CUDA C sources:
# PTX by clang 14 or later (its NVPTX back end; no CUDA toolkit), then SASS
# for sm_80, sm_90 and sm_100 by NVIDIA's ptxas, so that a GPU of those
# generations loads machine code instead of having the driver JIT-compile
# the PTX on first use (0.43 s on an H200). ptxas comes from NVIDIA's nvcc
# wheel on PyPI (fetched once by pip into a cache) unless PTXAS names one.
# Everything is checked in, so building zerohop never needs this; run it
# after editing a kernel, then run the tests (they check the source on the
# host, and the cubins against the PTX through KERNEL.cubins.txt).
set -euo pipefail
cd "$(dirname "$0")/../crates/zerohop-cuda/kernels"
clang="${CLANG:-$(command -v clang-14 || command -v clang)}"

# The exact ptxas. 12.8 is the first that generates sm_100; a 12.x
# toolkit's cubins load with any driver of CUDA 12.0 or later (CUDA's minor
# version compatibility), where CUDA 13's would need a CUDA 13 driver.
# The hashes are those of the x86_64 and aarch64 Linux wheels.
ptxas_package=nvidia-cuda-nvcc-cu12
ptxas_version=12.9.86
ptxas_wheel_sha256=(
    5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0
    44e1eca4d08926193a558d2434b1bf83d57b4d5743e0c431c0c83d51da1df62b
)
archs=(80 90 100)

fetch_ptxas() {
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/zerohop/ptxas-$ptxas_version"
    if [[ ! -x "$cache/ptxas" ]]; then
        mkdir -p "$cache"
        local req="$cache/requirements.txt"
        printf '%s==%s' "$ptxas_package" "$ptxas_version" > "$req"
        printf ' --hash=sha256:%s' "${ptxas_wheel_sha256[@]}" >> "$req"
        echo >> "$req"
        python3 -m pip download --quiet --no-deps --only-binary=:all: \
            --require-hashes -r "$req" --dest "$cache" >&2
        # Only ptxas, of the wheel's whole toolkit.
        python3 - "$cache" <<'EOF'
import glob, os, sys, zipfile
cache = sys.argv[1]
(wheel,) = glob.glob(os.path.join(cache, "*.whl"))
with zipfile.ZipFile(wheel) as z, open(os.path.join(cache, "ptxas"), "wb") as out:
    out.write(z.read("nvidia/cuda_nvcc/bin/ptxas"))
os.chmod(os.path.join(cache, "ptxas"), 0o755)
EOF
        rm -f "$cache"/*.whl
    fi
    echo "$cache/ptxas"
}
ptxas="${PTXAS:-$(fetch_ptxas)}"
ptxas_says="$("$ptxas" --version | grep -m1 release)"

for src in *.cu; do
    name="${src%.cu}"
    # PTX for sm_70 in PTX ISA 6.4, so the driver can still JIT it for GPUs
    # without SASS here (Volta on); ptxas takes it unchanged for each arch.
    "$clang" -x cuda --cuda-device-only --cuda-gpu-arch=sm_70 -nocudainc -nocudalib \
        -Xclang -target-feature -Xclang +ptx64 -O3 -S -o "$name.ptx" "$src"
    echo "wrote kernels/$name.ptx"
    manifest="# Written by scripts/build-kernels.sh: the PTX that the cubins were built
# from, the ptxas that built them, and each cubin. A test checks the files
# against it, so a kernel edited without rerunning the script fails.
ptx-sha256 $(sha256sum "$name.ptx" | cut -d' ' -f1)
ptxas $ptxas_says"
    for arch in "${archs[@]}"; do
        "$ptxas" -arch="sm_$arch" -O3 -o "$name.sm_$arch.cubin" "$name.ptx"
        manifest+=$'\n'"sm_$arch-sha256 $(sha256sum "$name.sm_$arch.cubin" | cut -d' ' -f1)"
        echo "wrote kernels/$name.sm_$arch.cubin"
    done
    echo "$manifest" > "$name.cubins.txt"
    echo "wrote kernels/$name.cubins.txt"
done
