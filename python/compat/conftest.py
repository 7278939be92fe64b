"""Copied beside safetensors' test file by run.py. Loaded by pytest before
the test module imports safetensors' names, so its file APIs are zerohop's
when the tests run."""

import pytest
import safetensors
import safetensors.torch

import zerohop

safetensors.safe_open = zerohop.safe_open
safetensors.torch.load_file = zerohop.load_file
safetensors.torch.save_file = zerohop.save_file

# Tests that fail by design, and why (the README lists them too). Strict:
# one that starts passing fails the run, so this list stays true.
DELIBERATE = {
    "TorchTestCase::test_serialization": (
        "zerohop pads the header to 4 KiB so the data can be written with O_DIRECT: "
        "the file's bytes differ from safetensors', its tensors do not"
    ),
}


def pytest_collection_modifyitems(items):
    found = set()
    for item in items:
        for test, reason in DELIBERATE.items():
            if item.nodeid.endswith("::" + test):
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
                found.add(test)
    missing = set(DELIBERATE) - found
    if missing:
        raise pytest.UsageError(f"deliberate differences name tests that no longer exist: {sorted(missing)}")
