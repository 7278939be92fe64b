#!/usr/bin/env bash
# Builds CRIU 4.x from a source checkout into .tools/criu/ (git-ignored),
# for checkpointing whole GPU processes: Debian 12's CRIU 3.17 fails
# `criu check` on recent kernels ("vdso: Unexpected rt vDSO area bounds").
#
#   bash scripts/build-criu.sh SRC_DIR [MAKE_ARGS...]
#
# SRC_DIR is a CRIU source tree (a checkout of tag v4.2, say); it is built
# in place with `make criu NO_GNUTLS=1` (no page-server TLS; nftables
# support only where libnftables-dev is already installed). Missing Debian
# build dependencies are installed with apt-get. The result:
#
#   .tools/criu/criu       a wrapper that runs bin/criu with lib/ on
#                          LD_LIBRARY_PATH: put .tools/criu on PATH, or set
#                          ZEROHOP_CRIU=.tools/criu/criu
#   .tools/criu/bin/criu   the binary
#   .tools/criu/lib/       the shared libraries it links beyond glibc
#                          (libprotobuf-c, libnl-3, libnet, ...), so the
#                          folder runs on a machine without them
#
# Ends by running `criu check` (CRIU needs root for it) and printing the
# verdict; a failing check is reported, not fatal. CRIU_OUT overrides the
# destination folder.
set -euo pipefail

usage() {
    echo "usage: $0 SRC_DIR [MAKE_ARGS...]   (SRC_DIR: a CRIU 4.x source tree)" >&2
    exit 2
}
die() {
    echo "build-criu: $*" >&2
    exit 1
}

[[ $# -ge 1 ]] || usage
[[ $1 != -h && $1 != --help ]] || usage
src="$1"
shift
[[ -d $src ]] || die "$src is not a directory"
src="$(cd "$src" && pwd)"
[[ -f $src/Makefile.versions && -f $src/criu/Makefile ]] ||
    die "$src does not look like a CRIU source tree (no Makefile.versions or criu/Makefile)"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${CRIU_OUT:-$root/.tools/criu}"

# The source's version, before spending minutes on it.
major="$(sed -n 's/^CRIU_VERSION_MAJOR[[:space:]]*:=[[:space:]]*\([0-9]*\).*/\1/p' "$src/Makefile.versions")"
minor="$(sed -n 's/^CRIU_VERSION_MINOR[[:space:]]*:=[[:space:]]*\([0-9]*\).*/\1/p' "$src/Makefile.versions")"
[[ $major =~ ^[0-9]+$ ]] || die "cannot read CRIU_VERSION_MAJOR from $src/Makefile.versions"
((major >= 4)) || die "$src is CRIU $major.${minor:-0}; CRIU 4.0 or later is needed (check out tag v4.2)"
echo "build-criu: CRIU $major.${minor:-0} from $src"

# Debian's build dependencies (CRIU's criu/Makefile.packages, plus the
# optional libbsd for setproctitle and libaio for its tests).
deps=(gcc make pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
    protobuf-compiler python3-protobuf libcap-dev libnl-3-dev libnet1-dev uuid-dev
    libbsd-dev libaio-dev)
if command -v dpkg-query >/dev/null; then
    missing=()
    for p in "${deps[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$p")
    done
    if ((${#missing[@]})); then
        echo "build-criu: installing ${missing[*]}"
        sudo=()
        if ((EUID != 0)); then
            command -v sudo >/dev/null || die "not root and no sudo: install ${missing[*]}"
            sudo=(sudo)
        fi
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends "${missing[@]}" ||
            die "apt-get could not install ${missing[*]} (try apt-get update first)"
    fi
else
    echo "build-criu: not a Debian system; the build needs the equivalents of: ${deps[*]}" >&2
fi

start=$SECONDS
make -C "$src" -j"$(nproc)" criu NO_GNUTLS=1 "$@" || die "make criu failed in $src"
echo "build-criu: built in $((SECONDS - start)) s"
bin="$src/criu/criu"
[[ -x $bin ]] || die "make succeeded but $bin is missing"

# Install: the binary, its non-glibc libraries, and the wrapper.
rm -rf "$out/bin" "$out/lib" "$out/criu"
mkdir -p "$out/bin" "$out/lib"
cp "$bin" "$out/bin/criu"
ldd_out="$(ldd "$bin")" || die "ldd $bin failed"
if grep -q 'not found' <<<"$ldd_out"; then
    die "$bin has unresolved libraries: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t' ' ')"
fi
# glibc's own libraries come with every system and must match its loader.
glibc='^(ld-linux[^ ]*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl)\.so'
while read -r name arrow path _; do
    [[ $arrow == "=>" && $path == /* ]] || continue
    [[ $name =~ $glibc ]] && continue
    cp -L "$path" "$out/lib/$name"
    echo "build-criu: bundled $name (from $path)"
done <<<"$ldd_out"
cat >"$out/criu" <<'EOF'
#!/bin/sh
# Runs the CRIU built by scripts/build-criu.sh with its bundled libraries.
here="$(dirname "$(readlink -f "$0")")"
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/criu" "$@"
EOF
chmod +x "$out/criu"

# The installed copy's own word on its version.
version_line="$("$out/criu" --version | sed -n 's/^Version:[[:space:]]*//p' | head -n1)"
[[ $version_line =~ ^([0-9]+)\.([0-9]+) ]] ||
    die "cannot read a version from '$out/criu --version'"
((BASH_REMATCH[1] >= 4)) || die "$out/criu is version $version_line; 4.0 or later is needed"
echo "build-criu: installed CRIU $version_line as $out/criu"
echo "build-criu: use it with  export PATH=\"$out:\$PATH\"  or  export ZEROHOP_CRIU=$out/criu"

# The verdict. Not fatal: the build is fine even where this kernel or user
# cannot checkpoint.
echo "build-criu: criu check:"
set +e
check_out="$(timeout 60 "$out/criu" check 2>&1)"
rc=$?
set -e
sed 's/^/    /' <<<"$check_out"
if ((rc == 0)); then
    echo "build-criu: criu check passes"
elif ((rc == 124)); then
    echo "build-criu: criu check did not finish in 60 s"
else
    hint=""
    ((EUID == 0)) || hint=" (criu check needs root)"
    echo "build-criu: criu check FAILS (exit $rc)$hint"
fi
