"""The native half of zerohop (Rust). Private: its functions take raw
addresses; use the functions of the `zerohop` package instead."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

__version__: str
DEBUG_BUILD: bool

class IntegrityError(Exception):
    """Stored bytes do not match their checksum; the message names the first bad chunk."""

TensorSpec = Tuple[str, str, List[int], int, int]

def device_name(spec: str) -> str: ...
def info(path: Optional[str] = None) -> str: ...
def prepare(device: str) -> str: ...
def grow_descriptor_table() -> None: ...
def safetensors_header(path: str) -> Tuple[Optional[Dict[str, str]], List[TensorSpec]]: ...
def expand_names(names: Sequence[str]) -> List[str]: ...
def object_stamp(url: str) -> Tuple[int, str]: ...
def is_object(name: Any) -> bool: ...
class Sources:
    """Files or objects opened once for many reads (each mapped once)."""

    def __init__(self, paths: Sequence[str]) -> None: ...
    def wait_for_threads(self) -> None:
        """Until no read-ahead thread holds the files."""

def read(
    device: str,
    sources: "Sequence[str] | Sources",
    pieces: Sequence[Tuple[int, int, int, int]],
    stream: Optional[int] = None,
    progress: Any = None,
    stats: bool = True,
    regions: Optional[Sequence[Tuple[int, int]]] = None,
) -> Optional[str]: ...
Piece = Tuple[int, int, int, int]

def plan_blocks(sizes: Sequence[int], block_bytes: int) -> List[Optional[Tuple[int, int]]]: ...
def pieces_of(tensors: Sequence[Tuple[int, int, int, int, Optional[int]]]) -> List[Piece]: ...
class Layout:
    """Every tensor of some safetensors files, placed in blocks of device memory."""

    def __len__(self) -> int: ...
    def block_ends(self) -> List[int]: ...
    def alone(self) -> List[Tuple[int, str, List[int]]]: ...
    def pieces(self, blocks: Sequence[int], alone: Sequence[int]) -> List[Piece]: ...
    def specs(self) -> List[Tuple[str, List[int], int]]: ...
    def members(self) -> List[List[Tuple[str, List[Tuple[int, int]]]]]: ...
    def names(self) -> List[str]: ...

def safetensors_layout(paths: Sequence[str], block_bytes: int) -> Layout: ...
class QueuedRead:
    """A read started by `read_queued`."""

    def wait(self) -> Optional[str]: ...

def read_queued(
    device: str,
    sources: Sources,
    pieces: Sequence[Tuple[int, int, int, int]],
    stream: Optional[int],
    regions: Optional[Sequence[Tuple[int, int]]],
    keep: Any,
    after: Optional[QueuedRead] = None,
) -> QueuedRead: ...
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
    at: str,
    entries: Sequence[Tuple[str, Optional[str], Optional[List[int]], int, int]],
    parent: Optional[str] = None,
    metadata: Optional[Dict[str, str]] = None,
    stream: Optional[int] = None,
    progress: Any = None,
) -> Tuple[str, float, int, str]: ...
def checkpoint_open(at: str) -> OpenedCheckpoint: ...

class OpenedCheckpoint:
    def metadata(self) -> Dict[str, str]: ...
    def entries(self) -> List[Tuple[str, Optional[str], Optional[List[int]], int]]: ...
    def file_order(self) -> List[str]: ...  # entry names, in the order their bytes lie in the data files
    def restore(
        self,
        device: str,
        targets: Sequence[Tuple[str, int, int]],
        stream: Optional[int] = None,
        progress: Any = None,
        regions: Optional[Sequence[Tuple[int, int]]] = None,  # (address, bytes) of blocks holding targets
    ) -> str: ...

def checkpoint_verify(at: str, progress: Any = None) -> Tuple[int, int]: ...  # (chunks, bytes)
def checkpoint_list(store: str) -> List[Tuple[str, Optional[str], int, int]]: ...  # (name, parent, entries, bytes)
def checkpoint_remove(at: str) -> None: ...
def freeze(
    pid: int, dir: str, leave_running: bool, parent: Optional[str], shell_job: bool, tcp_established: bool,
    file_locks: bool, ext_unix_sk: bool, criu_args: List[str], lock_timeout: float,
) -> str: ...  # FREEZE.json
def thaw(dir: str, criu_args: List[str]) -> str: ...  # the thaw's report

class AgentClient:
    def __init__(self, socket: Optional[str] = None) -> None: ...
    def register_file(self, fd: int) -> int: ...
    def deregister_file(self, id: int) -> None: ...
    def create_host_buffer(self, size: int) -> AgentHostBuffer: ...
    def register_device_buffer(self, device: int, ptr: int, size: int) -> int: ...
    def deregister_buffer(self, id: int) -> None: ...
    def create_ring(self, entries: int) -> AgentRing: ...
    def status(self) -> str: ...

class AgentHostBuffer:
    id: int
    address: int
    size: int

class AgentRing:
    in_flight: int
    def prepare(
        self, op: int, file: int, file_offset: int, buffer: int, buffer_offset: int, length: int, user_data: int
    ) -> bool: ...
    def submit(self) -> None: ...
    def wait(self, min: int = 1, timeout: Optional[float] = None) -> List[Tuple[int, int]]: ...
