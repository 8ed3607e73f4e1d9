"""InitProducerId (22): a producer id and epoch.

Without a transactional id: a new producer id, epoch 0, for idempotent producers.  Ids come in
blocks from the controller (Kafka's ProducerIdManager), persisted before use, so an id is never
handed out twice, even across crashes.  With one: the transaction coordinator (controller only;
a worker answers NOT_COORDINATOR) bumps the id's epoch, fencing the previous producer and
aborting its open transaction (``shmq.coordinator.transactions``); v3+ may name the producer id
and epoch the caller had (KIP-360), and a stale pair is PRODUCER_FENCED (INVALID_PRODUCER_EPOCH
before v4).
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._txn import NOT_COORDINATOR, downgrade, millis, txn_coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, _ = response_module(22, header.api_version)
    if request.transactional_id is not None:
        coord = txn_coordinator(ctx)
        if coord is None:
            return build(cls, error_code=NOT_COORDINATOR, producer_id=-1, producer_epoch=-1)
        error, pid, epoch = await coord.init_producer_id(
            request.transactional_id, millis(request.transaction_timeout),
            int(getattr(request, "producer_id", -1)), int(getattr(request, "producer_epoch", -1)))
        return build(cls, error_code=downgrade(22, header.api_version, error), producer_id=pid,
                     producer_epoch=epoch)
    pid = await ctx.next_producer_id()
    return build(cls, error_code=0, producer_id=pid, producer_epoch=0)
