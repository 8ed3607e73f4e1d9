from libc.stdint cimport uint32_t

cdef extern from "_crc32c_impl.h":
    void shmq_crc32c_init() nogil
    uint32_t shmq_crc32c_update(uint32_t crc, const unsigned char *p, size_t n, int allow_hw) nogil
    int shmq_crc32c_have_hw
    int shmq_crc32c_have_vclmul

# CRC-32C of p[0:n], continuing from `crc` (0 to start). Needs no GIL.
cdef inline uint32_t crc32c_c(const unsigned char *p, size_t n, uint32_t crc=0) noexcept nogil:
    return shmq_crc32c_update(crc, p, n, 1)
