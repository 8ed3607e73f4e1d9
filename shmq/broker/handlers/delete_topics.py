"""DeleteTopics (20): by name (v6 may name topics by id)."""

from __future__ import annotations

import uuid
from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module

UNKNOWN_TOPIC_ID = 100


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(20, header.api_version)
    if header.api_version >= 6:
        by_id = {t.topic_id: t.name for t in ctx.metadata.topics.values()}
        names = []
        for t in request.topics:
            if t.name is None and t.topic_id is not None:
                names.append(by_id.get(str(t.topic_id), f"<id {t.topic_id}>"))
            else:
                names.append(t.name)
    else:
        names = list(request.topic_names)
    results = await ctx.controller.delete_topics(names)
    out = tuple(build(m.DeletableTopicResult, name=r.name,
                      topic_id=uuid.UUID(r.topic_id) if r.topic_id else uuid.UUID(int=0),
                      error_code=r.error_code, error_message=r.error_message)
                for r in results)
    return build(cls, responses=out)
