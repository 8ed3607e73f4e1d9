"""LeaveGroup (13): members leave at once (the group rebalances without waiting for a timeout).

v0–v2 name one member; v3+ carry a batch of (member_id, group_instance_id), where a static
member may be named by its instance id alone (admin removal, KIP-345).
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import NOT_COORDINATOR, coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    version = header.api_version
    cls, m = response_module(13, version)
    if version >= 3:
        leaving = [(mi.member_id, mi.group_instance_id) for mi in request.members]
    else:
        leaving = [(request.member_id, None)]
    coord = coordinator(ctx)
    if coord is None:
        error, errors = NOT_COORDINATOR, [NOT_COORDINATOR] * len(leaving)
    else:
        error, errors = coord.leave_group(request.group_id, leaving)
    if version < 3:
        return build(cls, error_code=error or errors[0])
    members = tuple(build(m.MemberResponse, member_id=mid, group_instance_id=iid, error_code=e)
                    for (mid, iid), e in zip(leaving, errors, strict=True))
    return build(cls, error_code=error, members=members if not error else ())
