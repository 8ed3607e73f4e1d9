"""OffsetFetch (9): a group's committed positions (-1 where none).

v2+: null topics = every partition the group committed, and a group-level error code; v5+:
leader epochs; v7: require_stable (UNSTABLE_OFFSET_COMMIT while a transactional commit is
pending; librdkafka's read_committed consumers set it); v8+: several groups per request.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import NOT_COORDINATOR, coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    version = header.api_version
    cls, m = response_module(9, version)
    coord = coordinator(ctx)
    stable = bool(getattr(request, "require_stable", False))
    if version >= 8:
        groups = []
        for g in request.groups:
            wanted = _wanted(g.topics)
            error, found = _fetch(coord, g.group_id, wanted, stable)
            groups.append(build(m.OffsetFetchResponseGroup, group_id=g.group_id,
                                error_code=error, topics=tuple(
                build(m.OffsetFetchResponseTopics, name=name, partitions=tuple(
                    build(m.OffsetFetchResponsePartitions, partition_index=o.partition,
                          committed_offset=o.offset, committed_leader_epoch=o.leader_epoch,
                          metadata=o.metadata, error_code=o.error) for o in offsets))
                for name, offsets in found)))
        return build(cls, groups=tuple(groups))
    wanted = _wanted(request.topics)
    error, found = _fetch(coord, request.group_id, wanted, stable)
    if version < 2 and error:  # no group-level error before v2: every partition carries it
        found = [(name, [_with_error(o, error) for o in offsets]) for name, offsets in found]
    return build(cls, error_code=error, topics=tuple(
        build(m.OffsetFetchResponseTopic, name=name, partitions=tuple(
            build(m.OffsetFetchResponsePartition, partition_index=o.partition,
                  committed_offset=o.offset, committed_leader_epoch=o.leader_epoch,
                  metadata=o.metadata, error_code=o.error) for o in offsets))
        for name, offsets in found))


def _wanted(topics: Any) -> list[tuple[str, list[int]]] | None:
    if topics is None:
        return None
    return [(t.name, list(t.partition_indexes)) for t in topics]


def _fetch(coord: Any, group_id: str, wanted: list | None, stable: bool) -> tuple[int, list]:
    from shmq.coordinator.coordinator import CommittedOffset

    if coord is None:
        return NOT_COORDINATOR, [(name, [CommittedOffset(p, error=NOT_COORDINATOR) for p in parts])
                                 for name, parts in (wanted or [])]
    return coord.fetch_offsets(group_id, wanted, stable)  # type: ignore[no-any-return]


def _with_error(o: Any, error: int) -> Any:
    o.error = error
    return o
