"""CreatePartitions (37): grow a topic's partition count, decided by the controller.

Counts only grow (INVALID_PARTITIONS otherwise, with Kafka's messages); manual assignments must
give each new partition one replica on a worker.  ``validate_only`` checks and changes nothing.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(37, header.api_version)
    topics = [{"name": t.name, "count": int(t.count),
               "assignments": None if t.assignments is None
               else [[int(b) for b in a.broker_ids] for a in t.assignments]}
              for t in request.topics]
    results = await ctx.controller.create_partitions(topics, bool(request.validate_only))
    return build(cls, results=tuple(
        build(m.CreatePartitionsTopicResult, name=r["name"], error_code=r["error_code"],
              error_message=r["error_message"]) for r in results))
