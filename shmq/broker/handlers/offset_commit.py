"""OffsetCommit (8): store a group's positions; answered once they are durable.

v0 has no generation or member (a simple group's commit: generation -1, member ""; Kafka 3.9
kept v0 commits in ZooKeeper, shmq in the coordinator like any other); v1 adds them and a commit
timestamp per partition, kept as the offset's commit time unless -1; v2–v4 carry a retention time
(ignored, as Kafka does since 2.1: offsets.retention.minutes rules); v6+: committed leader epoch;
v7+: group_instance_id; v9: GROUP_ID_NOT_FOUND instead of ILLEGAL_GENERATION for an unknown group.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import NOT_COORDINATOR, coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(8, header.api_version)
    topics = [(t.name, [(p.partition_index, p.committed_offset,
                         getattr(p, "committed_leader_epoch", -1), p.committed_metadata,
                         getattr(p, "commit_timestamp", -1))
                        for p in t.partitions]) for t in request.topics]
    coord = coordinator(ctx)
    if coord is None:
        errors = [[NOT_COORDINATOR] * len(parts) for _, parts in topics]
    else:
        errors = await coord.commit_offsets(
            request.group_id, getattr(request, "generation_id_or_member_epoch", -1),
            getattr(request, "member_id", ""), getattr(request, "group_instance_id", None),
            topics, header.api_version)
    return build(cls, topics=tuple(
        build(m.OffsetCommitResponseTopic, name=name, partitions=tuple(
            build(m.OffsetCommitResponsePartition, partition_index=p[0], error_code=e)
            for p, e in zip(parts, errs, strict=True)))
        for (name, parts), errs in zip(topics, errors, strict=True)))
