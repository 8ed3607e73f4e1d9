"""CreateTopics (19): decided and done by the controller (``admin.plan_create_topics``).

A created topic is answered with its id, partition count, replication factor and, from v5, its
effective configs (Kafka's ``CreatableTopicResult``: Java's AdminClient reads them and fails on
a missing list); an error with the defaults (-1, an empty config list).  v0 has no
``validate_only``.
"""

from __future__ import annotations

import uuid
from typing import Any

from shmq.broker.context import BrokerContext, TopicRequest
from shmq.broker.handlers._build import build, response_module

ZERO = uuid.UUID(int=0)


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(19, header.api_version)
    wanted = [TopicRequest(t.name, t.num_partitions, t.replication_factor,
                           {c.name: c.value for c in t.configs},
                           [[a.partition_index, [int(b) for b in a.broker_ids]]
                            for a in t.assignments])
              for t in request.topics]
    results = await ctx.controller.create_topics(wanted,
                                                 bool(getattr(request, "validate_only", False)))
    topics = []
    for r in results:
        configs = tuple(build(m.CreatableTopicConfigs, name=name, value=value, read_only=ro,
                              config_source=source, is_sensitive=sensitive)
                        for name, value, ro, source, sensitive in r.configs or ()
                        ) if header.api_version >= 5 else ()
        topics.append(build(
            m.CreatableTopicResult, name=r.name,
            topic_id=uuid.UUID(r.topic_id) if r.topic_id else ZERO,
            error_code=r.error_code, error_message=r.error_message, topic_config_error_code=0,
            num_partitions=r.num_partitions, replication_factor=r.replication_factor,
            configs=configs))
    return build(cls, topics=tuple(topics))
