"""ListGroups (16): every group of this coordinator; v4+ filter by state, v5 by type
("classic" is the only type here).

Admin clients send ListGroups to every broker and merge the answers.  A partition worker
coordinates no group, so, like a Kafka broker that leads no ``__consumer_offsets`` partition, it
answers an empty list with NONE (an error would make librdkafka report one failure per worker and
Java's admin client fail the whole listing)."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(16, header.api_version)
    coord = coordinator(ctx)
    if coord is None:
        return build(cls, error_code=0, groups=())
    found = coord.list_groups(getattr(request, "states_filter", None) or None,
                              getattr(request, "types_filter", None) or None)
    return build(cls, error_code=0, groups=tuple(
        build(m.ListedGroup, group_id=gid, protocol_type=ptype, group_state=state,
              group_type="classic") for gid, ptype, state in found))
