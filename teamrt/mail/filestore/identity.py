"""Whether a file opened again by name is the one a reader left: its birth time and its marks.

A parked reader (reader.py) closed its descriptor, so the file could be deleted meanwhile and its
inode freed; a file created in its place usually gets the freed number at once (ext4 hands it out
first), so the device and inode number do not tell. The reader also compares the file's birth
time, where the file system keeps one (statx's `stx_btime`, called through libc: Python 3.11 has
no `os.statx`), and the CRCs of the first and of the last `CHECK` bytes before its position,
which an append-only log never changes. What that catches and what it cannot is spelt in
mailboxes/README.md. Everything here is a few system calls: it runs at every reopen.
"""

from __future__ import annotations

import ctypes
import os
import struct
import zlib
from collections.abc import Callable

#: Bytes at each end of what a reader has read whose CRC it compares when it reopens the file.
CHECK = 256

_AT_EMPTY_PATH = 0x1000
_STATX_BTIME = 0x800
_STATX_SIZE = 256  # sizeof(struct statx): stx_mask (u32) at 0, stx_btime (i64 s, u32 ns) at 0x50
_BTIME_AT = 0x50


def _load_statx() -> Callable[..., int] | None:
    try:
        statx = ctypes.CDLL(None, use_errno=True).statx  # glibc 2.28+, musl 1.2.5+
    except (OSError, AttributeError):
        return None
    statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    statx.restype = ctypes.c_int
    return statx


_statx = _load_statx()


def birth_time(fd: int) -> int:
    """When `fd`'s file was created, in nanoseconds since the epoch; 0 where that is not known
    (a libc without statx, a kernel that refuses it, a file system that keeps no birth time)."""
    statx = _statx
    if statx is None:
        return 0
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if statx(fd, b"", _AT_EMPTY_PATH, _STATX_BTIME, buf) != 0:
        return 0
    if not struct.unpack_from("I", buf)[0] & _STATX_BTIME:
        return 0
    seconds, nanoseconds = struct.unpack_from("qI", buf, _BTIME_AT)
    return int(seconds) * 1_000_000_000 + int(nanoseconds)


def read_marks(fd: int, offset: int) -> tuple[int, int]:
    """The CRCs of the first and of the last (up to) `CHECK` bytes before `offset` of `fd`'s file
    (one read where the two are close)."""
    if offset <= 2 * CHECK:
        data = os.pread(fd, offset, 0)
        return zlib.crc32(data[:CHECK]), zlib.crc32(data[max(0, offset - CHECK) :])
    return zlib.crc32(os.pread(fd, CHECK, 0)), zlib.crc32(os.pread(fd, CHECK, offset - CHECK))
