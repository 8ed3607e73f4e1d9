/* The fixed 61-byte header of a RecordBatch v2 (magic 2), written in place before its CRC:
 *
 *   baseOffset int64 (0: the broker assigns) | batchLength int32 | partitionLeaderEpoch int32 (-1)
 *   magic int8 | crc uint32 (bytes 17-20: the caller's, over bytes 21..end) | attributes int16
 *   lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 | producerId int64
 *   producerEpoch int16 | baseSequence int32 | recordCount int32
 *
 * One place for the encoders of the rings and of Arrow batches (ring.pyx, batch.pyx); the
 * pure-Python twin is records.encode_batch.
 */
#ifndef SHMQ_BATCH_HEADER_H
#define SHMQ_BATCH_HEADER_H
#include <stddef.h>
#include <stdint.h>
#include "_endian.h"

static inline void shmq_write_batch_header(unsigned char *start, size_t size, uint16_t attributes,
                                           int32_t n, int64_t base_ts, int64_t max_ts,
                                           int64_t producer_id, int16_t producer_epoch,
                                           int32_t base_sequence) {
    shmq_store_u64(start, 0);
    shmq_store_u32(start + 8, (uint32_t)(size - 12));
    shmq_store_u32(start + 12, (uint32_t)-1);
    start[16] = 2;
    shmq_store_u16(start + 21, attributes);
    shmq_store_u32(start + 23, (uint32_t)(n - 1));
    shmq_store_u64(start + 27, (uint64_t)base_ts);
    shmq_store_u64(start + 35, (uint64_t)max_ts);
    shmq_store_u64(start + 43, (uint64_t)producer_id);
    shmq_store_u16(start + 51, (uint16_t)producer_epoch);
    shmq_store_u32(start + 53, (uint32_t)base_sequence);
    shmq_store_u32(start + 57, (uint32_t)n);
}
#endif
