from libc.stdint cimport uint32_t, uint64_t

# The ring and state-table memory orderings (``_atomics.h``), shared by the ring modules.
cdef extern from "_atomics.h":
    uint64_t shmq_load_acquire_u64(const unsigned char *p) noexcept nogil
    void shmq_store_release_u64(unsigned char *p, uint64_t v) noexcept nogil
    uint32_t shmq_load_acquire_u32(const unsigned char *p) noexcept nogil
    uint32_t shmq_exchange_u32(unsigned char *p, uint32_t v) noexcept nogil
    void shmq_full_fence() noexcept nogil
