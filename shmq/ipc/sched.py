"""Asking the kernel for short time slices: a latency hint for threads that mostly sleep.

Linux 6.6's EEVDF scheduler gives each task a virtual deadline of its vruntime plus its slice
(``sched_runtime`` of ``sched_setattr`` for SCHED_OTHER since 6.12, 0.1-100 ms; the default is
the base slice, 0.7-3 ms), and since 6.12 a waking task with a shorter slice than the one
running may preempt it (``PREEMPT_SHORT``) instead of waiting for the running task's slice to
end.  A thread that wakes for tens of microseconds of work (the worker's drain, a waiting
reader) then runs when woken rather than behind a compile's whole slice.  It is not a priority:
the task's share of the CPU (its weight, from nice) is the same; it only runs in shorter turns,
sooner.  Older kernels ignore the field (``sched_runtime`` is zero-checked only for
SCHED_DEADLINE) or refuse the call: then nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import threading

# x86-64 and arm64 / generic syscall numbers
_SETATTR = {"x86_64": 314, "aarch64": 274}.get(platform.machine())
_GETATTR = {"x86_64": 315, "aarch64": 275}.get(platform.machine())
_ATTR = struct.Struct("IIQiIQQQII")  # size, policy, flags, nice, priority, runtime, deadline,
#                                      period, util_min, util_max (sched_attr, 56 bytes)
_libc: ctypes.CDLL | None = None


def _syscall() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and _SETATTR is not None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    return _libc


def _get(tid: int = 0) -> tuple[int, int, int] | None:
    """The thread's policy, nice value and requested slice (ns, 0: the default); None where
    the kernel does not say."""
    libc = _syscall()
    if libc is None or _GETATTR is None:
        return None
    buf = ctypes.create_string_buffer(_ATTR.size)
    if libc.syscall(_GETATTR, tid, buf, _ATTR.size, 0) != 0:
        return None
    _, policy, _, nice, _, runtime, _, _, _, _ = _ATTR.unpack(buf.raw)
    return policy, nice, runtime


def _set(policy: int, nice: int, ns: int, tid: int = 0) -> bool:
    libc = _syscall()
    want = _ATTR.pack(_ATTR.size, policy, 0, nice, 0, ns, 0, 0, 0, 0)
    return libc is not None and libc.syscall(_SETATTR, tid, ctypes.c_char_p(want), 0) == 0


def slice_ns(tid: int = 0) -> int | None:
    """The thread's requested slice (0: the default), None where it cannot be read."""
    got = _get(tid)
    return None if got is None else got[2]


def request_slice(us: float, tid: int = 0) -> bool:
    """Ask for ``us`` microsecond slices for the calling thread (``tid`` 0), keeping its
    policy and nice value (0: the kernel's default slice again); True when the kernel took it.
    Only SCHED_OTHER / SCHED_BATCH threads are changed (a real-time thread's runtime field
    means something else).  A thread created later inherits its creator's slice."""
    got = _get(tid)
    if got is None or us < 0 or got[0] not in (0, 3):  # SCHED_OTHER, SCHED_BATCH
        return False
    ns = int(us * 1000)
    return _set(got[0], got[1], ns, tid) and (ns == 0 or slice_ns(tid) == ns)


def swap_slice(us: float) -> tuple[int, int, int] | None:
    """Give the calling thread ``us`` microsecond slices for a while (a wait on the user's
    thread); what to hand ``restore_slice`` afterwards, or None when nothing was changed (the
    kernel takes no slice, the thread is not SCHED_OTHER / SCHED_BATCH, it has that slice
    already, or ``us`` <= 0).  Three system calls a wait, with ``restore_slice``, plus the
    ctypes calls' own cost (~6 us the pair): a local reader's wait does the same in C, and only
    when it sleeps (``_fast.wait_bound``, ``shmq_slice_swap`` in ``_seqlock.h``); this one is
    the pure-Python twin's."""
    if us <= 0:
        return None
    got = _get()
    ns = int(us * 1000)
    if got is None or got[0] not in (0, 3) or got[2] == ns or not _set(got[0], got[1], ns):
        return None
    return got


def restore_slice(saved: tuple[int, int, int] | None) -> None:
    """Put back the slice ``swap_slice`` found."""
    if saved is not None:
        _set(*saved)


_asked = threading.local()  # ``asked``: this thread asked already (``request_slice_once``)


def request_slice_once(us: float) -> None:
    """``request_slice`` for the calling thread the first time it asks (one system call pair
    a thread, not one a wait); ``us`` <= 0 asks nothing."""
    if us <= 0 or getattr(_asked, "asked", False):
        return
    _asked.asked = True
    request_slice(us)


def slice_us_from_env(name: str, default: float) -> float:
    """A slice length from the environment variable ``name`` (0 turns the request off: A/B
    measurements), else ``default``."""
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default
