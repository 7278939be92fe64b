#!/usr/bin/env bash
# The whole test suite, as the README gives it: the Rust workspace (GPU tests
# say "skipped" without a GPU), then the Python package, installed from this
# checkout with pip and tested with pytest (torch and GPU tests say
# "skipped" where those are missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cargo test --workspace

pip=(python3 -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" pytest numpy safetensors
"${pip[@]}" .
# From outside the checkout, so `import zerohop` is the installed package;
# the agent tests run the binary `cargo test` built.
export ZEROHOP_BIN="$PWD/target/debug/zerohop"
(cd python/tests && python3 -m pytest -q -rs -p no:cacheprovider .)
