# cython: language_level=3, boundscheck=False, wraparound=False
"""Seqlock read and write of one 64-byte state-table slot (DESIGN.md §4).

Slot layout, native byte order (the state table never leaves the host), offsets in bytes::

    0  seq           u64   even: stable; odd: a write is in progress
    8  leader        i32   leader node id (-1: none / unknown)
    12 leader_epoch  i32
    16 log_start     i64
    24 high_watermark i64
    32 last_stable   i64
    40 log_end       i64
    48 segments_gen  u32   bumped on roll / delete / truncate: mmap readers re-list segments
    52 flags         u32
    56 waiters       u32   set by a reader asleep on the slot (``wait_slot``), cleared by the writer
    60 reserved      4 B   zero

Theory of operation (one writer per slot, any number of readers, in any processes):

* the writer stores seq+1 (odd, release), a release fence, the fields (relaxed atomic stores),
  another release fence, then seq+2 (even, release);
* a reader loads seq (acquire); if odd it retries; else it loads the fields (relaxed), an
  acquire fence, and seq again: equal means no write overlapped the read;
* a reader gives up after ``max_spins`` attempts and returns ``None``: the writer may have died
  mid-update (seq stuck odd) or be descheduled, and the caller falls back to the socket path;
* a writer that finds seq already odd finishes the dead writer's update instead of flipping it
  to even halfway through (the controller resets a dead worker's slots this way).

The atomics live in ``_seqlock.h`` (GCC ``__atomic`` builtins).  The pure-Python twin,
``_seqlock_reference``, is the oracle for the byte layout, not for atomicity.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memset
from cpython.exc cimport PyErr_CheckSignals

cdef extern from "_seqlock.h":
    ctypedef struct shmq_slot_values_t:
        int32_t leader
        int32_t epoch
        int64_t log_start
        int64_t hw
        int64_t lso
        int64_t leo
        uint32_t segments_gen
        uint32_t flags
    void shmq_slot_write(unsigned char *base, const shmq_slot_values_t *v) noexcept nogil
    int shmq_slot_read(const unsigned char *base, shmq_slot_values_t *out,
                       long max_spins) noexcept nogil
    uint64_t shmq_slot_seq(const unsigned char *base) noexcept nogil
    int shmq_slot_wait(unsigned char *base, uint64_t seen, int64_t timeout_ns, int64_t spin_ns) noexcept nogil
    int shmq_slot_wait_bound(unsigned char *base, int64_t offset, int committed,
                             int64_t deadline_ns, int64_t spin_ns, int64_t slice_ns,
                             long max_spins, shmq_slot_values_t *out,
                             int64_t *began) noexcept nogil
    int64_t shmq_monotonic_ns() noexcept nogil

SLOT_SIZE = 64
# Each attempt costs one `pause` (~40-140 cycles) at most: 10,000 attempts bound a reader to
# roughly 0.1-1 ms before it falls back to the socket path (reliability.md §6: "e.g. 1 ms").
DEFAULT_MAX_SPINS = 10000


cdef int _check_slot(Py_ssize_t size, const unsigned char *base, Py_ssize_t slot_offset) except -1:
    if slot_offset < 0 or slot_offset > size - 64:
        raise IndexError(f"slot at {slot_offset} does not fit in {size} bytes")
    if (<uintptr_t>(base + slot_offset)) & 7:
        raise ValueError("a slot must be 8-byte aligned")
    return 0


def write_slot(unsigned char[::1] buf not None, Py_ssize_t slot_offset, int32_t leader,
               int32_t epoch, int64_t log_start, int64_t hw, int64_t lso, int64_t leo,
               uint32_t segments_gen, uint32_t flags):
    """Publish one slot's values under its seqlock (the caller is the slot's only writer)."""
    cdef shmq_slot_values_t v
    _check_slot(buf.shape[0], &buf[0], slot_offset)
    v.leader = leader
    v.epoch = epoch
    v.log_start = log_start
    v.hw = hw
    v.lso = lso
    v.leo = leo
    v.segments_gen = segments_gen
    v.flags = flags
    with nogil:
        shmq_slot_write(&buf[slot_offset], &v)


def read_slot(const unsigned char[::1] buf not None, Py_ssize_t slot_offset,
              long max_spins=DEFAULT_MAX_SPINS):
    """A consistent ``(leader, epoch, log_start, hw, lso, leo, segments_gen, flags)``, or
    ``None`` when no stable snapshot was seen in ``max_spins`` attempts."""
    cdef shmq_slot_values_t v
    cdef int ok
    _check_slot(buf.shape[0], &buf[0], slot_offset)
    if max_spins < 1:
        raise ValueError("max_spins must be at least 1")
    with nogil:
        ok = shmq_slot_read(&buf[slot_offset], &v, max_spins)
    if not ok:
        return None
    return (v.leader, v.epoch, v.log_start, v.hw, v.lso, v.leo, v.segments_gen, v.flags)


def slot_seq(const unsigned char[::1] buf not None, Py_ssize_t slot_offset):
    """The slot's seq word (acquire load): even when stable, odd while written."""
    _check_slot(buf.shape[0], &buf[0], slot_offset)
    return shmq_slot_seq(&buf[slot_offset])


def wait_slot(unsigned char[::1] buf not None, Py_ssize_t slot_offset, uint64_t seen,
              double timeout, double spin=0.0):
    """Sleep (FUTEX_WAIT) until the slot's seq is no longer ``seen`` or ``timeout`` seconds
    passed (negative: no limit), after looking at seq for up to ``spin`` seconds first.  True
    when it changed or may have (a wake-up; the caller re-reads the slot), False on timeout.
    The buffer must be writable: the reader sets the slot's ``waiters`` flag so the writer
    knows to wake it."""
    cdef int r
    cdef int64_t ns = -1 if timeout < 0 else <int64_t>(timeout * 1e9)
    cdef int64_t spin_ns = <int64_t>(spin * 1e9) if spin > 0 else 0
    _check_slot(buf.shape[0], &buf[0], slot_offset)
    with nogil:
        r = shmq_slot_wait(&buf[slot_offset], seen, ns, spin_ns)
    return r == 1


def wait_bound(unsigned char[::1] buf not None, Py_ssize_t slot_offset, int64_t offset,
               bint committed, double timeout, double spin=0.0, double slice_us=0.0,
               long max_spins=DEFAULT_MAX_SPINS):
    """A local reader's wait, in one call without the GIL (``shmq_slot_wait_bound``): until the
    slot's bound (its last stable offset when ``committed``, else its high watermark) passes
    ``offset``, ``offset`` is below the log start, the slot has no leader, or ``timeout``
    seconds passed.  Each sleep is preceded by a look at seq for ``spin`` seconds; from the
    first sleep on the thread has ``slice_us`` microsecond slices (0: untouched), its own put
    back before the call returns.  A signal that interrupts the sleep runs its Python handler
    (which may raise, e.g. KeyboardInterrupt), then the wait goes on.  Returns ``(values,
    waited)``: the last snapshot as ``read_slot`` gives it (None when the slot stayed odd for
    ``max_spins`` reads), and how long it waited in seconds (-1.0: it did not).  The buffer
    must be writable (the slot's ``waiters`` flag)."""
    cdef shmq_slot_values_t v
    cdef int r
    cdef int64_t began = -1, end
    cdef int64_t ns = <int64_t>(min(timeout, 1e9) * 1e9) if timeout > 0 else 0
    cdef int64_t spin_ns = <int64_t>(min(spin, 1e9) * 1e9) if spin > 0 else 0
    cdef int64_t slice_ns = <int64_t>(min(slice_us, 1e9) * 1e3) if slice_us > 0 else 0
    memset(&v, 0, sizeof(v))
    _check_slot(buf.shape[0], &buf[0], slot_offset)
    if max_spins < 1:
        raise ValueError("max_spins must be at least 1")
    cdef int64_t deadline = shmq_monotonic_ns() + ns
    while True:
        with nogil:
            r = shmq_slot_wait_bound(&buf[slot_offset], offset, committed, deadline, spin_ns,
                                     slice_ns, max_spins, &v, &began)
        if r != 2:
            break
        PyErr_CheckSignals()  # a handler that raises ends the wait here
    end = shmq_monotonic_ns()
    waited = -1.0 if began < 0 else (end - began) * 1e-9
    if r == 0:
        return None, waited
    return (v.leader, v.epoch, v.log_start, v.hw, v.lso, v.leo, v.segments_gen, v.flags), waited
