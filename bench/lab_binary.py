"""Where `zerohop-lab` (the developers' benchmarks) is: beside the `zerohop`
binary a script was given, as cargo and `scripts/gpu.sh stage` put them."""

from __future__ import annotations

import os
import shutil


def lab_binary(zerohop: str) -> str:
    found = shutil.which(zerohop) or zerohop
    return os.path.join(os.path.dirname(os.path.abspath(found)), "zerohop-lab")
