"""OffsetDelete (47): remove a group's committed offsets for some partitions (librdkafka's
DeleteConsumerGroupOffsets).  Topics the group's members subscribe to are
GROUP_SUBSCRIBED_TO_TOPIC; a non-consumer group with members is NON_EMPTY_GROUP."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import NOT_COORDINATOR, coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(47, header.api_version)
    coord = coordinator(ctx)
    if coord is None:
        return build(cls, error_code=NOT_COORDINATOR, topics=())
    error, found = await coord.delete_offsets(
        request.group_id, [(t.name, [p.partition_index for p in t.partitions])
                           for t in request.topics])
    return build(cls, error_code=error, topics=tuple(
        build(m.OffsetDeleteResponseTopic, name=name, partitions=tuple(
            build(m.OffsetDeleteResponsePartition, partition_index=p, error_code=e)
            for p, e in parts)) for name, parts in found))
