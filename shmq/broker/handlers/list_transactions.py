"""ListTransactions (66) v0-1: transactional ids, filtered by state, producer id and (v1)
how long they have been running; state names Kafka does not know come back in
``unknown_state_filters``.  Kafka's admin client asks every broker and merges the answers; a
worker coordinates no transactional id, so it answers NONE with an empty list, as a Kafka broker
leading none of ``__transaction_state``'s partitions does."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._txn import txn_coordinator
from shmq.coordinator.transactions import TxnState

KNOWN = {s.kafka_name.lower(): s for s in TxnState}


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(66, header.api_version)
    coord = txn_coordinator(ctx)
    unknown = tuple(s for s in request.state_filters if s.lower() not in KNOWN)
    known = [s for s in request.state_filters if s.lower() in KNOWN]
    if coord is None or (request.state_filters and not known):
        found = []
    else:
        found = coord.list(known, [int(p) for p in request.producer_id_filters],
                           int(getattr(request, "duration_filter", -1)))
    return build(cls, error_code=0, unknown_state_filters=unknown, transaction_states=tuple(
        build(m.TransactionState, transactional_id=t.transactional_id,
              producer_id=t.producer_id, transaction_state=t.state.kafka_name)
        for t in sorted(found, key=lambda t: t.transactional_id)))
