# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The partition worker's half of a session's rings (layout in ``shmq/ipc/ring.py``): it consumes
the submit ring and produces into the completion ring.

``shmq.ipc.ring.Ring`` does the same through one ``_fast.ring`` call per counter (a buffer
acquired per call) and a Python method per step; a worker drain of one small entry made ~10
of them.  Here the session's mapping is held once and each step (take the next PRODUCE entry with
every bound checked, answer one, give space back, go to sleep) is one call.

The checks are ``Ring.peek``'s and the worker's PRODUCE checks, in the same order with the same
outcome: a counter or header outside the ring raises ``error`` (the session's
``RingCorruptError``).  Every field the client can write is read once into a local before use.

The pure-Python twin, ``_worker_ring_reference.WorkerRings``, has the same methods and results;
it is the oracle in ``tests/unit/ipc/test_worker_ring.py``.
"""

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

from shmq._fast.atomics cimport (shmq_exchange_u32, shmq_full_fence, shmq_load_acquire_u32,
                                  shmq_load_acquire_u64, shmq_store_release_u64)

cdef enum:
    TAIL = 0
    HEAD = 64
    CONSUMER_SLEEPING = 128
    PRODUCER_WAITING = 132
    PAD = 0
    PRODUCE = 1
    COMPLETION = 2
    PRODUCE_HEADER_SIZE = 24
    COMPLETION_HEADER_SIZE = 40


cdef inline void _entry_header(unsigned char *p, uint64_t size, uint16_t kind) noexcept nogil:
    """An entry's 8-byte header: its size (u32), its kind (u16) and a zero u16."""
    cdef uint32_t u32 = <uint32_t>size
    cdef uint16_t zero = 0
    memcpy(p, &u32, 4)
    memcpy(p + 4, &kind, 2)
    memcpy(p + 6, &zero, 2)


cdef inline uint64_t _align8(uint64_t n) noexcept nogil:
    return (n + 7) & ~(<uint64_t>7)


cdef inline bint _room(uint64_t cap, uint64_t tail, uint64_t seen, uint64_t need) noexcept nogil:
    """``need <= cap - (tail - seen)`` in Python's unbounded integers (``Ring.reserve``): the
    counters come from shared memory, so neither order nor distance is assumed."""
    cdef uint64_t d
    if seen >= tail:
        d = seen - tail
        return need <= cap or need - cap <= d
    d = tail - seen
    return d <= cap and need <= cap - d


cdef class WorkerRings:
    """``WorkerRings(view, submit_control, submit_data, submit_capacity, completion_control,
    completion_data, completion_capacity, error)``: offsets into the writable buffer ``view``;
    ``error`` is the exception class raised for garbage in the submit ring."""
    cdef Py_buffer buf
    cdef bint held
    cdef unsigned char *s_ctl
    cdef unsigned char *s_data
    cdef uint64_t s_cap, s_head, s_seen
    cdef unsigned char *c_ctl
    cdef unsigned char *c_data
    cdef uint64_t c_cap, c_tail, c_seen
    cdef Py_ssize_t s_data_off, c_data_off
    cdef object error

    def __cinit__(self, view, Py_ssize_t submit_control, Py_ssize_t submit_data,
                  Py_ssize_t submit_capacity, Py_ssize_t completion_control,
                  Py_ssize_t completion_data, Py_ssize_t completion_capacity, error):
        cdef Py_ssize_t c
        PyObject_GetBuffer(view, &self.buf, PyBUF_WRITABLE)
        self.held = True
        for c in (submit_capacity, completion_capacity):
            if c < 8 or c & (c - 1):
                raise ValueError(f"ring capacity {c} is not a power of two")
        for c in (submit_control, completion_control):
            if c < 0 or c % 64 or c + 136 > self.buf.len:
                raise ValueError(f"ring control at {c} is outside the buffer")
        if (submit_data < 0 or submit_data % 8 or submit_data + submit_capacity > self.buf.len
                or completion_data < 0 or completion_data % 8
                or completion_data + completion_capacity > self.buf.len):
            raise ValueError("ring data outside the buffer")
        base = <unsigned char *>self.buf.buf
        self.s_ctl = base + submit_control
        self.s_data = base + submit_data
        self.s_data_off = submit_data
        self.s_cap = submit_capacity
        self.c_ctl = base + completion_control
        self.c_data = base + completion_data
        self.c_data_off = completion_data
        self.c_cap = completion_capacity
        self.s_head = shmq_load_acquire_u64(self.s_ctl + HEAD)
        self.s_seen = 0
        self.c_tail = shmq_load_acquire_u64(self.c_ctl + TAIL)
        self.c_seen = 0
        self.error = error

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.buf)

    def close(self):
        """Let go of the buffer (the mapping can then be closed); no method may follow."""
        if self.held:
            PyBuffer_Release(&self.buf)
            self.held = False
            self.s_ctl = self.s_data = self.c_ctl = self.c_data = NULL

    cdef int _live(self) except -1:
        if not self.held:
            raise ValueError("the rings are closed")
        return 0

    # -- submit ring: consumer ------------------------------------------------------------------

    @property
    def head(self):
        """The end of the entries taken so far (``Ring.head``)."""
        return self.s_head

    cdef int _published(self) except -1:
        cdef uint64_t tail = shmq_load_acquire_u64(self.s_ctl + TAIL)
        if tail & 7 or tail - self.s_head > self.s_cap or tail < self.s_head:
            raise self.error(f"ring tail {tail} is not within a ring of {self.s_cap} bytes "
                             f"ahead of head {self.s_head}")
        self.s_seen = tail
        return 0

    def next_produce(self):
        """``(offset in view, len, correlation, partition, topic_len, acks)`` of the next entry
        (PAD entries skipped), or None when the ring is empty.  The entry stays until
        ``advance``.  Raises ``error`` for anything that is not a whole PRODUCE entry inside
        the ring with a topic inside the entry and acks of 0, 1 or -1."""
        cdef uint64_t idx, mask = self.s_cap - 1
        cdef uint32_t length, corr
        cdef uint16_t kind, tlen
        cdef int32_t partition
        cdef int8_t acks
        cdef unsigned char *p
        self._live()
        while True:
            if self.s_head == self.s_seen:
                self._published()
                if self.s_seen == self.s_head:
                    return None
            idx = self.s_head & mask
            p = self.s_data + idx
            memcpy(&length, p, 4)
            memcpy(&kind, p + 4, 2)
            if (length < 8 or length > self.s_cap - idx or self.s_seen < self.s_head
                    or _align8(length) > self.s_seen - self.s_head):
                raise self.error(f"ring entry of {length} bytes at {idx} does not fit")
            if kind == PAD:
                if length != self.s_cap - idx:
                    raise self.error(f"PAD entry of {length} bytes at {idx}")
                self.s_head += length
                continue
            break
        if kind != PRODUCE or length < PRODUCE_HEADER_SIZE:
            raise self.error(f"entry kind {kind} of {length} bytes")
        memcpy(&corr, p + 8, 4)
        memcpy(&partition, p + 12, 4)
        memcpy(&tlen, p + 16, 2)
        memcpy(&acks, p + 18, 1)
        if tlen > length - PRODUCE_HEADER_SIZE or not (acks == 0 or acks == 1 or acks == -1):
            raise self.error(f"entry topic length {tlen}, acks {acks}")
        return (self.s_data_off + <Py_ssize_t>idx, length, corr, partition, tlen, acks)

    def advance(self, uint32_t length):
        """Done with the entry ``next_produce`` returned (its space goes back at ``release``)."""
        self.s_head += _align8(length)

    def release(self, uint64_t upto):
        """Give the submit ring's space below ``upto`` back; True when the client waits for
        space and must be woken (``Ring.release``)."""
        self._live()
        shmq_store_release_u64(self.s_ctl + HEAD, upto)
        shmq_full_fence()
        if shmq_load_acquire_u32(self.s_ctl + PRODUCER_WAITING):
            return shmq_exchange_u32(self.s_ctl + PRODUCER_WAITING, 0) != 0
        return False

    def set_sleeping(self):
        """Announce that the worker sleeps; False if entries arrived meanwhile (do not sleep)."""
        self._live()
        shmq_exchange_u32(self.s_ctl + CONSUMER_SLEEPING, 1)
        self._published()
        if self.s_seen != self.s_head:
            shmq_exchange_u32(self.s_ctl + CONSUMER_SLEEPING, 0)
            return False
        return True

    # -- completion ring: producer --------------------------------------------------------------

    @property
    def completion_tail(self):
        """Bytes ever published into the completion ring (PAD entries included)."""
        return self.c_tail

    def free_space(self):
        """The completion ring's free bytes (the client's head loaded now)."""
        self._live()
        self.c_seen = shmq_load_acquire_u64(self.c_ctl + HEAD)
        return self.c_cap - (<object>self.c_tail - <object>self.c_seen)  # unbounded, as Ring

    def set_waiting(self):
        """The worker is about to wait until the client frees completion space."""
        self._live()
        shmq_exchange_u32(self.c_ctl + PRODUCER_WAITING, 1)

    def answer(self, uint32_t correlation, int16_t error_code, int64_t base_offset,
               int64_t log_append_time, int64_t log_start_offset, bytes message not None):
        """Write and publish one COMPLETION (``Ring.reserve`` + ``commit``): 1 when the
        client sleeps and must be woken, 0 when not, -1 when the ring has no room (nothing
        written)."""
        cdef Py_ssize_t mlen = PyBytes_GET_SIZE(message)
        cdef uint64_t size = COMPLETION_HEADER_SIZE + <uint64_t>mlen
        cdef uint64_t n = _align8(size), mask = self.c_cap - 1
        cdef uint64_t idx, room, need, start
        cdef unsigned char *p
        cdef uint16_t u16
        self._live()
        if n > self.c_cap:
            raise ValueError(f"entry of {size} bytes does not fit a ring of {self.c_cap}")
        idx = self.c_tail & mask
        room = self.c_cap - idx
        need = n if n <= room else room + n
        if not _room(self.c_cap, self.c_tail, self.c_seen, need):
            self.c_seen = shmq_load_acquire_u64(self.c_ctl + HEAD)
            if not _room(self.c_cap, self.c_tail, self.c_seen, need):
                return -1
        start = self.c_tail
        if n > room:  # a PAD entry fills the ring's end
            _entry_header(self.c_data + idx, room, PAD)
            start += room
            idx = 0
        p = self.c_data + idx
        _entry_header(p, size, COMPLETION)
        u16 = 0
        memcpy(p + 8, &correlation, 4)
        memcpy(p + 12, &error_code, 2)
        memcpy(p + 14, &u16, 2)
        memcpy(p + 16, &base_offset, 8)
        memcpy(p + 24, &log_append_time, 8)
        memcpy(p + 32, &log_start_offset, 8)
        if mlen:
            memcpy(p + COMPLETION_HEADER_SIZE, PyBytes_AS_STRING(message), mlen)
        self.c_tail = start + n
        shmq_store_release_u64(self.c_ctl + TAIL, self.c_tail)
        shmq_full_fence()
        if shmq_load_acquire_u32(self.c_ctl + CONSUMER_SLEEPING):
            return 1 if shmq_exchange_u32(self.c_ctl + CONSUMER_SLEEPING, 0) else 0
        return 0
