"""Runs the safetensors project's own PyTorch tests against zerohop: the
test file `bindings/python/tests/test_pt_comparison.py` of the safetensors
source distribution, with `safetensors.torch.load_file`, `save_file` and
`safetensors.safe_open` pointed at zerohop's (conftest.py here does that;
the in-memory `save` and `load` stay safetensors' own). Deliberate
differences are expected failures, listed with their reasons in
conftest.py.

    python python/compat/run.py [--cache DIR] [--fetch-only]

The source distribution is fetched with pip once and kept in DIR (default:
.venv/compat/ in this checkout; --fetch-only stops there, for machines
without a network). Needs torch, and safetensors at VERSION installed
beside zerohop; without torch it reports itself skipped."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.8.0"
HERE = Path(__file__).resolve().parent
TESTS = f"safetensors-{VERSION}/bindings/python/tests"


def fetch_sdist(cache: Path) -> Path:
    """The source distribution, downloaded into `cache` on first use."""
    sdist = cache / f"safetensors-{VERSION}.tar.gz"
    if sdist.exists():
        return sdist
    cache.mkdir(parents=True, exist_ok=True)
    # pip reads the package's metadata through its build backend (maturin,
    # which scripts/test.sh installs beside this interpreter): without build
    # isolation, so pip does not build maturin itself from source.
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-binary", "safetensors", "--no-build-isolation", f"safetensors=={VERSION}", "-d", str(cache)],
        check=True,
        env=env,
    )
    return sdist


def unpack_tests(sdist: Path, work: Path) -> Path:
    """The PyTorch test file and its data folder, under work/tests/."""
    wanted = (f"{TESTS}/test_pt_comparison.py", f"{TESTS}/data/")
    root = (work / "tests").resolve()
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(wanted):
                continue
            # A name with ".." (or an absolute one) must not write outside
            # work/tests/, whatever the archive holds.
            target = (root / member.name[len(TESTS) + 1:]).resolve()
            if not target.is_relative_to(root):
                raise ValueError(f"{sdist}: member {member.name!r} would be written outside {root}")
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    (work / "tests" / "data").mkdir(parents=True, exist_ok=True)  # the tests write their files there
    return work / "tests" / "test_pt_comparison.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=HERE.parent.parent / ".venv" / "compat",
                        help="where the source distribution is kept (default: .venv/compat/)")
    parser.add_argument("--fetch-only", action="store_true", help="fetch the source distribution, run nothing")
    args = parser.parse_args()
    if args.fetch_only:
        print(fetch_sdist(args.cache))
        return 0
    try:
        import torch  # noqa: F401
    except ImportError as e:
        # In pytest's summary form ("N skipped in S.SSs"): .ci/run's summary
        # regex counts it as a skipped test. Change the two together.
        print(f"python/compat: 1 skipped in 0.00s: safetensors {VERSION}'s PyTorch tests need torch ({e})")
        return 0
    import safetensors

    if safetensors.__version__ != VERSION:
        print(f"python/compat: these are safetensors {VERSION}'s tests, but safetensors "
              f"{safetensors.__version__} is installed: pip install safetensors=={VERSION}", file=sys.stderr)
        return 1
    sdist = fetch_sdist(args.cache)
    with tempfile.TemporaryDirectory(prefix="zerohop-compat-") as tmp:
        work = Path(tmp)
        test_file = unpack_tests(sdist, work)
        shutil.copy(HERE / "conftest.py", work / "conftest.py")
        # The tests write to ./tests/data/: run them from the copy.
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rsx", "-p", "no:cacheprovider", str(test_file.relative_to(work))],
            cwd=work,
        )
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
