"""Produce (0): validate and append each partition's batch, then answer per the acks.

Requests are parsed by hand (``protocol.produce_request``) so the record bytes stay a view of the
receive buffer until the one ``pwritev`` that stores them.  Kafka's rules: v3+ carries exactly one
batch per partition; versions 0..2 are advertised (librdkafka's compression gate, KAFKA-18659)
but refused; a bad size or CRC is CORRUPT_MESSAGE, a batch that breaks a produce rule (record
count, control batch, sequence, magic 0/1, a length past the bytes sent) is INVALID_RECORD, and
neither appends anything; a batch over max.message.bytes is MESSAGE_TOO_LARGE; records whose
timestamps ``message.timestamp.before/after.max.ms`` refuse are INVALID_TIMESTAMP, with one
``record_errors`` entry per record (v8+), as Kafka answers.  acks=0 gets no response at all;
acks=all on a single replica means appended and, with ``flush.on.ack``, fsynced by a group
commit shared by every waiting request.

``produce_partition`` is the one path from a batch to the log: validation, idempotence, append,
high watermark, state table, long-poll wake-ups and the per-partition metrics.  The wire handler
below and the shared-memory rings (``shmq.worker.rings``) both call it, so both give the same
errors and offsets; each then waits for ``flush_for_acks`` before it answers acks=all.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable
from time import perf_counter_ns
from typing import Any, NamedTuple

from shmq._fast._metrics_reference import (
    PRODUCE_WAIT_HIST,
    PRODUCE_WAITS_DONE,
    PRODUCE_WAITS_STARTED,
)
from shmq.broker.context import BrokerContext
from shmq.broker.metadata import INTERNAL_TOPICS
from shmq.errors import CorruptRecordError, InvalidRecordError, KafkaApiError
from shmq.protocol.produce_request import encode_produce_response, parse_produce_request

_BATCH_LENGTH = struct.Struct(">i")
HEADER_SIZE = 61
NONE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, 2, 3, 6
MESSAGE_TOO_LARGE, UNSUPPORTED_VERSION, INVALID_RECORD, INVALID_TOPIC = 10, 35, 87, 17
INVALID_TXN_STATE = 48


class PartitionResult(NamedTuple):
    """One partition's answer, in the Produce response's field order."""

    partition: int
    error_code: int
    base_offset: int
    log_append_time: int
    log_start_offset: int
    error_message: str | None
    record_errors: tuple[tuple[int, str], ...] = ()  # (record index, message), v8+


class Durable(NamedTuple):
    """What an acks=all answer waits for: ``log`` fsynced below ``upto``."""

    log: Any
    upto: int


def produce_partition(ctx: BrokerContext, topic: str, index: int, records: Any,
                      acks: int) -> tuple[PartitionResult, Durable | None]:
    """Validate and append one partition's batch; the answer and, for acks=all with
    ``flush.on.ack``, the flush the answer must wait for."""
    code, base, start, message, append_time = NONE, -1, -1, None, -1
    record_errors: tuple[tuple[int, str], ...] = ()
    durable = None
    appended = None
    info = ctx.metadata.topics.get(topic)
    log = ctx.log_for(topic, index)
    if topic in INTERNAL_TOPICS:
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
        except InvalidRecordError as exc:  # Kafka's InvalidRecordException
            code, message = INVALID_RECORD, str(exc)
        except CorruptRecordError as exc:  # CorruptRecordException: size, CRC
            code, message = CORRUPT_MESSAGE, str(exc)
        except KafkaApiError as exc:
            code, message = exc.code, str(exc)
            record_errors = tuple(getattr(exc, "record_errors", ()))  # InvalidTimestampError
        else:
            base = appended.first_offset
            append_time = appended.log_append_time
            log.update_high_watermark(log.log_end_offset)
            ctx.publish_state(topic, index, log)
            ctx.notify_data(topic, index)
            if acks == -1 and ctx.config.flush_on_ack:
                durable = Durable(log, appended.last_offset + 1)
    if log is not None:
        start = log.log_start_offset
    metrics = ctx.metrics
    if metrics is not None:  # Kafka's BrokerTopicMetrics, counted per partition
        slot = (info.partitions[index].slot
                if info is not None and 0 <= index < len(info.partitions) else -1)
        if code:
            metrics.produce_failed(slot)
            metrics.error(0, code)
        elif appended is not None:
            metrics.produced(slot, appended.last_offset - appended.first_offset + 1
                             if appended.batch_count else 0, appended.size)
    return PartitionResult(index, code, base, append_time, start, message,
                           record_errors), durable


async def flush_for_acks(ctx: BrokerContext, flushes: Iterable[Durable]) -> int:
    """fsync every log below its offset, off the event loop (a group commit per log); returns
    the nanoseconds waited (0 when there was nothing to flush)."""
    todo = list(flushes)
    if not todo:
        return 0
    loop = asyncio.get_running_loop()
    metrics = ctx.metrics
    if metrics is None:
        await asyncio.gather(*(loop.run_in_executor(None, d.log.flush, d.upto) for d in todo))
        return 0
    # Kafka's produce purgatory: acks=all waits here (RemoteTimeMs)
    metrics.add(PRODUCE_WAITS_STARTED)
    waited = perf_counter_ns()
    try:
        await asyncio.gather(*(loop.run_in_executor(None, d.log.flush, d.upto) for d in todo))
    finally:
        metrics.add(PRODUCE_WAITS_DONE)
    waited = perf_counter_ns() - waited
    metrics.observe(PRODUCE_WAIT_HIST, waited)
    return waited


_PID_EPOCH = struct.Struct(">qh")


async def _verify_txn(ctx: BrokerContext, transactional_id: str | None, topic: str, index: int,
                      records: Any) -> int:
    """KIP-890 part 1: a transactional batch that would open a transaction in this partition
    is first checked with the transaction coordinator (``TransactionCoordinator.verify``):
    INVALID_TXN_STATE for a write its transaction does not expect here (ended, partition
    not added), INVALID_PRODUCER_EPOCH for a fenced producer.  Batches of a transaction
    already open here, and of a partition this node does not lead, go on unchecked."""
    pid, epoch = _PID_EPOCH.unpack_from(records, 43)
    log = ctx.log_for(topic, index)
    if pid < 0 or log is None:
        return NONE
    entry = log.producer_state.last_entry(pid)
    if entry is not None and entry.current_txn_first_offset is not None \
            and entry.producer_epoch == epoch:
        return NONE
    if transactional_id is None:
        return INVALID_TXN_STATE
    verify = getattr(ctx.controller, "verify_txn", None)
    if verify is None:
        return NONE
    return int(await verify(transactional_id, pid, epoch, topic, index))


async def handle(ctx: BrokerContext, frame: memoryview, header_size: int, api_version: int,
                 correlation_id: int) -> bytes | None:
    transactional_id, acks, _timeout_ms, topics = parse_produce_request(frame, header_size,
                                                                        api_version)
    results = []
    to_flush = []
    metrics = ctx.metrics
    for topic, partitions in topics:
        out: list[Any] = []
        for index, records in partitions:
            if api_version < 3:
                log = ctx.log_for(topic, index)
                start = log.log_start_offset if log is not None else -1
                if metrics is not None:
                    info = ctx.metadata.topics.get(topic)
                    metrics.produce_failed(info.partitions[index].slot if info is not None
                                           and 0 <= index < len(info.partitions) else -1)
                    metrics.error(0, UNSUPPORTED_VERSION)
                out.append(PartitionResult(index, UNSUPPORTED_VERSION, -1, -1, start, None))
                continue
            if records is not None and len(records) >= HEADER_SIZE \
                    and records[22] & 0x30 == 0x10:  # transactional, not control
                code = await _verify_txn(ctx, transactional_id, topic, index, records)
                if code:
                    log = ctx.log_for(topic, index)
                    out.append(PartitionResult(index, code, -1, -1,
                                               log.log_start_offset if log else -1, None))
                    if metrics is not None:
                        metrics.error(0, code)
                    continue
            result, durable = produce_partition(ctx, topic, index, records, acks)
            out.append(result)
            if durable is not None:
                to_flush.append(durable)
        results.append((topic, out))
    if to_flush:
        waited = await flush_for_acks(ctx, to_flush)
        if metrics is not None:
            ctx.remote_ns = waited
    if acks == 0:
        return None
    return encode_produce_response(api_version, correlation_id, 0, results)
