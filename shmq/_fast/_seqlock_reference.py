"""Pure-Python twin of ``shmq._fast.seqlock``: same names, same slot bytes.

It is the oracle for the slot layout (``SLOT_FORMAT``) in the parity tests and the fallback when
the extension is not built.  Python has no fences, so it relies on the hardware: on x86-64 (total
store order) it is a correct seqlock because the seq word is loaded and stored whole, through a
one-item ``Q`` memoryview (CPython copies the item with an 8-byte ``memcpy``: one aligned
``mov``).  Never through ``struct``: ``pack_into`` zeroes its bytes before it writes them, so a
reader could see seq 0 (even) in the middle of an update, twice, and take a torn snapshot for a
stable one (seen as 1 torn read in ~166,000 under the stress test).  The fields themselves go
through ``struct``; the seq checks cover them.  On weaker memory models it is best effort.

Slot layout, native byte order, see ``seqlock.pyx`` for the full picture::

    seq u64 | leader i32 | epoch i32 | log_start i64 | hw i64 | lso i64 | leo i64
    | segments_gen u32 | flags u32 | waiters u32 | reserved 4 B

Waiting (``wait_slot``) uses the same futex protocol as the compiled module, through libc's
``syscall`` with ctypes.  Its two store-then-load steps (the writer: seq, then the waiters flag;
the waiter: the flag, then seq) each need a full fence between the store and the load, or both
sides can read the old value (x86-64 lets a load pass an earlier store to another address: the
store-buffer litmus test) and the wake-up is lost until the waiter's timeout.  Python has no
fence, so ``_fence`` takes and gives back a lock: an uncontended ``threading.Lock`` is an atomic
compare-and-swap in libc (a ``lock``-prefixed instruction, a full barrier on x86-64).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import sys
import threading
import time
from typing import Any

SLOT_SIZE = 64
DEFAULT_MAX_SPINS = 10000

# "=": native byte order, standard sizes, no padding (the fields are naturally aligned anyway).
SLOT_FORMAT = "=QiiqqqqII"
_FIELDS = struct.Struct("=iiqqqqII")  # at offset 8
assert struct.calcsize(SLOT_FORMAT) == 56

_RANGES = (
    ("leader", -(2**31), 2**31 - 1),
    ("epoch", -(2**31), 2**31 - 1),
    ("log_start", -(2**63), 2**63 - 1),
    ("hw", -(2**63), 2**63 - 1),
    ("lso", -(2**63), 2**63 - 1),
    ("leo", -(2**63), 2**63 - 1),
    ("segments_gen", 0, 2**32 - 1),
    ("flags", 0, 2**32 - 1),
)


_WAITERS = 56
_U32 = struct.Struct("=I")
_SYS_FUTEX = 202 if sys.maxsize > 2**32 else 240  # x86-64 (aarch64 is 98)
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc: Any = None
_FENCE = threading.Lock()


def _fence() -> None:
    """A full memory barrier (see the module docstring): acquiring an uncontended lock is an
    atomic read-modify-write."""
    _FENCE.acquire()
    _FENCE.release()


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex(view: memoryview, slot_offset: int, op: int, value: int,
           timeout: float | None = None) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        import platform
        global _SYS_FUTEX
        if platform.machine() in ("aarch64", "arm64"):
            _SYS_FUTEX = 98
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view, slot_offset)) + (
        4 if sys.byteorder == "big" else 0)
    ts = None
    if timeout is not None and timeout >= 0:
        ts = _Timespec(int(timeout), int((timeout - int(timeout)) * 1e9))
    r = _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), op, ctypes.c_uint32(value),
                      ctypes.byref(ts) if ts is not None else None, None, 0)
    return 0 if r != -1 else ctypes.get_errno()


def _check_slot(buf: memoryview, slot_offset: int) -> None:
    if slot_offset < 0 or slot_offset > buf.nbytes - SLOT_SIZE:
        raise IndexError(f"slot at {slot_offset} does not fit in {buf.nbytes} bytes")
    if slot_offset % 8:
        # The compiled module checks the address; a mapping is page aligned, so this is the same.
        raise ValueError("a slot must be 8-byte aligned")


def write_slot(
    buf: Any,
    slot_offset: int,
    leader: int,
    epoch: int,
    log_start: int,
    hw: int,
    lso: int,
    leo: int,
    segments_gen: int,
    flags: int,
) -> None:
    """Publish one slot's values under its seqlock (the caller is the slot's only writer)."""
    values = (leader, epoch, log_start, hw, lso, leo, segments_gen, flags)
    for value, (name, lo, hi) in zip(values, _RANGES, strict=True):
        if not lo <= value <= hi:  # the compiled module raises OverflowError on conversion
            raise OverflowError(f"{name}={value} is out of range")
    with memoryview(buf).cast("B") as view:
        if view.readonly:
            raise BufferError("underlying buffer is not writable")  # as the compiled module
        _check_slot(view, slot_offset)
        with view[slot_offset : slot_offset + 8] as raw, raw.cast("Q") as seq_word:
            seq = seq_word[0]
            if seq & 1 == 0:  # odd on entry: a dead writer's update, finish it (see seqlock.pyx)
                seq += 1
                seq_word[0] = seq
            _FIELDS.pack_into(view, slot_offset + 8, *values)
            seq_word[0] = (seq + 1) & 0xFFFFFFFFFFFFFFFF
        _fence()  # the even seq before the flag is read (the compiled module's seq_cst fence)
        if _U32.unpack_from(view, slot_offset + _WAITERS)[0]:  # a reader sleeps: wake it
            with view[slot_offset + _WAITERS : slot_offset + _WAITERS + 4] as raw, \
                    raw.cast("I") as waiters:
                waiters[0] = 0
            _futex(view, slot_offset, _FUTEX_WAKE, 0x7FFFFFFF)


def read_slot(
    buf: Any, slot_offset: int, max_spins: int = DEFAULT_MAX_SPINS
) -> tuple[int, int, int, int, int, int, int, int] | None:
    """A consistent ``(leader, epoch, log_start, hw, lso, leo, segments_gen, flags)``, or
    ``None`` when no stable snapshot was seen in ``max_spins`` attempts."""
    with memoryview(buf).cast("B") as view:
        _check_slot(view, slot_offset)
        if max_spins < 1:
            raise ValueError("max_spins must be at least 1")
        with view[slot_offset : slot_offset + 8] as raw, raw.cast("Q") as seq_word:
            for _ in range(max_spins):
                s1 = seq_word[0]
                if s1 & 1:
                    continue
                values = _FIELDS.unpack_from(view, slot_offset + 8)
                if seq_word[0] == s1:
                    return values  # type: ignore[return-value]
        return None


def slot_seq(buf: Any, slot_offset: int) -> int:
    """The slot's seq word: even when stable, odd while written."""
    with memoryview(buf).cast("B") as view:
        _check_slot(view, slot_offset)
        with view[slot_offset : slot_offset + 8] as raw, raw.cast("Q") as seq_word:
            return int(seq_word[0])


def wait_slot(buf: Any, slot_offset: int, seen: int, timeout: float, spin: float = 0.0) -> bool:
    """Sleep until the slot's seq is no longer ``seen`` or ``timeout`` passed, after looking at
    seq for up to ``spin`` seconds (see seqlock.pyx)."""
    with memoryview(buf).cast("B") as view:
        if view.readonly:
            raise BufferError("underlying buffer is not writable")
        _check_slot(view, slot_offset)
        if 0 <= timeout < spin:
            spin = timeout  # the spin counts against the timeout: never past it
        if spin > 0:
            until = time.monotonic() + spin
            with view[slot_offset : slot_offset + 8] as raw, raw.cast("Q") as seq_word:
                while time.monotonic() < until:
                    if seq_word[0] != seen:
                        return True
                    os.sched_yield()  # the CPU to whoever waits for it (see _seqlock.h)
            if timeout >= 0:
                timeout -= spin
                if timeout <= 0:
                    return False
        with view[slot_offset + _WAITERS : slot_offset + _WAITERS + 4] as raw, \
                raw.cast("I") as waiters:
            waiters[0] = 1
        _fence()  # the flag before seq is read again
        with view[slot_offset : slot_offset + 8] as raw, raw.cast("Q") as seq_word:
            if seq_word[0] != seen:
                return True
        err = _futex(view, slot_offset, _FUTEX_WAIT, seen & 0xFFFFFFFF,
                     None if timeout < 0 else timeout)
        return err != errno.ETIMEDOUT


def wait_bound(buf: Any, slot_offset: int, offset: int, committed: bool, timeout: float,
               spin: float = 0.0, slice_us: float = 0.0, max_spins: int = DEFAULT_MAX_SPINS
               ) -> tuple[tuple[int, int, int, int, int, int, int, int] | None, float]:
    """A local reader's wait, whole (see seqlock.pyx): ``(values, waited)`` once the slot's
    bound (lso when ``committed``, else hw) passes ``offset``, ``offset`` is below the log
    start, the slot has no leader or ``timeout`` passed; values None when the slot stayed odd.
    The thread has ``slice_us`` slices from its first futex sleep until it returns."""
    from shmq.ipc import sched  # a leaf's twin: the slice calls only when it sleeps

    if max_spins < 1:
        raise ValueError("max_spins must be at least 1")
    deadline = time.monotonic() + max(timeout, 0.0)
    began = -1.0
    saved: Any = None
    swapped = False
    try:
        while True:
            seen = slot_seq(buf, slot_offset)
            values = read_slot(buf, slot_offset, max_spins)
            now = time.monotonic()
            if values is None:
                break
            if (values[4] if committed else values[3]) > offset or offset < values[2] \
                    or values[0] < 0 or now >= deadline:
                break
            if began < 0:
                began = now
            left = deadline - now
            if spin > 0:  # the spin alone, then the slice, then the futex
                if wait_slot(buf, slot_offset, seen, min(spin, left), min(spin, left)):
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    continue
            if not swapped:
                saved, swapped = sched.swap_slice(slice_us), True
            wait_slot(buf, slot_offset, seen, left, 0.0)
    finally:
        sched.restore_slice(saved)
    return values, (-1.0 if began < 0 else now - began)
