"""Transaction markers in a worker (Kafka's WriteTxnMarkers, 27, as the leader applies it).

The transaction coordinator (controller) sends ``[topic, partition, producer id, epoch,
commit]`` lists over the control channel; each becomes a control batch appended to the
partition (``PartitionLog.append_control``), with the partition's leader epoch, then the high
watermark, last stable offset (state table) and waiting fetches move, and the logs are fsynced
before the answer, as Kafka appends markers with acks=all.  One error code per marker: NONE,
UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, INVALID_PRODUCER_EPOCH or
TRANSACTION_COORDINATOR_FENCED, KAFKA_STORAGE_ERROR for an I/O failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from shmq.broker.context import BrokerContext
from shmq.errors import KafkaApiError

log = logging.getLogger("shmq.worker")

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER, KAFKA_STORAGE_ERROR = 0, 3, 6, 56


async def write_markers(ctx: BrokerContext, markers: Sequence[Sequence[Any]],
                        coordinator_epoch: int) -> list[int]:
    errors: list[int] = []
    touched: dict[int, Any] = {}
    for topic, partition, producer_id, producer_epoch, commit in markers:
        info = ctx.metadata.topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            errors.append(UNKNOWN_TOPIC_OR_PARTITION)
            continue
        plog = ctx.log_for(topic, partition)
        if plog is None:
            errors.append(NOT_LEADER)
            continue
        try:
            plog.append_control(int(producer_id), int(producer_epoch), coordinator_epoch,
                                bool(commit), leader_epoch=info.partitions[partition].leader_epoch)
        except KafkaApiError as exc:
            errors.append(exc.code)
            continue
        except OSError as exc:
            log.error("cannot write a transaction marker into %s-%d: %s", topic, partition, exc)
            errors.append(KAFKA_STORAGE_ERROR)
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
