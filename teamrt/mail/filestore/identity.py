"""Whether a file opened again by name is the one a reader left: its birth and its marks.

A parked reader (reader.py) closed its descriptor, so the file could be deleted meanwhile and its
inode freed; a file created in its place usually gets the freed number at once (ext4 hands it out
first), so the device and inode number do not tell. The reader also compares the file's birth
time, where the file system keeps one (statx's `stx_btime`, called through libc: Python 3.11 has
no `os.statx`), its inode generation where the file system keeps one (FS_IOC_GETVERSION; ext4
draws it at random for each new inode), and the CRCs of the first and of the last `CHECK` bytes
before its position, which an append-only log never changes. A birth time alone is not enough: it
is a tick of the kernel's coarse clock (4 ms at HZ=250), so a file deleted and created again at
once often has the old one's. What all that catches and what it cannot is spelt in
mailboxes/README.md. Everything here is a few system calls: it runs at every reopen.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import threading
import zlib
from collections.abc import Callable

#: Bytes at each end of what a reader has read whose CRC it compares when it reopens the file.
CHECK = 256

_AT_EMPTY_PATH = 0x1000
_STATX_WANTED = 0x100 | 0x200 | 0x800  # STATX_INO | STATX_SIZE | STATX_BTIME
_STATX_BTIME = 0x800
#: struct statx (linux/stat.h): stx_mask at 0, stx_ino and stx_size at 0x20, stx_btime (s, ns)
#: at 0x50, stx_dev_major and stx_dev_minor at 0x88; 256 bytes in all.
_FIELDS = struct.Struct("=I28xQQ32xqI44xII")
_STATX_SIZE = 256
_local = threading.local()  # one result buffer per thread: readers run on several event loops


def _load_statx() -> Callable[..., int] | None:
    try:
        statx = ctypes.CDLL(None, use_errno=True).statx  # glibc 2.28+, musl 1.2.5+
    except (OSError, AttributeError):
        return None
    # no argtypes: ctypes' default conversions (int, bytes, buffer) fit statx's arguments, so
    # there is nothing for ctypes to check on each call (one per cursor commit)
    statx.restype = ctypes.c_int
    return statx


_statx = _load_statx()

#: FS_IOC_GETVERSION (linux/fs.h: _IOR('v', 1, long)): the inode's generation
_GETVERSION = 0x80087601 if struct.calcsize("l") == 8 else 0x80047601
_GENERATION = struct.Struct("l")
_INT = struct.Struct("=I")
_no_generation = False  # set once the kernel or a sandbox refuses the call itself


def generation(fd: int) -> int:
    """`fd`'s inode generation, 0 where it is not known (a file system that keeps none, such
    as tmpfs, or a sandbox that refuses the call): see the module."""
    global _no_generation
    if _no_generation:
        return 0
    buf = getattr(_local, "generation", None)
    if buf is None:
        buf = _local.generation = bytearray(_GENERATION.size)
    try:
        fcntl.ioctl(fd, _GETVERSION, buf)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):
            _no_generation = True
        return 0  # ENOTTY, EOPNOTSUPP: this file system's; EBADF: the caller's, told by fstat
    # the kernel writes an int (of the long the ioctl's number names); a generation of 0 is a
    # real one, told from "not known" by the bit above its 32
    generation: int = _INT.unpack_from(buf)[0]
    return generation | 1 << 32


_OVERLAYFS_MAGIC = 0x794C7630  # linux/magic.h
_STATFS_SIZE = 120  # struct statfs on 64-bit Linux; f_type, a long, comes first


def _load_fstatfs() -> Callable[..., int] | None:
    try:
        call = ctypes.CDLL(None, use_errno=True).fstatfs
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_int
    return call


_fstatfs = _load_fstatfs()


def on_overlayfs(fd: int) -> bool:
    """True if `fd`'s file is on overlayfs, where a file of a lower layer (a container image's)
    is copied up into a new file at its first write: same inode number and bytes, another birth
    time and generation. Only asked when those differ, so its cost is off the reopen path."""
    call = _fstatfs
    if call is None:
        return False
    buf = ctypes.create_string_buffer(_STATFS_SIZE + 136)  # room for other ABIs' larger struct
    if call(fd, buf) != 0:
        return False
    return bool(struct.unpack_from("=l", buf)[0] == _OVERLAYFS_MAGIC)


def identify(fd: int) -> tuple[int, int, int, int, int]:
    """`fd`'s file as (device, inode number, size, birth time in ns since the epoch, inode
    generation), in two system calls; the birth time is 0 where it is not known (a libc without
    statx, a kernel or a sandbox that refuses it, a file system that keeps none), and so is the
    generation (see `generation`)."""
    statx = _statx
    if statx is not None:
        buf = getattr(_local, "buf", None)
        if buf is None:
            buf = _local.buf = ctypes.create_string_buffer(_STATX_SIZE)
        if statx(fd, b"", _AT_EMPTY_PATH, _STATX_WANTED, buf) == 0:
            mask, ino, size, seconds, nanoseconds, major, minor = _FIELDS.unpack_from(buf)
            born = seconds * 1_000_000_000 + nanoseconds if mask & _STATX_BTIME else 0
            return os.makedev(major, minor), ino, size, born, generation(fd)
        _give_up_on_statx(ctypes.get_errno())
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, 0, generation(fd)


def _give_up_on_statx(err: int) -> None:
    """A kernel without statx (ENOSYS) or a sandbox that forbids it (EPERM) will not change its
    mind: fstat from now on. Other errors (EBADF) are the caller's, reported by its fstat."""
    global _statx
    if err in (errno.ENOSYS, errno.EPERM):
        _statx = None


def birth_time(fd: int) -> int:
    """When `fd`'s file was created (ns since the epoch), 0 where not known: see `identify`."""
    return identify(fd)[3]


def read_marks(fd: int, offset: int) -> tuple[int, int]:
    """The CRCs of the first and of the last (up to) `CHECK` bytes before `offset` of `fd`'s file
    (one read where the two are close)."""
    if offset <= 2 * CHECK:
        data = os.pread(fd, offset, 0)
        return zlib.crc32(data[:CHECK]), zlib.crc32(data[max(0, offset - CHECK) :])
    return zlib.crc32(os.pread(fd, CHECK, 0)), zlib.crc32(os.pread(fd, CHECK, offset - CHECK))


def reopened_differs(
    fd: int,
    size: int,
    offset: int,
    *,
    left: tuple[int, int],
    now: tuple[int, int],
    marks: tuple[int, int],
) -> str | None:
    """How the file `fd` (`size` bytes), reopened by name, is not the one a reader left at
    `offset`, or None where it is: its inode number may have gone to a new file. `left` and
    `now` are the (birth time, inode generation) it had and has (0: not known, see `identify`);
    `marks` are the `read_marks` taken when it was left."""
    born, igen = now
    if (
        (born and left[0] and born != left[0]) or (igen and left[1] and igen != left[1])
    ) and not on_overlayfs(fd):  # there, a copy-up: the size and the bytes decide
        return (
            "was deleted and created again while it was read (the new file got the old "
            "one's inode number, but it was created later)"
        )
    if size < offset:
        return f"shrank to {size} bytes below the read position {offset} (truncated)"
    if read_marks(fd, offset) != marks:
        return (
            f"changed before the read position {offset} while it was read (rewritten, or "
            "deleted and created again)"
        )
    return None
