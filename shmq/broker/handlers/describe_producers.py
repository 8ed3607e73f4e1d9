"""DescribeProducers (61): the idempotent/transactional producers a partition's leader knows.

Served by the leader from the log's producer state (the last sequence and timestamp each
producer id wrote, its epoch, and the first offset of an open transaction); another node answers
NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, 3, 6


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(61, header.api_version)
    topics = []
    for t in request.topics:
        info = ctx.metadata.topics.get(t.name)
        parts = []
        for index in t.partition_indexes:
            code, message, active = NONE, None, ()
            if info is None or not 0 <= index < len(info.partitions):
                code = UNKNOWN_TOPIC_OR_PARTITION
                message = "This server does not host this topic-partition."
            elif (log := ctx.log_for(t.name, index)) is None:
                code = NOT_LEADER
                message = "This server is not the leader for that topic-partition."
            else:
                active = tuple(
                    build(m.ProducerState, producer_id=e.producer_id,
                          producer_epoch=e.producer_epoch, last_sequence=e.last_seq,
                          last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
                          current_txn_start_offset=-1 if e.current_txn_first_offset is None
                          else e.current_txn_first_offset)
                    for e in sorted(log.producer_state.producers.values(),
                                    key=lambda e: e.producer_id))
            parts.append(build(m.PartitionResponse, partition_index=index, error_code=code,
                               error_message=message, active_producers=active))
        topics.append(build(m.TopicResponse, name=t.name, partitions=tuple(parts)))
    return build(cls, topics=tuple(topics))
