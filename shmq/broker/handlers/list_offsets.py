"""ListOffsets (2): latest (-1), earliest (-2), max timestamp (-3, v7+), earliest local (-4,
v8+) or the first offset whose timestamp is at or after a given one.

"Latest" is the high watermark for read_uncommitted and the last stable offset for
read_committed: a consumer never positions itself past what it may read.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._epochs import check_leader_epoch
from shmq.storage.log import MAX_TIMESTAMP

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, 3, 6


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    version = header.api_version
    cls, m = response_module(2, version)
    committed = getattr(request, "isolation_level", 0) == 1
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            code, offset, ts, epoch = NONE, -1, -1, -1
            info = ctx.metadata.topics.get(t.name)
            log = ctx.log_for(t.name, p.partition_index)
            if info is None or not 0 <= p.partition_index < len(info.partitions):
                code = UNKNOWN_TOPIC_OR_PARTITION
            elif log is None:
                code = NOT_LEADER
            else:
                epoch = info.partitions[p.partition_index].leader_epoch
                code = check_leader_epoch(getattr(p, "current_leader_epoch", -1), epoch)
                if code != NONE:
                    epoch = -1
                elif p.timestamp == -1:
                    offset = log.high_watermark  # LSO == HW until transactions exist
                elif p.timestamp in (-2, -4):
                    offset = log.log_start_offset
                elif p.timestamp == MAX_TIMESTAMP and version >= 7:
                    found = log.offset_for_timestamp(MAX_TIMESTAMP)
                    if found is not None:
                        offset, ts = found
                else:
                    found = log.offset_for_timestamp(p.timestamp)
                    if found is not None and found[0] < log.high_watermark:
                        offset, ts = found
            parts.append(build(m.ListOffsetsPartitionResponse, partition_index=p.partition_index,
                               error_code=code, timestamp=ts, offset=offset, leader_epoch=epoch,
                               old_style_offsets=(offset,) if offset >= 0 else ()))
        topics.append(build(m.ListOffsetsTopicResponse, name=t.name, partitions=tuple(parts)))
    _ = committed
    return build(cls, topics=tuple(topics))
