/* Atomic loads, stores and fences on shared memory for the SPSC rings (shmq/ipc/ring.py), with
 * GCC/Clang __atomic builtins.  Callers guarantee natural alignment (the ring headers are page
 * aligned and every field sits at a multiple of its size). */
#ifndef SHMQ_ATOMICS_H
#define SHMQ_ATOMICS_H
#include <stdint.h>

static inline uint64_t shmq_load_acquire_u64(const unsigned char *p) {
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
}
static inline void shmq_store_release_u64(unsigned char *p, uint64_t v) {
    __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
}
static inline uint32_t shmq_load_acquire_u32(const unsigned char *p) {
    return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
}
/* Sequentially consistent exchange: the store-load order that the "sleeping" flag protocol
 * needs (publish, then look at the flag; set the flag, then look at the ring again). */
static inline uint32_t shmq_exchange_u32(unsigned char *p, uint32_t v) {
    return __atomic_exchange_n((uint32_t *)p, v, __ATOMIC_SEQ_CST);
}
static inline void shmq_full_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#endif
