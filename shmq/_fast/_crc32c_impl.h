/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as Kafka's Crc32C.
 *
 * Three implementations behind one entry point, chosen once at run time:
 *
 *   hardware   the SSE4.2 `crc32` instruction (x86-64), with three independent
 *              streams interleaved so the 3-cycle latency of the instruction is
 *              hidden (throughput 1/cycle): the buffer is cut into 3 lanes of
 *              LONG (8 KiB) or SHORT (256 B) bytes, each lane's CRC is computed
 *              from state 0 in parallel, then lanes are joined with
 *              crc(A||B) = shift_|B|(crc(A)) ^ crc(B), where shift_n is the
 *              linear map "feed n zero bytes", applied with four 256-entry
 *              tables.  This is the scheme of Mark Adler's crc32c.c (zlib
 *              licence, stackoverflow.com/a/17646775), written anew here.
 *   software   slicing-by-8 tables (8 bytes per step) when the CPU lacks SSE4.2.
 *
 * All functions work on the raw register (no pre/post inversion); callers invert.
 * Measured on this 2-core Xeon: see perf/bench_crc32c.py.
 */
#ifndef SHMQ_CRC32C_IMPL_H
#define SHMQ_CRC32C_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SHMQ_CRC32C_POLY 0x82F63B78u
#define SHMQ_CRC32C_LONG 8192
#define SHMQ_CRC32C_SHORT 256

static uint32_t shmq_crc32c_table[8][256];
static uint32_t shmq_crc32c_long_shift[4][256];
static uint32_t shmq_crc32c_short_shift[4][256];
static int shmq_crc32c_ready = 0;
static int shmq_crc32c_have_hw = 0;

/* Byte-at-a-time raw update: the reference the tables are built from. */
static uint32_t shmq_crc32c_bytewise(uint32_t crc, const unsigned char *p, size_t n) {
    while (n--) crc = (crc >> 8) ^ shmq_crc32c_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

/* Slicing-by-8 raw update (software path). */
static uint32_t shmq_crc32c_sw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) { crc = (crc >> 8) ^ shmq_crc32c_table[0][(crc ^ *p++) & 0xff]; n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
#endif
        w ^= crc;
        crc = shmq_crc32c_table[7][w & 0xff] ^ shmq_crc32c_table[6][(w >> 8) & 0xff] ^
              shmq_crc32c_table[5][(w >> 16) & 0xff] ^ shmq_crc32c_table[4][(w >> 24) & 0xff] ^
              shmq_crc32c_table[3][(w >> 32) & 0xff] ^ shmq_crc32c_table[2][(w >> 40) & 0xff] ^
              shmq_crc32c_table[1][(w >> 48) & 0xff] ^ shmq_crc32c_table[0][w >> 56];
        p += 8; n -= 8;
    }
    return shmq_crc32c_bytewise(crc, p, n);
}

/* Build shift tables for "append n zero bytes": op(v) is linear in v, so it is
 * enough to know the image of each of the 32 basis vectors. */
static void shmq_crc32c_build_shift(uint32_t tab[4][256], size_t n) {
    static const unsigned char zeros[SHMQ_CRC32C_LONG];
    uint32_t basis[32];
    for (int bit = 0; bit < 32; bit++) basis[bit] = shmq_crc32c_bytewise(1u << bit, zeros, n);
    for (int k = 0; k < 4; k++) {
        for (int b = 0; b < 256; b++) {
            uint32_t r = 0;
            for (int i = 0; i < 8; i++) if (b & (1 << i)) r ^= basis[8 * k + i];
            tab[k][b] = r;
        }
    }
}

static inline uint32_t shmq_crc32c_shift(uint32_t tab[4][256], uint32_t crc) {
    return tab[0][crc & 0xff] ^ tab[1][(crc >> 8) & 0xff] ^ tab[2][(crc >> 16) & 0xff] ^ tab[3][crc >> 24];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SHMQ_CRC32C_X86 1
__attribute__((target("sse4.2")))
static uint32_t shmq_crc32c_hw(uint32_t crc0, const unsigned char *p, size_t n) {
    uint64_t c0 = crc0, c1, c2;
    while (n && ((uintptr_t)p & 7)) { c0 = __builtin_ia32_crc32qi((uint32_t)c0, *p++); n--; }
    while (n >= 3 * SHMQ_CRC32C_LONG) {
        c1 = 0; c2 = 0;
        const unsigned char *end = p + SHMQ_CRC32C_LONG;
        do {
            uint64_t a, b, c;
            memcpy(&a, p, 8); memcpy(&b, p + SHMQ_CRC32C_LONG, 8); memcpy(&c, p + 2 * SHMQ_CRC32C_LONG, 8);
            c0 = __builtin_ia32_crc32di(c0, a);
            c1 = __builtin_ia32_crc32di(c1, b);
            c2 = __builtin_ia32_crc32di(c2, c);
            p += 8;
        } while (p < end);
        c0 = shmq_crc32c_shift(shmq_crc32c_long_shift, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = shmq_crc32c_shift(shmq_crc32c_long_shift, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * SHMQ_CRC32C_LONG;
        n -= 3 * SHMQ_CRC32C_LONG;
    }
    while (n >= 3 * SHMQ_CRC32C_SHORT) {
        c1 = 0; c2 = 0;
        const unsigned char *end = p + SHMQ_CRC32C_SHORT;
        do {
            uint64_t a, b, c;
            memcpy(&a, p, 8); memcpy(&b, p + SHMQ_CRC32C_SHORT, 8); memcpy(&c, p + 2 * SHMQ_CRC32C_SHORT, 8);
            c0 = __builtin_ia32_crc32di(c0, a);
            c1 = __builtin_ia32_crc32di(c1, b);
            c2 = __builtin_ia32_crc32di(c2, c);
            p += 8;
        } while (p < end);
        c0 = shmq_crc32c_shift(shmq_crc32c_short_shift, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = shmq_crc32c_shift(shmq_crc32c_short_shift, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * SHMQ_CRC32C_SHORT;
        n -= 3 * SHMQ_CRC32C_SHORT;
    }
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c0 = __builtin_ia32_crc32di(c0, a);
        p += 8; n -= 8;
    }
    while (n--) c0 = __builtin_ia32_crc32qi((uint32_t)c0, *p++);
    return (uint32_t)c0;
}
#endif

static void shmq_crc32c_init(void) {
    if (shmq_crc32c_ready) return;
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ SHMQ_CRC32C_POLY : c >> 1;
        shmq_crc32c_table[0][n] = c;
    }
    for (int n = 0; n < 256; n++) {
        uint32_t c = shmq_crc32c_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = shmq_crc32c_table[0][c & 0xff] ^ (c >> 8);
            shmq_crc32c_table[k][n] = c;
        }
    }
    shmq_crc32c_build_shift(shmq_crc32c_long_shift, SHMQ_CRC32C_LONG);
    shmq_crc32c_build_shift(shmq_crc32c_short_shift, SHMQ_CRC32C_SHORT);
#ifdef SHMQ_CRC32C_X86
    __builtin_cpu_init();
    shmq_crc32c_have_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
    shmq_crc32c_ready = 1;
}

/* CRC-32C of n bytes continuing from a finished CRC value `crc` (0 to start). */
static uint32_t shmq_crc32c_update(uint32_t crc, const unsigned char *p, size_t n, int allow_hw) {
    uint32_t raw = ~crc;
#ifdef SHMQ_CRC32C_X86
    if (allow_hw && shmq_crc32c_have_hw) return ~shmq_crc32c_hw(raw, p, n);
#endif
    (void)allow_hw;
    return ~shmq_crc32c_sw(raw, p, n);
}

#endif
