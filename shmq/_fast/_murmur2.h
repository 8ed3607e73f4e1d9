/* Kafka's murmur2 (Java ``Utils.murmur2``, seed 0x9747b28c), on uint32_t as Java's int
 * arithmetic wraps: the one kernel of the per-record partitioner (client.pyx) and the
 * columnar one (batch.pyx).  Twin: ``_client_reference.murmur2``. */
#ifndef SHMQ_MURMUR2_H
#define SHMQ_MURMUR2_H

#include <stddef.h>
#include <stdint.h>

static inline uint32_t shmq_murmur2(const unsigned char *p, ptrdiff_t n)
{
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)n;
    ptrdiff_t i, n4 = n / 4;
    for (i = 0; i < n4; i++) {
        uint32_t k = (uint32_t)p[4 * i] | ((uint32_t)p[4 * i + 1] << 8)
                     | ((uint32_t)p[4 * i + 2] << 16) | ((uint32_t)p[4 * i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    i = n & ~(ptrdiff_t)3;
    switch (n & 3) {
    case 3:
        h ^= (uint32_t)p[i + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)p[i + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)p[i];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

#endif
