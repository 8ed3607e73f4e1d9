# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The data plane's wire codec: Produce and Fetch requests in, Produce and Fetch responses out.

The pure-Python twins (and the byte layouts, drawn there) are ``shmq.protocol.produce_request``,
``fetch_request``, ``fetch_response`` and ``request_header``; they are the oracles of
``tests/unit/test_wire_parity.py`` and ``test_wire_fetch_request.py``.  Requests come out as the
NamedTuples of ``_wire_types`` (shared with the twins).

* ``request_header_size`` finds where a Produce or Fetch body starts (header v1, or v2 with its
  tagged fields skipped).
* ``parse_fetch_request`` reads a Fetch v4..v12 body the same way as the Produce parser, through
  a plain ``Py_buffer`` (a typed memoryview costs ~0.5 us to acquire); tagged fields are skipped,
  bytes after the body ignored (as on the kio path it replaces).

* ``parse_produce_request`` walks the frame through a typed memoryview; every length and count
  is checked against the bytes left before it is used, and nothing is allocated from a count.
  Each partition's records are a memoryview slice of the frame (zero copy).  Any malformed
  request raises ``RemoteProtocolError``.
* ``encode_produce_response`` writes the framed response into one growing C buffer.
* ``ReceiveBuffer`` is the memory ``shmq.protocol.framing.FrameReceiver`` reads frames into; it
  counts its buffer exports, so the receiver knows when no frame view is left and the buffer can
  be filled again (see there).
* ``encode_fetch_response`` writes the size prefix, the header and every partition header into
  one ``bytearray`` and returns ``[view, slice, view, slice, ..., view]``: memoryviews of that
  bytearray between the file slices, which stay objects for ``os.sendfile``.  The record bytes
  never enter this process.

Only the varint and tagged-field scans run without the GIL: every other step builds or reads a
Python object.  Measured on the loaded 2-core box (timeit, best of 5): a 3-partition Produce v9
request parses in 2.2 us (twin 22 us), its response encodes in 0.6 us (4.9 us), a 3-partition
Fetch v12 response with file slices in 7.3 us (44 us).  A Fetch v12 request (header size
included) parses in 1.2-2.3 us with 1 partition, 3.3-3.9 us with 6 (kio 8-18 us; twin 10-21 us;
``perf/bench_fetch_request.py``).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.errno cimport errno
from libc.string cimport memcpy
from posix.mman cimport MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_READ, PROT_WRITE, mmap, munmap

cdef extern from *:
    """
    #include <sys/mman.h>
    #ifndef MADV_FREE
    #define MADV_FREE 8
    #endif
    """
    int MADV_FREE
    int madvise(void *addr, size_t length, int advice)

import os

from shmq._fast._errors import LocalProtocolError, RemoteProtocolError
from shmq._fast._wire_types import (
    FetchPartition,
    FetchRequest,
    FetchTopic,
    ForgottenTopic,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
)

cdef object _tuple_new = tuple.__new__

cdef enum:
    PRODUCE_MIN = 3
    PRODUCE_MAX = 12  # v12 is v11 on the wire (transaction version 2)
    PRODUCE_FIRST_FLEXIBLE = 9
    FETCH_MIN = 4
    FETCH_MAX = 12
    FETCH_FIRST_FLEXIBLE = 12
    MAX_FRAME = 0x7FFFFFFF
    # scan results below 0 (nogil helpers cannot raise)
    E_SHORT = -1
    E_VARINT = -2
    E_COUNT = -3

cdef const uint8_t EMPTY[1]


# --- big-endian loads and stores (the project's _endian.h, as in batch.pyx) ------------------

cdef extern from "_endian.h":
    int16_t _be16 "shmq_load_i16"(const uint8_t *p) noexcept nogil
    int32_t _be32 "shmq_load_i32"(const uint8_t *p) noexcept nogil
    int64_t _be64 "shmq_load_i64"(const uint8_t *p) noexcept nogil
    void _put16 "shmq_store_u16"(uint8_t *p, int16_t v) noexcept nogil
    void _put32 "shmq_store_u32"(uint8_t *p, int32_t v) noexcept nogil
    void _put64 "shmq_store_u64"(uint8_t *p, int64_t v) noexcept nogil


# --- reading ------------------------------------------------------------------------------------

cdef inline Py_ssize_t _uvarint(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                                uint64_t *out) noexcept nogil:
    """Unsigned LEB128 of at most 5 bytes; the new position, or E_SHORT / E_VARINT."""
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef uint8_t byte
    if pos < end and p[pos] < 0x80:  # every count and length below 128
        out[0] = p[pos]
        return pos + 1
    while shift <= 28:
        if pos >= end:
            return E_SHORT
        byte = p[pos]
        pos += 1
        value |= (<uint64_t>(byte & 0x7F)) << shift
        if byte < 0x80:
            out[0] = value
            return pos
        shift += 7
    return E_VARINT


cdef Py_ssize_t _skip_tags(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end) noexcept nogil:
    """Skip a tagged-field section (KIP-482: unknown tags are skipped; we read none)."""
    cdef uint64_t count, tag, size, i
    if pos < end and p[pos] == 0:
        return pos + 1
    pos = _uvarint(p, pos, end, &count)
    if pos < 0:
        return pos
    if count > <uint64_t>(end - pos):
        return E_COUNT
    for i in range(count):
        pos = _uvarint(p, pos, end, &tag)
        if pos < 0:
            return pos
        pos = _uvarint(p, pos, end, &size)
        if pos < 0:
            return pos
        if size > <uint64_t>(end - pos):
            return E_SHORT
        pos += <Py_ssize_t>size
    return pos


cdef int _scan_error(Py_ssize_t code, Py_ssize_t pos, const char *api) except -1:
    if code == E_VARINT:
        raise RemoteProtocolError(f"unsigned varint longer than 5 bytes near byte {pos}")
    if code == E_COUNT:
        raise RemoteProtocolError(f"tagged field count exceeds the bytes left after byte {pos}")
    raise RemoteProtocolError(f"{api.decode()} request is truncated")


cdef struct Cursor:
    const uint8_t *p
    Py_ssize_t pos
    Py_ssize_t end
    bint flexible
    const char *api  # "Produce" or "Fetch", for error messages


cdef inline int _need(Cursor *c, Py_ssize_t n) except -1:
    """``n`` (>= 0, up to 2**63 from a varint length) more bytes must be in the frame."""
    if n > c.end - c.pos:  # not c.pos + n: that could overflow
        _scan_error(E_SHORT, c.pos, c.api)
    return 0


cdef inline int _length(Cursor *c, int legacy_width, int64_t *out) except -1:
    """A string/bytes length or an array count; -1 means null."""
    cdef uint64_t v = 0
    cdef Py_ssize_t pos
    cdef int64_t value
    if c.flexible:
        pos = _uvarint(c.p, c.pos, c.end, &v)
        if pos < 0:
            _scan_error(pos, c.pos, c.api)
        c.pos = pos
        out[0] = <int64_t>v - 1
        return 0
    _need(c, legacy_width)
    value = _be16(c.p + c.pos) if legacy_width == 2 else _be32(c.p + c.pos)
    c.pos += legacy_width
    if value < -1:
        raise RemoteProtocolError(f"negative length {value} in {c.api.decode()} request")
    out[0] = value
    return 0


cdef inline int64_t _count(Cursor *c, int64_t min_item_size) except -1:
    cdef int64_t count
    _length(c, 4, &count)
    if count < 0:
        raise RemoteProtocolError(f"null array in {c.api.decode()} request")
    if count * min_item_size > c.end - c.pos:
        raise RemoteProtocolError(f"array count {count} exceeds the bytes left")
    return count


cdef object _string(Cursor *c, bint nullable):
    cdef int64_t n
    _length(c, 2, &n)
    if n < 0:
        if nullable:
            return None
        raise RemoteProtocolError(f"null topic name in {c.api.decode()} request")
    _need(c, <Py_ssize_t>n)
    try:
        s = PyUnicode_DecodeUTF8(<const char *>(c.p + c.pos), <Py_ssize_t>n, NULL)
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"invalid UTF-8 in {c.api.decode()} request: {exc}") from None
    c.pos += <Py_ssize_t>n
    return s


cdef inline int _skip(Cursor *c) except -1:
    cdef Py_ssize_t pos
    if c.flexible:
        pos = _skip_tags(c.p, c.pos, c.end)
        if pos < 0:
            _scan_error(pos, c.pos, c.api)
        c.pos = pos
    return 0


def request_header_size(frame, bint flexible):
    """Bytes of a request header: v1 (api key, version, correlation id, int16-length client id,
    -1 = null) plus, for flexible API versions (header v2), a tagged-field section, skipped.

    Malformed input raises ``RemoteProtocolError``.  Twin: ``protocol.request_header``.
    """
    cdef Py_buffer view
    cdef const uint8_t *p
    cdef Py_ssize_t pos
    cdef int16_t client_len
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        p = <const uint8_t *>view.buf
        if view.len < 10:
            raise RemoteProtocolError("request header is truncated")
        client_len = _be16(p + 8)
        if client_len < -1:
            raise RemoteProtocolError(f"invalid client_id length {client_len}")
        pos = 10 + (client_len if client_len > 0 else 0)
        if pos > view.len:
            raise RemoteProtocolError("request header runs past the frame")
        if flexible:
            pos = _skip_tags(p, pos, view.len)
            if pos < 0:
                if pos == E_VARINT:
                    raise RemoteProtocolError("bad unsigned varint in the request header")
                if pos == E_COUNT:
                    raise RemoteProtocolError("request header tagged field count exceeds the "
                                              "bytes left")
                raise RemoteProtocolError("request header runs past the frame")
        return pos
    finally:
        PyBuffer_Release(&view)


def parse_produce_request(frame, Py_ssize_t header_size, int version):
    """Parse the Produce body that starts at ``header_size`` in ``frame`` (v3..v12).

    Returns a ``ProduceRequest``; each partition's ``records`` is a memoryview slice of
    ``frame`` (or None for null records).
    Malformed input raises ``RemoteProtocolError``; a version outside 3..12 is the caller's bug
    (``ValueError``).
    """
    if not PRODUCE_MIN <= version <= PRODUCE_MAX:
        raise ValueError(f"Produce v{version} is not parsed here (v{PRODUCE_MIN}..v{PRODUCE_MAX})")
    mv = frame if type(frame) is memoryview else memoryview(frame)
    cdef const uint8_t[::1] buf = mv
    cdef Cursor c
    c.p = &buf[0] if buf.shape[0] else EMPTY
    c.end = buf.shape[0]
    c.flexible = version >= PRODUCE_FIRST_FLEXIBLE
    c.api = b"Produce"
    if header_size < 0 or header_size > c.end:
        raise RemoteProtocolError("Produce request header runs past the frame")
    c.pos = header_size
    cdef int64_t min_topic = 3 if c.flexible else 6  # name, partition count, [tags]
    cdef int64_t min_partition = 6 if c.flexible else 8  # index, records length, [tags]
    cdef int64_t n_topics, n_parts, i, j, length
    cdef int32_t index
    transactional_id = _string(&c, True)
    _need(&c, 6)
    acks = _be16(c.p + c.pos)
    timeout_ms = _be32(c.p + c.pos + 2)
    c.pos += 6
    topics = []
    n_topics = _count(&c, min_topic)
    for i in range(n_topics):
        name = _string(&c, False)
        partitions = []
        n_parts = _count(&c, min_partition)
        for j in range(n_parts):
            _need(&c, 4)
            index = _be32(c.p + c.pos)
            c.pos += 4
            _length(&c, 4, &length)
            if length >= 0:
                _need(&c, <Py_ssize_t>length)
                records = mv[c.pos:c.pos + length]
                c.pos += <Py_ssize_t>length
            else:
                records = None
            _skip(&c)
            partitions.append(_tuple_new(ProducePartition, (index, records)))
        _skip(&c)
        topics.append(_tuple_new(ProduceTopic, (name, partitions)))
    _skip(&c)
    if c.pos != c.end:
        raise RemoteProtocolError(
            f"{c.end - c.pos} unexpected bytes after a Produce v{version} body")
    return _tuple_new(ProduceRequest, (transactional_id, acks, timeout_ms, topics))




def parse_fetch_request(frame, Py_ssize_t header_size, int version):
    """Parse the Fetch body that starts at ``header_size`` in ``frame`` (v4..v12).

    Returns a ``FetchRequest`` of ``_wire_types`` with kio's defaults for fields the version
    lacks.  Tagged fields are skipped (v12's ``cluster_id`` too); bytes after the body are
    ignored, as Kafka's parser and ``codec.decode_request`` do.  Malformed input raises
    ``RemoteProtocolError``; a version outside 4..12 is the caller's bug (``ValueError``).
    """
    if not FETCH_MIN <= version <= FETCH_MAX:
        raise ValueError(f"Fetch v{version} is not parsed here (v{FETCH_MIN}..v{FETCH_MAX})")
    # a plain buffer, not a typed memoryview: acquiring one costs ~0.5 us of a ~2 us parse
    cdef Py_buffer view
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        return _parse_fetch(<const uint8_t *>view.buf, view.len, header_size, version)
    finally:
        PyBuffer_Release(&view)


cdef object _parse_fetch(const uint8_t *data, Py_ssize_t size, Py_ssize_t header_size,
                         int version):
    cdef Cursor c
    c.p = data if size else EMPTY
    c.end = size
    c.flexible = version >= FETCH_FIRST_FLEXIBLE
    c.api = b"Fetch"
    if header_size < 0 or header_size > c.end:
        raise RemoteProtocolError("Fetch request header runs past the frame")
    c.pos = header_size
    # fixed bytes of one partition: partition, [current_leader_epoch v9+], fetch_offset,
    # [last_fetched_epoch v12+], [log_start_offset v5+], partition_max_bytes
    cdef Py_ssize_t part_fixed = (4 + (4 if version >= 9 else 0) + 8 + (4 if version >= 12 else 0)
                                  + (8 if version >= 5 else 0) + 4)
    cdef int64_t min_topic = 3 if c.flexible else 6  # name, partition count, [tags]
    cdef int64_t min_partition = part_fixed + c.flexible  # fixed fields, [tags]
    cdef int64_t n_topics, n_parts, i, j
    cdef const uint8_t *q
    cdef int32_t replica_id, max_wait_ms, min_bytes, max_bytes
    cdef int32_t session_id = 0, session_epoch = -1
    cdef int32_t partition, current_leader_epoch, last_fetched_epoch, partition_max_bytes
    cdef int64_t fetch_offset, log_start_offset
    cdef int8_t isolation_level
    _need(&c, 17 + (8 if version >= 7 else 0))
    q = c.p + c.pos
    replica_id = _be32(q)
    max_wait_ms = _be32(q + 4)
    min_bytes = _be32(q + 8)
    max_bytes = _be32(q + 12)
    isolation_level = <int8_t>q[16]
    c.pos += 17
    if version >= 7:
        session_id = _be32(q + 17)
        session_epoch = _be32(q + 21)
        c.pos += 8
    topics = []
    n_topics = _count(&c, min_topic)
    for i in range(n_topics):
        name = _string(&c, False)
        partitions = []
        n_parts = _count(&c, min_partition)
        for j in range(n_parts):
            _need(&c, part_fixed)
            q = c.p + c.pos
            partition = _be32(q)
            q += 4
            current_leader_epoch = -1
            if version >= 9:
                current_leader_epoch = _be32(q)
                q += 4
            fetch_offset = _be64(q)
            q += 8
            last_fetched_epoch = -1
            if version >= 12:
                last_fetched_epoch = _be32(q)
                q += 4
            log_start_offset = -1
            if version >= 5:
                log_start_offset = _be64(q)
                q += 8
            partition_max_bytes = _be32(q)
            c.pos += part_fixed
            _skip(&c)
            partitions.append(_tuple_new(FetchPartition, (
                partition, current_leader_epoch, fetch_offset, last_fetched_epoch,
                log_start_offset, partition_max_bytes)))
        _skip(&c)
        topics.append(_tuple_new(FetchTopic, (name, partitions)))
    forgotten = []
    if version >= 7:
        n_topics = _count(&c, min_topic)
        for i in range(n_topics):
            name = _string(&c, False)
            indexes = []
            n_parts = _count(&c, 4)
            for j in range(n_parts):
                indexes.append(_be32(c.p + c.pos))  # _count checked the 4 * n bytes
                c.pos += 4
            _skip(&c)
            forgotten.append(_tuple_new(ForgottenTopic, (name, indexes)))
    rack_id = _string(&c, False) if version >= 11 else ""
    _skip(&c)
    return _tuple_new(FetchRequest, (replica_id, max_wait_ms, min_bytes, max_bytes,
                                     isolation_level, session_id, session_epoch, topics,
                                     forgotten, rack_id))


# --- writing ------------------------------------------------------------------------------------

cdef struct Out:
    uint8_t *data
    Py_ssize_t length
    Py_ssize_t capacity


cdef inline uint8_t *_reserve(Out *o, Py_ssize_t n) except NULL:
    """Room for ``n`` more bytes at ``o.data + o.length`` (the caller advances ``length``)."""
    cdef Py_ssize_t want = o.length + n
    cdef Py_ssize_t cap
    cdef uint8_t *grown
    if want > o.capacity:
        cap = o.capacity * 2 if o.capacity else 256
        while cap < want:
            cap *= 2
        grown = <uint8_t *>realloc(o.data, cap)
        if grown == NULL:
            raise MemoryError()
        o.data = grown
        o.capacity = cap
    return o.data + o.length


cdef inline int _w8(Out *o, uint8_t v) except -1:
    _reserve(o, 1)[0] = v
    o.length += 1
    return 0


cdef inline int _w16(Out *o, int16_t v) except -1:
    _put16(_reserve(o, 2), v)
    o.length += 2
    return 0


cdef inline int _w32(Out *o, int32_t v) except -1:
    _put32(_reserve(o, 4), v)
    o.length += 4
    return 0


cdef inline int _w64(Out *o, int64_t v) except -1:
    _put64(_reserve(o, 8), v)
    o.length += 8
    return 0


cdef inline int _wuvarint(Out *o, uint64_t v) except -1:
    cdef uint8_t *p = _reserve(o, 10)
    cdef Py_ssize_t n = 0
    while v >= 0x80:
        p[n] = <uint8_t>((v & 0x7F) | 0x80)
        v >>= 7
        n += 1
    p[n] = <uint8_t>v
    o.length += n + 1
    return 0


cdef inline int _wbytes(Out *o, const uint8_t *src, Py_ssize_t n) except -1:
    if n:
        memcpy(_reserve(o, n), src, n)
        o.length += n
    return 0


cdef inline int _wcount(Out *o, Py_ssize_t n, bint flexible) except -1:
    """An array count or a bytes/records length (int32, or uvarint(n + 1) when flexible)."""
    if flexible:
        return _wuvarint(o, <uint64_t>n + 1)
    if n > 0x7FFFFFFF:
        raise OverflowError(f"length {n} does not fit an int32")
    return _w32(o, <int32_t>n)


cdef inline int _wnull(Out *o, bint flexible) except -1:
    return _w8(o, 0) if flexible else _w32(o, -1)


cdef int _wstring(Out *o, s, bint flexible) except -1:
    cdef bytes data
    cdef Py_ssize_t n
    if s is None:
        if flexible:
            return _w8(o, 0)
        return _w16(o, -1)
    data = (<str?>s).encode("utf-8")
    n = len(data)
    if flexible:
        _wuvarint(o, <uint64_t>n + 1)
    else:
        if n > 0x7FFF:
            raise OverflowError(f"string of {n} bytes does not fit an int16 length")
        _w16(o, <int16_t>n)
    return _wbytes(o, <const uint8_t *><const char *>data, n)


def encode_produce_response(int version, correlation_id, throttle_ms, results):
    """The framed Produce response (size prefix, header, body) for v3..v12, as ``bytes``.

    ``results`` holds ``(topic, [(partition, error_code, base_offset, log_append_time,
    log_start_offset, error_message[, record_errors]), ...])`` as in the twin.
    """
    if not PRODUCE_MIN <= version <= PRODUCE_MAX:
        raise LocalProtocolError(f"cannot encode a Produce v{version} response")
    cdef bint flexible = version >= PRODUCE_FIRST_FLEXIBLE
    cdef Out o
    o.data = NULL
    o.length = 0
    o.capacity = 0
    try:
        try:
            _reserve(&o, 8)
            o.length = 8
            if flexible:
                _w8(&o, 0)  # response header v1
            _wcount(&o, len(results), flexible)
            for topic, partitions in results:
                _wstring(&o, topic, flexible)
                _wcount(&o, len(partitions), flexible)
                for p in partitions:
                    _w32(&o, p[0])
                    _w16(&o, p[1])
                    _w64(&o, p[2])
                    _w64(&o, p[3])
                    if version >= 5:
                        _w64(&o, p[4])
                    if version >= 8:
                        record_errors = p[6] if len(p) > 6 else ()
                        _wcount(&o, len(record_errors), flexible)
                        for batch_index, message in record_errors:
                            _w32(&o, batch_index)
                            _wstring(&o, message, flexible)
                            if flexible:
                                _w8(&o, 0)
                        _wstring(&o, p[5], flexible)
                    if flexible:
                        _w8(&o, 0)
                if flexible:
                    _w8(&o, 0)
            _w32(&o, throttle_ms)
            if flexible:
                _w8(&o, 0)
            _put32(o.data, <int32_t>(o.length - 4))
            _put32(o.data + 4, correlation_id)
        except (OverflowError, TypeError) as exc:
            raise LocalProtocolError(
                f"cannot encode Produce v{version} response: {exc}") from exc
        return PyBytes_FromStringAndSize(<const char *>o.data, o.length)
    finally:
        free(o.data)


cdef bint _is_bytes_like(obj):
    return isinstance(obj, (bytes, bytearray, memoryview))


def encode_fetch_response(int version, correlation_id, topics, throttle_ms=0, error_code=0,
                          session_id=0):
    """The framed Fetch response (v4..v12) as ``[view, slice, view, ..., view]``.

    ``topics`` holds ``(topic, [partition, ...])`` with each partition a sequence shaped like
    ``FetchPartitionData``: ``(partition_index, error_code, high_watermark, last_stable_offset,
    log_start_offset, aborted_transactions | None, preferred_read_replica, records | None
    [, diverging_epoch (epoch, end offset) | None])``; ``records`` holds file slices (objects
    with ``length``) and/or bytes-like pieces.  The views
    are consecutive memoryviews of one bytearray holding every byte that is not a slice.
    """
    if not FETCH_MIN <= version <= FETCH_MAX:
        raise LocalProtocolError(f"cannot encode a Fetch v{version} response")
    cdef bint flexible = version >= FETCH_FIRST_FLEXIBLE
    cdef Out o
    cdef int64_t total = 0  # slice bytes
    cdef int64_t length
    cdef Py_ssize_t i, start
    cdef const uint8_t[::1] piece_bytes
    cuts = []  # (offset in the buffer, slice): the slice goes out right after that offset
    o.data = NULL
    o.length = 0
    o.capacity = 0
    try:
        try:
            _reserve(&o, 8)
            o.length = 8
            if flexible:
                _w8(&o, 0)  # response header v1
            _w32(&o, throttle_ms)
            if version >= 7:
                _w16(&o, error_code)
                _w32(&o, session_id)
            _wcount(&o, len(topics), flexible)
            for topic, partitions in topics:
                _wstring(&o, topic, flexible)
                _wcount(&o, len(partitions), flexible)
                for p in partitions:
                    _w32(&o, p[0])  # partition_index
                    _w16(&o, p[1])  # error_code
                    _w64(&o, p[2])  # high_watermark
                    _w64(&o, p[3])  # last_stable_offset
                    if version >= 5:
                        _w64(&o, p[4])  # log_start_offset
                    aborted = p[5]
                    if aborted is None:
                        _wnull(&o, flexible)
                    else:
                        _wcount(&o, len(aborted), flexible)
                        for producer_id, first_offset in aborted:
                            _w64(&o, producer_id)
                            _w64(&o, first_offset)
                            if flexible:
                                _w8(&o, 0)
                    if version >= 11:
                        _w32(&o, p[6])  # preferred_read_replica
                    records = p[7]
                    if records is None:
                        _wnull(&o, flexible)
                    else:
                        length = 0
                        for piece in records:
                            length += len(piece) if _is_bytes_like(piece) else piece.length
                        _wcount(&o, length, flexible)
                        for piece in records:
                            if _is_bytes_like(piece):
                                piece_bytes = memoryview(piece).cast("B")
                                if piece_bytes.shape[0]:
                                    _wbytes(&o, &piece_bytes[0], piece_bytes.shape[0])
                            else:
                                length = piece.length
                                if length:
                                    total += length
                                    cuts.append((o.length, piece))
                    diverging = p[8] if len(p) > 8 else None
                    if flexible and diverging is not None:
                        _w8(&o, 1)   # one tagged field: diverging_epoch (tag 0), 13 bytes
                        _w8(&o, 0)
                        _w8(&o, 13)
                        _w32(&o, diverging[0])
                        _w64(&o, diverging[1])
                        _w8(&o, 0)
                    elif flexible:
                        _w8(&o, 0)
                if flexible:
                    _w8(&o, 0)
            if flexible:
                _w8(&o, 0)
        except (OverflowError, TypeError) as exc:
            raise LocalProtocolError(f"cannot encode Fetch v{version} response: {exc}") from exc
        total += o.length
        if total - 4 > MAX_FRAME:
            raise LocalProtocolError(f"Fetch response of {total} bytes is too large to frame")
        _put32(o.data, <int32_t>(total - 4))
        try:
            _put32(o.data + 4, correlation_id)
        except (OverflowError, TypeError) as exc:
            raise LocalProtocolError(f"cannot encode Fetch v{version} response: {exc}") from exc
        head = PyByteArray_FromStringAndSize(<const char *>o.data, o.length)
    finally:
        free(o.data)
    view = memoryview(head)
    if not cuts:
        return [view]
    pieces = []
    start = 0
    for offset, piece in cuts:
        pieces.append(view[start:offset])
        pieces.append(piece)
        start = offset
    pieces.append(view[start:])
    return pieces


# --- receive buffers ----------------------------------------------------------------------------

# Mappings of dead receive buffers kept for the next ones (see ``ReceiveBuffer``): at most
# ``POOL_MAX`` per process, each of at most ``POOL_BYTES`` (the receiver's usual 1 MiB buffer;
# a larger one was made for one large frame and is unmapped).  Touched only with the GIL held.
DEF _POOL_SLOTS = 8
POOL_MAX = _POOL_SLOTS
DEF _POOL_BYTES = 1 << 20
POOL_BYTES = _POOL_BYTES
cdef void *_pool_addr[_POOL_SLOTS]
cdef Py_ssize_t _pool_size[_POOL_SLOTS]
cdef int _pooled = 0


def pooled_buffers():
    """How many dead receive buffers' mappings wait in this process's pool (for tests)."""
    return _pooled


cdef class ReceiveBuffer:
    """``size`` bytes of anonymous private memory (pages cost memory once written) that counts
    the buffer views taken of it: ``exports`` is the number of live ``memoryview(buffer)`` calls
    (each shared by every slice cut from it).

    A dead buffer's mapping (at most ``POOL_BYTES``) goes to a pool of ``POOL_MAX`` per process
    and the next buffer of its size takes it, pages and all, marked ``MADV_FREE`` meanwhile (the
    kernel may take them back under memory pressure; until it does, writing them again costs no
    fault).  Without it every buffer was a fresh mapping: a worker that gets pipelined Produce
    requests renews its buffer while earlier frames still hold the old one, and a producer's new
    connection starts with a new one, so nearly every received byte landed on a page touched
    for the first time (a fault, a zeroed page, a memcg charge: 410 us a MiB against 46 us to
    reuse a ``MADV_FREE``d one) and was unmapped after: 9 % of the workers' CPU in a suite
    produce cell (confluent-kafka 100 B x4, 64 partitions; perf, page faults under ``recvfrom``
    and ``munmap``)."""
    cdef char *addr
    cdef readonly Py_ssize_t size
    cdef readonly Py_ssize_t exports
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, Py_ssize_t size):
        global _pooled
        cdef void *p
        cdef int i
        if size <= 0:
            raise ValueError("a receive buffer needs at least one byte")
        for i in range(_pooled - 1, -1, -1):
            if _pool_size[i] == size:
                self.addr = <char *>_pool_addr[i]
                self.size = size
                _pooled -= 1
                _pool_addr[i] = _pool_addr[_pooled]
                _pool_size[i] = _pool_size[_pooled]
                return
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno))
        self.addr = <char *>p
        self.size = size

    def __dealloc__(self):
        global _pooled
        if self.addr == NULL:
            return
        if (self.size <= _POOL_BYTES and _pooled < _POOL_SLOTS
                and madvise(self.addr, self.size, MADV_FREE) == 0):
            _pool_addr[_pooled] = self.addr
            _pool_size[_pooled] = self.size
            _pooled += 1
        else:
            munmap(self.addr, self.size)
        self.addr = NULL

    def __len__(self):
        return self.size

    def __getbuffer__(self, Py_buffer *view, int flags):
        self.shape[0] = self.size
        self.strides[0] = 1
        view.buf = self.addr
        view.obj = self
        view.len = self.size
        view.readonly = 0
        view.itemsize = 1
        view.format = "B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self.exports -= 1
