/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as Kafka's Crc32C.
 *
 * Four implementations behind one entry point, chosen once at run time:
 *
 *   folding    AVX-512 VPCLMULQDQ (shmq_crc32c_vclmul, below) for buffers of 256 bytes and
 *              more, its last 16 bytes and the tail through the crc32 instruction: ~3.5x
 *              the crc32 instruction alone on this VM's EPYC (110 KB batch in cache: 55.6
 *              against 15.8 GB/s).
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
static int shmq_crc32c_have_vclmul = 0;

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
#include <immintrin.h>
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

/* Carry-less multiplication folding (the scheme of Intel's "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ", written anew here) with AVX-512 VPCLMULQDQ: four 512-bit
 * accumulators take 256 bytes per step, each 128-bit lane folded forward by 2048 bits, then
 * the accumulators and lanes are folded into one 128-bit value, whose CRC (and the tail's)
 * the crc32 instruction finishes: the folded value followed by the rest of the buffer has the
 * raw CRC of the whole.  The constants are x^(D+32) and x^(D-32) mod P, bit-reflected and
 * shifted left by one, for a fold over D bits (tests/unit/test_fast_parity.py derives them
 * and finds them here).  The crc32 instruction does 8 bytes a cycle at best; this ~4x
 * that on a CPU with 512-bit VPCLMULQDQ.  For n >= 256. */
#define SHMQ_CRC32C_FOLD_MIN 256
__attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))
static uint32_t shmq_crc32c_vclmul(uint32_t crc0, const unsigned char *p, size_t n) {
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x(0xb9e02b86, 0xdcb17aa4));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x9e4addf8, 0x740eef02));
    const __m128i k384 = _mm_set_epi64x(0x1d82c63da, 0x1c291d04);
    const __m128i k256 = _mm_set_epi64x(0xba4fc28e, 0x1384aa63a);
    const __m128i k128 = _mm_set_epi64x(0x14cd00bd6, 0xf20c0dfe);
    __m512i x0 = _mm512_loadu_si512((const void *)p), x1, x2, x3;
    __m128i a, b, c, d;
    uint64_t r;
    x0 = _mm512_xor_si512(x0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc0)));
#define SHMQ_FOLD512(x, k, next) _mm512_ternarylogic_epi64( \
        _mm512_clmulepi64_epi128((x), (k), 0x00), _mm512_clmulepi64_epi128((x), (k), 0x11), \
        (next), 0x96)
#define SHMQ_FOLD128(x, k) _mm_xor_si128(_mm_clmulepi64_si128((x), (k), 0x00), \
                                         _mm_clmulepi64_si128((x), (k), 0x11))
    x1 = _mm512_loadu_si512((const void *)(p + 64));
    x2 = _mm512_loadu_si512((const void *)(p + 128));
    x3 = _mm512_loadu_si512((const void *)(p + 192));
    p += 256;
    n -= 256;
    while (n >= 256) {
        x0 = SHMQ_FOLD512(x0, k2048, _mm512_loadu_si512((const void *)p));
        x1 = SHMQ_FOLD512(x1, k2048, _mm512_loadu_si512((const void *)(p + 64)));
        x2 = SHMQ_FOLD512(x2, k2048, _mm512_loadu_si512((const void *)(p + 128)));
        x3 = SHMQ_FOLD512(x3, k2048, _mm512_loadu_si512((const void *)(p + 192)));
        p += 256;
        n -= 256;
    }
    x0 = SHMQ_FOLD512(x0, k512, x1);
    x0 = SHMQ_FOLD512(x0, k512, x2);
    x0 = SHMQ_FOLD512(x0, k512, x3);
    while (n >= 64) {
        x0 = SHMQ_FOLD512(x0, k512, _mm512_loadu_si512((const void *)p));
        p += 64;
        n -= 64;
    }
    a = _mm512_extracti32x4_epi32(x0, 0);
    b = _mm512_extracti32x4_epi32(x0, 1);
    c = _mm512_extracti32x4_epi32(x0, 2);
    d = _mm512_extracti32x4_epi32(x0, 3);
    d = _mm_xor_si128(d, SHMQ_FOLD128(a, k384));
    d = _mm_xor_si128(d, SHMQ_FOLD128(b, k256));
    d = _mm_xor_si128(d, SHMQ_FOLD128(c, k128));
#undef SHMQ_FOLD512
#undef SHMQ_FOLD128
    r = __builtin_ia32_crc32di(0, (uint64_t)_mm_cvtsi128_si64(d));
    r = __builtin_ia32_crc32di(r, (uint64_t)_mm_extract_epi64(d, 1));
    return shmq_crc32c_hw((uint32_t)r, p, n);
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
    shmq_crc32c_have_vclmul = shmq_crc32c_have_hw && __builtin_cpu_supports("avx512f")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq")
        && __builtin_cpu_supports("pclmul") ? 1 : 0;
#endif
    shmq_crc32c_ready = 1;
}

/* CRC-32C of n bytes continuing from a finished CRC value `crc` (0 to start).  allow_hw: 0 the
   tables, 1 the fastest path there is, 2 the crc32 instruction without the folding. */
static uint32_t shmq_crc32c_update(uint32_t crc, const unsigned char *p, size_t n, int allow_hw) {
    uint32_t raw = ~crc;
#ifdef SHMQ_CRC32C_X86
    if (allow_hw == 1 && shmq_crc32c_have_vclmul && n >= SHMQ_CRC32C_FOLD_MIN)
        return ~shmq_crc32c_vclmul(raw, p, n);
    if (allow_hw && shmq_crc32c_have_hw) return ~shmq_crc32c_hw(raw, p, n);
#endif
    (void)allow_hw;
    return ~shmq_crc32c_sw(raw, p, n);
}

#endif
