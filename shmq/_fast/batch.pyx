# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""RecordBatch v2 hot paths: header checks, in-place stamping, batch scans, record codecs.

Byte layout of a batch (big-endian, Kafka ``DefaultRecordBatch``)::

    0  baseOffset int64          (stamped by the broker, not in the CRC)
    8  batchLength int32         bytes after this field = size - 12
   12  partitionLeaderEpoch int32 (stamped by the broker, not in the CRC)
   16  magic int8 = 2
   17  crc uint32                CRC-32C of bytes 21..size
   21  attributes int16          bits 0-2 codec, 3 LogAppendTime, 4 transactional, 5 control
   23  lastOffsetDelta int32
   27  baseTimestamp int64
   35  maxTimestamp int64
   43  producerId int64
   51  producerEpoch int16
   53  baseSequence int32
   57  recordsCount int32
   61  records (one compressed stream when the codec is not none)

Record (zigzag varints)::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
    keyLength varint (-1 null) | key | valueLength varint (-1 null) | value
    headersCount varint | [headerKeyLength varint | key utf-8 | headerValueLength varint | value]

Every function here bounds every read by the buffer it was given: bad input raises
``CorruptRecordError`` and never reads outside the buffer.  The pure-Python twin in
``_reference.py`` has the same names and behaviour and is the oracle in the parity tests.
"""

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t, INT64_MAX, INT64_MIN
from libc.string cimport memcpy, memset
from libc.stdlib cimport malloc, realloc, free
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF, Py_XINCREF, Py_XDECREF
from cpython.object cimport PyObject, PyTypeObject
from cpython.exc cimport PyErr_SetFromErrno, PyErr_CheckSignals
from libc cimport errno as c_errno
from posix.uio cimport iovec, pwritev

cdef extern from "Python.h":
    # A decoded record holds only ints, bytes, str, None and tuples of those: it can never be
    # part of a reference cycle, so it is untracked at once.  Otherwise every 700 new records
    # start a GC pass over everything decoded so far (measured: 3.8 -> 0.7 M records/s when a
    # caller keeps 200k records).
    void PyObject_GC_UnTrack(void *op)

# Record construction on borrowed C pointers: the decoding loop makes 4-5 objects a record and
# Cython's reference juggling around `object` locals was measurable there.
cdef extern from *:
    """
    static inline PyObject *shmq_bytes(const char *p, Py_ssize_t n) {
        return PyBytes_FromStringAndSize(p, n);
    }
    static inline PyObject *shmq_int64(int64_t v) { return PyLong_FromLongLong(v); }
    /* A plain tuple, untracked (see PyObject_GC_UnTrack above). */
    static inline PyObject *shmq_tuple_new(Py_ssize_t n) {
        PyObject *t = PyTuple_New(n);
        if (t) PyObject_GC_UnTrack(t);
        return t;
    }
    /* A tuple subtype instance as tuple_subtype_new makes it (PyType_GenericAlloc), untracked.
       Items start NULL. */
    static inline PyObject *shmq_generic_alloc(PyTypeObject *tp, Py_ssize_t n) {
        PyObject *t = PyType_GenericAlloc(tp, n);
        if (t) PyObject_GC_UnTrack(t);
        return t;
    }
    /* The same for a subtype laid out exactly as a tuple (shmq_plain_tuple_layout): no spare
       item, no zeroing, never tracked.  The caller sets every item before anything sees it. */
    static inline PyObject *shmq_tuple_subtype_new(PyTypeObject *tp, Py_ssize_t n) {
        return (PyObject *)PyObject_GC_NewVar(PyTupleObject, tp, n);
    }
    #ifndef Py_TPFLAGS_MANAGED_DICT
    #define Py_TPFLAGS_MANAGED_DICT 0
    #endif
    #ifndef Py_TPFLAGS_MANAGED_WEAKREF
    #define Py_TPFLAGS_MANAGED_WEAKREF 0
    #endif
    /* Instances of tp are tuples plus nothing (a NamedTuple: __slots__ = ()). */
    static inline int shmq_plain_tuple_layout(PyTypeObject *tp) {
        return tp->tp_basicsize == PyTuple_Type.tp_basicsize
            && tp->tp_itemsize == PyTuple_Type.tp_itemsize
            && tp->tp_dictoffset == 0 && tp->tp_weaklistoffset == 0
            && !(tp->tp_flags & (Py_TPFLAGS_MANAGED_DICT | Py_TPFLAGS_MANAGED_WEAKREF))
            && tp->tp_alloc == PyType_GenericAlloc && tp->tp_free == PyObject_GC_Del;
    }
    /* Steals the five references. */
    static inline void shmq_tuple_fill5(PyObject *t, PyObject *a, PyObject *b, PyObject *c,
                                        PyObject *d, PyObject *e) {
        PyObject **items = ((PyTupleObject *)t)->ob_item;
        items[0] = a; items[1] = b; items[2] = c; items[3] = d; items[4] = e;
    }
    static inline PyObject **shmq_list_items(PyObject *list) {
        return ((PyListObject *)list)->ob_item;
    }
    """
    PyObject *shmq_bytes(const char *p, Py_ssize_t n)
    PyObject *shmq_int64(int64_t v)
    PyObject *shmq_tuple_new(Py_ssize_t n)
    PyObject *shmq_generic_alloc(PyTypeObject *tp, Py_ssize_t n)
    PyObject *shmq_tuple_subtype_new(PyTypeObject *tp, Py_ssize_t n)
    int shmq_plain_tuple_layout(PyTypeObject *tp)
    void shmq_tuple_fill5(PyObject *t, PyObject *a, PyObject *b, PyObject *c, PyObject *d,
                          PyObject *e)
    PyObject **shmq_list_items(object lst)

from shmq._fast.crc32c cimport crc32c_c, shmq_crc32c_init
from shmq._fast._errors import CorruptRecordError, InvalidRecordError

cdef extern from "_endian.h":
    int16_t shmq_load_i16(const unsigned char *p) nogil
    int32_t shmq_load_i32(const unsigned char *p) nogil
    int64_t shmq_load_i64(const unsigned char *p) nogil
    uint32_t shmq_load_u32(const unsigned char *p) nogil
    void shmq_store_u16(unsigned char *p, uint16_t v) nogil
    void shmq_store_u32(unsigned char *p, uint32_t v) nogil
    void shmq_store_u64(unsigned char *p, uint64_t v) nogil

shmq_crc32c_init()

cdef enum:
    HEADER = 61
    # scan_batches statuses
    S_END = 0        # stopped exactly at `end`
    S_PARTIAL = 1    # the batch at `pos` runs past `end` (a torn tail, or a lying length)
    S_CORRUPT = 2    # the batch at `pos` is invalid (size, magic, CRC, counts)
    S_FULL = 3       # `out` is full; call again from `pos`

HEADER_SIZE = HEADER
# "this batch is not LogAppendTime" for decode_records / fill_columns (any int64 can be a time)
cdef int64_t NO_LAT = -0x7fffffffffffffff - 1
NO_LOG_APPEND_TIME = NO_LAT
SCAN_END, SCAN_PARTIAL, SCAN_CORRUPT, SCAN_FULL = S_END, S_PARTIAL, S_CORRUPT, S_FULL
# scan_batches output columns, SCAN_COLUMNS int64 per batch
SCAN_COLUMNS = 12
COL_POSITION, COL_BASE_OFFSET, COL_LAST_OFFSET, COL_MAX_TIMESTAMP, COL_SIZE, COL_LEADER_EPOCH, \
    COL_PRODUCER_ID, COL_PRODUCER_EPOCH, COL_BASE_SEQUENCE, COL_ATTRIBUTES, COL_RECORDS_COUNT, \
    COL_BASE_TIMESTAMP = range(12)

# reasons a batch is invalid (_check); messages in _REASONS
cdef enum:
    OK = 0
    PARTIAL = 1
    R_SHORT_LENGTH = 10
    R_MAGIC = 11
    R_CRC = 12
    R_COUNT = 13
    R_DELTA = 14
    R_CONTROL = 15
    R_SEQUENCE = 16
    R_OVERFLOW = 17

_REASONS = {
    PARTIAL: "batch runs past the end of the buffer",
    R_SHORT_LENGTH: "batch length is smaller than the 61-byte header",
    R_MAGIC: "magic byte is not 2",
    R_CRC: "CRC-32C mismatch",
    R_COUNT: "record count is invalid",
    R_DELTA: "lastOffsetDelta does not match the record count",
    R_CONTROL: "clients may not write control batches",
    R_SEQUENCE: "producer id set but base sequence is negative",
    R_OVERFLOW: "last offset overflows int64",
}


cdef int _check(const unsigned char *p, Py_ssize_t avail, bint verify_crc, bint strict,
                Py_ssize_t *size_out) noexcept nogil:
    """Classify the batch at p: OK (size in size_out), PARTIAL, or a reason code."""
    cdef int32_t length, count, delta
    cdef Py_ssize_t size
    if avail < 17:
        return PARTIAL
    length = shmq_load_i32(p + 8)
    if length < HEADER - 12:
        return R_SHORT_LENGTH
    if p[16] != 2:
        return R_MAGIC
    size = <Py_ssize_t>length + 12
    if size > avail:
        return PARTIAL
    size_out[0] = size
    if verify_crc and crc32c_c(p + 21, size - 21) != shmq_load_u32(p + 17):
        return R_CRC
    count = shmq_load_i32(p + 57)
    delta = shmq_load_i32(p + 23)
    if count < 0 or delta < 0:
        return R_COUNT
    if shmq_load_i64(p) > INT64_MAX - delta:
        return R_OVERFLOW
    if strict:
        # LogValidator.validateBatch: a client batch holds exactly lastOffsetDelta + 1 records,
        # is not a control batch, and carries a sequence when it carries a producer id.
        if count == 0 or delta != count - 1:
            return R_DELTA
        if p[22] & 0x20:
            return R_CONTROL
        if shmq_load_i64(p + 43) >= 0 and shmq_load_i32(p + 53) < 0:
            return R_SEQUENCE
    return OK


cdef object _corrupt(int reason, Py_ssize_t pos, int magic=2):
    """The exception for a batch ``_check`` refused: InvalidRecordError where Kafka answers
    INVALID_RECORD on produce (see _errors.py), else CorruptRecordError."""
    message = f"invalid record batch at byte {pos}: {_REASONS[reason]}"
    if reason in (PARTIAL, R_COUNT, R_DELTA, R_CONTROL, R_SEQUENCE) or (
            reason == R_MAGIC and (magic == 0 or magic == 1)):
        return InvalidRecordError(message)
    return CorruptRecordError(message)


def validate_batch(const unsigned char[::1] buf not None, Py_ssize_t pos=0, Py_ssize_t end=-1,
                   bint verify_crc=True, bint strict=True):
    """Validate the batch at ``buf[pos:]`` (bounded by ``end``) and return its size in bytes.

    ``strict`` adds the checks Kafka applies to client batches on produce (count equals
    lastOffsetDelta + 1 and is positive, no control batch, sequence with producer id).
    """
    cdef Py_ssize_t size = 0
    cdef int r
    if end < 0 or end > buf.shape[0]:
        end = buf.shape[0]
    if pos < 0 or pos > end:
        raise CorruptRecordError(f"batch position {pos} outside the buffer")
    with nogil:
        r = _check(&buf[0] + pos if buf.shape[0] else NULL, end - pos, verify_crc, strict, &size)
    if r != OK:
        raise _corrupt(r, pos, buf[pos + 16] if end - pos > 16 else 2)
    return size


def write_stamped(int fd, int64_t at, object buf not None, Py_ssize_t pos, Py_ssize_t size,
                  int64_t base_offset, int32_t leader_epoch):
    """Write the batch at ``buf[pos:pos + size]`` to ``fd`` at byte ``at`` as the log stores it:
    its first 16 bytes replaced by baseOffset, batchLength (``size`` - 12) and
    partitionLeaderEpoch (all outside the CRC), the client's bytes from the magic byte on.
    ``PartitionLog.append``'s iovec [prefix, body] for one batch, in one ``pwritev`` from C: no
    prefix bytes object, body view or iovec list.  A short write is finished; EINTR is retried
    (after the signal handlers ran); another error raises OSError, part of the batch possibly
    written (the caller truncates).  Returns ``size``."""
    # the plain buffer protocol: a typed memoryview cost ~0.2 us to set up, per batch
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or size < HEADER or size > view.len - pos:
            raise ValueError(f"no batch of {size} bytes at {pos} in a buffer of {view.len}")
        return _write_stamped(fd, at, <const unsigned char *>view.buf + pos, size, base_offset,
                              leader_epoch)
    finally:
        PyBuffer_Release(&view)


cdef Py_ssize_t _write_stamped(int fd, int64_t at, const unsigned char *p, Py_ssize_t size,
                               int64_t base_offset, int32_t leader_epoch) except -1:
    cdef unsigned char prefix[16]
    shmq_store_u64(prefix, <uint64_t>base_offset)
    shmq_store_u32(prefix + 8, <uint32_t>(size - 12))
    shmq_store_u32(prefix + 12, <uint32_t>leader_epoch)
    cdef iovec iov[2]
    iov[0].iov_base = prefix
    iov[0].iov_len = 16
    iov[1].iov_base = <void *>(p + 16)
    iov[1].iov_len = size - 16
    cdef Py_ssize_t done = 0
    cdef ssize_t n
    cdef int first = 0, err = 0
    while done < size:
        with nogil:
            n = pwritev(fd, &iov[first], 2 - first, at + done)
            if n < 0:
                err = c_errno.errno
        if n < 0:
            if err == c_errno.EINTR:
                PyErr_CheckSignals()
                continue
            c_errno.errno = err
            PyErr_SetFromErrno(OSError)
        if n == 0:  # a regular file never does this; never loop on it
            c_errno.errno = c_errno.EIO
            PyErr_SetFromErrno(OSError)
        done += n
        while n > 0:  # past what was written (only after a short write)
            if <size_t>n >= iov[first].iov_len:
                n -= iov[first].iov_len
                first += 1
            else:
                iov[first].iov_base = <unsigned char *>iov[first].iov_base + n
                iov[first].iov_len -= n
                n = 0
    return size


def batch_header(const unsigned char[::1] buf not None, Py_ssize_t pos=0):
    """The 13 header fields of the batch at ``buf[pos:]`` (no validation beyond the bounds).

    Returns (base_offset, batch_length, leader_epoch, magic, crc, attributes, last_offset_delta,
    base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, records_count).
    """
    if pos < 0 or buf.shape[0] - pos < HEADER:
        raise CorruptRecordError(f"record batch header at byte {pos} is truncated")
    cdef const unsigned char *p = &buf[0] + pos
    return (shmq_load_i64(p), shmq_load_i32(p + 8), shmq_load_i32(p + 12), <int8_t>p[16],
            shmq_load_u32(p + 17), shmq_load_i16(p + 21), shmq_load_i32(p + 23),
            shmq_load_i64(p + 27), shmq_load_i64(p + 35), shmq_load_i64(p + 43),
            shmq_load_i16(p + 51), shmq_load_i32(p + 53), shmq_load_i32(p + 57))


def stamp_batch(unsigned char[::1] buf not None, Py_ssize_t pos, int64_t base_offset,
                int32_t leader_epoch):
    """Write baseOffset and partitionLeaderEpoch in place; both lie outside the CRC."""
    if pos < 0 or buf.shape[0] - pos < HEADER:
        raise CorruptRecordError(f"record batch header at byte {pos} is truncated")
    shmq_store_u64(&buf[pos], <uint64_t>base_offset)
    shmq_store_u32(&buf[pos + 12], <uint32_t>leader_epoch)


def scan_batches(const unsigned char[::1] buf not None, Py_ssize_t start, Py_ssize_t end,
                 int64_t[::1] out not None, bint verify_crc=True, bint strict=False):
    """Walk batches in ``buf[start:end]``, writing SCAN_COLUMNS int64 per batch into ``out``.

    Returns ``(count, pos, status, reason)``: ``pos`` is where the walk stopped (the start of the
    first batch not reported), ``status`` one of SCAN_END / SCAN_PARTIAL / SCAN_CORRUPT /
    SCAN_FULL and ``reason`` a message for PARTIAL and CORRUPT (else None).
    """
    cdef Py_ssize_t cap = out.shape[0] // SCAN_COLUMNS
    cdef Py_ssize_t n = 0, pos, size = 0
    cdef int r = OK, status = 0
    cdef const unsigned char *base
    cdef const unsigned char *p
    cdef int64_t *row
    if end < 0 or end > buf.shape[0]:
        end = buf.shape[0]
    if start < 0 or start > end:
        raise CorruptRecordError(f"scan start {start} outside the buffer")
    pos = start
    if end == start:
        return 0, pos, S_END, None
    base = &buf[0]
    with nogil:
        while True:
            if pos == end:
                status = S_END
                break
            if n == cap:
                status = S_FULL
                break
            p = base + pos
            r = _check(p, end - pos, verify_crc, strict, &size)
            if r != OK:
                status = S_PARTIAL if r == PARTIAL else S_CORRUPT
                break
            row = &out[n * 12]
            row[0] = pos
            row[1] = shmq_load_i64(p)
            row[2] = row[1] + shmq_load_i32(p + 23)
            row[3] = shmq_load_i64(p + 35)
            row[4] = size
            row[5] = shmq_load_i32(p + 12)
            row[6] = shmq_load_i64(p + 43)
            row[7] = shmq_load_i16(p + 51)
            row[8] = shmq_load_i32(p + 53)
            row[9] = shmq_load_i16(p + 21)
            row[10] = shmq_load_i32(p + 57)
            row[11] = shmq_load_i64(p + 27)
            n += 1
            pos += size
    return n, pos, status, (_REASONS[r] if r != OK else None)


# --- varints (zigzag, Kafka ByteUtils) -------------------------------------------------------

cdef extern from "_varint.h":
    int _varint_size "shmq_varint_size" (int64_t v) noexcept nogil
    Py_ssize_t _write_varint "shmq_write_varint" (unsigned char *p, int64_t v) noexcept nogil


# --- record decoding -------------------------------------------------------------------------

cdef extern from "_record.h":
    ctypedef struct RecordView "shmq_record":
        int64_t timestamp_delta
        int64_t offset_delta
        const unsigned char *key        # NULL when null
        int64_t key_len
        const unsigned char *value      # NULL when null
        int64_t value_len
        const unsigned char *headers    # the first header
        int64_t headers_count
        const unsigned char *end        # the byte after the record
    const unsigned char *_varint "shmq_varint"(const unsigned char *p, const unsigned char *lim,
                                               int64_t *out, int max_bytes) noexcept nogil
    const unsigned char *_parse_record "shmq_parse_record"(
        const unsigned char *p, const unsigned char *end, RecordView *rv) noexcept nogil


cdef PyObject *_headers_tuple(RecordView *rv) except NULL:
    """The headers of a parsed record as a new tuple of (str, bytes | None)."""
    cdef const unsigned char *p = rv.headers
    cdef int64_t klen, vlen, i
    cdef object key, value
    out = PyTuple_New(rv.headers_count)
    PyObject_GC_UnTrack(<void *>out)
    for i in range(rv.headers_count):
        # _parse_record checked every length: these reads cannot fail
        p = _varint(p, rv.end, &klen, 5)
        key = PyUnicode_DecodeUTF8(<const char *>p, klen, "replace")
        p += klen
        p = _varint(p, rv.end, &vlen, 5)
        if vlen < 0:
            value = None
        else:
            value = PyBytes_FromStringAndSize(<const char *>p, vlen)
            p += vlen
        item = (key, value)
        PyObject_GC_UnTrack(<void *>item)
        Py_INCREF(item)
        PyTuple_SET_ITEM(out, i, item)
    Py_INCREF(out)
    return <PyObject *>out


cdef object _NO_HEADERS = ()


cdef inline PyObject *_bytes_or_none(const unsigned char *p, Py_ssize_t n) noexcept:
    if p == NULL:
        Py_INCREF(None)
        return <PyObject *>None
    return shmq_bytes(<const char *>p, n)


# Fresh pymalloc arenas (1 MiB mmaps) are faulted in page by page as the records fill them;
# with 1 M records kept (~290 MB) the page faults were 44 % of the decoding time (perf).  While
# a large decode_sections / decode_records runs, the arena allocator is wrapped so that each
# new arena is populated by one madvise(MADV_POPULATE_WRITE) (the decoding fills every arena it
# takes anyway; measured 1.42x -> 1.55x over the previous decoder, 1 M records kept), and the
# previous allocator is restored afterwards (also on errors).  The wrapper asks the previous
# allocator for the memory, so arenas stay compatible with whichever allocator frees them.  The
# GIL is held throughout; another thread that runs meanwhile (a finalizer released the GIL)
# only gets populated arenas too.
cdef extern from *:
    """
    #include <sys/mman.h>
    #ifndef MADV_POPULATE_WRITE
    #define MADV_POPULATE_WRITE 23
    #endif
    static PyObjectArenaAllocator shmq_arena_prev;
    static int shmq_arena_depth = 0;
    static void *shmq_arena_alloc(void *ctx, size_t size) {
        void *p = shmq_arena_prev.alloc(shmq_arena_prev.ctx, size);
        if (p != NULL)
            (void)madvise(p, size, MADV_POPULATE_WRITE);  /* best effort (Linux >= 5.14) */
        return p;
    }
    static void shmq_arena_free(void *ctx, void *p, size_t size) {
        shmq_arena_prev.free(shmq_arena_prev.ctx, p, size);
    }
    static void shmq_populate_arenas_begin(void) {
        if (shmq_arena_depth++ == 0) {
            PyObjectArenaAllocator a = {NULL, shmq_arena_alloc, shmq_arena_free};
            PyObject_GetArenaAllocator(&shmq_arena_prev);
            PyObject_SetArenaAllocator(&a);
        }
    }
    static void shmq_populate_arenas_end(void) {
        if (--shmq_arena_depth == 0)
            PyObject_SetArenaAllocator(&shmq_arena_prev);
    }
    """
    void shmq_populate_arenas_begin() noexcept
    void shmq_populate_arenas_end() noexcept

# below this many records the arenas a decode takes are few: leave the allocator alone
cdef enum:
    POPULATE_MIN_RECORDS = 4096


cdef void _fill_none(list out, Py_ssize_t start, Py_ssize_t stop) noexcept:
    """Put None in the slots of out[start:stop] still NULL, so the list is valid to free."""
    cdef PyObject **slots = shmq_list_items(out)
    cdef Py_ssize_t j
    for j in range(start, stop):
        if slots[j] == NULL:
            Py_INCREF(None)
            slots[j] = <PyObject *>None


cdef Py_ssize_t _decode_section(list out, Py_ssize_t at, const unsigned char *p,
                                Py_ssize_t size, int64_t count, int64_t base_offset,
                                int64_t base_timestamp, int64_t log_append_time,
                                PyTypeObject *record_type, int alloc) except -1:
    """Decode ``count`` records at p[0:size] into ``out[at:at + count]`` (slots still NULL).

    Returns 0, or raises after filling the slots it did not fill with None.  ``alloc``: 0 plain
    tuples, 1 PyObject_GC_NewVar(record_type), 2 PyType_GenericAlloc(record_type).

    Every record holds five new objects (tuple, offset int, two bytes); the records of a batch
    usually share one millisecond, so a timestamp equal to the previous record's reuses its int
    (a fifth of the allocations, and of the fresh pages a caller keeping 1 M records touches).
    """
    cdef const unsigned char *end = p + size
    cdef const unsigned char *q = p
    cdef RecordView rv
    cdef PyObject *rec
    cdef PyObject *off_o
    cdef PyObject *key_o
    cdef PyObject *value_o
    cdef PyObject *hdr_o
    cdef PyObject *ts_o = NULL
    cdef int64_t ts, last_ts = 0
    cdef Py_ssize_t i, j
    cdef PyObject **slots = shmq_list_items(out) + at
    try:
        for i in range(count):
            q = _parse_record(q, end, &rv)
            if q == NULL:
                raise CorruptRecordError(f"record {i} of {count} is malformed")
            ts = log_append_time if log_append_time != NO_LAT else base_timestamp + rv.timestamp_delta
            if ts_o == NULL or ts != last_ts:
                Py_XDECREF(ts_o)
                ts_o = shmq_int64(ts)
                if ts_o == NULL:
                    raise MemoryError()
                last_ts = ts
            if rv.headers_count:
                hdr_o = _headers_tuple(&rv)
            else:
                Py_INCREF(_NO_HEADERS)
                hdr_o = <PyObject *>_NO_HEADERS
            off_o = shmq_int64(base_offset + rv.offset_delta)
            key_o = _bytes_or_none(rv.key, rv.key_len)
            value_o = _bytes_or_none(rv.value, rv.value_len)
            rec = NULL
            if off_o != NULL and key_o != NULL and value_o != NULL:
                if alloc == 0:
                    rec = shmq_tuple_new(5)
                elif alloc == 1:
                    rec = shmq_tuple_subtype_new(record_type, 5)
                else:
                    rec = shmq_generic_alloc(record_type, 5)
            if rec == NULL:
                Py_XDECREF(off_o)
                Py_XDECREF(key_o)
                Py_XDECREF(value_o)
                Py_XDECREF(hdr_o)
                raise MemoryError()
            Py_XINCREF(ts_o)
            shmq_tuple_fill5(rec, off_o, ts_o, key_o, value_o, hdr_o)
            slots[i] = rec
        if q != end:
            raise CorruptRecordError(f"{end - q} bytes left after {count} records")
    except BaseException:
        _fill_none(out, at, at + count)
        raise
    finally:
        Py_XDECREF(ts_o)
    return 0


cdef int _record_alloc(type record_type) except -1:
    if record_type is None:
        return 0
    if not (issubclass(record_type, tuple) and len(getattr(record_type, "_fields", ())) == 5):
        raise TypeError("record_type must be a tuple subclass with 5 fields")
    # 80 instead of 96 bytes a record, no zeroing, no GC tracking
    return 1 if shmq_plain_tuple_layout(<PyTypeObject *>record_type) else 2


def decode_records(const unsigned char[::1] body not None, int64_t count, int64_t base_offset,
                   int64_t base_timestamp, int64_t log_append_time=NO_LAT, type record_type=None):
    """Decode ``count`` records from an uncompressed records section.

    Returns a list of ``(offset, timestamp, key, value, headers)`` tuples, headers a tuple of
    ``(str, bytes | None)``.  A ``log_append_time`` other than NO_LOG_APPEND_TIME replaces every
    timestamp (LogAppendTime batches).  ``record_type``, a 5-field tuple subclass such as a
    NamedTuple, is built instead of plain tuples at the same cost.  Raises CorruptRecordError
    when the section does not hold exactly ``count`` records.
    """
    cdef Py_ssize_t end = body.shape[0]
    if count < 0 or count > end:
        raise CorruptRecordError(f"record count {count} cannot fit in {end} bytes")
    cdef int alloc = _record_alloc(record_type)
    out = PyList_New(count)
    cdef bint populate = count >= POPULATE_MIN_RECORDS
    if populate:
        shmq_populate_arenas_begin()
    try:
        _decode_section(out, 0, &body[0] if end else NULL, end, count, base_offset,
                        base_timestamp, log_append_time, <PyTypeObject *>record_type, alloc)
    finally:
        if populate:
            shmq_populate_arenas_end()
    return out


cdef inline int64_t _record_ts(int64_t base_timestamp, int64_t delta, int64_t lat) noexcept nogil:
    # Java's long addition wraps; so does this one (no UB: unsigned arithmetic)
    return lat if lat != NO_LAT else <int64_t>(<uint64_t>base_timestamp + <uint64_t>delta)


def check_timestamps(const unsigned char[::1] body not None, int64_t count, int64_t base_offset,
                     int64_t base_timestamp, int64_t log_append_time, bint create_time,
                     int64_t now, int64_t before_max_ms, int64_t after_max_ms):
    """Kafka's ``LogValidator.validateTimestamp`` over one records section: (max, errors).

    Walks the ``count`` records of an uncompressed records section, each parsed whole as Kafka's
    record iterator does: a malformed record, or bytes left after the last, raise
    InvalidRecordError.  A record's timestamp is ``base_timestamp`` + its delta, or
    ``log_append_time`` for a batch that carries the LogAppendTime attribute
    (NO_LOG_APPEND_TIME otherwise).  On a CreateTime topic (``create_time``) a timestamp other
    than -1 must lie in [now - before_max_ms, now + after_max_ms]; otherwise a LogAppendTime
    batch is refused.  ``errors`` is None, or a list of (record index, kind, timestamp, offset,
    key length, value length), kind 0 for a timestamp out of range and 1 for the attribute.
    ``max`` is Kafka's derived maxTimestamp: the largest record timestamp, -1 if none is larger.
    """
    return _timestamps(&body[0] if body.shape[0] else NULL, body.shape[0], count, base_offset,
                       base_timestamp, log_append_time, create_time, now, before_max_ms,
                       after_max_ms)


cdef tuple _timestamps(const unsigned char *start, Py_ssize_t end, int64_t count,
                       int64_t base_offset, int64_t base_timestamp, int64_t log_append_time,
                       bint create_time, int64_t now, int64_t before_max_ms,
                       int64_t after_max_ms):
    """``check_timestamps`` over the ``end`` bytes at ``start``."""
    if count < 0 or count > end:
        raise InvalidRecordError(f"record count {count} cannot fit in {end} bytes")
    # the allowed range, saturated at the int64 limits (Kafka compares now - ts with the limits)
    lo_py = <object>now - <object>before_max_ms   # Python ints: no overflow here
    hi_py = <object>now + <object>after_max_ms
    cdef int64_t lo = INT64_MIN if lo_py < INT64_MIN else lo_py
    cdef int64_t hi = INT64_MAX if hi_py > INT64_MAX else hi_py
    cdef const unsigned char *stop = start + end
    cdef const unsigned char *q = start
    cdef RecordView rv
    cdef int64_t i, ts, max_ts = -1, bad = 0
    cdef Py_ssize_t malformed = -1
    with nogil:
        for i in range(count):
            q = _parse_record(q, stop, &rv)
            if q == NULL:
                malformed = i
                break
            ts = _record_ts(base_timestamp, rv.timestamp_delta, log_append_time)
            if create_time and ts != -1:
                if ts < lo or ts > hi:
                    bad += 1
            elif log_append_time != NO_LAT:
                bad += 1
            if ts > max_ts:
                max_ts = ts
    if malformed >= 0:
        raise InvalidRecordError(f"record {malformed} of {count} is malformed")
    if q != stop:
        raise InvalidRecordError(f"{stop - q} bytes left after {count} records")
    if not bad:
        return max_ts, None
    errors = []
    q = start
    for i in range(count):  # again, with the GIL, for the rare batch that has errors
        q = _parse_record(q, stop, &rv)
        ts = _record_ts(base_timestamp, rv.timestamp_delta, log_append_time)
        if create_time and ts != -1:
            if ts < lo or ts > hi:
                errors.append((i, 0, ts, _record_ts(base_offset, rv.offset_delta, NO_LAT),
                               rv.key_len, rv.value_len))
        elif log_append_time != NO_LAT:
            errors.append((i, 1, ts, _record_ts(base_offset, rv.offset_delta, NO_LAT),
                           rv.key_len, rv.value_len))
    return max_ts, errors


# check_batch's ``rewrite`` for a compressed batch whose timestamps it left to the caller
TIMESTAMPS_UNCHECKED = -2


def check_batch(object buf not None, Py_ssize_t pos, Py_ssize_t limit, bint validate,
                bint create_time, int64_t now, int64_t before_max_ms, int64_t after_max_ms):
    """Pass 1 of ``PartitionLog.append`` for the batch at ``buf[pos:]``, in one call:
    ``validate_batch(buf, pos, -1, True, validate)``, its header fields and, with ``validate``
    and a size within ``limit`` (max.message.bytes; a larger one is the caller's
    MESSAGE_TOO_LARGE, checked first), Kafka's timestamp rules (``check_timestamps``) and what
    the log stores for them.

    Returns (size, attributes, lastOffsetDelta, max timestamp to store, rewrite, producer id,
    producer epoch, base sequence, errors).  ``rewrite``: -1 the header stays as sent, else the
    attributes to rewrite it with (maxTimestamp and CRC redone: a CreateTime batch whose
    maxTimestamp is not its records', or that claims LogAppendTime), or TIMESTAMPS_UNCHECKED
    for a compressed batch (the caller decompresses and checks it).  ``errors``: None, or
    ``check_timestamps``' list (the caller raises INVALID_TIMESTAMP).  On a LogAppendTime topic
    (not ``create_time``) the max timestamp is ``now``.  Without ``validate`` the header's
    maxTimestamp is kept.  Raises as validate_batch and check_timestamps do."""
    # the plain buffer protocol: a typed memoryview cost ~0.2 us to set up, per batch
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        return _check_batch(<const unsigned char *>view.buf, view.len, pos, limit, validate,
                            create_time, now, before_max_ms, after_max_ms)
    finally:
        PyBuffer_Release(&view)


cdef tuple _check_batch(const unsigned char *buf, Py_ssize_t end, Py_ssize_t pos,
                        Py_ssize_t limit, bint validate, bint create_time, int64_t now,
                        int64_t before_max_ms, int64_t after_max_ms):
    cdef Py_ssize_t size = 0
    cdef int r
    if pos < 0 or pos > end:
        raise CorruptRecordError(f"batch position {pos} outside the buffer")
    cdef const unsigned char *p = buf + pos if end else NULL
    with nogil:
        r = _check(p, end - pos, True, validate, &size)
    if r != OK:
        raise _corrupt(r, pos, buf[pos + 16] if end - pos > 16 else 2)
    cdef int16_t attributes = shmq_load_i16(p + 21)
    cdef int32_t delta = shmq_load_i32(p + 23)
    cdef int64_t header_max = shmq_load_i64(p + 35)
    cdef int64_t batch_max = header_max
    cdef int rewrite = -1
    cdef object errors = None
    if validate and size <= limit:
        if attributes & 0x07:
            rewrite = TIMESTAMPS_UNCHECKED
        else:
            derived, errors = _timestamps(
                p + HEADER, size - HEADER, <int64_t>delta + 1, shmq_load_i64(p),
                shmq_load_i64(p + 27), header_max if attributes & 0x08 else NO_LAT, create_time,
                now, before_max_ms, after_max_ms)
            if not create_time:
                batch_max = now
            else:
                batch_max = derived
                if attributes & 0x08 or batch_max != header_max:
                    rewrite = attributes & 0x77
    return (size, attributes, delta, batch_max, rewrite, shmq_load_i64(p + 43),
            shmq_load_i16(p + 51), shmq_load_i32(p + 53), errors)


def decode_sections(list bodies not None, const int64_t[::1] meta not None,
                    type record_type=None):
    """Decode many records sections into one list, as ``decode_records`` would each.

    ``bodies`` and ``meta`` are laid out as for ``fill_columns``: ``meta[4*i:4*i+4]`` is
    section i's (count, base offset, base timestamp, log append time or NO_LOG_APPEND_TIME).
    One call for a whole fetch: no per-batch list to build and extend.  A count that cannot fit
    in its section (a record takes at least 7 bytes) raises CorruptRecordError before the
    list is allocated.
    """
    cdef Py_ssize_t nb = len(bodies), b, at = 0, end
    cdef int64_t count, total = 0
    cdef const unsigned char[::1] body
    if meta.shape[0] < 4 * nb:
        raise ValueError("meta holds fewer than 4 values per section")
    cdef int alloc = _record_alloc(record_type)
    for b in range(nb):
        count = meta[4 * b]
        end = len(bodies[b])
        # a record takes at least 7 bytes: a lying count must not size the list
        if count < 0 or count > end // 7:
            raise CorruptRecordError(f"record count {count} cannot fit in {end} bytes")
        total += count
    out = PyList_New(total)
    cdef bint populate = total >= POPULATE_MIN_RECORDS
    if populate:
        shmq_populate_arenas_begin()
    try:
        for b in range(nb):
            body = bodies[b]
            end = body.shape[0]
            count = meta[4 * b]
            _decode_section(out, at, &body[0] if end else NULL, end, count, meta[4 * b + 1],
                            meta[4 * b + 2], meta[4 * b + 3], <PyTypeObject *>record_type, alloc)
            at += count
    except BaseException:
        _fill_none(out, at, total)
        raise
    finally:
        if populate:
            shmq_populate_arenas_end()
    return out


# --- record encoding -------------------------------------------------------------------------

cdef class _Buf:
    """A borrowed read-only view of a bytes-like object, or None (null)."""
    cdef Py_buffer view
    cdef bint held

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef inline _Buf _get_buf(object obj):
    cdef _Buf b = _Buf.__new__(_Buf)
    if obj is not None:
        if isinstance(obj, str):
            obj = (<str>obj).encode("utf-8")
        PyObject_GetBuffer(obj, &b.view, PyBUF_SIMPLE)
        b.held = True
    return b


def encode_records(records, int64_t base_timestamp):
    """Encode ``records`` (sequence of ``(key, value, timestamp, headers)``) as a records section.

    Offset deltas are 0..n-1; timestamps are written as deltas from ``base_timestamp``.  Keys and
    values are bytes-like or None; headers a sequence of ``(str | bytes, bytes-like | None)``.
    """
    cdef Py_ssize_t n = len(records), i, total = 0, body, pos = 0, k
    cdef int64_t ts
    cdef _Buf kb, vb, hk, hv
    cdef unsigned char *w
    cdef list bufs = []
    cdef Py_ssize_t *bodies = <Py_ssize_t *>malloc(sizeof(Py_ssize_t) * (n if n else 1))
    if bodies == NULL:
        raise MemoryError()
    try:
        # pass 1: sizes (and keep the buffers alive for pass 2)
        for i in range(n):
            key, value, timestamp, headers = records[i]
            ts = timestamp - base_timestamp
            kb = _get_buf(key)
            vb = _get_buf(value)
            bufs.append(kb)
            bufs.append(vb)
            body = 1 + _varint_size(ts) + _varint_size(i)
            body += (_varint_size(kb.view.len) + kb.view.len) if kb.held else 1
            body += (_varint_size(vb.view.len) + vb.view.len) if vb.held else 1
            hlist = list(headers) if headers else []
            bufs.append(hlist)
            body += _varint_size(len(hlist))
            for h in hlist:
                hk = _get_buf(h[0])
                hv = _get_buf(h[1])
                if not hk.held:
                    raise ValueError("header keys may not be None")
                bufs.append(hk)
                bufs.append(hv)
                body += _varint_size(hk.view.len) + hk.view.len
                body += (_varint_size(hv.view.len) + hv.view.len) if hv.held else 1
            bodies[i] = body
            total += _varint_size(body) + body
        out = PyBytes_FromStringAndSize(NULL, total)
        w = <unsigned char *>PyBytes_AS_STRING(out)
        # pass 2: write
        k = 0
        for i in range(n):
            ts = records[i][2] - base_timestamp
            kb = <_Buf>bufs[k]
            vb = <_Buf>bufs[k + 1]
            hlist = bufs[k + 2]
            k += 3
            pos += _write_varint(w + pos, bodies[i])
            w[pos] = 0
            pos += 1
            pos += _write_varint(w + pos, ts)
            pos += _write_varint(w + pos, i)
            if kb.held:
                pos += _write_varint(w + pos, kb.view.len)
                memcpy(w + pos, kb.view.buf, kb.view.len)
                pos += kb.view.len
            else:
                pos += _write_varint(w + pos, -1)
            if vb.held:
                pos += _write_varint(w + pos, vb.view.len)
                memcpy(w + pos, vb.view.buf, vb.view.len)
                pos += vb.view.len
            else:
                pos += _write_varint(w + pos, -1)
            pos += _write_varint(w + pos, len(hlist))
            for _ in range(len(hlist)):
                hk = <_Buf>bufs[k]
                hv = <_Buf>bufs[k + 1]
                k += 2
                pos += _write_varint(w + pos, hk.view.len)
                memcpy(w + pos, hk.view.buf, hk.view.len)
                pos += hk.view.len
                if hv.held:
                    pos += _write_varint(w + pos, hv.view.len)
                    memcpy(w + pos, hv.view.buf, hv.view.len)
                    pos += hv.view.len
                else:
                    pos += _write_varint(w + pos, -1)
        return out
    finally:
        free(bodies)


def build_batch(const unsigned char[::1] records not None, int32_t records_count,
                int32_t last_offset_delta, int16_t attributes, int64_t base_offset,
                int32_t leader_epoch, int64_t base_timestamp, int64_t max_timestamp,
                int64_t producer_id, int16_t producer_epoch, int32_t base_sequence):
    """Frame a (possibly compressed) records section as a RecordBatch v2 with a valid CRC."""
    cdef Py_ssize_t n = records.shape[0]
    cdef Py_ssize_t size = HEADER + n
    if size - 12 > 0x7fffffff:
        raise ValueError("record batch larger than 2 GiB")
    out = bytearray(size)
    cdef unsigned char *w = out
    shmq_store_u64(w, <uint64_t>base_offset)
    shmq_store_u32(w + 8, <uint32_t>(size - 12))
    shmq_store_u32(w + 12, <uint32_t>leader_epoch)
    w[16] = 2
    shmq_store_u16(w + 21, <uint16_t>attributes)
    shmq_store_u32(w + 23, <uint32_t>last_offset_delta)
    shmq_store_u64(w + 27, <uint64_t>base_timestamp)
    shmq_store_u64(w + 35, <uint64_t>max_timestamp)
    shmq_store_u64(w + 43, <uint64_t>producer_id)
    shmq_store_u16(w + 51, <uint16_t>producer_epoch)
    shmq_store_u32(w + 53, <uint32_t>base_sequence)
    shmq_store_u32(w + 57, <uint32_t>records_count)
    if n:
        memcpy(w + HEADER, &records[0], n)
    shmq_store_u32(w + 17, crc32c_c(w + 21, size - 21))
    return out


# --- columnar decoding (Arrow layout) --------------------------------------------------------

cdef extern from "_record.h":
    ctypedef struct Columns "shmq_columns":
        int64_t *offsets
        int64_t *timestamps
        int32_t *key_offsets
        unsigned char *key_data
        unsigned char *key_valid
        int32_t *value_offsets
        unsigned char *value_data
        unsigned char *value_valid
        int64_t cap_rows, cap_key, cap_value
        int64_t min_offset, max_offset, timestamp_scale
        int64_t rows, klen, vlen, knulls, vnulls
        int64_t records_done
        int64_t left
    enum:
        FILL_OK "SHMQ_FILL_OK"
        FILL_MALFORMED "SHMQ_FILL_MALFORMED"
        FILL_TRAILING "SHMQ_FILL_TRAILING"
        FILL_FULL "SHMQ_FILL_FULL"
        FILL_OVERFLOW "SHMQ_FILL_OVERFLOW"
    int _fill_section "shmq_fill_section"(Columns *c, const unsigned char *p,
                                          const unsigned char *e, int64_t count,
                                          int64_t base_offset, int64_t base_ts, int64_t lat,
                                          int64_t no_lat) noexcept nogil


cdef void _clear_bits_from(unsigned char *bitmap, Py_ssize_t size, Py_ssize_t rows) noexcept nogil:
    """Zero the bits of rows >= rows (the bitmaps started all ones)."""
    cdef Py_ssize_t byte = rows >> 3
    if byte >= size:
        return
    bitmap[byte] &= <unsigned char>((1 << (rows & 7)) - 1)
    memset(bitmap + byte + 1, 0, size - byte - 1)


def fill_columns(list bodies not None, const int64_t[::1] meta not None,
                 int64_t[::1] offsets not None, int64_t[::1] timestamps not None,
                 int32_t[::1] key_offsets not None, unsigned char[::1] key_data not None,
                 unsigned char[::1] key_valid not None,
                 int32_t[::1] value_offsets not None, unsigned char[::1] value_data not None,
                 unsigned char[::1] value_valid not None,
                 int64_t min_offset=-0x7fffffffffffffff, int64_t max_offset=0x7fffffffffffffff,
                 int64_t timestamp_scale=1):
    """Decode records sections straight into Arrow column buffers (no object per record).

    ``bodies[i]`` is an uncompressed records section; ``meta[4*i:4*i+4]`` is its (count,
    base offset, base timestamp, log append time or NO_LOG_APPEND_TIME).  Records with offsets
    outside [min_offset, max_offset) are skipped.  The caller sizes the buffers: rows for every
    record (sum of counts; +1 for the offset arrays), key_data/value_data for the sum of the
    sections' lengths (an upper bound), bitmaps for rows/8 + 1 bytes.  Bytes of key_data and
    value_data after the returned lengths may be overwritten (scratch).  Returns (rows, key
    bytes, value bytes, key nulls, value nulls).  A malformed section raises CorruptRecordError.
    """
    cdef Py_ssize_t nb = len(bodies), b, end
    cdef int64_t count
    cdef const unsigned char[::1] body
    cdef const unsigned char *p
    cdef Columns c
    cdef int status = FILL_OK
    if meta.shape[0] < 4 * nb:
        raise ValueError("meta holds fewer than 4 values per section")
    c.cap_rows = min(offsets.shape[0], timestamps.shape[0], key_offsets.shape[0] - 1,
                     value_offsets.shape[0] - 1, 8 * key_valid.shape[0], 8 * value_valid.shape[0])
    if c.cap_rows < 0:
        raise ValueError("offset arrays need room for rows + 1 entries")
    c.cap_key = key_data.shape[0]
    c.cap_value = value_data.shape[0]
    c.offsets, c.timestamps = &offsets[0], &timestamps[0]
    c.key_offsets, c.value_offsets = &key_offsets[0], &value_offsets[0]
    c.key_data, c.value_data = &key_data[0], &value_data[0]
    c.key_valid, c.value_valid = &key_valid[0], &value_valid[0]
    c.min_offset, c.max_offset, c.timestamp_scale = min_offset, max_offset, timestamp_scale
    c.rows = c.klen = c.vlen = c.knulls = c.vnulls = 0
    memset(c.key_valid, 0xff, key_valid.shape[0])
    memset(c.value_valid, 0xff, value_valid.shape[0])
    c.key_offsets[0] = 0
    c.value_offsets[0] = 0
    try:
        for b in range(nb):
            body = bodies[b]
            count = meta[4 * b]
            end = body.shape[0]
            if count < 0 or count > end:
                raise CorruptRecordError(f"record count {count} cannot fit in {end} bytes")
            if count == 0:
                if end:
                    raise CorruptRecordError(f"{end} bytes left after 0 records")
                continue
            p = &body[0]
            with nogil:
                status = _fill_section(&c, p, p + end, count, meta[4 * b + 1], meta[4 * b + 2],
                                       meta[4 * b + 3], NO_LAT)
            if status == FILL_MALFORMED:
                raise CorruptRecordError(
                    f"record {c.records_done} of {count} in section {b} is malformed")
            if status == FILL_TRAILING:
                raise CorruptRecordError(f"{c.left} bytes left after {count} records in section {b}")
            if status == FILL_FULL:
                raise ValueError("column buffers are too small for these sections")
            if status == FILL_OVERFLOW:
                raise OverflowError("more than 2 GiB of keys or values in one column")
    finally:
        _clear_bits_from(c.key_valid, key_valid.shape[0], c.rows)
        _clear_bits_from(c.value_valid, value_valid.shape[0], c.rows)
    return c.rows, c.klen, c.vlen, c.knulls, c.vnulls


cdef extern from "_record.h":
    ctypedef struct HeaderColumns "shmq_header_columns":
        int32_t *list_offsets
        unsigned char *list_valid
        int32_t *key_offsets
        unsigned char *key_data
        int32_t *value_offsets
        unsigned char *value_data
        unsigned char *value_valid
        int64_t cap_rows, cap_headers, cap_key, cap_value
        int64_t min_offset, max_offset
        int64_t rows, headers, klen, vlen, list_nulls, value_nulls, bad_keys
        int64_t records_done, left
    int _fill_headers_section "shmq_fill_headers_section"(
        HeaderColumns *c, const unsigned char *p, const unsigned char *e, int64_t count,
        int64_t base_offset) noexcept nogil


def fill_headers(list bodies not None, const int64_t[::1] meta not None,
                 int32_t[::1] list_offsets not None, unsigned char[::1] list_valid not None,
                 int32_t[::1] key_offsets not None, unsigned char[::1] key_data not None,
                 int32_t[::1] value_offsets not None, unsigned char[::1] value_data not None,
                 unsigned char[::1] value_valid not None,
                 int64_t min_offset=-0x7fffffffffffffff, int64_t max_offset=0x7fffffffffffffff):
    """Decode the records' headers into Arrow ``list<struct<key: string, value: binary>>``
    buffers, for the records ``fill_columns`` selects from the same sections and window.

    A record without headers is a null list entry.  Sizes the caller guarantees: rows + 1
    list offsets, rows/8 + 1 list bitmap bytes; for the headers (at most a section's length / 2
    of them: a header takes two bytes at least) that many + 1 key and value offsets and /8 + 1
    value bitmap bytes; keys and values at most the sections' lengths.  Returns (rows, headers,
    key bytes, value bytes, null lists, null values, keys that are not valid UTF-8).  A
    malformed section raises CorruptRecordError.
    """
    cdef Py_ssize_t nb = len(bodies), b, end
    cdef int64_t count
    cdef const unsigned char[::1] body
    cdef const unsigned char *p
    cdef HeaderColumns c
    cdef int status = FILL_OK
    if meta.shape[0] < 4 * nb:
        raise ValueError("meta holds fewer than 4 values per section")
    c.cap_rows = min(list_offsets.shape[0] - 1, 8 * list_valid.shape[0])
    c.cap_headers = min(key_offsets.shape[0] - 1, value_offsets.shape[0] - 1,
                        8 * value_valid.shape[0])
    if c.cap_rows < 0 or c.cap_headers < 0:
        raise ValueError("offset arrays need room for n + 1 entries")
    c.cap_key = key_data.shape[0]
    c.cap_value = value_data.shape[0]
    c.list_offsets = &list_offsets[0]
    c.list_valid = &list_valid[0] if list_valid.shape[0] else NULL
    c.key_offsets, c.value_offsets = &key_offsets[0], &value_offsets[0]
    c.key_data = &key_data[0] if key_data.shape[0] else NULL
    c.value_data = &value_data[0] if value_data.shape[0] else NULL
    c.value_valid = &value_valid[0] if value_valid.shape[0] else NULL
    c.min_offset, c.max_offset = min_offset, max_offset
    c.rows = c.headers = c.klen = c.vlen = c.list_nulls = c.value_nulls = c.bad_keys = 0
    if list_valid.shape[0]:
        memset(c.list_valid, 0xff, list_valid.shape[0])
    if value_valid.shape[0]:
        memset(c.value_valid, 0xff, value_valid.shape[0])
    c.list_offsets[0] = c.key_offsets[0] = c.value_offsets[0] = 0
    try:
        for b in range(nb):
            body = bodies[b]
            count = meta[4 * b]
            end = body.shape[0]
            if count < 0 or count > end:
                raise CorruptRecordError(f"record count {count} cannot fit in {end} bytes")
            if count == 0:
                if end:
                    raise CorruptRecordError(f"{end} bytes left after 0 records")
                continue
            p = &body[0]
            with nogil:
                status = _fill_headers_section(&c, p, p + end, count, meta[4 * b + 1])
            if status == FILL_MALFORMED:
                raise CorruptRecordError(
                    f"record {c.records_done} of {count} in section {b} is malformed")
            if status == FILL_TRAILING:
                raise CorruptRecordError(f"{c.left} bytes left after {count} records in section {b}")
            if status == FILL_FULL:
                raise ValueError("column buffers are too small for these sections")
            if status == FILL_OVERFLOW:
                raise OverflowError("more than 2 GiB of header keys or values in one column")
    finally:
        if c.list_valid != NULL:
            _clear_bits_from(c.list_valid, list_valid.shape[0], c.rows)
        if c.value_valid != NULL:
            _clear_bits_from(c.value_valid, value_valid.shape[0], c.headers)
    return c.rows, c.headers, c.klen, c.vlen, c.list_nulls, c.value_nulls, c.bad_keys


# --- Kafka's default partitioner ---------------------------------------------------------------

cdef extern from "_batch_header.h":
    void shmq_write_batch_header(unsigned char *start, size_t size, uint16_t attributes,
                                 int32_t n, int64_t base_ts, int64_t max_ts, int64_t producer_id,
                                 int16_t producer_epoch, int32_t base_sequence) noexcept nogil

cdef extern from "_murmur2.h":
    uint32_t _murmur2 "shmq_murmur2" (const unsigned char *p, Py_ssize_t n) noexcept nogil


def murmur2_partitions(const int32_t[::1] offsets not None, const unsigned char[::1] data not None,
                       valid, int32_t partitions, int32_t[::1] out not None):
    """Kafka's partition of each key of an Arrow binary column: ``toPositive(murmur2(key)) %
    partitions`` (Java's ``BuiltInPartitioner.partitionForKey``), -1 for a null key.

    ``offsets`` has n + 1 entries, ``valid`` is the validity bitmap (a buffer, or None when no
    key is null), ``out`` receives n partitions."""
    cdef Py_ssize_t n = out.shape[0], i
    cdef int32_t a, b
    cdef const unsigned char[::1] bits
    cdef bint has_bits = valid is not None
    if partitions <= 0:
        raise ValueError("partitions must be positive")
    if offsets.shape[0] < n + 1:
        raise ValueError("offsets need n + 1 entries")
    if has_bits:
        bits = memoryview(valid).cast("B")  # pyarrow buffers export signed chars
        if bits.shape[0] * 8 < n:
            raise ValueError("the validity bitmap is too short")
    for i in range(n):
        if has_bits and not (bits[i >> 3] >> (i & 7)) & 1:
            out[i] = -1
            continue
        a, b = offsets[i], offsets[i + 1]
        if a < 0 or b < a or b > data.shape[0]:
            raise ValueError(f"key {i}: offsets {a}..{b} outside the data")
        out[i] = <int32_t>((_murmur2(&data[0] + a if b > a else NULL, b - a) & 0x7fffffff)
                           % <uint32_t>partitions)


# --- RecordBatch v2 from Arrow columns ---------------------------------------------------------

cdef inline bint _arrow_valid(const unsigned char *bits, int64_t r) noexcept nogil:
    return bits == NULL or (bits[r >> 3] >> (r & 7)) & 1


cdef inline int64_t _arrow_len(const int32_t *off, const unsigned char *bits, int64_t r) noexcept nogil:
    """The length of row r of a binary column, -1 when null (or when there is no column)."""
    if off == NULL or not _arrow_valid(bits, r):
        return -1
    return off[r + 1] - off[r]


cdef inline Py_ssize_t _arrow_body(int64_t i, int64_t klen, int64_t vlen) noexcept nogil:
    # attributes, timestamp delta 0, offset delta, key, value, no headers
    return (2 + _varint_size(i) + _varint_size(klen) + (klen if klen > 0 else 0)
            + _varint_size(vlen) + (vlen if vlen > 0 else 0) + 1)


def encode_arrow_batch_into(unsigned char[::1] out not None, Py_ssize_t pos, Py_ssize_t limit,
                            const int64_t[::1] rows not None,
                            const int32_t[::1] key_offsets, const unsigned char[::1] key_data,
                            key_valid,
                            const int32_t[::1] value_offsets not None,
                            const unsigned char[::1] value_data not None, value_valid,
                            int64_t timestamp, int64_t producer_id=-1,
                            int16_t producer_epoch=-1, int32_t base_sequence=-1):
    """Rows ``rows`` of Arrow binary columns as one uncompressed RecordBatch v2 at
    ``out[pos:pos + limit]``, with no object per record (the Spark sink's shared-memory path).

    Keys are (offsets, data, validity bitmap or None), or None for no key column; values the
    same.  Every record gets ``timestamp`` (CreateTime) and no headers.  Base offset 0 and
    partition leader epoch -1 (the broker stamps both).  Returns the batch size, or ``-size``
    (nothing written) when it does not fit in ``limit``.
    """
    cdef Py_ssize_t n = rows.shape[0], i, size, body
    cdef int64_t r, klen, vlen
    cdef int64_t key_rows = key_offsets.shape[0] - 1 if key_offsets is not None else 0
    cdef int64_t value_rows = value_offsets.shape[0] - 1
    cdef const int32_t *koff = &key_offsets[0] if key_offsets is not None else NULL
    cdef const int32_t *voff = &value_offsets[0]
    cdef const unsigned char *kbits = NULL
    cdef const unsigned char *vbits = NULL
    cdef const unsigned char[::1] kb
    cdef const unsigned char[::1] vb
    cdef unsigned char *start
    cdef unsigned char *w
    if n == 0:
        raise ValueError("a record batch holds at least one record")
    if n > 0x7fffffff:
        raise ValueError("too many records for one batch")
    if pos < 0 or limit < 0 or pos > out.shape[0] - limit:
        raise IndexError("encode window is outside the buffer")
    if key_offsets is not None and key_data is None:
        raise ValueError("key offsets without key data")
    if key_valid is not None and key_offsets is not None:
        kb = memoryview(key_valid).cast("B")
        if kb.shape[0] * 8 < key_rows:
            raise ValueError("the key validity bitmap is too short")
        kbits = &kb[0] if kb.shape[0] else NULL
    if value_valid is not None:
        vb = memoryview(value_valid).cast("B")
        if vb.shape[0] * 8 < value_rows:
            raise ValueError("the value validity bitmap is too short")
        vbits = &vb[0] if vb.shape[0] else NULL
    # pass 1: bounds and size
    size = HEADER
    for i in range(n):
        r = rows[i]
        if r < 0 or r >= value_rows or (koff != NULL and r >= key_rows):
            raise IndexError(f"row {r} is outside the columns")
        if koff != NULL and _arrow_valid(kbits, r) and not (
                0 <= koff[r] <= koff[r + 1] <= key_data.shape[0]):
            raise ValueError(f"row {r}: key offsets outside the column data")
        if _arrow_valid(vbits, r) and not 0 <= voff[r] <= voff[r + 1] <= value_data.shape[0]:
            raise ValueError(f"row {r}: value offsets outside the column data")
        klen = _arrow_len(koff, kbits, r)
        vlen = _arrow_len(voff, vbits, r)
        body = _arrow_body(i, klen, vlen)
        size += _varint_size(body) + body
    if size - 12 > 0x7fffffff:
        raise ValueError("record batch larger than 2 GiB")
    if size > limit:
        return -size
    start = &out[pos]
    w = start + HEADER
    with nogil:
        for i in range(n):
            r = rows[i]
            klen = _arrow_len(koff, kbits, r)
            vlen = _arrow_len(voff, vbits, r)
            body = _arrow_body(i, klen, vlen)
            w += _write_varint(w, body)
            w[0] = 0  # attributes
            w[1] = 0  # timestamp delta
            w += 2
            w += _write_varint(w, i)
            w += _write_varint(w, klen)
            if klen > 0:
                memcpy(w, &key_data[0] + koff[r], klen)
                w += klen
            w += _write_varint(w, vlen)
            if vlen > 0:
                memcpy(w, &value_data[0] + voff[r], vlen)
                w += vlen
            w[0] = 0  # no headers
            w += 1
        shmq_write_batch_header(start, size, 0, n, timestamp, timestamp, producer_id,
                                producer_epoch, base_sequence)
        shmq_store_u32(start + 17, crc32c_c(start + 21, size - 21))
    return size


# The Arrow C data interface (arrow/c/abi.h), for ``import_spark_batch``: a RecordBatch is
# handed to pyarrow as one struct ArrowArray whose children point into buffers that Python
# objects own; the parent's release callback drops those objects (with the GIL).
cdef extern from *:
    """
    struct ShmqArrowArray {
        int64_t length;
        int64_t null_count;
        int64_t offset;
        int64_t n_buffers;
        int64_t n_children;
        const void **buffers;
        struct ShmqArrowArray **children;
        struct ShmqArrowArray *dictionary;
        void (*release)(struct ShmqArrowArray *);
        void *private_data;
    };
    typedef struct {
        struct ShmqArrowArray kids[7];
        struct ShmqArrowArray *kid_ptrs[7];
        const void *bufs[7][3];
        const void *parent_bufs[1];
        PyObject *keep;
    } shmq_spark_export_t;

    static void shmq_spark_kid_release(struct ShmqArrowArray *a) { a->release = NULL; }

    static void shmq_spark_release(struct ShmqArrowArray *a) {
        shmq_spark_export_t *e = (shmq_spark_export_t *)a->private_data;
        if (e != NULL) {
            if (e->keep != NULL && Py_IsInitialized()) {
                PyGILState_STATE g = PyGILState_Ensure();
                Py_DECREF(e->keep);
                PyGILState_Release(g);
            }
            free(e);
        }
        a->private_data = NULL;
        a->release = NULL;
    }

    static inline void shmq_spark_kid(shmq_spark_export_t *e, int i, int64_t n,
                                      int64_t nulls, int64_t n_buffers, const void *b0,
                                      const void *b1, const void *b2) {
        struct ShmqArrowArray *k = &e->kids[i];
        e->bufs[i][0] = b0;
        e->bufs[i][1] = b1;
        e->bufs[i][2] = b2;
        k->length = n;
        k->null_count = nulls;
        k->offset = 0;
        k->n_buffers = n_buffers;
        k->n_children = 0;
        k->buffers = e->bufs[i];
        k->children = NULL;
        k->dictionary = NULL;
        k->release = shmq_spark_kid_release;
        k->private_data = NULL;
        e->kid_ptrs[i] = k;
    }
    """
    struct ShmqArrowArray:
        int64_t length
        int64_t null_count
        int64_t offset
        int64_t n_buffers
        int64_t n_children
        const void **buffers
        ShmqArrowArray **children
        ShmqArrowArray *dictionary
        void (*release)(ShmqArrowArray *)
        void *private_data
    ctypedef struct shmq_spark_export_t:
        ShmqArrowArray *kid_ptrs[7]
        const void *parent_bufs[1]
        PyObject *keep
    void shmq_spark_release(ShmqArrowArray *a)
    void shmq_spark_kid(shmq_spark_export_t *e, int i, int64_t n, int64_t nulls,
                        int64_t n_buffers, const void *b0, const void *b1, const void *b2)


def import_spark_batch(object importer, object schema, int64_t n, object block,
                       Py_ssize_t at_koff, Py_ssize_t at_kdata, Py_ssize_t at_kvalid,
                       Py_ssize_t r4, Py_ssize_t data, Py_ssize_t bits, Py_ssize_t r8,
                       int64_t knulls, int64_t vnulls, object topic_ends, object topic_data,
                       object partitions, object types):
    """The spark_bridge RecordBatch (no headers) of ``sections_to_arrow``'s filled ``block``
    (a ``pyarrow.Buffer``; the positions as it lays them out) and the constant columns'
    buffers (topic offsets and bytes, partition, timestampType), through the Arrow C data
    interface: ``importer(address, schema)`` is ``pyarrow.RecordBatch._import_from_c``.  The
    batch holds the five buffer objects until pyarrow releases it (~6 us less than building
    seven arrays and a batch from Python)."""
    cdef ShmqArrowArray parent
    cdef shmq_spark_export_t *e
    cdef uintptr_t b = block.address
    cdef tuple keep = (block, topic_ends, topic_data, partitions, types)
    cdef uintptr_t te = topic_ends.address, td = topic_data.address
    cdef uintptr_t pa_ = partitions.address, ty = types.address
    e = <shmq_spark_export_t *>malloc(sizeof(shmq_spark_export_t))
    if e == NULL:
        raise MemoryError()
    shmq_spark_kid(e, 0, n, knulls, 3, <const void *>(b + at_kvalid) if knulls else NULL,
                   <const void *>(b + at_koff), <const void *>(b + at_kdata))
    shmq_spark_kid(e, 1, n, vnulls, 3, <const void *>(b + at_kvalid + bits) if vnulls else NULL,
                   <const void *>(b + at_koff + r4), <const void *>(b + at_kdata + data))
    shmq_spark_kid(e, 2, n, 0, 3, NULL, <const void *>te, <const void *>td)
    shmq_spark_kid(e, 3, n, 0, 2, NULL, <const void *>pa_, NULL)
    shmq_spark_kid(e, 4, n, 0, 2, NULL, <const void *>b, NULL)
    shmq_spark_kid(e, 5, n, 0, 2, NULL, <const void *>(b + r8), NULL)
    shmq_spark_kid(e, 6, n, 0, 2, NULL, <const void *>ty, NULL)
    e.parent_bufs[0] = NULL
    Py_INCREF(keep)
    e.keep = <PyObject *>keep
    parent.length = n
    parent.null_count = 0
    parent.offset = 0
    parent.n_buffers = 1
    parent.n_children = 7
    parent.buffers = e.parent_bufs
    parent.children = e.kid_ptrs
    parent.dictionary = NULL
    parent.release = shmq_spark_release
    parent.private_data = e
    try:
        return importer(<uintptr_t>&parent, schema)
    finally:
        if parent.release != NULL:  # not moved: the import failed before it took the array
            parent.release(&parent)
