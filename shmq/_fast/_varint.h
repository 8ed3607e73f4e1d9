/* Zigzag varints of Kafka's record format (ByteUtils.writeVarint/writeVarlong): the size of
 * one and its bytes.  One place for the record encoders of the rings, the client's batches and
 * Arrow batches (ring.pyx, client.pyx, batch.pyx); the pure-Python twin is
 * _client_reference._zigzag. */
#ifndef SHMQ_VARINT_H
#define SHMQ_VARINT_H
#include <stddef.h>
#include <stdint.h>

static inline int shmq_varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

/* Writes the varint of ``v`` at ``p``; returns its size. */
static inline ptrdiff_t shmq_write_varint(unsigned char *p, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    ptrdiff_t n = 0;
    while (z >= 0x80) {
        p[n] = (unsigned char)((z & 0x7f) | 0x80);
        z >>= 7;
        n++;
    }
    p[n] = (unsigned char)z;
    return n + 1;
}
#endif
