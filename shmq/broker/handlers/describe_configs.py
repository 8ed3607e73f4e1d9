"""DescribeConfigs (32): every topic or broker config with its value, source and synonyms.

Served by any node from its copy of the metadata (the controller pushes every change to all
workers before it answers an alter, so a read after a write sees it).  Topic resources list every
Kafka topic config; broker resources ("1", or "" for the cluster-wide dynamic defaults) list
shmq's broker configs.  v3+ documentation is sent only when asked for.  v0 says ``is_default``
(the value is Kafka's default) where v1+ give the source: Kafka 3.9 left it false for every
config (its generated v0 writer is never given one), shmq sets it.
"""

from __future__ import annotations

from typing import Any

from shmq.broker import dynamic_configs as dc
from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.metadata import validate_topic_name


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(32, header.api_version)
    synonyms = bool(getattr(request, "include_synonyms", False))
    docs = bool(getattr(request, "include_documentation", False))
    results = []
    for res in request.resources:
        keys = list(res.configuration_keys) if res.configuration_keys else None
        code, message, entries = 0, "", []  # Kafka: "" unless an exception explains itself
        try:
            entries = _describe(ctx, int(res.resource_type), res.resource_name, keys)
        except dc.ConfigChangeError as exc:
            code, message = exc.code, exc.args[0]
        configs = tuple(
            build(m.DescribeConfigsResourceResult, name=e.name, value=e.value,
                  read_only=e.read_only, config_source=e.source, is_sensitive=e.sensitive,
                  is_default=e.source == dc.DEFAULT_CONFIG,
                  synonyms=tuple(build(m.DescribeConfigsSynonym, name=n, value=v, source=s)
                                 for n, v, s in e.synonyms) if synonyms else (),
                  config_type=e.type, documentation=e.doc if docs else None)
            for e in entries)
        results.append(build(m.DescribeConfigsResult, error_code=code, error_message=message,
                             resource_type=res.resource_type, resource_name=res.resource_name,
                             configs=configs))
    return build(cls, results=tuple(results))


def _describe(ctx: BrokerContext, rtype: int, name: str, keys: list[str] | None) -> list[Any]:
    meta = ctx.metadata
    if rtype == dc.TOPIC:
        reason = validate_topic_name(name)
        if reason:
            raise dc.ConfigChangeError(dc.INVALID_TOPIC, reason)
        if name not in meta.topics:  # Kafka sets the code only
            raise dc.ConfigChangeError(dc.UNKNOWN_TOPIC_OR_PARTITION, "")
        return dc.describe_topic(meta, ctx.config.log, ctx.node_id, name, keys)
    if rtype == dc.BROKER:
        if name == "":
            return dc.describe_broker(meta, ctx.config, ctx.node_id, keys, default_entity=True)
        if not name.isdigit() or int(name) not in meta.brokers:
            raise dc.ConfigChangeError(dc.INVALID_REQUEST,
                                       f"Unexpected broker id, expected one of "
                                       f"{sorted(meta.brokers)} or empty string, but received "
                                       f"{name}")
        return dc.describe_broker(meta, ctx.config, int(name), keys)
    raise dc.ConfigChangeError(dc.INVALID_REQUEST, f"Unsupported resource type {rtype} for shmq")
