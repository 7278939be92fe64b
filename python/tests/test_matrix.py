"""bench/matrix.py at a small size on host memory, as CI runs it: every
operation and every shape runs through zerohop and its installed peers in
fresh processes, and every byte comes back right (the matrix checks them
and fails otherwise). Speed is judged on a GPU, not here."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

MATRIX = Path(__file__).resolve().parents[2] / "bench" / "matrix.py"

torch = pytest.importorskip("torch", reason="the matrix makes its tensors with torch")
pytest.importorskip("safetensors", reason="the matrix makes its files with safetensors")


def test_every_operation_and_shape_gives_back_the_right_bytes(tmp_path):
    out = subprocess.run(
        [sys.executable, str(MATRIX), "--device", "cpu", "--size", "64MiB", "--rounds", "1",
         "--dir", str(tmp_path), "--json-out", str(tmp_path / "matrix.json")],
        capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "every byte checked" in out.stdout
    for op in ("load_file", "get_slice", "save_file", "checkpoint-save", "checkpoint-load"):
        assert f"== {op} " in out.stdout, out.stdout
    # Nothing is left behind in the directory but the report.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.json"]


def test_a_wrong_byte_fails_the_matrix(tmp_path):
    """The check is real: a child that hands back other bytes is reported
    and fails the run (ZEROHOP_MATRIX_CORRUPT flips a loaded byte)."""
    out = subprocess.run(
        [sys.executable, str(MATRIX), "--device", "cpu", "--size", "1MiB", "--rounds", "1",
         "--dir", str(tmp_path), "--ops", "load_file", "--shapes", "four"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "ZEROHOP_MATRIX_CORRUPT": "1"},
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "bytes differ" in out.stdout
