# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Ring primitives for the shared-memory produce path (layout in ``shmq/ipc/ring.py``).

* Atomic loads and stores of the ring counters (acquire / release) and the sequentially
  consistent exchange of the "sleeping" flags, so a published entry is never seen half written
  and a wake-up hint is never lost (``_atomics.h``).
* ``encode_batch_into``: a RecordBatch v2 (header, records, CRC-32C) written straight into the
  ring's memory, with no intermediate bytes object; the client's per-record cost.
  ``encode_values_into`` writes one whose size an earlier size pass gave (no second one).

The pure-Python twin, ``_ring_reference``, has the same names and writes the same bytes (it
builds the batch with ``encode_records`` + ``build_batch`` and copies it); it is the oracle in
the parity tests.
"""

from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE

from shmq._fast.crc32c cimport crc32c_c, shmq_crc32c_init

cdef extern from "_endian.h":
    void shmq_store_u16(unsigned char *p, uint16_t v) nogil
    void shmq_store_u32(unsigned char *p, uint32_t v) nogil
    void shmq_store_u64(unsigned char *p, uint64_t v) nogil

cdef extern from "_batch_header.h":
    void shmq_write_batch_header(unsigned char *start, size_t size, uint16_t attributes,
                                 int32_t n, int64_t base_ts, int64_t max_ts, int64_t producer_id,
                                 int16_t producer_epoch, int32_t base_sequence) noexcept nogil

from shmq._fast.atomics cimport (shmq_exchange_u32, shmq_full_fence, shmq_load_acquire_u32,
                                  shmq_load_acquire_u64, shmq_store_release_u64)

shmq_crc32c_init()

cdef enum:
    HEADER = 61


cdef inline int _check(Py_ssize_t size, Py_ssize_t off, int width) except -1:
    if off < 0 or off > size - width or off % width:
        raise IndexError(f"{width}-byte word at {off} is outside or misaligned in {size} bytes")
    return 0


def load_u64(const unsigned char[::1] buf not None, Py_ssize_t off):
    """Acquire load of the native u64 at ``off``."""
    _check(buf.shape[0], off, 8)
    return shmq_load_acquire_u64(&buf[off])


def store_u64(unsigned char[::1] buf not None, Py_ssize_t off, uint64_t value):
    """Release store of the native u64 at ``off``: everything written before is visible first."""
    _check(buf.shape[0], off, 8)
    shmq_store_release_u64(&buf[off], value)


def load_u32(const unsigned char[::1] buf not None, Py_ssize_t off):
    """Acquire load of the native u32 at ``off``."""
    _check(buf.shape[0], off, 4)
    return shmq_load_acquire_u32(&buf[off])


def exchange_u32(unsigned char[::1] buf not None, Py_ssize_t off, uint32_t value):
    """Sequentially consistent exchange of the native u32 at ``off``; returns the old value."""
    _check(buf.shape[0], off, 4)
    return shmq_exchange_u32(&buf[off], value)


def full_fence():
    """A sequentially consistent fence (store-load order)."""
    shmq_full_fence()


def publish_u64(unsigned char[::1] buf not None, Py_ssize_t off, uint64_t value,
                Py_ssize_t flag):
    """A ring's publication in one call: release store of the u64 ``value`` at ``off``, a
    full fence, then the u32 wake-up flag at ``flag`` taken (exchanged with 0) if it was set.
    Returns whether it was set (the peer sleeps: write its eventfd).  What ``Ring.commit`` /
    ``release`` did in four calls (store, fence, load, exchange)."""
    _check(buf.shape[0], off, 8)
    _check(buf.shape[0], flag, 4)
    shmq_store_release_u64(&buf[off], value)
    shmq_full_fence()
    if shmq_load_acquire_u32(&buf[flag]):
        return shmq_exchange_u32(&buf[flag], 0) != 0
    return False


# --- varints (zigzag, Kafka ByteUtils) -------------------------------------------------------

cdef extern from "_varint.h":
    int _varint_size "shmq_varint_size" (int64_t v) noexcept nogil
    Py_ssize_t _write_varint "shmq_write_varint" (unsigned char *p, int64_t v) noexcept nogil


cdef class _Held:
    """Buffers of the general (tuple) records, held between the size pass and the write pass."""
    cdef list objs

    def __cinit__(self):
        self.objs = []


cdef inline object _as_bytes(object obj):
    """None, bytes, or a bytes copy of another bytes-like / str (the general, slower path)."""
    if obj is None or PyBytes_CheckExact(obj):
        return obj
    if isinstance(obj, str):
        return (<str>obj).encode("utf-8")
    return bytes(obj)


cdef inline Py_ssize_t _field_size(object b) except -1:
    if b is None:
        return 1
    return _varint_size(PyBytes_GET_SIZE(b)) + PyBytes_GET_SIZE(b)


cdef inline Py_ssize_t _write_field(unsigned char *w, object b) except -1:
    cdef Py_ssize_t n
    if b is None:
        w[0] = 1  # zigzag(-1)
        return 1
    n = PyBytes_GET_SIZE(b)
    cdef Py_ssize_t k = _write_varint(w, n)
    memcpy(w + k, PyBytes_AS_STRING(b), n)
    return k + n


cdef inline Py_ssize_t _value_record_body(Py_ssize_t i, Py_ssize_t vlen) noexcept nogil:
    """The body length of record ``i`` of a values-only batch: attributes, timestamp delta 0,
    offset delta ``i``, null key, the value, no headers."""
    return 3 + _varint_size(i) + _varint_size(vlen) + vlen + 1


cdef inline unsigned char *_write_value_record(unsigned char *w, Py_ssize_t i, const char *value,
                                               Py_ssize_t vlen, Py_ssize_t body) noexcept nogil:
    """Writes record ``i`` of a values-only batch (``body``: ``_value_record_body``) at ``w``;
    returns the position after it."""
    w += _write_varint(w, body)
    w[0] = 0      # attributes
    w[1] = 0      # timestamp delta 0
    w += 2
    w += _write_varint(w, i)
    w[0] = 1      # key -1 (null)
    w += 1
    w += _write_varint(w, vlen)
    memcpy(w, value, vlen)
    w += vlen
    w[0] = 0      # no headers
    return w + 1


def encode_batch_into(unsigned char[::1] out not None, Py_ssize_t pos, Py_ssize_t limit,
                      list records not None, int64_t timestamp, int64_t producer_id=-1,
                      int16_t producer_epoch=-1, int32_t base_sequence=-1,
                      int16_t attributes=0):
    """Write ``records`` as one uncompressed RecordBatch v2 at ``out[pos:pos + limit]``.

    A record is ``bytes`` (a value without key) or a tuple ``(key, value[, timestamp[,
    headers]])``: keys and values bytes-like, str or None, a timestamp None for ``timestamp``,
    headers a sequence of ``(str, bytes | None)``.  Base offset 0 and partition leader epoch -1
    (the broker stamps both); base timestamp is the first record's, max timestamp the largest.
    Returns the batch size, or ``-size`` (nothing written) when it does not fit in ``limit``.
    """
    cdef Py_ssize_t n = len(records), i, size, body, w_at
    cdef int64_t ts, base_ts = timestamp, max_ts, delta
    cdef object rec, key, value, headers, hk, hv
    cdef list general = None   # per general record: (key, value, ts, [(hk, hv), ...])
    cdef unsigned char *w
    cdef unsigned char *start
    cdef Py_ssize_t nh, j, vlen
    if n == 0:
        raise ValueError("a record batch holds at least one record")
    if n > 0x7fffffff:
        raise ValueError("too many records for one batch")
    if pos < 0 or limit < 0 or pos > out.shape[0] - limit:
        raise IndexError("encode window is outside the buffer")
    # pass 1: sizes (and the general records normalised)
    rec = records[0]
    if not PyBytes_CheckExact(rec):
        general = []
    size = HEADER
    max_ts = timestamp
    for i in range(n):
        rec = records[i]
        if general is None and PyBytes_CheckExact(rec):
            # fast path: value only, the batch timestamp (delta 0)
            body = _value_record_body(i, PyBytes_GET_SIZE(rec))
            size += _varint_size(body) + body
            continue
        if general is None:  # a general record after fast ones: start over, all general
            return encode_batch_into(out, pos, limit, [(None, r) if PyBytes_CheckExact(r) else r
                                                       for r in records],
                                     timestamp, producer_id, producer_epoch, base_sequence,
                                     attributes)
        if PyBytes_CheckExact(rec):
            key, value, ts, headers = None, rec, timestamp, None
        else:
            t = tuple(rec)
            if not 2 <= len(t) <= 4:
                raise ValueError("a record is bytes or (key, value[, timestamp[, headers]])")
            key = t[0]
            value = t[1]
            ts = timestamp if len(t) < 3 or t[2] is None else <int64_t>t[2]
            headers = t[3] if len(t) > 3 else None
        key = _as_bytes(key)
        value = _as_bytes(value)
        hlist = []
        if headers:
            for h in headers:
                hk = _as_bytes(h[0])
                if hk is None:
                    raise ValueError("header keys may not be None")
                hlist.append((hk, _as_bytes(h[1])))
        if i == 0:
            base_ts = ts
            max_ts = ts
        elif ts > max_ts:
            max_ts = ts
        general.append((key, value, ts, hlist))
        body = 1 + _varint_size(ts - base_ts) + _varint_size(i) + _field_size(key) + _field_size(value)
        nh = len(hlist)
        body += _varint_size(nh)
        for j in range(nh):
            body += _field_size(hlist[j][0]) + _field_size(hlist[j][1])
        size += _varint_size(body) + body
    if size - 12 > 0x7fffffff:
        raise ValueError("record batch larger than 2 GiB")
    if size > limit:
        return -size
    start = &out[pos]
    w = start + HEADER
    if general is None:
        for i in range(n):
            rec = records[i]
            vlen = PyBytes_GET_SIZE(rec)
            w = _write_value_record(w, i, PyBytes_AS_STRING(rec), vlen,
                                    _value_record_body(i, vlen))
    else:
        for i in range(n):
            key, value, ts, hlist = general[i]
            nh = len(hlist)
            body = 1 + _varint_size(ts - base_ts) + _varint_size(i) + _field_size(key) + _field_size(value)
            body += _varint_size(nh)
            for j in range(nh):
                body += _field_size(hlist[j][0]) + _field_size(hlist[j][1])
            w += _write_varint(w, body)
            w[0] = 0
            w += 1
            w += _write_varint(w, ts - base_ts)
            w += _write_varint(w, i)
            w += _write_field(w, key)
            w += _write_field(w, value)
            w += _write_varint(w, nh)
            for j in range(nh):
                w += _write_field(w, hlist[j][0])
                w += _write_field(w, hlist[j][1])
    if w - start != size:
        raise AssertionError("record batch size mismatch")
    shmq_write_batch_header(start, size, <uint16_t>attributes, n, base_ts, max_ts, producer_id,
                            producer_epoch, base_sequence)
    with nogil:
        shmq_store_u32(start + 17, crc32c_c(start + 21, size - 21))
    return size


def encode_values_into(unsigned char[::1] out not None, Py_ssize_t pos, Py_ssize_t size,
                       list records not None, int64_t timestamp, int64_t producer_id=-1,
                       int16_t producer_epoch=-1, int32_t base_sequence=-1):
    """``encode_batch_into`` of a batch whose size is known: ``size`` is what its size pass
    returned (``-encode_batch_into(b"", 0, 0, records, ...)``), and the batch is written at
    ``out[pos:pos + size]`` with no size pass of its own (the caller reserves ring room between
    the two calls: encoded elsewhere and copied, the batch cost a copy).  Values (``bytes``)
    are written in one loop; any other record form goes through ``encode_batch_into``.
    Returns ``size``; raises ValueError when the records do not make a batch of exactly
    ``size`` bytes (the window may then hold part of one)."""
    cdef Py_ssize_t n = len(records), i, vlen, body, need, got
    cdef object rec
    cdef unsigned char *start
    cdef unsigned char *w
    cdef unsigned char *end
    if n == 0:
        raise ValueError("a record batch holds at least one record")
    if size < HEADER or pos < 0 or pos > out.shape[0] - size:
        raise IndexError("encode window is outside the buffer")
    start = &out[pos]
    end = start + size
    w = start + HEADER
    for i in range(n):
        rec = records[i]
        if not PyBytes_CheckExact(rec):  # not the values-only form
            got = encode_batch_into(out, pos, size, records, timestamp, producer_id,
                                    producer_epoch, base_sequence)
            if got != size:
                raise ValueError(f"the records make a batch of {abs(got)} bytes, not {size}")
            return size
        vlen = PyBytes_GET_SIZE(rec)
        body = _value_record_body(i, vlen)
        need = _varint_size(body) + body
        if end - w < need:
            raise ValueError(f"the records make a batch of more than {size} bytes")
        w = _write_value_record(w, i, PyBytes_AS_STRING(rec), vlen, body)
    if w != end:
        raise ValueError(f"the records make a batch of {w - start} bytes, not {size}")
    shmq_write_batch_header(start, size, 0, n, timestamp, timestamp, producer_id,
                            producer_epoch, base_sequence)
    with nogil:
        shmq_store_u32(start + 17, crc32c_c(start + 21, size - 21))
    return size


def encode_columns_into(unsigned char[::1] out not None, Py_ssize_t pos, Py_ssize_t limit,
                        list keys not None, list values not None, list stamps not None,
                        int64_t producer_id=-1, int16_t producer_epoch=-1,
                        int32_t base_sequence=-1):
    """``encode_batch_into`` for a producer's open batch kept as parallel lists: record ``i`` is
    ``(keys[i], values[i], stamps[i])``, keys and values ``bytes`` or None, stamps ints, no
    headers.  No object per record (the tuples of ``encode_batch_into``'s general form cost as
    much as the encoding).  Returns the batch size, or ``-size`` when it does not fit."""
    cdef Py_ssize_t n = len(values), i, size, body
    cdef int64_t ts, base_ts, max_ts
    cdef object key, value
    cdef unsigned char *w
    cdef unsigned char *start
    if n == 0:
        raise ValueError("a record batch holds at least one record")
    if len(keys) != n or len(stamps) != n:
        raise ValueError("keys, values and stamps differ in length")
    if n > 0x7fffffff:
        raise ValueError("too many records for one batch")
    if pos < 0 or limit < 0 or pos > out.shape[0] - limit:
        raise IndexError("encode window is outside the buffer")
    base_ts = stamps[0]
    max_ts = base_ts
    size = HEADER
    for i in range(n):
        key = keys[i]
        value = values[i]
        if (key is not None and not PyBytes_CheckExact(key)) or (
                value is not None and not PyBytes_CheckExact(value)):
            raise TypeError("keys and values must be bytes or None")
        ts = stamps[i]
        if ts > max_ts:
            max_ts = ts
        body = (1 + _varint_size(ts - base_ts) + _varint_size(i)
                + (1 if key is None else _varint_size(PyBytes_GET_SIZE(key)) + PyBytes_GET_SIZE(key))
                + (1 if value is None else _varint_size(PyBytes_GET_SIZE(value))
                   + PyBytes_GET_SIZE(value))
                + 1)
        size += _varint_size(body) + body
    if size - 12 > 0x7fffffff:
        raise ValueError("record batch larger than 2 GiB")
    if size > limit:
        return -size
    start = &out[pos]
    w = start + HEADER
    for i in range(n):
        key = keys[i]
        value = values[i]
        ts = stamps[i]
        body = (1 + _varint_size(ts - base_ts) + _varint_size(i)
                + (1 if key is None else _varint_size(PyBytes_GET_SIZE(key)) + PyBytes_GET_SIZE(key))
                + (1 if value is None else _varint_size(PyBytes_GET_SIZE(value))
                   + PyBytes_GET_SIZE(value))
                + 1)
        w += _write_varint(w, body)
        w[0] = 0      # attributes
        w += 1
        w += _write_varint(w, ts - base_ts)
        w += _write_varint(w, i)
        w += _write_field(w, key)
        w += _write_field(w, value)
        w[0] = 0      # no headers
        w += 1
    if w - start != size:
        raise AssertionError("record batch size mismatch")
    shmq_write_batch_header(start, size, 0, n, base_ts, max_ts, producer_id,
                            producer_epoch, base_sequence)
    with nogil:
        shmq_store_u32(start + 17, crc32c_c(start + 21, size - 21))
    return size
