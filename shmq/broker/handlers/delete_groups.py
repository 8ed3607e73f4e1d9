"""DeleteGroups (42): an Empty group and its offsets go (tombstones); a group with members is
NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND."""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import NOT_COORDINATOR, coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(42, header.api_version)
    coord = coordinator(ctx)
    names = list(request.groups_names)
    if coord is None:
        errors = [NOT_COORDINATOR] * len(names)
    else:
        errors = await coord.delete_groups(names)
    return build(cls, results=tuple(build(m.DeletableGroupResult, group_id=g, error_code=e)
                                    for g, e in zip(names, errors, strict=True)))
