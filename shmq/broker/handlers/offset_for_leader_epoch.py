"""OffsetForLeaderEpoch (23): the end offset of a leader epoch (KIP-101/KIP-320).

Every partition has had one leader epoch so far (single replica, epoch bumped only when a
partition moves to another worker), so the answer for an epoch at or below the current one is
(that epoch's latest known epoch, LEO).
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER, FENCED_EPOCH, UNKNOWN_EPOCH = 0, 3, 6, 73, 74


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
                if 0 <= p.current_leader_epoch < current:
                    code = FENCED_EPOCH
                elif p.current_leader_epoch > current:
                    code = UNKNOWN_EPOCH
                elif p.leader_epoch <= current:
                    epoch, end = current, log.log_end_offset
            parts.append(build(m.EpochEndOffset, error_code=code, partition=p.partition,
                               leader_epoch=epoch, end_offset=end))
        topics.append(build(m.OffsetForLeaderTopicResult, topic=t.topic, partitions=tuple(parts)))
    return build(cls, topics=tuple(topics))
