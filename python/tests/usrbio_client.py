"""A ctypes client of libhf3fs_api_shared.so, as USRBIO's Python wrappers
use one: the library loaded by name with RTLD_GLOBAL, from HF3FS_LIB_DIR
when set, else through LD_LIBRARY_PATH. Run as a script, it is the second
process of the device tests:

    python usrbio_client.py read-into-device MOUNT FILE ID_HEX SIZE
"""

import ctypes
import os
import sys

LIB = "libhf3fs_api_shared.so"


class Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("iovh", ctypes.c_void_p), ("id", ctypes.c_uint8 * 16),
                ("mount_point", ctypes.c_char * 256), ("size", ctypes.c_size_t),
                ("block_size", ctypes.c_size_t), ("numa", ctypes.c_int)]


class Ior(ctypes.Structure):
    _fields_ = [("iov", Iov), ("iorh", ctypes.c_void_p), ("mount_point", ctypes.c_char * 256),
                ("for_read", ctypes.c_bool), ("io_depth", ctypes.c_int), ("priority", ctypes.c_int),
                ("timeout", ctypes.c_int), ("flags", ctypes.c_uint64)]


class Cqe(ctypes.Structure):
    _fields_ = [("index", ctypes.c_int32), ("reserved", ctypes.c_int32), ("result", ctypes.c_int64),
                ("userdata", ctypes.c_void_p)]


def load() -> ctypes.CDLL:
    where = os.environ.get("HF3FS_LIB_DIR")
    lib = ctypes.CDLL(os.path.join(where, LIB) if where else LIB, mode=ctypes.RTLD_GLOBAL)
    p = ctypes.POINTER
    c = ctypes
    sig = {
        "hf3fs_extract_mount_point": (c.c_int, [c.c_char_p, c.c_int, c.c_char_p]),
        "hf3fs_is_hf3fs": (c.c_bool, [c.c_int]),
        "hf3fs_iovcreate": (c.c_int, [p(Iov), c.c_char_p, c.c_size_t, c.c_size_t, c.c_int]),
        "hf3fs_iovopen": (c.c_int, [p(Iov), c.c_void_p, c.c_char_p, c.c_size_t, c.c_size_t, c.c_int]),
        "hf3fs_iovcreate_device": (c.c_int, [p(Iov), c.c_char_p, c.c_size_t, c.c_size_t, c.c_int]),
        "hf3fs_iovopen_device": (c.c_int, [p(Iov), c.c_void_p, c.c_char_p, c.c_size_t, c.c_size_t, c.c_int]),
        "hf3fs_iovwrap_device": (c.c_int, [p(Iov), c.c_void_p, c.c_void_p, c.c_char_p, c.c_size_t, c.c_size_t,
                                           c.c_int]),
        "hf3fs_iovdestroy": (None, [p(Iov)]),
        "hf3fs_iov_mem_type": (c.c_int, [p(Iov)]),
        "hf3fs_iov_device_id": (c.c_int, [p(Iov)]),
        "hf3fs_iovsync": (c.c_int, [p(Iov), c.c_int]),
        "hf3fs_gdr_available": (c.c_bool, []),
        "hf3fs_iorcreate4": (c.c_int, [p(Ior), c.c_char_p, c.c_int, c.c_bool, c.c_int, c.c_int, c.c_int,
                                       c.c_uint64]),
        "hf3fs_iordestroy": (None, [p(Ior)]),
        "hf3fs_reg_fd": (c.c_int, [c.c_int, c.c_uint64]),
        "hf3fs_dereg_fd": (None, [c.c_int]),
        "hf3fs_prep_io": (c.c_int, [p(Ior), p(Iov), c.c_bool, c.c_void_p, c.c_int, c.c_size_t, c.c_uint64,
                                    c.c_void_p]),
        "hf3fs_submit_ios": (c.c_int, [p(Ior)]),
        "hf3fs_wait_for_ios": (c.c_int, [p(Ior), p(Cqe), c.c_int, c.c_int, c.c_void_p]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def check(rc: int, what: str) -> int:
    if rc < 0:
        raise OSError(-rc, f"{what}: {os.strerror(-rc)}")
    return rc


def read(lib, mount: bytes, iov: Iov, path: str, offset_in_iov: int = 0, length=None) -> int:
    """Reads `path` from its start into `iov` at `offset_in_iov`; returns the bytes read."""
    length = os.path.getsize(path) if length is None else length
    fd = os.open(path, os.O_RDONLY)
    try:
        rc = lib.hf3fs_reg_fd(fd, 0)
        if rc > 0:
            raise OSError(rc, f"hf3fs_reg_fd: {os.strerror(rc)}")
        ior = Ior()
        check(lib.hf3fs_iorcreate4(ctypes.byref(ior), mount, 8, True, 0, 0, -1, 0), "hf3fs_iorcreate4")
        try:
            check(lib.hf3fs_prep_io(ctypes.byref(ior), ctypes.byref(iov), True, iov.base + offset_in_iov, fd, 0,
                                    length, None), "hf3fs_prep_io")
            check(lib.hf3fs_submit_ios(ctypes.byref(ior)), "hf3fs_submit_ios")
            cqe = Cqe()
            assert check(lib.hf3fs_wait_for_ios(ctypes.byref(ior), ctypes.byref(cqe), 1, 1, None), "wait") == 1
            return check(cqe.result, "the read")
        finally:
            lib.hf3fs_iordestroy(ctypes.byref(ior))
            lib.hf3fs_dereg_fd(fd)
    finally:
        os.close(fd)


def main(argv) -> None:
    what, mount, path, id_hex, size = argv
    assert what == "read-into-device"
    lib = load()
    iov = Iov()
    ident = (ctypes.c_uint8 * 16).from_buffer_copy(bytes.fromhex(id_hex))
    check(lib.hf3fs_iovopen_device(ctypes.byref(iov), ident, mount.encode(), int(size), 0, 0), "hf3fs_iovopen_device")
    assert lib.hf3fs_iov_mem_type(ctypes.byref(iov)) == 1 and lib.hf3fs_iov_device_id(ctypes.byref(iov)) == 0
    assert read(lib, mount.encode(), iov, path) == int(size)
    lib.hf3fs_iovdestroy(ctypes.byref(iov))
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1:])
