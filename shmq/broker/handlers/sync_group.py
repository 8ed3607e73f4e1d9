"""SyncGroup (14): the leader hands in the assignment; followers wait for theirs (a long poll).

v3+: group_instance_id; v5: protocol type and name, checked against the group's.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import NOT_COORDINATOR, coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, _ = response_module(14, header.api_version)
    coord = coordinator(ctx)
    if coord is None:
        return build(cls, error_code=NOT_COORDINATOR, assignment=b"", protocol_type=None,
                     protocol_name=None)
    parked = perf_counter_ns()
    r = await coord.sync_group(
        request.group_id, request.generation_id, request.member_id,
        getattr(request, "group_instance_id", None), getattr(request, "protocol_type", None),
        getattr(request, "protocol_name", None),
        {a.member_id: bytes(a.assignment) for a in request.assignments})
    ctx.remote_ns = perf_counter_ns() - parked  # the rebalance wait: Kafka's remote time
    return build(cls, error_code=r.error, assignment=r.assignment,
                 protocol_type=r.protocol_type, protocol_name=r.protocol_name)
