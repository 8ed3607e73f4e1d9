"""AddOffsetsToTxn (25): a group's ``__consumer_offsets`` partition joins the transaction (its
TxnOffsetCommit offsets then take effect with the transaction's COMMIT marker)."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._txn import NOT_COORDINATOR, downgrade, txn_coordinator

INVALID_GROUP_ID = 24


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, _ = response_module(25, header.api_version)
    coord = txn_coordinator(ctx)
    if coord is None:
        error = NOT_COORDINATOR
    elif not request.group_id:
        error = INVALID_GROUP_ID
    else:
        if ctx.controller is not None:
            await ctx.controller.create_internal_topic("__consumer_offsets", wait=False)
        error = await coord.add_offsets(request.transactional_id, int(request.producer_id),
                                        int(request.producer_epoch), request.group_id)
    return build(cls, error_code=downgrade(25, header.api_version, error))
