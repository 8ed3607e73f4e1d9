# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The producer state of one partition as a table in C memory (Kafka ``ProducerStateEntry``s).

Why not a dict of Python objects: every idempotent client process gets a new producer id, and a
partition keeps each one until it has been idle for ``producer.id.expiration.ms``.  As objects
(an entry, a list, a tuple per batch, their ints) a producer cost ~400 bytes in ~8 small objects,
all from Python's small-object allocator, which returns a 1 MiB arena to the OS only once every
object in it is gone: a handful of unrelated long-lived objects (a timer, an offset) allocated
while 100,000 producers came and went pinned enough arenas that the worker kept ~9 MiB (29 %)
after they all expired.  Here a producer is one 192-byte row in a malloc'd array, found through
an open-addressing index; rows are compacted and the arrays shrunk when producers expire, so the
memory goes back (test_producer_expiry.py).  The checks run in C too (~0.2 us a batch).

Layout::

    rows    Row[cap]            rows 0..n-1 live, in no particular order
    slots   int32[nslots]       open addressing, linear probing, -1 empty; nslots a power of
                                two >= 2 * cap (load <= 1/2); slot of pid: fibonacci hash

    Row (192 bytes)
      0   producer_id        int64
      8   last_timestamp     int64   max timestamp of its last batch (or marker)
      16  txn_first_offset   int64   first offset of its open transaction, -1: none
      24  coordinator_epoch  int32   -1: no marker seen
      28  producer_epoch     int16   -1: none
      30  count              uint8   batches retained (0..5)
      31  head               uint8   ring position of the oldest
      32  batches[5]         32 bytes each: last_offset i64, timestamp i64, first_seq i32,
                                     last_seq i32, offset_delta i32, reserved i32

The rules are Kafka's (``ProducerAppendInfo.checkProducerEpoch / checkSequence``); the module
docstring of ``shmq/storage/producer_state.py`` states them.  The pure-Python twin is
``_producers_reference.ProducerTable``, the oracle of the parity tests.
"""

from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint64_t, INT64_MAX, INT64_MIN
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memset

cdef extern from *:
    """
    #include <stdint.h>
    typedef struct {
        int64_t last_offset;
        int64_t timestamp;
        int32_t first_seq;
        int32_t last_seq;
        int32_t offset_delta;
        int32_t reserved;
    } shmq_pbatch;
    typedef struct {
        int64_t producer_id;
        int64_t last_timestamp;
        int64_t txn_first_offset;
        int32_t coordinator_epoch;
        int16_t producer_epoch;
        uint8_t count;
        uint8_t head;
        shmq_pbatch batches[5];
    } shmq_prow;
    _Static_assert(sizeof(shmq_prow) == 192, "producer row layout");
    """
    ctypedef struct Batch "shmq_pbatch":
        int64_t last_offset
        int64_t timestamp
        int32_t first_seq
        int32_t last_seq
        int32_t offset_delta
        int32_t reserved
    ctypedef struct Row "shmq_prow":
        int64_t producer_id
        int64_t last_timestamp
        int64_t txn_first_offset
        int32_t coordinator_epoch
        int16_t producer_epoch
        uint8_t count
        uint8_t head
        Batch batches[5]

cdef enum:
    RETAIN = 5
    NO_EPOCH = -1
    MIN_CAP = 4       # rows of the first allocation; an empty table holds no memory

OK, DUPLICATE = 0, 1
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
TRANSACTION_COORDINATOR_FENCED = 52
cdef tuple _OK = (0,)


cdef inline bint _in_sequence(int32_t last_seq, int32_t next_seq) noexcept nogil:
    return <int64_t>next_seq == <int64_t>last_seq + 1 or (next_seq == 0 and last_seq == 0x7fffffff)


cdef inline Batch *_batch(Row *row, int i) noexcept nogil:
    """The i-th retained batch, oldest first."""
    return &row.batches[(row.head + i) % RETAIN]


cdef inline int32_t _last_seq(Row *row) noexcept nogil:
    return _batch(row, row.count - 1).last_seq if row.count else -1


cdef inline void _set_epoch(Row *row, int16_t epoch) noexcept nogil:
    if row.producer_epoch != epoch:  # a new epoch starts a new sequence space
        row.count = 0
        row.head = 0
        row.producer_epoch = epoch


cdef inline void _push(Row *row, int32_t first_seq, int32_t last_seq, int64_t last_offset,
                       int32_t delta, int64_t timestamp) noexcept nogil:
    cdef Batch *b
    if row.count == RETAIN:  # the oldest falls out
        b = &row.batches[row.head]
        row.head = (row.head + 1) % RETAIN
    else:
        b = &row.batches[(row.head + row.count) % RETAIN]
        row.count += 1
    b.first_seq = first_seq
    b.last_seq = last_seq
    b.last_offset = last_offset
    b.offset_delta = delta
    b.timestamp = timestamp
    b.reserved = 0


cdef inline Py_ssize_t _hash(int64_t pid, int bits) noexcept nogil:
    return <Py_ssize_t>((<uint64_t>pid * <uint64_t>0x9E3779B97F4A7C15) >> (64 - bits))


cdef class ProducerTable:
    """Producer id -> epoch, coordinator epoch, last timestamp, open transaction, last 5 batches."""

    cdef Row *rows
    cdef int32_t *slots
    cdef Py_ssize_t n, cap, nslots
    cdef int bits
    cdef Py_ssize_t open_txns

    def __cinit__(self):
        self.rows = NULL
        self.slots = NULL
        self.n = self.cap = self.nslots = 0
        self.bits = 0
        self.open_txns = 0

    def __dealloc__(self):
        free(self.rows)
        free(self.slots)

    # -- storage ----------------------------------------------------------------------------------

    cdef int _resize(self, Py_ssize_t cap) except -1:
        """Make room for ``cap`` rows (>= n) and rebuild the index for them; 0 frees both."""
        if cap == 0:
            free(self.rows)
            free(self.slots)
            self.rows = NULL
            self.slots = NULL
            self.cap = self.nslots = 0
            self.bits = 0
            return 0
        cdef Row *rows = <Row *>realloc(self.rows, cap * sizeof(Row))
        if rows == NULL:
            raise MemoryError()
        self.rows = rows
        self.cap = cap
        cdef int bits = 1
        while (<Py_ssize_t>1 << bits) < 2 * cap:
            bits += 1
        cdef int32_t *slots = <int32_t *>malloc((<Py_ssize_t>1 << bits) * sizeof(int32_t))
        if slots == NULL:
            raise MemoryError()
        free(self.slots)
        self.slots = slots
        self.bits = bits
        self.nslots = <Py_ssize_t>1 << bits
        self._reindex()
        return 0

    cdef void _reindex(self) noexcept nogil:
        cdef Py_ssize_t i, s, mask = self.nslots - 1
        memset(self.slots, 0xff, self.nslots * sizeof(int32_t))  # -1 everywhere
        for i in range(self.n):
            s = _hash(self.rows[i].producer_id, self.bits)
            while self.slots[s] != -1:
                s = (s + 1) & mask
            self.slots[s] = <int32_t>i

    cdef inline Row *_find(self, int64_t pid) noexcept nogil:
        cdef Py_ssize_t s, mask = self.nslots - 1
        cdef int32_t r
        if self.n == 0:
            return NULL
        s = _hash(pid, self.bits)
        while True:
            r = self.slots[s]
            if r == -1:
                return NULL
            if self.rows[r].producer_id == pid:
                return &self.rows[r]
            s = (s + 1) & mask

    cdef Row *_insert(self, int64_t pid) except NULL:
        """The row of ``pid``, created empty if it is not there."""
        cdef Row *row = self._find(pid)
        if row != NULL:
            return row
        if self.n == self.cap:
            if self.cap >= 0x40000000:
                raise MemoryError("too many producers in one partition")
            self._resize(max(<Py_ssize_t>MIN_CAP, 2 * self.cap))
        row = &self.rows[self.n]
        memset(row, 0, sizeof(Row))
        row.producer_id = pid
        row.last_timestamp = -1
        row.txn_first_offset = -1
        row.coordinator_epoch = -1
        row.producer_epoch = NO_EPOCH
        cdef Py_ssize_t s = _hash(pid, self.bits), mask = self.nslots - 1
        while self.slots[s] != -1:
            s = (s + 1) & mask
        self.slots[s] = <int32_t>self.n
        self.n += 1
        return row

    cdef int _maybe_shrink(self) except -1:
        """After rows went: shrink the arrays to at most four times what is left (none: free
        them), else rebuild the index over the compacted rows."""
        cdef Py_ssize_t cap = self.cap
        if self.n == 0:
            cap = 0
        while cap > MIN_CAP and self.n * 4 <= cap:
            cap //= 2
        if cap != self.cap:
            self._resize(cap)
        else:
            self._reindex()
        return 0

    def __len__(self):
        return self.n

    def __contains__(self, object producer_id):
        try:
            return self._find(producer_id) != NULL
        except (TypeError, OverflowError):
            return False

    def memory(self):
        """Bytes held by the arrays (rows and index)."""
        return self.cap * sizeof(Row) + self.nslots * sizeof(int32_t)

    # -- the append path --------------------------------------------------------------------------

    def check(self, int64_t producer_id, int16_t epoch, int32_t first_seq, int32_t last_seq,
              bint transactional, bint origin_client):
        """``(OK,)``, ``(DUPLICATE, first_seq, last_seq, last_offset, offset_delta, timestamp)``
        of the retained batch, or ``(error, current_epoch, current_last_seq, txn_first_offset)``
        with error 47, 45 or 48, in Kafka's order (see producer_state.py)."""
        cdef Row *row = self._find(producer_id)
        cdef int16_t cur_epoch = NO_EPOCH
        cdef int32_t cur_last = -1
        cdef int64_t txn = -1
        cdef int i
        cdef Batch *b
        if row != NULL:
            cur_epoch, cur_last, txn = row.producer_epoch, _last_seq(row), row.txn_first_offset
            if origin_client and epoch == cur_epoch:
                for i in range(row.count):
                    b = _batch(row, i)
                    if b.first_seq == first_seq and b.last_seq == last_seq:
                        return (DUPLICATE, b.first_seq, b.last_seq, b.last_offset, b.offset_delta,
                                b.timestamp)
        if epoch < cur_epoch:
            return INVALID_PRODUCER_EPOCH, cur_epoch, cur_last, txn
        if origin_client:
            if epoch != cur_epoch:
                if first_seq != 0 and cur_epoch != NO_EPOCH:
                    return OUT_OF_ORDER_SEQUENCE_NUMBER, cur_epoch, cur_last, txn
            elif cur_epoch != NO_EPOCH and not _in_sequence(cur_last, first_seq):
                return OUT_OF_ORDER_SEQUENCE_NUMBER, cur_epoch, cur_last, txn
        if txn >= 0 and not transactional:
            return INVALID_TXN_STATE, cur_epoch, cur_last, txn
        return _OK

    def append_batch(self, int64_t producer_id, int16_t epoch, int32_t first_seq,
                     int32_t last_seq, int64_t first_offset, int64_t last_offset,
                     int64_t timestamp, bint transactional):
        """Record a data batch appended at [first_offset, last_offset] (no checks)."""
        if last_offset - first_offset > 0x7fffffff or last_offset < first_offset:
            raise OverflowError(f"offset delta of [{first_offset}, {last_offset}] is out of range")
        cdef Row *row = self._insert(producer_id)
        _set_epoch(row, epoch)
        _push(row, first_seq, last_seq, last_offset, <int32_t>(last_offset - first_offset),
              timestamp)
        row.last_timestamp = timestamp
        if transactional and row.txn_first_offset < 0:
            row.txn_first_offset = first_offset
            self.open_txns += 1

    def end_txn(self, int64_t producer_id, int16_t epoch, int64_t timestamp,
                int32_t coordinator_epoch, bint has_coordinator_epoch, bint check):
        """A COMMIT/ABORT marker: ``(0, first offset of the ended transaction or -1, epoch,
        coordinator epoch)``, or ``(47 | 52, -1, current epoch, current coordinator epoch)``
        when ``check`` finds an older producer or coordinator epoch (nothing changes then)."""
        cdef Row *row = self._find(producer_id)
        cdef int16_t cur_epoch = row.producer_epoch if row != NULL else NO_EPOCH
        cdef int32_t cur_coord = row.coordinator_epoch if row != NULL else -1
        cdef int64_t first
        if check:
            if epoch < cur_epoch:
                return INVALID_PRODUCER_EPOCH, -1, cur_epoch, cur_coord
            if has_coordinator_epoch and coordinator_epoch < cur_coord:
                return TRANSACTION_COORDINATOR_FENCED, -1, cur_epoch, cur_coord
        row = self._insert(producer_id)
        first = row.txn_first_offset
        _set_epoch(row, epoch)
        if has_coordinator_epoch:
            row.coordinator_epoch = coordinator_epoch
        if row.txn_first_offset >= 0:
            self.open_txns -= 1
        row.txn_first_offset = -1
        row.last_timestamp = timestamp
        return OK, first, row.producer_epoch, row.coordinator_epoch

    # -- whole entries ----------------------------------------------------------------------------

    cdef tuple _entry(self, Row *row):
        cdef int i
        cdef Batch *b
        batches = []
        for i in range(row.count):
            b = _batch(row, i)
            batches.append((b.first_seq, b.last_seq, b.last_offset, b.offset_delta, b.timestamp))
        return (row.producer_id, row.producer_epoch, row.coordinator_epoch, row.last_timestamp,
                row.txn_first_offset, tuple(batches))

    def get(self, int64_t producer_id):
        """``(producer_id, epoch, coordinator_epoch, last_timestamp, txn_first_offset,
        batches)`` with ``batches`` a tuple of 5-tuples, oldest first; None if unknown."""
        cdef Row *row = self._find(producer_id)
        return None if row == NULL else self._entry(row)

    def items(self):
        """``get`` of every producer, in producer id order."""
        cdef Py_ssize_t i
        out = [self._entry(&self.rows[i]) for i in range(self.n)]
        out.sort()
        return out

    def put(self, int64_t producer_id, int16_t epoch, int32_t coordinator_epoch,
            int64_t last_timestamp, int64_t txn_first_offset, batches):
        """Insert or replace a producer whole (a snapshot entry); the last 5 batches are kept."""
        cdef list kept = []
        for first_seq, last_seq, last_offset, delta, ts in batches:
            kept.append(((<int32_t>first_seq), (<int32_t>last_seq), (<int64_t>last_offset),
                         (<int32_t>delta), (<int64_t>ts)))  # range checks before any change
        cdef Row *row = self._insert(producer_id)
        if row.txn_first_offset >= 0:
            self.open_txns -= 1
        row.producer_epoch = epoch
        row.coordinator_epoch = coordinator_epoch
        row.last_timestamp = last_timestamp
        row.txn_first_offset = txn_first_offset if txn_first_offset >= 0 else -1
        if row.txn_first_offset >= 0:
            self.open_txns += 1
        row.count = 0
        row.head = 0
        for first_seq, last_seq, last_offset, delta, ts in kept[-RETAIN:]:
            _push(row, first_seq, last_seq, last_offset, delta, ts)

    def remove_expired(self, now_ms, expiration_ms, bint ids=True):
        """Forget producers with no open transaction whose last timestamp is at least
        ``expiration_ms`` before ``now_ms``; their ids in row order (``ids`` False: how many,
        without making an int object per producer).  The rows left are compacted and the arrays
        shrunk to at most four times what they hold."""
        threshold = now_ms - expiration_ms   # expired: last_timestamp <= threshold
        if threshold < INT64_MIN:
            return [] if ids else 0
        cdef int64_t limit = min(threshold, INT64_MAX)
        cdef Py_ssize_t i, kept = 0
        cdef list gone = [] if ids else None
        for i in range(self.n):
            if self.rows[i].txn_first_offset < 0 and self.rows[i].last_timestamp <= limit:
                if ids:
                    gone.append(self.rows[i].producer_id)
            else:
                if kept != i:
                    self.rows[kept] = self.rows[i]
                kept += 1
        cdef Py_ssize_t removed = self.n - kept
        if removed:
            self.n = kept
            self._maybe_shrink()
        return gone if ids else removed

    def first_unstable_offset(self):
        """The smallest first offset of an open transaction, -1 if none."""
        cdef Py_ssize_t i
        cdef int64_t best = INT64_MAX
        if self.open_txns == 0:
            return -1
        for i in range(self.n):
            if 0 <= self.rows[i].txn_first_offset < best:
                best = self.rows[i].txn_first_offset
        return best

    def clear(self):
        self.n = 0
        self.open_txns = 0
        self._maybe_shrink()
