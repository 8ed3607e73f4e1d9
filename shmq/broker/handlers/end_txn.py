"""EndTxn (26) v0-5: commit or abort; answered once every partition has its marker and the
transaction's end is durable in ``__transaction_state``.  v5 is transaction version 2 (Kafka
decides by the request's version): the epoch is bumped at the end and the answer carries the
producer id and epoch the client goes on with (-1, -1 on an error)."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._txn import NOT_COORDINATOR, downgrade, txn_coordinator

FIRST_V2_VERSION = 5


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, _ = response_module(26, header.api_version)
    coord = txn_coordinator(ctx)
    pid, epoch = -1, -1
    if coord is None:
        error = NOT_COORDINATOR
    else:
        error, pid, epoch = await coord.end_txn(
            request.transactional_id, int(request.producer_id), int(request.producer_epoch),
            bool(request.committed), 2 if header.api_version >= FIRST_V2_VERSION else 0)
    error = downgrade(26, header.api_version, error)
    if header.api_version >= FIRST_V2_VERSION:
        return build(cls, error_code=error, producer_id=pid, producer_epoch=epoch)
    return build(cls, error_code=error)
