# cython: language_level=3, boundscheck=False, wraparound=False
"""CRC-32C (Castagnoli) as Kafka's ``Crc32C``: AVX-512 carry-less multiplication folding, SSE4.2
with interleaved streams, or tables.

The algorithm lives in ``_crc32c_impl.h``; this module is its Python face.
"""

from libc.stdint cimport uint32_t

shmq_crc32c_init()


cdef uint32_t _crc(const unsigned char[::1] data, uint32_t value, int path):
    """``shmq_crc32c_update`` of ``data`` through ``path`` (1: the best this CPU has, 0: the
    tables, 2: the ``crc32`` instruction without folding)."""
    cdef size_t n = data.shape[0]
    if n == 0:
        return value
    with nogil:
        value = shmq_crc32c_update(value, &data[0], n, path)
    return value


def crc32c(const unsigned char[::1] data not None, unsigned int value=0):
    """CRC-32C of ``data`` continuing from ``value`` (a finished CRC, 0 to start)."""
    return _crc(data, value, 1)


def crc32c_software(const unsigned char[::1] data not None, unsigned int value=0):
    """CRC-32C through the table path only (to test it on CPUs that have SSE4.2)."""
    return _crc(data, value, 0)


def crc32c_sse42(const unsigned char[::1] data not None, unsigned int value=0):
    """CRC-32C through the ``crc32`` instruction only, never the folding (to test one against
    the other); the table path on CPUs without SSE4.2."""
    return _crc(data, value, 2)


def have_hardware():
    """True when the SSE4.2 ``crc32`` instruction is in use."""
    return bool(shmq_crc32c_have_hw)


def have_folding():
    """True when buffers of 256 bytes and more go through the VPCLMULQDQ folding."""
    return bool(shmq_crc32c_have_vclmul)
