"""EndTxn (26) v0-4: commit or abort; answered once every partition has its marker and the
transaction's end is durable in ``__transaction_state``."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._txn import NOT_COORDINATOR, downgrade, txn_coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, _ = response_module(26, header.api_version)
    coord = txn_coordinator(ctx)
    if coord is None:
        error = NOT_COORDINATOR
    else:
        error = await coord.end_txn(request.transactional_id, int(request.producer_id),
                                    int(request.producer_epoch), bool(request.committed))
    return build(cls, error_code=downgrade(26, header.api_version, error))
