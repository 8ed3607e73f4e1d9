"""Transaction markers (Kafka's WriteTxnMarkers, 27, as the partition's leader applies it).

The transaction coordinator (controller) sends ``[topic, partition, producer id, epoch,
commit, transaction version]`` lists over the control channel; each becomes a control batch appended to the
partition (``PartitionLog.append_control``), with the partition's leader epoch, then the high
watermark, last stable offset (state table) and waiting fetches move, and the logs are fsynced
before the answer, as Kafka appends markers with acks=all.  One error code per marker: NONE,
UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, INVALID_PRODUCER_EPOCH or
TRANSACTION_COORDINATOR_FENCED, KAFKA_STORAGE_ERROR for an I/O failure.

On the wire (``handle``: v1-2, as Kafka 4.3 advertises it on its client listener, for its
brokers' transaction coordinators and for ``kafka-transactions.sh abort`` of a hanging
transaction) every node serves the partitions it hosts: a worker its own, the controller
``__consumer_offsets`` (the group coordinator's marker, which commits or drops the producer's
transactional offsets).  A partition the node does not host is UNKNOWN_TOPIC_OR_PARTITION, as
on a Kafka broker without a replica of it; answers are grouped by producer id, as Kafka's.
The marker's ``transaction_version`` (v2; 0 in v1) is checked as Kafka checks it: an older
producer epoch is INVALID_PRODUCER_EPOCH, and for version 2 (the coordinator bumped the epoch
to end the transaction) so is the same epoch while a transaction of it is open, while a retry
of a version 2 marker already written is NONE and writes nothing; an older coordinator epoch
is TRANSACTION_COORDINATOR_FENCED.  There is no authorizer, so no CLUSTER_ACTION check (Kafka
without one allows it too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.metadata import OFFSETS_TOPIC
from shmq.errors import KafkaApiError

log = logging.getLogger("shmq.worker")

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER, KAFKA_STORAGE_ERROR = 0, 3, 6, 56


def _write(topic: str, partition: int, write: Callable[[], Any]) -> tuple[int, Any]:
    """One marker's write: (error code, what ``write`` returned)."""
    try:
        return NONE, write()
    except KafkaApiError as exc:
        return exc.code, None
    except OSError as exc:
        log.error("cannot write a transaction marker into %s-%d: %s", topic, partition, exc)
        return KAFKA_STORAGE_ERROR, None


async def write_markers(ctx: BrokerContext, markers: Sequence[Sequence[Any]],
                        coordinator_epoch: int, elsewhere: int = NOT_LEADER) -> list[int]:
    """``elsewhere``: the code for a partition of a known topic this worker does not host."""
    errors: list[int] = []
    touched: dict[int, Any] = {}
    for topic, partition, producer_id, producer_epoch, commit, *tv in markers:
        info = ctx.metadata.topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            errors.append(UNKNOWN_TOPIC_OR_PARTITION)
            continue
        plog = ctx.log_for(topic, partition)
        if plog is None:
            errors.append(elsewhere)
            continue
        code, _ = _write(topic, partition, partial(
            plog.append_control, int(producer_id), int(producer_epoch), coordinator_epoch,
            bool(commit), leader_epoch=info.partitions[partition].leader_epoch,
            transaction_version=int(tv[0]) if tv else 0))
        if code != NONE:
            errors.append(code)
            continue
        plog.update_high_watermark(plog.log_end_offset)
        ctx.publish_state(topic, partition, plog)
        ctx.notify_data(topic, partition)
        touched[id(plog)] = plog
        errors.append(NONE)
    if touched:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.gather(*(loop.run_in_executor(None, plog.flush)
                                   for plog in touched.values()))
        except OSError as exc:
            log.error("cannot flush transaction markers: %s", exc)
            return [KAFKA_STORAGE_ERROR if e == NONE else e for e in errors]
    return errors


async def _offsets_markers(ctx: BrokerContext, markers: Sequence[Sequence[Any]],
                           coordinator_epoch: int) -> list[int]:
    """On the controller: markers into ``__consumer_offsets`` through the group coordinator."""
    coordinator = ctx.coordinator
    errors: list[int] = []
    written: dict[int, int] = {}
    for topic, partition, producer_id, producer_epoch, commit, *tv in markers:
        if topic != OFFSETS_TOPIC or not 0 <= partition < coordinator.log.partitions:
            errors.append(UNKNOWN_TOPIC_OR_PARTITION)
            continue
        code, where = _write(topic, partition, partial(
            coordinator.write_txn_marker, partition, producer_id, producer_epoch,
            coordinator_epoch, commit, int(tv[0]) if tv else 0))
        if code != NONE:
            errors.append(code)
            continue
        p, end = where
        written[p] = max(end, written.get(p, 0))
        errors.append(NONE)
    try:
        for p, end in written.items():
            await coordinator.log.durable(p, end)
    except OSError as exc:
        log.error("cannot flush transaction markers: %s", exc)
        return [KAFKA_STORAGE_ERROR if e == NONE else e for e in errors]
    return errors


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(27, header.api_version)
    on_controller = getattr(ctx, "coordinator", None) is not None
    results: dict[int, dict[str, dict[int, int]]] = {}  # producer id -> topic -> partition
    for marker in request.markers:
        pid, epoch = int(marker.producer_id), int(marker.producer_epoch)
        tv = int(getattr(marker, "transaction_version", 0))
        wanted = [(t.name, int(p), pid, epoch, bool(marker.transaction_result), tv)
                  for t in marker.topics for p in t.partition_indexes]
        if on_controller:
            codes = await _offsets_markers(ctx, wanted, int(marker.coordinator_epoch))
        else:
            codes = await write_markers(ctx, wanted, int(marker.coordinator_epoch),
                                        elsewhere=UNKNOWN_TOPIC_OR_PARTITION)
        topics = results.setdefault(pid, {})
        for (topic, partition, *_), code in zip(wanted, codes, strict=True):
            topics.setdefault(topic, {})[partition] = code
    return build(cls, markers=tuple(
        build(m.WritableTxnMarkerResult, producer_id=pid, topics=tuple(
            build(m.WritableTxnMarkerTopicResult, name=topic, partitions=tuple(
                build(m.WritableTxnMarkerPartitionResult, partition_index=p, error_code=code)
                for p, code in parts.items()))
            for topic, parts in topics.items()))
        for pid, topics in results.items()))
