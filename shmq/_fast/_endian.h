/* Big-endian loads and stores on unaligned bytes (pgproto hton.h pattern). */
#ifndef SHMQ_ENDIAN_H
#define SHMQ_ENDIAN_H
#include <stdint.h>
#include <string.h>

static inline uint16_t shmq_load_u16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return __builtin_bswap16(v); }
static inline uint32_t shmq_load_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }
static inline uint64_t shmq_load_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return __builtin_bswap64(v); }
static inline int16_t shmq_load_i16(const unsigned char *p) { return (int16_t)shmq_load_u16(p); }
static inline int32_t shmq_load_i32(const unsigned char *p) { return (int32_t)shmq_load_u32(p); }
static inline int64_t shmq_load_i64(const unsigned char *p) { return (int64_t)shmq_load_u64(p); }
static inline void shmq_store_u16(unsigned char *p, uint16_t v) { v = __builtin_bswap16(v); memcpy(p, &v, 2); }
static inline void shmq_store_u32(unsigned char *p, uint32_t v) { v = __builtin_bswap32(v); memcpy(p, &v, 4); }
static inline void shmq_store_u64(unsigned char *p, uint64_t v) { v = __builtin_bswap64(v); memcpy(p, &v, 8); }
#endif
