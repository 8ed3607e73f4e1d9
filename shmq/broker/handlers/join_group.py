"""JoinGroup (11): enter a group's rebalance; a long poll until the join phase completes.

v4+: a member without an id gets MEMBER_ID_REQUIRED and its id, and joins again with it
(KIP-394).  v5+: group_instance_id (static membership, KIP-345).  v7+: protocol_type in the
response (nullable protocol name); v9: skip_assignment for a static leader that rejoined.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import NOT_COORDINATOR, client_host, coordinator, millis


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    version = header.api_version
    cls, m = response_module(11, version)
    coord = coordinator(ctx)
    if coord is None:
        return _response(cls, m, version, error=NOT_COORDINATOR, member_id=request.member_id)
    rebalance = getattr(request, "rebalance_timeout", None)
    parked = perf_counter_ns()
    r = await coord.join_group(
        request.group_id, request.member_id, getattr(request, "group_instance_id", None),
        header.client_id or "", client_host(ctx), millis(request.session_timeout),
        -1 if rebalance is None else millis(rebalance), request.protocol_type,
        [(p.name, bytes(p.metadata)) for p in request.protocols], version)
    ctx.remote_ns = perf_counter_ns() - parked  # the rebalance wait: Kafka's remote time
    members = tuple(build(m.JoinGroupResponseMember, member_id=mid, group_instance_id=iid,
                          metadata=meta) for mid, iid, meta in r.members)
    return _response(cls, m, version, error=r.error, generation=r.generation,
                     protocol_type=r.protocol_type, protocol_name=r.protocol_name,
                     leader=r.leader, member_id=r.member_id, members=members,
                     skip_assignment=r.skip_assignment)


def _response(cls: type, m: Any, version: int, *, error: int, member_id: str,
              generation: int = -1, protocol_type: str | None = None,
              protocol_name: str | None = None, leader: str = "", members: tuple = (),
              skip_assignment: bool = False) -> Any:
    if version < 7 and protocol_name is None:
        protocol_name = ""  # not nullable before v7
    return build(cls, error_code=error, generation_id=generation, protocol_type=protocol_type,
                 protocol_name=protocol_name, leader=leader, skip_assignment=skip_assignment,
                 member_id=member_id, members=members)
