"""Produce (0): validate and append each partition's batch, then answer per the acks.

Requests are parsed by hand (``protocol.produce_request``) so the record bytes stay a view of the
receive buffer until the one ``pwritev`` that stores them.  Kafka's rules: v3+ carries exactly one
batch per partition; versions 0..2 are advertised (librdkafka's compression gate, KAFKA-18659)
but refused; a bad CRC is CORRUPT_MESSAGE and appends nothing; a batch over max.message.bytes is
MESSAGE_TOO_LARGE.  acks=0 gets no response at all; acks=all on a single replica means appended
and, with ``flush.on.ack``, fsynced by a group commit shared by every waiting request.
"""

from __future__ import annotations

import asyncio
import struct
from time import perf_counter_ns

from shmq._fast._metrics_reference import (
    PRODUCE_WAIT_HIST,
    PRODUCE_WAITS_DONE,
    PRODUCE_WAITS_STARTED,
)
from shmq.broker.context import BrokerContext
from shmq.broker.metadata import INTERNAL_TOPICS
from shmq.errors import CorruptRecordError, KafkaApiError
from shmq.protocol.produce_request import encode_produce_response, parse_produce_request

_BATCH_LENGTH = struct.Struct(">i")
HEADER_SIZE = 61
NONE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, 2, 3, 6
MESSAGE_TOO_LARGE, UNSUPPORTED_VERSION, INVALID_RECORD, INVALID_TOPIC = 10, 35, 87, 17


async def handle(ctx: BrokerContext, frame: memoryview, header_size: int, api_version: int,
                 correlation_id: int) -> bytes | None:
    _transactional_id, acks, _timeout_ms, topics = parse_produce_request(frame, header_size,
                                                                         api_version)
    results = []
    to_flush = []
    metrics = ctx.metrics
    for topic, partitions in topics:
        out = []
        info = ctx.metadata.topics.get(topic)
        for index, records in partitions:
            code, base, start, message, append_time = NONE, -1, -1, None, -1
            log = ctx.log_for(topic, index)
            if api_version < 3:
                code = UNSUPPORTED_VERSION
            elif topic in INTERNAL_TOPICS:
                code, message = INVALID_TOPIC, f"Cannot append to internal topic {topic}"
            elif info is None or not 0 <= index < len(info.partitions):
                code = UNKNOWN_TOPIC_OR_PARTITION
            elif log is None:
                code = NOT_LEADER
            elif records is None or len(records) == 0:
                code, message = INVALID_RECORD, "no record batch"
            else:
                try:
                    # one batch per partition (v3+): its declared size must span the records.
                    # The header alone decides; append() validates size, magic and CRC once
                    # (validating here too computed every produced byte's CRC twice).
                    declared = _BATCH_LENGTH.unpack_from(records, 8)[0] + 12 if len(records) >= 12 else 0
                    if HEADER_SIZE <= declared < len(records):
                        raise KafkaApiError(INVALID_RECORD,
                                            "Produce v3+ carries exactly one batch per partition")
                    appended = log.append(records, leader_epoch=info.partitions[index].leader_epoch)
                except CorruptRecordError as exc:
                    code, message = CORRUPT_MESSAGE, str(exc)
                except KafkaApiError as exc:
                    code, message = exc.code, str(exc)
                else:
                    base = appended.first_offset
                    append_time = appended.log_append_time
                    log.update_high_watermark(log.log_end_offset)
                    ctx.publish_state(topic, index, log)
                    ctx.notify_data(topic, index)
                    if acks == -1 and ctx.config.flush_on_ack:
                        to_flush.append((log, appended.last_offset + 1))
                start = log.log_start_offset
            if metrics is not None:  # Kafka's BrokerTopicMetrics, counted per partition
                slot = (info.partitions[index].slot
                        if info is not None and 0 <= index < len(info.partitions) else -1)
                if code:
                    metrics.produce_failed(slot)
                    metrics.error(0, code)
                else:
                    metrics.produced(slot, appended.last_offset - appended.first_offset + 1
                                     if appended.batch_count else 0, appended.size)
            out.append((index, code, base, append_time, start, message))
        results.append((topic, out))
    if to_flush:
        loop = asyncio.get_running_loop()
        if metrics is None:
            await asyncio.gather(*(loop.run_in_executor(None, log.flush, upto)
                                   for log, upto in to_flush))
        else:  # Kafka's produce purgatory: acks=all waits here (RemoteTimeMs)
            metrics.add(PRODUCE_WAITS_STARTED)
            waited = perf_counter_ns()
            try:
                await asyncio.gather(*(loop.run_in_executor(None, log.flush, upto)
                                       for log, upto in to_flush))
            finally:
                metrics.add(PRODUCE_WAITS_DONE)
            ctx.remote_ns = waited = perf_counter_ns() - waited
            metrics.observe(PRODUCE_WAIT_HIST, waited)
    if acks == 0:
        return None
    return encode_produce_response(api_version, correlation_id, 0, results)
