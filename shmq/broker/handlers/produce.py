"""Produce (0): validate and append each partition's batch, then answer per the acks.

Requests are parsed by hand (``protocol.produce_request``) so the record bytes stay a view of the
receive buffer until the one ``pwritev`` that stores them.  Kafka's rules: v3+ carries exactly one
batch per partition; versions 0..2 are advertised (librdkafka's compression gate, KAFKA-18659)
but refused; a bad size or CRC is CORRUPT_MESSAGE, a batch that breaks a produce rule (record
count, control batch, sequence, magic 0/1, a length past the bytes sent) is INVALID_RECORD, and
neither appends anything; a batch over max.message.bytes is MESSAGE_TOO_LARGE; LogValidator's
per-record errors (a record without a key on a compacted topic: INVALID_RECORD; timestamps that
``message.timestamp.before/after.max.ms`` refuse: INVALID_TIMESTAMP) carry one ``record_errors``
entry per record (v8+) and Kafka's summary message; acks other than 0, 1 and -1 are
INVALID_REQUIRED_ACKS.  Other errors answer base offset -1 and no message, as Kafka's
PartitionResponse(error) does, and log start -1 except where Kafka's catch-all answers it
(INVALID_RECORD, sequence and epoch errors).  acks=0 gets no response at all; acks=all on a
single replica means appended and, with ``flush.on.ack``, fsynced by a group commit shared by
every waiting request.

``produce_partition`` is the one path from a batch to the log: validation, idempotence, append,
high watermark, state table, long-poll wake-ups and the per-partition metrics.  The wire handler
below and the shared-memory rings (``shmq.worker.rings``) both call it, so both give the same
errors and offsets; each then waits for ``flush_for_acks`` before it answers acks=all.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import struct
from collections.abc import Iterable
from functools import partial
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
from shmq.limits import Throttled
from shmq.protocol.produce_request import encode_produce_response, parse_produce_request
from shmq.storage.log import RecordTooLargeError, RecordValidationError

_BATCH_LENGTH = struct.Struct(">i")
HEADER_SIZE = 61
NONE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, 2, 3, 6
MESSAGE_TOO_LARGE, UNSUPPORTED_VERSION, INVALID_RECORD, INVALID_TOPIC = 10, 35, 87, 17
INVALID_REQUIRED_ACKS = 21
KAFKA_STORAGE_ERROR = 56
INVALID_TXN_STATE = 48

log = logging.getLogger(__name__)
_throttled = Throttled(log)


def storage_failed(ctx: BrokerContext, topic: str, index: int, plog: Any, exc: OSError,
                   what: str) -> str:
    """A write the disk refused (ENOSPC, EDQUOT, EIO...): the message for the client, the
    partition's state-table flags (what Metadata, ``shmq topics --describe`` and the metrics
    show) and one line in the broker log per interval for all partitions (a full disk fails
    every append)."""
    reason = f"{what} failed: {exc.strerror or exc}"
    if plog.storage_error is None:
        plog.storage_error = reason
        plog.storage_errno = exc.errno or errno.EIO
        ctx.publish_state(topic, index, plog)
    _throttled(logging.ERROR, ("storage", exc.errno),
               "%s-%d: %s; answering KAFKA_STORAGE_ERROR to its producers until a write "
               "succeeds again (reads and other partitions are served)",
               topic, index, reason)
    return reason


def storage_recovered(topic: str, index: int, plog: Any) -> None:
    """A write succeeded again (the caller publishes the state, which clears the flags)."""
    plog.storage_error = None
    plog.storage_errno = None
    _throttled(logging.WARNING, "storage-recovered", "%s-%d: appends succeed again",
               topic, index)


class PartitionResult(NamedTuple):
    """One partition's answer, in the Produce response's field order."""

    partition: int
    error_code: int
    base_offset: int
    log_append_time: int
    log_start_offset: int
    error_message: str | None
    record_errors: tuple[tuple[int, str], ...] = ()  # (batch index, message), v8+


class Durable(NamedTuple):
    """What an acks=all answer waits for: ``log`` fsynced below ``upto``."""

    log: Any
    upto: int


def produce_partition(ctx: BrokerContext, topic: str, index: int, records: Any,
                      acks: int) -> tuple[PartitionResult, Durable | None]:
    """Validate and append one partition's batch; the answer and, for acks=all with
    ``flush.on.ack``, the flush the answer must wait for."""
    code, base, start, append_time = NONE, -1, -1, -1
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()
    durable = None
    appended = None
    info = ctx.metadata.topics.get(topic)
    # the partition's metadata, looked up once (leader, epoch, state and metrics slots)
    part = info.partitions[index] if info is not None and 0 <= index < len(info.partitions) \
        else None
    log = None
    if part is not None:
        # ``ctx.log_for`` with the partition looked up once: an open log is taken from the log
        # manager here, a log not open yet (or created at first use) comes from ``log_for``
        logs = ctx.logs
        if logs is not None and part.leader == ctx.node_id:
            log = logs.get_log(topic, index)
            if log is None:
                log = ctx.log_for(topic, index)
    if acks not in (-1, 0, 1):
        code = INVALID_REQUIRED_ACKS
    elif topic in INTERNAL_TOPICS:
        code = INVALID_TOPIC
    elif part is None:
        code = UNKNOWN_TOPIC_OR_PARTITION
    elif log is None:
        code = NOT_LEADER
    elif (code := _request_rule(records)) != NONE:
        pass
    else:
        try:
            appended = log.append(records, leader_epoch=part.leader_epoch)
        except RecordValidationError as exc:  # LogValidator's per-record errors
            code, message, start = exc.code, str(exc), log.log_start_offset
            record_errors = tuple(exc.record_errors)
        except InvalidRecordError:  # Kafka's InvalidRecordException: its catch-all
            code, start = INVALID_RECORD, log.log_start_offset
        except CorruptRecordError:  # CorruptRecordException: size, CRC
            code = CORRUPT_MESSAGE
        except RecordTooLargeError:
            code = MESSAGE_TOO_LARGE
        except KafkaApiError as exc:  # sequence and epoch errors: Kafka's catch-all
            code, start = exc.code, log.log_start_offset  # answers the log start
        except OSError as exc:  # the disk: nothing of the batch stays (LogSegment.append)
            code, message = KAFKA_STORAGE_ERROR, storage_failed(ctx, topic, index, log, exc, "append")
        else:
            if log.storage_error is not None:
                storage_recovered(topic, index, log)
            base = appended.first_offset
            append_time = appended.log_append_time
            start = log.log_start_offset
            log.update_high_watermark(appended.last_offset + 1 if appended.batch_count
                                      else log.log_end_offset)
            ctx.publish_partition(part, log)
            ctx.notify_data(topic, index)
            if (acks == -1 and ctx.config.flush_on_ack) or log.flush_requested:
                # flush.messages / flush.ms due: flushed in a thread before the answer, as
                # Kafka's append does it before answering (its handler thread blocks; our
                # event loop must not)
                durable = Durable(log, appended.last_offset + 1)
    metrics = ctx.metrics
    if metrics is not None:  # Kafka's BrokerTopicMetrics, counted per partition
        slot = part.slot if part is not None else -1
        if code:
            metrics.produce_failed(slot)
            metrics.error(0, code)
        elif appended is not None:
            metrics.produced(slot, appended.last_offset - appended.first_offset + 1
                             if appended.batch_count else 0, appended.size)
    return PartitionResult(index, code, base, append_time, start, message, record_errors), durable


async def flush_for_acks(ctx: BrokerContext,
                         flushes: Iterable[Durable]) -> tuple[int, dict[int, OSError]]:
    """fdatasync every log below its offset, off the event loop (a group commit per log: the
    record bytes only, ``PartitionLog.flush(checkpoint=False)``; the recovery point follows at
    its checkpoints); returns
    the nanoseconds waited (0 when there was nothing to flush) and the logs whose fsync failed
    (``id(log)``: the error), whose acks=all answers are KAFKA_STORAGE_ERROR."""
    todo = list(flushes)
    if not todo:
        return 0, {}
    loop = asyncio.get_running_loop()
    metrics = ctx.metrics
    if metrics is not None:  # Kafka's produce purgatory: acks=all waits here (RemoteTimeMs)
        metrics.add(PRODUCE_WAITS_STARTED)
    waited = perf_counter_ns()
    try:
        outcomes = await asyncio.gather(
            *(loop.run_in_executor(None, partial(d.log.flush, d.upto, checkpoint=False))
              for d in todo),
            return_exceptions=True)
    finally:
        if metrics is not None:
            metrics.add(PRODUCE_WAITS_DONE)
    failed: dict[int, OSError] = {}
    for d, outcome in zip(todo, outcomes, strict=True):
        if isinstance(outcome, OSError):
            failed[id(d.log)] = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
    if metrics is None:
        return 0, failed
    waited = perf_counter_ns() - waited
    metrics.observe(PRODUCE_WAIT_HIST, waited)
    return waited, failed


_PID_EPOCH = struct.Struct(">qh")
_SEQ = _DELTA = struct.Struct(">i")


async def _verify_txn(ctx: BrokerContext, transactional_id: str | None, topic: str, index: int,
                      records: Any, api_version: int) -> tuple[int, str | None]:
    """A transactional batch that would open a transaction in this partition goes to the
    transaction coordinator first: (error code, message).  Batches of a transaction already
    open here, and of a partition this node does not lead, go on unchecked.

    v3-11, KIP-890 part 1 (``TransactionCoordinator.verify``): INVALID_TXN_STATE for a write
    its transaction does not expect here (ended, partition not added), INVALID_PRODUCER_EPOCH
    for a fenced producer.  v12, transaction version 2: the partition joins the transaction
    (``add_partition_implicitly``), as Kafka's leader asks through AddPartitionsToTxnManager;
    the coordinator's answer is mapped as ``ReplicaManager`` maps it (``_TV2_ERRORS``)."""
    pid, epoch = _PID_EPOCH.unpack_from(records, 43)
    log = ctx.log_for(topic, index)
    if pid < 0 or log is None:
        return NONE, None
    entry = log.producer_state.last_entry(pid)
    if entry is not None and entry.producer_epoch == epoch:
        if entry.current_txn_first_offset is not None:
            return NONE, None
        # a retry of a batch already in the log (its answer was lost: the worker died, the
        # connection broke) whose transaction has ended since: answered as the duplicate it is,
        # with its offsets, not INVALID_TXN_STATE, which tells the client it was never written
        # (librdkafka then hands the same sequence numbers to the next transaction's records,
        # and the log takes them for duplicates of the aborted batch: lost).  Nothing is
        # appended, so no transaction can hang.
        first_seq, delta = _SEQ.unpack_from(records, 53)[0], _DELTA.unpack_from(records, 23)[0]
        last_seq = (first_seq + delta) % (1 << 31)
        if any(b.first_seq == first_seq and b.last_seq == last_seq for b in entry.batches):
            return NONE, None
    if transactional_id is None:
        return INVALID_TXN_STATE, None
    if api_version < FIRST_ADD_PARTITION_VERSION:
        verify = getattr(ctx.controller, "verify_txn", None)
        if verify is None:
            return NONE, None
        return int(await verify(transactional_id, pid, epoch, topic, index)), None
    add = getattr(ctx.controller, "add_txn_partition", None)
    if add is None:
        return NONE, None
    answer = int(await add(transactional_id, pid, epoch, topic, index))
    code = _TV2_ERRORS.get(answer, answer)
    if code == NOT_ENOUGH_REPLICAS:
        return code, ("Unable to verify the partition has been added to the transaction. "
                      f"Underlying error: {_NAMES[answer]}")
    if code == INVALID_TXN_STATE:
        return code, "Partition was not added to the transaction"
    return code, None


FIRST_ADD_PARTITION_VERSION = 12
NOT_ENOUGH_REPLICAS = 19
# the coordinator's answers to a partition leader's add, as the producer gets them (Kafka's
# AddPartitionsToTxnManager and ReplicaManager): a fenced epoch is the produce path's
# INVALID_PRODUCER_EPOCH; the coordinator not (yet) reachable is NOT_ENOUGH_REPLICAS, which
# producers retry without a metadata refresh; CONCURRENT_TRANSACTIONS stays itself for v12
_NAMES = {13: "NETWORK_EXCEPTION", 14: "COORDINATOR_LOAD_IN_PROGRESS",
          15: "COORDINATOR_NOT_AVAILABLE", 16: "NOT_COORDINATOR"}
_TV2_ERRORS = {90: 47, 13: NOT_ENOUGH_REPLICAS, 14: NOT_ENOUGH_REPLICAS,
               15: NOT_ENOUGH_REPLICAS, 16: NOT_ENOUGH_REPLICAS}


async def handle(ctx: BrokerContext, frame: memoryview, header_size: int, api_version: int,
                 correlation_id: int) -> bytes | None:
    """The response to one Produce request (None for acks=0), once it may leave."""
    out = await append(ctx, frame, header_size, api_version, correlation_id)
    if isinstance(out, asyncio.Future):
        response, ctx.remote_ns, _ = await out
        return response
    return out


async def append(ctx: BrokerContext, frame: memoryview, header_size: int, api_version: int,
                 correlation_id: int) -> bytes | None | asyncio.Future:
    """Validate and append the request's batches now; the response (None for acks=0), or, when
    it must wait for fsyncs (acks=all with ``flush.on.ack``, flush.messages / flush.ms due), a
    future of ``(response, nanoseconds waited, perf_counter_ns when done)``.

    The connection pipelines on the future: the next Produce request of the same connection is
    appended while this one's fsync runs, and the group commit covers both (one request at a
    time, each appended only after the previous one's fsync, made a librdkafka producer's
    requests queue behind fsyncs: p99 115 ms at 10,000 msg/s).  Answers still leave in request
    order, and appends happen in request order, so what a client sees is what Kafka answers."""
    transactional_id, acks, _timeout_ms, topics = parse_produce_request(frame, header_size,
                                                                        api_version)
    results = []
    to_flush: list[Durable] = []
    flushed_parts: list[tuple[list[Any], int, Durable]] = []  # (answers, slot, its flush)
    metrics = ctx.metrics
    for topic, partitions in topics:
        out: list[Any] = []
        for index, records in partitions:
            if api_version < 3 and acks in (-1, 0, 1):
                if metrics is not None:
                    info = ctx.metadata.topics.get(topic)
                    metrics.produce_failed(info.partitions[index].slot if info is not None
                                           and 0 <= index < len(info.partitions) else -1)
                    metrics.error(0, UNSUPPORTED_VERSION)
                out.append(PartitionResult(index, UNSUPPORTED_VERSION, -1, -1, -1, None))
                continue
            if records is not None and len(records) >= HEADER_SIZE \
                    and records[22] & 0x30 == 0x10:  # transactional, not control
                code, message = await _verify_txn(ctx, transactional_id, topic, index, records,
                                                  api_version)
                if code:  # Kafka's UNKNOWN_LOG_APPEND_INFO: no offsets, log start -1
                    out.append(PartitionResult(index, code, -1, -1, -1, message))
                    if metrics is not None:
                        metrics.error(0, code)
                    continue
            result, durable = produce_partition(ctx, topic, index, records, acks)
            out.append(result)
            if durable is not None:
                to_flush.append(durable)
                flushed_parts.append((out, len(out) - 1, durable))
        results.append((topic, out))
    if to_flush:
        return asyncio.ensure_future(_answer_when_flushed(
            ctx, to_flush, flushed_parts, results, acks, api_version, correlation_id))
    if acks == 0:
        return None
    return encode_produce_response(api_version, correlation_id, 0, results)


async def _answer_when_flushed(ctx: BrokerContext, to_flush: list[Durable],
                               flushed_parts: list[tuple[list[Any], int, Durable]],
                               results: list[tuple[str, list[Any]]], acks: int, api_version: int,
                               correlation_id: int) -> tuple[bytes | None, int, int]:
    waited, failed = await flush_for_acks(ctx, to_flush)
    for out, slot, durable in flushed_parts:
        exc = failed.get(id(durable.log))
        if exc is not None:
            topic = next(t for t, o in results if o is out)
            out[slot] = out[slot]._replace(
                error_code=KAFKA_STORAGE_ERROR, base_offset=-1, log_append_time=-1,
                error_message=storage_failed(ctx, topic, out[slot].partition, durable.log,
                                             exc, "fsync"))
    response = None if acks == 0 else encode_produce_response(api_version, correlation_id, 0,
                                                             results)
    return response, waited, perf_counter_ns()


def _request_rule(records: Any) -> int:
    """Kafka's ``ProduceRequest.validateRecords`` (v3+), checked before the log is asked and
    answered without a log start: exactly one whole batch of magic 2 per partition.  No batch
    (none sent, or fewer bytes than its header declares) and magic 0/1 are INVALID_RECORD, and so
    is a second batch; a size or magic no batch can have is CORRUPT_MESSAGE (the batch
    iterator's).  The header alone decides; append() validates size and CRC once (validating
    here too computed every produced byte's CRC twice)."""
    n = 0 if records is None else len(records)
    if n < 12:
        return INVALID_RECORD
    size = _BATCH_LENGTH.unpack_from(records, 8)[0] + 12
    if size < 14:  # LegacyRecord.RECORD_OVERHEAD_V0
        return CORRUPT_MESSAGE
    if n < 17 or size > n:
        return INVALID_RECORD
    magic = records[16]
    if magic > 2:  # a negative or unknown magic byte
        return CORRUPT_MESSAGE
    if magic != 2 or HEADER_SIZE <= size < n:
        return INVALID_RECORD
    return NONE
