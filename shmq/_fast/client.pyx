# cython: language_level=3, boundscheck=False, wraparound=False
"""The client's per-record hash (twin: ``_client_reference``): Kafka's murmur2 partitioner."""

from libc.stdint cimport int32_t, uint32_t


cdef extern from "_murmur2.h":  # the one murmur2 kernel, shared with batch.pyx
    uint32_t _murmur2 "shmq_murmur2" (const unsigned char *data, Py_ssize_t length) noexcept nogil


def murmur2(const unsigned char[::1] data not None):
    """Kafka's murmur2 of ``data`` as a signed 32-bit int (Java ``Utils.murmur2``)."""
    return <int32_t>_murmur2(&data[0] if data.shape[0] else NULL, data.shape[0])


def murmur2_partition(const unsigned char[::1] key not None, Py_ssize_t partition_count):
    """``toPositive(murmur2(key)) % partition_count``: the partition of Java's client."""
    if partition_count <= 0:
        raise ValueError("partition_count must be positive")
    cdef uint32_t h = _murmur2(&key[0] if key.shape[0] else NULL, key.shape[0])
    return <Py_ssize_t>(h & 0x7FFFFFFF) % partition_count


# --- the producer's per-record path -----------------------------------------------------------

from libc.stdint cimport int16_t, int64_t, uint16_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport PyObject
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_acquire_lock, PyThread_release_lock,
                               PyThread_get_thread_ident, WAIT_LOCK, NOWAIT_LOCK)
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME

from shmq._fast.crc32c cimport crc32c_c, shmq_crc32c_init

cdef extern from "_endian.h":
    void shmq_store_u32(unsigned char *p, uint32_t v) nogil

cdef extern from "_batch_header.h":
    void shmq_write_batch_header(unsigned char *start, size_t size, uint16_t attributes,
                                 int32_t n, int64_t base_ts, int64_t max_ts, int64_t producer_id,
                                 int16_t producer_epoch, int32_t base_sequence) noexcept nogil

shmq_crc32c_init()

cdef extern from *:
    """
    /* produce_batch's lists: a value's length (-1 None, -2 neither None nor exactly bytes)
       and its bytes, from a borrowed list item, with no reference taken */
    static inline Py_ssize_t shmq_value_len(PyObject *v) {
        if (v == Py_None) return -1;
        if (!PyBytes_CheckExact(v)) return -2;
        return PyBytes_GET_SIZE(v);
    }
    static inline const char *shmq_bytes_data(PyObject *v) { return PyBytes_AS_STRING(v); }
    #define shmq_list_item(l, i) PyList_GET_ITEM((l), (i))
    /* a bytes object of ~100 B spans three cache lines from its header */
    static inline void shmq_prefetch_header(PyObject *v) { __builtin_prefetch(v); }
    static inline void shmq_prefetch_bytes(PyObject *v) {
        __builtin_prefetch(v);
        __builtin_prefetch((const char *)v + 64);
        __builtin_prefetch((const char *)v + 128);
    }
    """

    Py_ssize_t shmq_value_len(PyObject *v) noexcept
    const char *shmq_bytes_data(PyObject *v) noexcept
    PyObject *PyList_GET_ITEM_PTR "shmq_list_item" (list l, Py_ssize_t i) noexcept
    void shmq_prefetch_header(PyObject *v) noexcept
    void shmq_prefetch_bytes(PyObject *v) noexcept

cdef Py_ssize_t RECORD_MAX_OVERHEAD = 61 + 5 + 1 + 10 + 5 + 5 + 5 + 5
cdef enum:
    HEADER = 61              # RecordBatch v2's fixed part: room kept at the front of a batch
    FIRST_CAPACITY = 4096
    PREFETCH_AHEAD = 8       # list rows: how far ahead extend and bytes_stats prefetch


cdef class RLock:
    """A reentrant lock (``threading.RLock``'s behaviour) that ``produce`` takes and releases in
    C: the open batches are shared with the linger thread.  ``with lock:`` works from Python."""

    cdef PyThread_type_lock _lock
    cdef long _owner
    cdef long _count

    def __cinit__(self):
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError()
        self._owner = 0
        self._count = 0

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    cdef inline int take(self) except -1:
        cdef long me = <long>PyThread_get_thread_ident()
        cdef int got
        if self._count and self._owner == me:
            self._count += 1
            return 0
        if not PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            with nogil:
                got = PyThread_acquire_lock(self._lock, WAIT_LOCK)
        self._owner = me
        self._count = 1
        return 0

    cdef inline int give(self) except -1:
        if not self._count or self._owner != <long>PyThread_get_thread_ident():
            raise RuntimeError("cannot release un-acquired lock")
        self._count -= 1
        if not self._count:
            self._owner = 0
            PyThread_release_lock(self._lock)
        return 0

    def acquire(self):
        self.take()
        return True

    def release(self):
        self.give()

    def __enter__(self):
        self.take()
        return True

    def __exit__(self, *exc):
        self.give()
        return False


cdef extern from "_varint.h":
    int _varint_size "shmq_varint_size" (int64_t v) noexcept nogil
    Py_ssize_t _write_varint "shmq_write_varint" (unsigned char *p, int64_t v) noexcept nogil


cdef inline Py_ssize_t _field_len(object b) noexcept:
    return -1 if b is None else PyBytes_GET_SIZE(b)


cdef inline Py_ssize_t _field_size(Py_ssize_t n) noexcept nogil:
    return _varint_size(n) + (n if n > 0 else 0)


cdef inline unsigned char *_put_field(unsigned char *w, object b, Py_ssize_t n) noexcept:
    w += _write_varint(w, n)
    if n > 0:
        memcpy(w, PyBytes_AS_STRING(b), n)
        w += n
    return w


cdef object _header_bytes(object s):
    if s is None or PyBytes_CheckExact(s):
        return s
    if isinstance(s, str):
        return (<str>s).encode("utf-8")
    return bytes(s)


cdef class Batch:
    """A partition's open batch, its records encoded as they come (RecordBatch v2 records after
    61 bytes of room for the header, which ``write`` fills in when the batch goes, with the
    producer id and sequence of that moment): no object per record, one copy into the ring.

    Keys, values, timestamps and headers are kept as well (parallel lists) only once a record
    has a delivery callback: its report needs them."""

    cdef public object data          # bytearray: header room, then the encoded records
    cdef public Py_ssize_t used      # bytes of data in use (the batch's size)
    cdef public Py_ssize_t n         # records
    cdef public Py_ssize_t nbytes    # the records' queued-bytes estimate (librdkafka's)
    cdef public int64_t base_ts, max_ts
    cdef public double opened
    cdef public object cbs, keys, values, stamps, headers

    def __init__(self, double opened, spare=None):
        self.data = spare if spare is not None else bytearray(FIRST_CAPACITY)
        self.used = HEADER
        self.n = 0
        self.nbytes = 0
        self.base_ts = self.max_ts = 0
        self.opened = opened
        self.cbs = self.keys = self.values = self.stamps = self.headers = None

    cpdef Py_ssize_t count(self):
        return self.n

    cpdef Py_ssize_t size(self):
        """The batch's size on the wire (header included)."""
        return self.used

    cdef unsigned char *_room(self, Py_ssize_t need) except NULL:
        cdef Py_ssize_t cap
        if type(self.data) is not bytearray:
            raise ValueError("the batch was released")
        cap = PyByteArray_GET_SIZE(self.data)
        if self.used + need > cap:
            cap = max(2 * cap, self.used + need)
            PyByteArray_Resize(self.data, cap)
        return <unsigned char *>PyByteArray_AS_STRING(self.data) + self.used

    cdef inline int64_t _stamp(self, int64_t ts) noexcept:
        """A record of timestamp ``ts`` joins the batch: the base (its first record's) and
        max timestamps move; returns its delta from the base."""
        if self.n == 0:
            self.base_ts = self.max_ts = ts
        elif ts > self.max_ts:
            self.max_ts = ts
        return ts - self.base_ts

    cdef int _add(self, object key, object value, int64_t ts, list hdrs) except -1:
        """One record; key and value bytes or None, ``hdrs`` None or ``(bytes, bytes | None)``
        pairs."""
        cdef Py_ssize_t klen = _field_len(key), vlen = _field_len(value), body, need, j, nh = 0
        cdef int64_t delta
        cdef unsigned char *w
        if self.n >= 0x7fffffff:
            raise ValueError("too many records for one batch")
        delta = self._stamp(ts)
        body = (1 + _varint_size(delta) + _varint_size(self.n) + _field_size(klen)
                + _field_size(vlen))
        if hdrs is not None:
            nh = len(hdrs)
            for j in range(nh):
                h = hdrs[j]
                body += _field_size(_field_len(h[0])) + _field_size(_field_len(h[1]))
        body += _varint_size(nh)
        need = _varint_size(body) + body
        w = self._room(need)
        w += _write_varint(w, body)
        w[0] = 0  # attributes
        w += 1
        w += _write_varint(w, delta)
        w += _write_varint(w, self.n)
        w = _put_field(w, key, klen)
        w = _put_field(w, value, vlen)
        w += _write_varint(w, nh)
        for j in range(nh):
            h = hdrs[j]
            w = _put_field(w, h[0], _field_len(h[0]))
            w = _put_field(w, h[1], _field_len(h[1]))
        self.used += need
        self.n += 1
        return 0

    cdef int _keep(self, object key, object value, int64_t ts, object headers, object cb) except -1:
        """What a delivery report needs (from the first record with a callback on)."""
        cdef Py_ssize_t before = self.n - 1
        if self.cbs is None:
            if cb is None:
                return 0
            self.cbs = [None] * before
            self.keys = [None] * before
            self.values = [None] * before
            self.stamps = [0] * before
            self.headers = [None] * before
        self.cbs.append(cb)
        self.keys.append(key)
        self.values.append(value)
        self.stamps.append(ts)
        self.headers.append(headers)
        return 0

    def extend(self, list values not None, Py_ssize_t start, Py_ssize_t stop, int64_t ts):
        """``values[start:stop]`` (bytes or None, checked by ``bytes_stats``) as keyless
        records with timestamp ``ts``: ``produce_batch``'s lists, no Arrow column between.

        One loop over the list with no object per record (``_add`` per record, with its
        arguments' reference counts and its room check, was twice as slow: perf of
        ``produce_batch``), the objects a few rows ahead prefetched (a list of distinct
        values is a pointer chase through memory the caches do not hold).  A value that is
        not bytes or None raises TypeError, the records before it kept, as ``_add`` did."""
        cdef Py_ssize_t i, vlen, body, need, cap, used, n
        cdef int64_t delta
        cdef int dsize
        cdef unsigned char *w
        cdef unsigned char *base
        cdef PyObject *v
        if start < 0 or stop > len(values) or start > stop:
            raise IndexError("rows outside the list")
        if self.cbs is not None:
            raise ValueError("a batch with delivery callbacks keeps its records one by one")
        if start == stop:
            return
        if type(self.data) is not bytearray:
            raise ValueError("the batch was released")
        delta = self._stamp(ts)
        dsize = _varint_size(delta)
        n = self.n
        used = self.used
        cap = PyByteArray_GET_SIZE(self.data)
        base = <unsigned char *>PyByteArray_AS_STRING(self.data)
        for i in range(start, stop):
            if i + PREFETCH_AHEAD < stop:
                shmq_prefetch_bytes(PyList_GET_ITEM_PTR(values, i + PREFETCH_AHEAD))
            v = PyList_GET_ITEM_PTR(values, i)
            vlen = shmq_value_len(v)
            if vlen == -2 or n >= 0x7fffffff:
                self.n = n
                self.used = used
                if vlen == -2:
                    raise TypeError("values must be bytes or None")
                raise ValueError("too many records for one batch")
            # attributes, timestamp delta, offset delta, key -1 (null), value, no headers
            body = 1 + dsize + _varint_size(n) + 1 + _field_size(vlen) + 1
            need = _varint_size(body) + body
            if used + need > cap:
                self.n = n  # a MemoryError keeps the records before, as _add did
                self.used = used
                cap = max(2 * cap, used + need)
                PyByteArray_Resize(self.data, cap)
                base = <unsigned char *>PyByteArray_AS_STRING(self.data)
            w = base + used
            w += _write_varint(w, body)
            w[0] = 0  # attributes
            w += 1
            w += _write_varint(w, delta)
            w += _write_varint(w, n)
            w[0] = 1  # key -1: null
            w += 1
            w += _write_varint(w, vlen)
            if vlen > 0:
                memcpy(w, shmq_bytes_data(v), vlen)
                w += vlen
            w[0] = 0  # no headers
            used += need
            n += 1
        self.n = n
        self.used = used

    cpdef append(self, key, value, int64_t ts, headers, cb):
        """Encode one record (key and value bytes or None; headers None or ``(str | bytes,
        bytes | None)`` pairs, kept as given for the report)."""
        cdef list hdrs = None
        if (key is not None and not PyBytes_CheckExact(key)) or (
                value is not None and not PyBytes_CheckExact(value)):
            raise TypeError("keys and values must be bytes or None")
        if headers is not None:
            hdrs = [(_header_bytes(h[0]), _header_bytes(h[1])) for h in headers]
            for h in hdrs:
                if h[0] is None:
                    raise ValueError("header keys may not be None")
        self._add(key, value, ts, hdrs)
        self._keep(key, value, ts, headers, cb)

    def load(self, data not None, Py_ssize_t used, Py_ssize_t n, int64_t base_ts,
             int64_t max_ts):
        """Take ``data[:used]`` (a bytearray holding one whole uncompressed batch of ``n``
        records, as ``encode_arrow_batch_into`` writes it) as this empty batch's records."""
        if self.n:
            raise ValueError("the batch already holds records")
        if type(data) is not bytearray or not HEADER < used <= len(data) or n <= 0:
            raise ValueError("a bytearray holding a batch of at least one record is needed")
        self.data = data
        self.used = used
        self.n = n
        self.base_ts = base_ts
        self.max_ts = max_ts

    cdef unsigned char *_seal(self, int64_t producer_id, int16_t producer_epoch,
                              int32_t base_sequence, uint16_t attributes) except NULL:
        cdef unsigned char *start
        if self.n == 0:
            raise ValueError("a record batch holds at least one record")
        if type(self.data) is not bytearray:
            raise ValueError("the batch was released")
        if self.used - 12 > 0x7fffffff:
            raise ValueError("record batch larger than 2 GiB")
        start = <unsigned char *>PyByteArray_AS_STRING(self.data)
        shmq_write_batch_header(start, self.used, attributes, <int32_t>self.n, self.base_ts,
                                self.max_ts, producer_id, producer_epoch, base_sequence)
        with nogil:
            shmq_store_u32(start + 17, crc32c_c(start + 21, self.used - 21))
        return start

    def write(self, unsigned char[::1] view not None, Py_ssize_t at, Py_ssize_t size,
              int64_t producer_id=-1, int16_t producer_epoch=-1, int32_t base_sequence=-1):
        """``LocalBroker.send_with``'s writer: with ``size < 0`` the batch's size; else the
        whole batch (header with this producer id, epoch and base sequence; CRC) copied to
        ``view[at:at + size]``."""
        cdef unsigned char *start
        if size < 0:
            return self.used
        if size != self.used or at < 0 or at > view.shape[0] - size:
            raise IndexError("the batch does not fit the window it is written to")
        start = self._seal(producer_id, producer_epoch, base_sequence, 0)
        memcpy(&view[at], start, size)
        return size

    def encoded(self, int64_t producer_id=-1, int16_t producer_epoch=-1,
                int32_t base_sequence=-1):
        """The whole batch as a new bytearray."""
        self._seal(producer_id, producer_epoch, base_sequence, 0)
        return self.data[:self.used]

    def release(self):
        """The buffer, for the next batch (this one is sent: its bytes were copied)."""
        data, self.data = self.data, None
        return data

    def reports(self):
        """``(cb, key, value, timestamp, headers)`` per record, None for records without a
        callback; None when no record has one."""
        if self.cbs is None:
            return None
        return [None if cb is None else (cb, k, v, t, h)
                for cb, k, v, t, h in zip(self.cbs, self.keys, self.values, self.stamps,
                                          self.headers)]


def bytes_stats(list values not None, Py_ssize_t stop=-1):
    """``(total bytes, longest)`` of ``values[:stop]`` (all of it when ``stop`` < 0; None
    counts 0), every item of the whole list checked to be bytes or None: else the index of the
    first other item as ``(-1, index)``.  One pass, no slice (``produce_batch`` queues the
    prefix the queue has room for, and checks the rest).  The objects a few rows ahead are
    prefetched."""
    cdef Py_ssize_t i, n, size = PyList_GET_SIZE(values), total = 0, longest = 0
    if stop < 0 or stop > size:
        stop = size
    for i in range(size):
        if i + PREFETCH_AHEAD < size:
            shmq_prefetch_header(PyList_GET_ITEM_PTR(values, i + PREFETCH_AHEAD))
        n = shmq_value_len(PyList_GET_ITEM_PTR(values, i))
        if n == -2:
            return -1, i
        if n > 0 and i < stop:
            total += n
            if n > longest:
                longest = n
    return total, longest


cdef class ProducerCore:
    """``produce()`` for the common case -- bytes or None key and value, no headers, no
    interceptors or serializers, a known topic, a record going into a partition's open batch
    that has room -- in C: the record is encoded into the batch there and then.  Everything
    else is ``_produce_slow`` / ``_append`` of the subclass (``shmq.client.producer.
    ShmProducer``), whose pure-Python ``produce`` is the twin.

    The open batches are kept per topic, a list indexed by partition (``_open_*``)."""

    cdef public RLock _lock
    cdef public object _slots, _counts, _default_cb, custom_partitioner
    cdef public bint _plain, closed
    cdef public long long _queued, _queued_bytes, _max_messages, _max_bytes, _message_max
    cdef public long long _batch_records, _batch_bytes
    cdef public int _partitioner
    cdef public Py_ssize_t _n_open

    def __cinit__(self):
        self._lock = RLock()
        self._slots = {}
        self._n_open = 0

    # -- the open batches, by (topic, partition) -------------------------------------------

    def _open_get(self, k):
        slots = self._slots.get(k[0])
        if slots is None or not 0 <= k[1] < len(slots):
            return None
        return slots[k[1]]

    def _open_set(self, k, batch):
        topic, p = k
        slots = self._slots.get(topic)
        if slots is None:
            slots = self._slots[topic] = []
        if p >= len(slots):
            slots.extend([None] * (p + 1 - len(slots)))
        if slots[p] is None:
            self._n_open += 1
        slots[p] = batch

    def _open_pop(self, k):
        slots = self._slots.get(k[0])
        if slots is None or not 0 <= k[1] < len(slots) or slots[k[1]] is None:
            return None
        batch = slots[k[1]]
        slots[k[1]] = None
        self._n_open -= 1
        return batch

    def _open_items(self):
        return [((topic, p), b) for topic, slots in self._slots.items()
                for p, b in enumerate(slots) if b is not None]

    def _open_clear(self):
        for slots in self._slots.values():
            slots[:] = [None] * len(slots)  # in place: produce holds the lists
        self._n_open = 0

    def produce(self, topic, value=None, key=None, partition=-1, on_delivery=None,
                timestamp=0, headers=None, *, callback=None):
        """Queue one record (confluent-kafka's ``Producer.produce``)."""
        cdef Py_ssize_t n, p, size
        cdef long long ts
        cdef timespec now
        cdef Batch batch
        cdef RLock lock
        if (self.closed or not self._plain or headers is not None or type(topic) is not str
                or type(partition) is not int or type(timestamp) is not int
                or (value is not None and type(value) is not bytes)
                or (key is not None and type(key) is not bytes)):
            return self._produce_slow(topic, value, key, partition, on_delivery, timestamp,
                                      headers, callback)
        cnt = self._counts.get(topic)
        slots = self._slots.get(topic)
        if cnt is None or slots is None:
            return self._produce_slow(topic, value, key, partition, on_delivery, timestamp,
                                      headers, callback)
        n = cnt
        size = RECORD_MAX_OVERHEAD
        if value is not None:
            size += PyBytes_GET_SIZE(value)
        if key is not None:
            size += PyBytes_GET_SIZE(key)
        p = partition
        if size > self._message_max or p < -1 or p >= n or (p == -1 and (
                key is None or self._partitioner != 0 or self.custom_partitioner is not None)):
            return self._produce_slow(topic, value, key, partition, on_delivery, timestamp,
                                      headers, callback)
        if p == -1:
            p = <Py_ssize_t>(_murmur2(<const unsigned char *><char *>key,
                                      PyBytes_GET_SIZE(key)) & 0x7FFFFFFF) % n
        if p >= PyList_GET_SIZE(slots):
            return self._produce_slow(topic, value, key, partition, on_delivery, timestamp,
                                      headers, callback)
        if self._queued >= self._max_messages or self._queued_bytes + size > self._max_bytes:
            raise BufferError("Local: Queue full")
        ts = timestamp
        if ts == 0:
            clock_gettime(CLOCK_REALTIME, &now)
            ts = <long long>now.tv_sec * 1000 + now.tv_nsec // 1000000
        cb = on_delivery if on_delivery is not None else callback
        if cb is None:
            cb = self._default_cb
        lock = self._lock
        lock.take()
        try:
            got = <object>PyList_GET_ITEM(slots, p)
            if got is None:
                return self._append((topic, p), key, value, ts, size, cb)
            batch = <Batch>got
            # size - HEADER bounds the record's encoded size: the batch stays within batch.size
            if batch.n >= self._batch_records or batch.used + size - HEADER > self._batch_bytes:
                return self._append((topic, p), key, value, ts, size, cb)
            batch._add(key, value, ts, None)
            if cb is not None or batch.cbs is not None:
                batch._keep(key, value, ts, None, cb)
            batch.nbytes += size
            self._queued += 1
            self._queued_bytes += size
            if batch.n >= self._batch_records or batch.used >= self._batch_bytes:
                self._send((topic, p), batch)
        finally:
            lock.give()


# --- the consumer's per-record path -----------------------------------------------------------

from posix.time cimport CLOCK_MONOTONIC


cdef class ConsumerCore:
    """``poll()``'s common case in C: the next buffered message while the slow path is not due
    (``time.monotonic()`` before ``_service_at``); everything else is the subclass's
    ``_poll_slow`` (``shmq.client.consumer.ShmConsumer``), whose pure-Python ``poll`` is the
    twin."""

    cdef public list _buffer
    cdef public Py_ssize_t _index
    cdef public double _service_at

    def __cinit__(self):
        self._buffer = []
        self._index = 0
        self._service_at = 0.0

    def poll(self, timeout=None):
        """One message or event, or None after ``timeout`` seconds (None or -1: no limit)."""
        cdef Py_ssize_t i = self._index
        cdef timespec now
        if i < PyList_GET_SIZE(self._buffer):
            clock_gettime(CLOCK_MONOTONIC, &now)
            if <double>now.tv_sec + <double>now.tv_nsec * 1e-9 < self._service_at:
                self._index = i + 1
                return <object>PyList_GET_ITEM(self._buffer, i)
        return self._poll_slow(timeout)
