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

from cpython.bytes cimport PyBytes_GET_SIZE
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME

cdef Py_ssize_t RECORD_MAX_OVERHEAD = 61 + 5 + 1 + 10 + 5 + 5 + 5 + 5


cdef class Batch:
    """A partition's open batch, kept as parallel lists (keys, values, timestamps; headers and
    delivery callbacks only once a record has them): no object per record that the garbage
    collector would walk again and again while the batch fills (a tuple a record cost 2/3 of
    ``produce``'s time in collections).  ``records()`` builds what ``send_batch`` takes."""

    cdef public list keys, values, stamps
    cdef public object headers, cbs, prebuilt
    cdef public Py_ssize_t nbytes
    cdef public double opened

    def __init__(self, double opened):
        self.keys = []
        self.values = []
        self.stamps = []
        self.headers = None
        self.cbs = None
        self.prebuilt = None
        self.nbytes = 0
        self.opened = opened

    cpdef Py_ssize_t count(self):
        return len(self.prebuilt) if self.prebuilt is not None else len(self.values)

    cpdef append(self, key, value, long long ts, headers, cb):
        cdef Py_ssize_t before = len(self.values)
        self.keys.append(key)
        self.values.append(value)
        self.stamps.append(ts)
        if headers is not None:
            if self.headers is None:
                self.headers = [None] * before
            self.headers.append(headers)
        elif self.headers is not None:
            self.headers.append(None)
        if cb is not None:
            if self.cbs is None:
                self.cbs = [None] * before
            self.cbs.append(cb)
        elif self.cbs is not None:
            self.cbs.append(None)

    def records(self):
        """``(key, value, timestamp[, headers])`` per record (what ``send_batch`` takes)."""
        if self.prebuilt is not None:
            return self.prebuilt
        if self.headers is None:
            return list(zip(self.keys, self.values, self.stamps))
        return list(zip(self.keys, self.values, self.stamps, self.headers))

    def reports(self):
        """``(cb, key, value, timestamp, headers)`` per record, None for records without a
        callback; None when no record has one."""
        if self.cbs is None:
            return None
        hs = self.headers if self.headers is not None else [None] * len(self.values)
        return [None if cb is None else (cb, k, v, t, h)
                for cb, k, v, t, h in zip(self.cbs, self.keys, self.values, self.stamps, hs)]


cdef class ProducerCore:
    """``produce()`` for the common case -- bytes or None key and value, no headers, no
    interceptors or serializers, a known topic, a record going into a partition's open batch
    that has room -- in C; everything else is ``_produce_slow`` / ``_append`` of the subclass
    (``shmq.client.producer.ShmProducer``), whose pure-Python ``produce`` is the twin."""

    cdef public object _lock, _open, _counts, _default_cb, custom_partitioner
    cdef public bint _plain, closed
    cdef public long long _queued, _queued_bytes, _max_messages, _max_bytes, _message_max
    cdef public long long _batch_records, _batch_bytes
    cdef public int _partitioner

    def produce(self, topic, value=None, key=None, partition=-1, on_delivery=None,
                timestamp=0, headers=None, *, callback=None):
        """Queue one record (confluent-kafka's ``Producer.produce``)."""
        cdef Py_ssize_t n, p, size
        cdef long long ts
        cdef timespec now
        cdef Batch batch
        if (self.closed or not self._plain or headers is not None or type(topic) is not str
                or type(partition) is not int or type(timestamp) is not int
                or (value is not None and type(value) is not bytes)
                or (key is not None and type(key) is not bytes)):
            return self._produce_slow(topic, value, key, partition, on_delivery, timestamp,
                                      headers, callback)
        cnt = self._counts.get(topic)
        if cnt is None:
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
        if self._queued >= self._max_messages or self._queued_bytes + size > self._max_bytes:
            raise BufferError("Local: Queue full")
        ts = timestamp
        if ts == 0:
            clock_gettime(CLOCK_REALTIME, &now)
            ts = <long long>now.tv_sec * 1000 + now.tv_nsec // 1000000
        cb = on_delivery if on_delivery is not None else callback
        if cb is None:
            cb = self._default_cb
        k = (topic, p)
        lock = self._lock
        lock.acquire()
        try:
            got = self._open.get(k)
            if got is None:
                return self._append(k, key, value, ts, size, cb)
            batch = <Batch>got
            if (batch.prebuilt is not None or len(batch.values) >= self._batch_records
                    or batch.nbytes + size > self._batch_bytes):
                return self._append(k, key, value, ts, size, cb)
            batch.append(key, value, ts, None, cb)
            batch.nbytes += size
            self._queued += 1
            self._queued_bytes += size
            if len(batch.values) >= self._batch_records or batch.nbytes >= self._batch_bytes:
                self._send(k, batch)
        finally:
            lock.release()
