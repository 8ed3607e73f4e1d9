"""CreateTopics (19): validated here, created by the controller."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext, TopicRequest
from shmq.broker.handlers._build import build, response_module


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(19, header.api_version)
    wanted = [TopicRequest(t.name, t.num_partitions, t.replication_factor,
                           {c.name: c.value for c in t.configs})
              for t in request.topics]
    results = await ctx.controller.create_topics(wanted, bool(request.validate_only))
    topics = []
    for r in results:
        import uuid

        topics.append(build(
            m.CreatableTopicResult, name=r.name,
            topic_id=uuid.UUID(r.topic_id) if r.topic_id else uuid.UUID(int=0),
            error_code=r.error_code, error_message=r.error_message, topic_config_error_code=0,
            num_partitions=r.num_partitions, replication_factor=1 if r.error_code == 0 else -1,
            configs=None))
    return build(cls, topics=tuple(topics))
