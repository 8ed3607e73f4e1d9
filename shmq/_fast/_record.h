/* One Kafka record (RecordBatch v2 records section), parsed in place.
 *
 *   length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
 *   keyLength varint (-1 null) | key | valueLength varint (-1 null) | value
 *   headersCount varint | [headerKeyLength varint | key | headerValueLength varint | value]
 *
 * Varints are zigzag (Kafka ByteUtils): at most 5 bytes for a varint, 10 for a varlong; a 10th
 * byte's high bits fall off as in Java.  Every read is bounded by the record's end, itself
 * bounded by the section's end: bad input returns NULL, never reads outside [p, end).
 *
 * In C rather than Cython for one reason: the parser must be inlined into each decoding loop
 * (decode_records / decode_sections and fill_columns), and GCC kept it out of line (an
 * out-of-line call per record measured as 30 % of the Arrow decoding time, perf, commit ffeb23b).
 * The multi-byte varint loop stays out of line: ~100 B records only use 1- and 2-byte varints.
 * The pure-Python twin is _reference._parse_record.
 */
#ifndef SHMQ_RECORD_H
#define SHMQ_RECORD_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t timestamp_delta;
    int64_t offset_delta;
    const unsigned char *key;      /* NULL when null */
    int64_t key_len;
    const unsigned char *value;    /* NULL when null */
    int64_t value_len;
    const unsigned char *headers;  /* the first header */
    int64_t headers_count;
    const unsigned char *end;      /* the byte after the record */
} shmq_record;

static inline int64_t shmq_unzigzag(uint64_t raw) {
    return (int64_t)((raw >> 1) ^ (uint64_t)(-(int64_t)(raw & 1)));
}

/* A varint read: its value and the byte after it (p NULL: malformed).  Returned by value (in
   two registers): with an out-parameter, the values went through the stack at every read. */
typedef struct {
    int64_t v;
    const unsigned char *p;
} shmq_varint_read;

/* Any varint of at most max_bytes in [p, lim). */
static __attribute__((noinline)) shmq_varint_read
shmq_varint_long(const unsigned char *p, const unsigned char *lim, int max_bytes) {
    shmq_varint_read r = {0, NULL};
    uint64_t raw = 0;
    int shift = 0, i = 0;
    for (;;) {
        if (i >= lim - p || i >= max_bytes)
            return r;
        unsigned char b = p[i];
        raw |= (uint64_t)(b & 0x7f) << shift;
        i++;
        if (!(b & 0x80))
            break;
        shift += 7;
    }
    r.v = shmq_unzigzag(raw);
    r.p = p + i;
    return r;
}

/* A varint of at most max_bytes in [p, lim).  One- and two-byte varints inline (in ~100 B
   records: the record length, value length and offset deltas >= 64 take two bytes, everything
   else one). */
static inline __attribute__((always_inline)) shmq_varint_read
shmq_varint2(const unsigned char *p, const unsigned char *lim, int max_bytes) {
    shmq_varint_read r;
    if (__builtin_expect(p < lim && p[0] < 0x80, 1)) {
        r.v = shmq_unzigzag(p[0]);
        r.p = p + 1;
        return r;
    }
    if (__builtin_expect(lim - p > 1 && p[1] < 0x80, 1)) {
        r.v = shmq_unzigzag((uint64_t)(p[0] & 0x7f) | ((uint64_t)p[1] << 7));
        r.p = p + 2;
        return r;
    }
    return shmq_varint_long(p, lim, max_bytes);
}

/* The same with an out-parameter (for the Cython callers). */
static inline __attribute__((always_inline)) const unsigned char *
shmq_varint(const unsigned char *p, const unsigned char *lim, int64_t *out, int max_bytes) {
    shmq_varint_read r = shmq_varint2(p, lim, max_bytes);
    *out = r.v;
    return r.p;
}

/* Parse the record at [p, end) into *r: the byte after it, or NULL when malformed. */
static inline __attribute__((always_inline)) const unsigned char *
shmq_parse_record(const unsigned char *p, const unsigned char *end, shmq_record *r) {
    shmq_varint_read v;
    const unsigned char *rend;
    int64_t i, n;
    v = shmq_varint2(p, end, 5);
    if (v.p == NULL || v.v < 6 || v.v > end - v.p)
        return NULL;
    rend = v.p + v.v;
    p = v.p; /* the attributes byte */
    /* A record holds at least 6 bytes, so p[0..5] lie before rend: a timestamp delta and an
       offset delta of 1-2 bytes each end by p + 5 and are read with no bounds check. */
    if (p[1] < 0x80) {
        r->timestamp_delta = shmq_unzigzag(p[1]);
        p += 2;
    } else if (p[2] < 0x80) {
        r->timestamp_delta = shmq_unzigzag((uint64_t)(p[1] & 0x7f) | ((uint64_t)p[2] << 7));
        p += 3;
    } else {
        v = shmq_varint_long(p + 1, rend, 10);
        if (v.p == NULL)
            return NULL;
        r->timestamp_delta = v.v;
        p = v.p;
        goto offset_checked;
    }
    if (p[0] < 0x80) {
        r->offset_delta = shmq_unzigzag(p[0]);
        p += 1;
        goto key;
    }
    if (p[1] < 0x80) {
        r->offset_delta = shmq_unzigzag((uint64_t)(p[0] & 0x7f) | ((uint64_t)p[1] << 7));
        p += 2;
        goto key;
    }
offset_checked:
    v = shmq_varint2(p, rend, 5);
    if (v.p == NULL)
        return NULL;
    r->offset_delta = v.v;
    p = v.p;
key:
    v = shmq_varint2(p, rend, 5);
    if (v.p == NULL || v.v < -1 || v.v > rend - v.p)
        return NULL;
    p = v.p;
    if (v.v < 0) {
        r->key = NULL;
        r->key_len = 0;
    } else {
        r->key = p;
        r->key_len = v.v;
        p += v.v;
    }
    v = shmq_varint2(p, rend, 5);
    if (v.p == NULL || v.v < -1 || v.v > rend - v.p)
        return NULL;
    p = v.p;
    if (v.v < 0) {
        r->value = NULL;
        r->value_len = 0;
    } else {
        r->value = p;
        r->value_len = v.v;
        p += v.v;
    }
    /* headers: almost always none, one 0 byte */
    if (__builtin_expect(p < rend && p[0] == 0, 1)) {
        r->headers_count = 0;
        r->headers = ++p;
    } else {
        v = shmq_varint2(p, rend, 5);
        if (v.p == NULL || v.v < 0 || v.v > rend - v.p)
            return NULL;
        r->headers_count = n = v.v;
        r->headers = p = v.p;
        for (i = 0; i < n; i++) {
            v = shmq_varint2(p, rend, 5);
            if (v.p == NULL || v.v < 0 || v.v > rend - v.p)
                return NULL;
            v = shmq_varint2(v.p + v.v, rend, 5);
            if (v.p == NULL || v.v < -1 || v.v > rend - v.p)
                return NULL;
            p = v.v > 0 ? v.p + v.v : v.p;
        }
    }
    if (p != rend)
        return NULL;
    r->end = rend;
    return rend;
}

/* --- records sections into Arrow column buffers (fill_columns) ---------------------------- */

typedef struct {
    /* output buffers and their capacities */
    int64_t *offsets;
    int64_t *timestamps;
    int32_t *key_offsets;          /* rows + 1 entries */
    unsigned char *key_data;
    unsigned char *key_valid;      /* starts all ones: only nulls touch it */
    int32_t *value_offsets;
    unsigned char *value_data;
    unsigned char *value_valid;
    int64_t cap_rows, cap_key, cap_value;
    /* filters */
    int64_t min_offset, max_offset, timestamp_scale;
    /* progress */
    int64_t rows, klen, vlen, knulls, vnulls;
    int64_t records_done;          /* records of the last section parsed (error messages) */
    int64_t left;                  /* bytes after the last section's records (SHMQ_FILL_TRAILING) */
} shmq_columns;

enum { SHMQ_FILL_OK, SHMQ_FILL_MALFORMED, SHMQ_FILL_TRAILING, SHMQ_FILL_FULL, SHMQ_FILL_OVERFLOW };

/* Fields are copied in 32-byte blocks (LZ4's wildcopy): up to 31 bytes past the field are
   read from the section and written to the column, where the next field overwrites them.
   Blocks need that slack on both sides; a field without it is copied exactly. */
#define SHMQ_BLOCK 32

static inline __attribute__((always_inline)) void
shmq_copy_blocks(unsigned char *dst, const unsigned char *src, int64_t n) {
    int64_t i;
    if (n <= 16) {  /* keys: one move */
        memcpy(dst, src, 16);
        return;
    }
    memcpy(dst, src, SHMQ_BLOCK);
    for (i = SHMQ_BLOCK; i < n; i += SHMQ_BLOCK)
        memcpy(dst + i, src + i, SHMQ_BLOCK);
}

static inline __attribute__((always_inline)) void
shmq_copy_field(unsigned char *dst, const unsigned char *src, int64_t n,
                const unsigned char *src_end, const unsigned char *dst_end) {
    if (n + SHMQ_BLOCK <= src_end - src && n + SHMQ_BLOCK <= dst_end - dst)
        shmq_copy_blocks(dst, src, n);
    else
        memcpy(dst, src, (size_t)n);
}

/* One section's records appended to the columns.  `roomy`: the caller checked that the whole
   section fits (rows, bytes plus a block of slack, 2 GiB offsets), so the loop skips the
   per-record capacity checks; a constant at both call sites, so each gets its own loop.  The
   loop keeps few values live (x86-64 has 15 registers; spills were visible in perf annotate):
   the offset window is one unsigned range compare, a LogAppendTime batch's timestamp is
   base + (delta & 0). */
static inline __attribute__((always_inline)) int
shmq_fill_loop(shmq_columns *c, const unsigned char *p, const unsigned char *e, int64_t count,
               int64_t base_offset, int64_t base_ts, int64_t lat, int64_t no_lat,
               const int roomy) {
    shmq_record r;
    int64_t i, off;
    /* keep min_offset <= off < max_offset as (off - min_offset) < span, unsigned */
    const uint64_t min_offset = (uint64_t)c->min_offset;
    const uint64_t span = c->max_offset > c->min_offset
        ? (uint64_t)c->max_offset - (uint64_t)c->min_offset : 0;
    const uint64_t scale = (uint64_t)c->timestamp_scale;
    const uint64_t ts_base = (uint64_t)(lat != no_lat ? lat : base_ts);
    const uint64_t ts_mask = lat != no_lat ? 0 : ~(uint64_t)0;
    int64_t rows = c->rows, klen = c->klen, vlen = c->vlen;
    int64_t knulls = c->knulls, vnulls = c->vnulls;
    /* every output pointer in a local: a store through an unsigned char pointer (the field
       copies, the validity bits) may alias *c, so c->... would be loaded again per record */
    unsigned char *const kdata = c->key_data, *const vdata = c->value_data;
    unsigned char *const kvalid = c->key_valid, *const vvalid = c->value_valid;
    int64_t *const offsets = c->offsets, *const timestamps = c->timestamps;
    int32_t *const koffsets = c->key_offsets, *const voffsets = c->value_offsets;
    const int64_t cap_rows = c->cap_rows, cap_key = c->cap_key, cap_value = c->cap_value;
    int status = SHMQ_FILL_OK;
    for (i = 0; i < count; i++) {
        p = shmq_parse_record(p, e, &r);
        if (p == NULL) {
            status = SHMQ_FILL_MALFORMED;
            break;
        }
        off = (int64_t)((uint64_t)base_offset + (uint64_t)r.offset_delta);
        if ((uint64_t)off - min_offset >= span)
            continue;
        if (!roomy && (rows >= cap_rows || klen + r.key_len > cap_key
                       || vlen + r.value_len > cap_value)) {
            status = SHMQ_FILL_FULL;
            break;
        }
        offsets[rows] = off;
        timestamps[rows] = (int64_t)((ts_base + ((uint64_t)r.timestamp_delta & ts_mask)) * scale);
        /* a roomy section whose record is followed by a block's worth of bytes: the fields
           can be copied in blocks with no further check (they end at or before the record's);
           a null key (keyless producers: the common case) only clears its bit */
        if (roomy && SHMQ_BLOCK <= e - r.end && r.value != NULL) {
            if (r.key != NULL) {
                shmq_copy_blocks(kdata + klen, r.key, r.key_len);
                klen += r.key_len;
            } else {
                kvalid[rows >> 3] &= (unsigned char)~(1u << (rows & 7));
                knulls++;
            }
            shmq_copy_blocks(vdata + vlen, r.value, r.value_len);
            vlen += r.value_len;
        } else {
            if (r.key != NULL) {
                shmq_copy_field(kdata + klen, r.key, r.key_len, e, kdata + cap_key);
                klen += r.key_len;
            } else {
                kvalid[rows >> 3] &= (unsigned char)~(1u << (rows & 7));
                knulls++;
            }
            if (r.value != NULL) {
                shmq_copy_field(vdata + vlen, r.value, r.value_len, e, vdata + cap_value);
                vlen += r.value_len;
            } else {
                vvalid[rows >> 3] &= (unsigned char)~(1u << (rows & 7));
                vnulls++;
            }
        }
        rows++;
        if (!roomy && (klen > 0x7fffffff || vlen > 0x7fffffff)) {
            status = SHMQ_FILL_OVERFLOW;
            break;
        }
        koffsets[rows] = (int32_t)klen;
        voffsets[rows] = (int32_t)vlen;
    }
    if (status == SHMQ_FILL_OK && p != e) {
        status = SHMQ_FILL_TRAILING;
        c->left = e - p;
    }
    c->knulls = knulls;
    c->vnulls = vnulls;
    c->rows = rows;
    c->klen = klen;
    c->vlen = vlen;
    c->records_done = i;
    return status;
}

/* Append the `count` records of the section [p, e) to the columns: a SHMQ_FILL_* status.
   Out of line on purpose: inlined into fill_columns' Python wrapper, the loop's state was
   spilled to the stack (perf annotate). */
static __attribute__((noinline)) int
shmq_fill_section(shmq_columns *c, const unsigned char *p, const unsigned char *e,
                  int64_t count, int64_t base_offset, int64_t base_ts, int64_t lat,
                  int64_t no_lat) {
    /* A section holds at most (e - p) bytes of keys and of values, and at most `count` rows. */
    int64_t size = e - p;
    if (count <= c->cap_rows - c->rows
            && size + SHMQ_BLOCK <= c->cap_key - c->klen
            && size + SHMQ_BLOCK <= c->cap_value - c->vlen
            && c->klen + size <= 0x7fffffff && c->vlen + size <= 0x7fffffff)
        return shmq_fill_loop(c, p, e, count, base_offset, base_ts, lat, no_lat, 1);
    return shmq_fill_loop(c, p, e, count, base_offset, base_ts, lat, no_lat, 0);
}

/* --- record headers into Arrow list<struct<key: string, value: binary>> buffers -------------
 *
 * fill_headers: the same records fill_columns selects (offset in [min_offset, max_offset)),
 * one list entry per record, null when the record has no header (Kafka's converter gives
 * Spark null, not an empty array).  Keys are copied as they are and checked as UTF-8: an
 * invalid one is counted and the caller repairs it (Java decodes header keys with
 * replacement characters). */

typedef struct {
    int32_t *list_offsets;         /* rows + 1 entries */
    unsigned char *list_valid;     /* starts all ones */
    int32_t *key_offsets;          /* headers + 1 entries */
    unsigned char *key_data;
    int32_t *value_offsets;        /* headers + 1 entries */
    unsigned char *value_data;
    unsigned char *value_valid;    /* starts all ones */
    int64_t cap_rows, cap_headers, cap_key, cap_value;
    int64_t min_offset, max_offset;
    int64_t rows, headers, klen, vlen, list_nulls, value_nulls, bad_keys;
    int64_t records_done, left;
} shmq_header_columns;

/* Whether [p, p + n) is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates, at most
   U+10FFFF), as Python's strict decoder accepts it. */
static inline int
shmq_utf8_valid(const unsigned char *p, int64_t n) {
    const unsigned char *e = p + n;
    while (p < e) {
        unsigned char c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int len;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else
            return 0;
        if (e - p < len || p[1] < lo || p[1] > hi)
            return 0;
        for (int i = 2; i < len; i++)
            if (p[i] < 0x80 || p[i] > 0xBF)
                return 0;
        p += len;
    }
    return 1;
}

static __attribute__((noinline)) int
shmq_fill_headers_section(shmq_header_columns *c, const unsigned char *p, const unsigned char *e,
                          int64_t count, int64_t base_offset) {
    shmq_record r;
    shmq_varint_read v;
    int64_t i, j, off;
    const uint64_t min_offset = (uint64_t)c->min_offset;
    const uint64_t span = c->max_offset > c->min_offset
        ? (uint64_t)c->max_offset - (uint64_t)c->min_offset : 0;
    int status = SHMQ_FILL_OK;
    for (i = 0; i < count; i++) {
        p = shmq_parse_record(p, e, &r);
        if (p == NULL) {
            status = SHMQ_FILL_MALFORMED;
            break;
        }
        off = (int64_t)((uint64_t)base_offset + (uint64_t)r.offset_delta);
        if ((uint64_t)off - min_offset >= span)
            continue;
        if (c->rows >= c->cap_rows || r.headers_count > c->cap_headers - c->headers) {
            status = SHMQ_FILL_FULL;
            break;
        }
        if (r.headers_count == 0) {
            c->list_valid[c->rows >> 3] &= (unsigned char)~(1u << (c->rows & 7));
            c->list_nulls++;
        }
        /* shmq_parse_record checked every header's lengths against the record */
        const unsigned char *h = r.headers;
        for (j = 0; j < r.headers_count; j++) {
            v = shmq_varint2(h, r.end, 5);
            h = v.p;
            if (v.v > c->cap_key - c->klen) {
                status = SHMQ_FILL_FULL;
                goto done;
            }
            memcpy(c->key_data + c->klen, h, (size_t)v.v);
            if (!shmq_utf8_valid(h, v.v))
                c->bad_keys++;
            c->klen += v.v;
            h += v.v;
            v = shmq_varint2(h, r.end, 5);
            h = v.p;
            if (v.v < 0) {
                c->value_valid[c->headers >> 3] &= (unsigned char)~(1u << (c->headers & 7));
                c->value_nulls++;
            } else {
                if (v.v > c->cap_value - c->vlen) {
                    status = SHMQ_FILL_FULL;
                    goto done;
                }
                memcpy(c->value_data + c->vlen, h, (size_t)v.v);
                c->vlen += v.v;
                h += v.v;
            }
            if (c->klen > 0x7fffffff || c->vlen > 0x7fffffff) {
                status = SHMQ_FILL_OVERFLOW;
                goto done;
            }
            c->headers++;
            c->key_offsets[c->headers] = (int32_t)c->klen;
            c->value_offsets[c->headers] = (int32_t)c->vlen;
        }
        c->rows++;
        c->list_offsets[c->rows] = (int32_t)c->headers;
    }
done:
    if (status == SHMQ_FILL_OK && p != e) {
        status = SHMQ_FILL_TRAILING;
        c->left = e - p;
    }
    c->records_done = i;
    return status;
}

#endif
