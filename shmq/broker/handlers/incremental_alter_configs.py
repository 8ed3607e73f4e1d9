"""IncrementalAlterConfigs (44): SET / DELETE / APPEND / SUBTRACT single configs.

APPEND and SUBTRACT apply to list configs only (``cleanup.policy``, the throttled-replica lists)
and start from the current value, override or default.  Decided by the controller like
AlterConfigs; the workers apply the result to their live logs.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(44, header.api_version)
    resources = [{"resource_type": int(r.resource_type), "resource_name": r.resource_name,
                  "configs": [[c.name, int(c.config_operation), c.value] for c in r.configs]}
                 for r in request.resources]
    results = await ctx.controller.alter_configs(resources, bool(request.validate_only), True)
    return build(cls, responses=tuple(
        build(m.AlterConfigsResourceResponse, error_code=res["error_code"],
              error_message=res["error_message"], resource_type=r.resource_type,
              resource_name=r.resource_name)
        for r, res in zip(request.resources, results, strict=True)))
