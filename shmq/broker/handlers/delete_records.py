"""DeleteRecords (21): move a partition's log start offset forward (served by its leader).

Offset -1 means the high watermark; an offset above it (or another negative one) is
OFFSET_OUT_OF_RANGE.  Whole segments below the new start are deleted at once, the log start
offset checkpoint is rewritten before the answer (it survives a crash), and the state table slot
is updated.  Fetches below the new start get OFFSET_OUT_OF_RANGE and clients reset per
``auto.offset.reset``.  A node that does not lead the partition answers NOT_LEADER_OR_FOLLOWER.
Internal topics are INVALID_TOPIC_EXCEPTION, as in Kafka's ``ReplicaManager.deleteRecords``.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.metadata import INTERNAL_TOPICS
from shmq.errors import OffsetOutOfRangeError

NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, 1, 3, 6
INVALID_TOPIC = 17
HIGH_WATERMARK = -1


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(21, header.api_version)
    moved = False
    topics = []
    for t in request.topics:
        parts = []
        info = ctx.metadata.topics.get(t.name)
        for p in t.partitions:
            code, low = NONE, -1
            index = int(p.partition_index)
            if info is None or not 0 <= index < len(info.partitions):
                code = UNKNOWN_TOPIC_OR_PARTITION
            elif t.name in INTERNAL_TOPICS:
                code = INVALID_TOPIC
            elif (log := ctx.log_for(t.name, index)) is None:
                code = NOT_LEADER
            else:
                offset = log.high_watermark if p.offset == HIGH_WATERMARK else int(p.offset)
                try:
                    before = log.log_start_offset
                    low = log.delete_records_before(offset)
                    if low != before:
                        moved = True
                        ctx.publish_state(t.name, index, log)
                except OffsetOutOfRangeError:
                    code = OFFSET_OUT_OF_RANGE
            parts.append(build(m.DeleteRecordsPartitionResult, partition_index=index,
                               low_watermark=low, error_code=code))
        topics.append(build(m.DeleteRecordsTopicResult, name=t.name, partitions=tuple(parts)))
    if moved and ctx.logs is not None:
        ctx.logs.checkpoint()
    return build(cls, topics=tuple(topics))
