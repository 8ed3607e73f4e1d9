"""Heartbeat (12): keeps a member's session; REBALANCE_IN_PROGRESS tells it to rejoin."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import NOT_COORDINATOR, coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, _ = response_module(12, header.api_version)
    coord = coordinator(ctx)
    if coord is None:
        return build(cls, error_code=NOT_COORDINATOR)
    error = coord.heartbeat(request.group_id, request.generation_id, request.member_id,
                            getattr(request, "group_instance_id", None))
    return build(cls, error_code=error)
