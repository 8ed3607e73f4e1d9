"""DescribeCluster (60): cluster id, controller and the brokers (Java's AdminClient.describeCluster).

v1 asks for an endpoint type: brokers (1) are served; controllers (2) are Kafka's KRaft quorum
endpoints, which a broker answers with MISMATCHED_ENDPOINT_TYPE, as here.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module

MISMATCHED_ENDPOINT_TYPE, UNSUPPORTED_ENDPOINT_TYPE = 114, 115
BROKERS, CONTROLLERS = 1, 2
NO_AUTHORIZED_OPS = -2147483648
# AclOperation codes a cluster resource supports (no authorizer: all of them are allowed)
_CLUSTER_OPS = (5, 7, 8, 9, 10, 11, 12)


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(60, header.api_version)
    meta = ctx.metadata
    endpoint = int(getattr(request, "endpoint_type", BROKERS))
    ops = (sum(1 << op for op in _CLUSTER_OPS) if request.include_cluster_authorized_operations
           else NO_AUTHORIZED_OPS)
    if endpoint != BROKERS:
        code = MISMATCHED_ENDPOINT_TYPE if endpoint == CONTROLLERS else UNSUPPORTED_ENDPOINT_TYPE
        return build(cls, error_code=code, error_message=f"The request was sent to a broker "
                     f"and asks for endpoint type {endpoint}", endpoint_type=endpoint,
                     cluster_id=meta.cluster_id, controller_id=-1, brokers=(),
                     cluster_authorized_operations=ops)
    brokers = tuple(build(m.DescribeClusterBroker, broker_id=node, host=host, port=port,
                          rack=None)
                    for node, (host, port) in sorted(meta.brokers.items()))
    return build(cls, error_code=0, error_message=None, endpoint_type=endpoint,
                 cluster_id=meta.cluster_id, controller_id=meta.controller_id, brokers=brokers,
                 cluster_authorized_operations=ops)
