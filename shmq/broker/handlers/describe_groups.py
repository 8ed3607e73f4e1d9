"""DescribeGroups (15): state, protocol and members of each group (metadata and assignment only
when Stable, as Kafka).  An unknown group is described as Dead with no error (v0–v5), from v6
(KIP-1043) as Dead with GROUP_ID_NOT_FOUND and Kafka's message."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import NOT_COORDINATOR, coordinator

NO_AUTHORIZED_OPS = -2147483648
GROUP_ID_NOT_FOUND = 69


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(15, header.api_version)
    coord = coordinator(ctx)
    out = []
    for gid in request.groups:
        if coord is None:
            out.append(build(m.DescribedGroup, error_code=NOT_COORDINATOR, group_id=gid,
                             group_state="", protocol_type="", protocol_data="", members=(),
                             authorized_operations=NO_AUTHORIZED_OPS))
            continue
        d = coord.describe_group(gid)
        if header.api_version >= 6 and d.state == "Dead" and not d.error:
            out.append(build(m.DescribedGroup, error_code=GROUP_ID_NOT_FOUND,
                             error_message=f"Group {gid} not found.", group_id=gid,
                             group_state="Dead", protocol_type="", protocol_data="",
                             members=(), authorized_operations=NO_AUTHORIZED_OPS))
            continue
        members = tuple(build(m.DescribedGroupMember, member_id=x.member_id,
                              group_instance_id=x.group_instance_id, client_id=x.client_id,
                              client_host=x.client_host, member_metadata=x.metadata,
                              member_assignment=x.assignment) for x in d.members)
        out.append(build(m.DescribedGroup, error_code=d.error, group_id=gid,
                         group_state=d.state, protocol_type=d.protocol_type,
                         protocol_data=d.protocol_data, members=members,
                         authorized_operations=NO_AUTHORIZED_OPS))
    return build(cls, groups=tuple(out))
