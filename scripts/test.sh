#!/usr/bin/env bash
# The whole test suite, as the README gives it: the Rust workspace (GPU tests
# are reported as ignored without a GPU), then the Python package, installed
# from this checkout into a virtual environment of its own (.venv/, created
# on first use: the system's Python is never changed) and tested with pytest
# (torch and GPU tests say "skipped" where those are missing), then
# safetensors' own PyTorch tests pointed at zerohop (python/compat/).
#
#   scripts/test.sh [CARGO TEST OPTIONS]   # CI passes --locked
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="$PWD/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
pip=("$py" -m pip install --quiet --disable-pip-version-check)
# safetensors at the version whose own tests python/compat runs; maturin
# here builds zerohop without fetching it again for every install.
"${pip[@]}" pytest numpy safetensors==0.8.0 "maturin>=1.9,<2"
# The venv first on PATH: the Rust interoperability test runs `python3`
# with safetensors and numpy, and the build finds maturin.
export PATH="$venv/bin:$PATH"

cargo test --workspace "$@"

# A debug build: the tests need the behaviour, not the speed, and it
# reuses what `cargo test` compiled.
MATURIN_PEP517_ARGS="--profile dev" "${pip[@]}" --no-build-isolation .
# From outside the checkout, so `import zerohop` is the installed package;
# the agent tests run the binary `cargo test` built.
export ZEROHOP_BIN="$PWD/target/debug/zerohop"
(cd python/tests && "$py" -m pytest -q -rs -p no:cacheprovider .)
"$py" python/compat/run.py
