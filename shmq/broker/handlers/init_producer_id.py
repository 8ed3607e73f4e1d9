"""InitProducerId (22): a new producer id, epoch 0, for idempotent producers.

Ids come in blocks from the controller (Kafka's ProducerIdManager), persisted before use, so an
id is never handed out twice, even across crashes.  Transactional ids arrive with the
transaction coordinator (a later issue): until then they are refused clearly.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module

TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
INVALID_TRANSACTION_TIMEOUT = 50


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, _ = response_module(22, header.api_version)
    if request.transactional_id is not None:
        return build(cls, error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED, producer_id=-1,
                     producer_epoch=-1)
    pid = await ctx.next_producer_id()
    return build(cls, error_code=0, producer_id=pid, producer_epoch=0)
