"""DeleteTopics (20): by name, or from v6 by topic id (``ControllerApis.deleteTopics``).

A topic named twice, an id given twice, a topic given by name and id at once, or neither, is
INVALID_REQUEST and nothing of it is deleted; an unknown id is UNKNOWN_TOPIC_ID with the id
echoed and no name, an unknown name UNKNOWN_TOPIC_OR_PARTITION.  The controller resolves ids and
names against the metadata it owns and deletes.
"""

from __future__ import annotations

import uuid
from typing import Any

from shmq.broker.context import BrokerContext, TopicResult
from shmq.broker.handlers._build import build, response_module

INVALID_REQUEST = 42
ZERO = uuid.UUID(int=0)


class _Once:
    """Kafka's provided/duplicate sets: what was given exactly once, in request order, and
    what was given more than once."""

    def __init__(self) -> None:
        self.once: dict[Any, None] = {}
        self.twice: dict[Any, None] = {}

    def add(self, key: Any) -> None:
        if key in self.twice:
            return
        if key in self.once:
            del self.once[key]
            self.twice[key] = None
        else:
            self.once[key] = None


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(20, header.api_version)
    answered: list[TopicResult] = []
    names, ids = _Once(), _Once()
    if header.api_version >= 6:
        for t in request.topics:
            topic_id = t.topic_id or ZERO
            if t.name is None and topic_id == ZERO:
                answered.append(TopicResult(None, INVALID_REQUEST,
                                            "Neither topic name nor id were specified."))
            elif t.name is None:
                ids.add(topic_id)
            elif topic_id == ZERO:
                names.add(t.name)
            else:
                answered.append(TopicResult(t.name, INVALID_REQUEST, "You may not specify both "
                                            "topic name and topic id.", str(topic_id)))
    else:
        for name in request.topic_names:
            names.add(name)
    answered += [TopicResult(n, INVALID_REQUEST, "Duplicate topic name.") for n in names.twice]
    answered += [TopicResult(None, INVALID_REQUEST, "Duplicate topic id.", str(i))
                 for i in ids.twice]
    if names.once or ids.once:
        answered += await ctx.controller.delete_topics(list(names.once),
                                                       [str(i) for i in ids.once])
    out = tuple(build(m.DeletableTopicResult, name=r.name,
                      topic_id=uuid.UUID(r.topic_id) if r.topic_id else ZERO,
                      error_code=r.error_code, error_message=r.error_message)
                for r in answered)
    return build(cls, responses=out)
