# cython: language_level=3, boundscheck=False, wraparound=False
"""The client's per-record hash (twin: ``_client_reference``): Kafka's murmur2 partitioner."""

from libc.stdint cimport int32_t, uint32_t


cdef inline uint32_t _murmur2(const unsigned char *data, Py_ssize_t length) noexcept nogil:
    cdef uint32_t m = 0x5BD1E995U, k
    cdef uint32_t h = (<uint32_t>0x9747B28CU) ^ <uint32_t>length
    cdef Py_ssize_t i, n4 = length // 4
    for i in range(n4):
        k = (<uint32_t>data[4 * i] | (<uint32_t>data[4 * i + 1] << 8)
             | (<uint32_t>data[4 * i + 2] << 16) | (<uint32_t>data[4 * i + 3] << 24))
        k *= m
        k ^= k >> 24
        k *= m
        h *= m
        h ^= k
    cdef Py_ssize_t tail = n4 * 4, rest = length & 3
    if rest == 3:
        h ^= <uint32_t>data[tail + 2] << 16
    if rest >= 2:
        h ^= <uint32_t>data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h *= m
    h ^= h >> 13
    h *= m
    h ^= h >> 15
    return h


def murmur2(const unsigned char[::1] data not None):
    """Kafka's murmur2 of ``data`` as a signed 32-bit int (Java ``Utils.murmur2``)."""
    return <int32_t>_murmur2(&data[0] if data.shape[0] else NULL, data.shape[0])


def murmur2_partition(const unsigned char[::1] key not None, Py_ssize_t partition_count):
    """``toPositive(murmur2(key)) % partition_count``: the partition of Java's client."""
    if partition_count <= 0:
        raise ValueError("partition_count must be positive")
    cdef uint32_t h = _murmur2(&key[0] if key.shape[0] else NULL, key.shape[0])
    return <Py_ssize_t>(h & 0x7FFFFFFF) % partition_count
