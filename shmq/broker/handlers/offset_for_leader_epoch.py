"""OffsetForLeaderEpoch (23): the end offset of a leader epoch (KIP-101/KIP-320).

The answer is Kafka's ``LeaderEpochFileCache.endOffsetFor`` over the partition's epoch history
(``leader-epoch-checkpoint``): the largest epoch at or below the requested one and the offset
where the next epoch starts, or the LEO for the current epoch; -1/-1 (and no error) for an epoch
newer than any.  A ``current_leader_epoch`` below the partition's is FENCED_LEADER_EPOCH, above it
UNKNOWN_LEADER_EPOCH (``Partition.checkCurrentLeaderEpoch``; -1 skips the check).  v0-1 carry
no current leader epoch (no fencing); v0 answers no leader epoch.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._epochs import check_leader_epoch

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, 3, 6


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(23, header.api_version)
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            code, epoch, end = NONE, -1, -1
            info = ctx.metadata.topics.get(t.topic)
            log = ctx.log_for(t.topic, p.partition)
            if info is None or not 0 <= p.partition < len(info.partitions):
                code = UNKNOWN_TOPIC_OR_PARTITION
            elif log is None:
                code = NOT_LEADER
            else:
                current = info.partitions[p.partition].leader_epoch
                code = check_leader_epoch(getattr(p, "current_leader_epoch", -1), current)
                if code == NONE:
                    epoch, end = log.end_offset_for_epoch(p.leader_epoch, current)
            parts.append(build(m.EpochEndOffset, error_code=code, partition=p.partition,
                               leader_epoch=epoch, end_offset=end))
        topics.append(build(m.OffsetForLeaderTopicResult, topic=t.topic, partitions=tuple(parts)))
    return build(cls, topics=tuple(topics))
