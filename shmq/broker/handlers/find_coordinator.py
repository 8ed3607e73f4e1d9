"""FindCoordinator (10): where a group's or a transactional id's coordinator lives.

The group and transaction coordinators live in the controller, Kafka node 0: every group key
and every transactional id is answered with node 0's listener, from any node.  The API must be offered in any
case: librdkafka enables LZ4 (and, in 2.0.2, the balanced consumer) only when the broker
advertises FindCoordinator v0 (rdkafka_feature.c).  v1+ carries a key type (0 group,
1 transaction); v4+ a batch of keys (KIP-699).  The first group key lists ``__consumer_offsets``,
the first transactional id ``__transaction_state``, as Kafka creates them then.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.metadata import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC

NONE, COORDINATOR_NOT_AVAILABLE, INVALID_REQUEST = 0, 15, 42
GROUP, TRANSACTION = 0, 1
COORDINATOR_NODE = 0


def _find(ctx: BrokerContext, key_type: int) -> tuple[int, str | None, int, str, int]:
    """(error, message, node id, host, port) for one key."""
    if key_type not in (GROUP, TRANSACTION):
        return INVALID_REQUEST, f"Unknown coordinator type {key_type}", -1, "", -1
    address = ctx.metadata.brokers.get(COORDINATOR_NODE)
    if address is None:
        return COORDINATOR_NOT_AVAILABLE, "The coordinator is not available.", -1, "", -1
    return NONE, "", COORDINATOR_NODE, address[0], address[1]  # Kafka: Errors.NONE.message()


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(10, header.api_version)
    key_type = int(getattr(request, "key_type", GROUP))
    internal = {GROUP: OFFSETS_TOPIC, TRANSACTION: TRANSACTION_STATE_TOPIC}.get(key_type)
    if internal is not None and internal not in ctx.metadata.topics \
            and ctx.controller is not None:
        await ctx.controller.create_internal_topic(internal, wait=False)
    error, message, node, host, port = _find(ctx, key_type)
    if header.api_version >= 4:
        coordinators = tuple(
            build(m.Coordinator, key=key, node_id=node, host=host, port=port,
                  error_code=error, error_message=message)
            for key in request.coordinator_keys)
        return build(cls, coordinators=coordinators)
    return build(cls, error_code=error, error_message=message, node_id=node, host=host, port=port)
