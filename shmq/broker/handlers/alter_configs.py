"""AlterConfigs (33): replace a topic's overrides (or a broker's dynamic configs) as a whole.

The legacy API: configs not named in the request go back to their defaults.  The controller
validates (INVALID_CONFIG with Kafka's message for unknown names and bad values), persists and
pushes the change to the workers, which apply it to their live logs.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.dynamic_configs import SET
from shmq.broker.handlers._build import build, response_module


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(33, header.api_version)
    resources = [{"resource_type": int(r.resource_type), "resource_name": r.resource_name,
                  "configs": [[c.name, SET, c.value] for c in r.configs]}
                 for r in request.resources]
    results = await ctx.controller.alter_configs(resources, bool(request.validate_only), False)
    return build(cls, responses=tuple(
        build(m.AlterConfigsResourceResponse, error_code=res["error_code"],
              error_message=res["error_message"], resource_type=r.resource_type,
              resource_name=r.resource_name)
        for r, res in zip(request.resources, results, strict=True)))
