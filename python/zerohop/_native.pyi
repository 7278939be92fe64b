"""The native half of zerohop (Rust). Private: its functions take raw
addresses; use the functions of the `zerohop` package instead."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

__version__: str

class IntegrityError(Exception):
    """Stored bytes do not match their checksum; the message names the first bad chunk."""

TensorSpec = Tuple[str, str, List[int], int, int]

def info(path: Optional[str] = None) -> str: ...
def safetensors_header(path: str) -> Tuple[Optional[Dict[str, str]], List[TensorSpec]]: ...
def read(
    device: str,
    paths: Sequence[str],
    pieces: Sequence[Tuple[int, int, int, int]],
    stream: Optional[int] = None,
    progress: Any = None,
) -> str: ...
def write(
    device: str,
    path: str,
    offset: int,
    addr: int,
    len: int,
    stream: Optional[int] = None,
    progress: Any = None,
) -> str: ...
def save_safetensors(
    device: str,
    path: str,
    tensors: Sequence[TensorSpec],
    metadata: Optional[Dict[str, str]] = None,
    stream: Optional[int] = None,
    progress: Any = None,
) -> str: ...
def checkpoint_save(
    device: str,
    dir: str,
    entries: Sequence[Tuple[str, Optional[str], Optional[List[int]], int, int]],
    parent: Optional[str] = None,
    metadata: Optional[Dict[str, str]] = None,
    stream: Optional[int] = None,
    progress: Any = None,
) -> Tuple[str, float, int]: ...
def checkpoint_entries(
    dir: str,
) -> Tuple[Dict[str, str], List[Tuple[str, Optional[str], Optional[List[int]], int]]]: ...
def checkpoint_restore(
    device: str,
    dir: str,
    targets: Sequence[Tuple[str, int, int]],
    stream: Optional[int] = None,
    progress: Any = None,
) -> str: ...
def checkpoint_verify(dir: str, progress: Any = None) -> Tuple[int, int]: ...
