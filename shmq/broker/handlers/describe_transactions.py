"""DescribeTransactions (65) v0: a transactional id's state, as ``kafka-transactions.sh
describe`` shows it; an unknown id is TRANSACTIONAL_ID_NOT_FOUND."""

from __future__ import annotations

import datetime
from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._txn import NOT_COORDINATOR, txn_coordinator

TRANSACTIONAL_ID_NOT_FOUND = 105


def _time(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(65, header.api_version)
    coord = txn_coordinator(ctx)
    states = []
    for tid in request.transactional_ids:
        meta = coord.describe(tid) if coord is not None else None
        if meta is None:
            code = NOT_COORDINATOR if coord is None else TRANSACTIONAL_ID_NOT_FOUND
            states.append(build(m.TransactionState, error_code=code, transactional_id=tid,
                                transaction_state="", transaction_timeout=datetime.timedelta(0),
                                transaction_start_time=_time(0), producer_id=-1,
                                producer_epoch=-1, topics=()))
            continue
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(meta.partitions):
            by_topic.setdefault(t, []).append(p)
        states.append(build(
            m.TransactionState, error_code=0, transactional_id=tid,
            transaction_state=meta.state.kafka_name,
            transaction_timeout=datetime.timedelta(milliseconds=meta.timeout_ms),
            transaction_start_time=_time(max(meta.start_ms, 0)) if meta.start_ms >= 0
            else _time(0),
            producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
            topics=tuple(build(m.TopicData, topic=t, partitions=tuple(ps))
                         for t, ps in by_topic.items())))
    return build(cls, transaction_states=tuple(states))
