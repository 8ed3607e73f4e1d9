"""``fsync`` and ``syncfs`` for the storage code, with the slow-disk fault hook of the tests.

``SHMQ_FAULT_FSYNC_DELAY_MS`` (read at import; tests only) makes every fsync of segment data
(``LogSegment.flush_log``: the group commits acks=all waits for, flush.ms / flush.messages, a log's
close) sleep that long first: what a disk with multi-second flush stalls does to the broker
(issue 19, "a slow disk").  Checkpoints and directories are fsynced without the delay, so that
a broker under test still starts and stops in seconds.  The test box has no device-mapper ``delay``
target (no ``dm`` module, no ``/dev/mapper/control``), so the delay is injected here, in the one
function every durable write goes through.

``syncfs`` (Linux ``syncfs(2)``, through libc: Python has no binding) writes back every dirty
page and inode of one filesystem and commits its journal, in one call: a clean shutdown makes
all its logs durable with it instead of three to five fsyncs per log (``LogManager.shutdown``).
Since Linux 5.8 it reports a writeback error that happened anywhere on the filesystem after the
descriptor it is given was opened (the superblock's ``errseq``); ``syncfs_errors_reported`` says
whether this kernel does.  Where libc has no ``syncfs`` (not Linux), ``HAVE_SYNCFS`` is False
and callers fsync file by file.

``start_writeback`` (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``) starts the disk writes of
a byte range and returns without waiting for them and without making anything durable: a group
commit calls it for the bytes it is about to fsync while the previous fsync still runs, so the
fsync that follows finds them written or in flight (``PartitionLog.flush``).  Durability is still
the ``fdatasync`` alone; where the call does not exist it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import time
from typing import Any

FSYNC_DELAY_S = float(os.environ.get("SHMQ_FAULT_FSYNC_DELAY_MS") or 0) / 1000
SYNC_FILE_RANGE_WRITE = 2


def _libc(name: str, *argtypes: Any) -> Any:
    """libc's ``name`` returning an int (None where libc has none); ctypes releases the GIL
    while it runs."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _libc("sync_file_range", ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_uint)


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Start writing ``length`` dirty bytes of ``fd`` from ``offset`` to the disk, without
    waiting for them (the GIL is released meanwhile); False when that is not possible here.
    A failure only loses the head start: the fsync writes the bytes anyway."""
    if _SYNC_FILE_RANGE is None or fd < 0 or length <= 0:
        return False
    return bool(_SYNC_FILE_RANGE(fd, offset, length, SYNC_FILE_RANGE_WRITE) == 0)


def fsync(fd: int, *, data_only: bool = False, slowed: bool = False) -> None:
    """``os.fsync`` (``data_only``: ``os.fdatasync``); ``slowed``: under the fault hook."""
    if slowed and FSYNC_DELAY_S:
        time.sleep(FSYNC_DELAY_S)
    if data_only:
        os.fdatasync(fd)
    else:
        os.fsync(fd)


def syncfs_errors_reported() -> bool:
    """Whether this kernel's ``syncfs`` reports writeback errors (Linux >= 5.8)."""
    try:
        major, minor = (int(x) for x in platform.release().split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 8)


_SYNCFS = _libc("syncfs", ctypes.c_int) if syncfs_errors_reported() else None
# a kernel whose syncfs always returns 0 would hide an EIO that an fsync reports: fsync there
HAVE_SYNCFS = _SYNCFS is not None


def syncfs(fd: int, *, slowed: bool = False) -> None:
    """``syncfs(2)`` of the filesystem holding ``fd``; OSError when it reports a writeback
    error (see above).  ``slowed``: under the fault hook (it writes segment data back)."""
    if _SYNCFS is None:
        raise OSError(38, "syncfs is not available here")  # ENOSYS: callers check HAVE_SYNCFS
    if slowed and FSYNC_DELAY_S:
        time.sleep(FSYNC_DELAY_S)
    if _SYNCFS(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
