"""FindCoordinator (10): where a group's or a transactional id's coordinator lives.

The group and transaction coordinators are later work (they will live in the controller, node
0).  Until then every key gets COORDINATOR_NOT_AVAILABLE, which clients treat as retriable.  The
API must still be offered: librdkafka enables LZ4 (and, in 2.0.2, the balanced consumer) only when
the broker advertises FindCoordinator v0 (rdkafka_feature.c), and otherwise silently sends lz4
batches uncompressed.  v4+ carries a batch of keys (KIP-699).
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module

COORDINATOR_NOT_AVAILABLE = 15
MESSAGE = "The coordinator is not available."


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(10, header.api_version)
    if header.api_version >= 4:
        coordinators = tuple(
            build(m.Coordinator, key=key, node_id=-1, host="", port=-1,
                  error_code=COORDINATOR_NOT_AVAILABLE, error_message=MESSAGE)
            for key in request.coordinator_keys)
        return build(cls, coordinators=coordinators)
    return build(cls, error_code=COORDINATOR_NOT_AVAILABLE, error_message=MESSAGE, node_id=-1,
                 host="", port=-1)
