"""What the group handlers share: the coordinator (controller only) and kio value conversions.

Group APIs are served by the controller (node 0, where FindCoordinator points); a worker that
gets one answers NOT_COORDINATOR, and the client asks FindCoordinator again.
"""

from __future__ import annotations

import datetime
from typing import Any

from shmq.broker.context import BrokerContext

NOT_COORDINATOR = 16


def coordinator(ctx: BrokerContext) -> Any:
    """The GroupCoordinator of this process, or None (a worker)."""
    return getattr(ctx, "coordinator", None)


def millis(value: Any) -> int:
    """kio decodes ``timedelta_i32`` fields as timedeltas; Kafka means milliseconds."""
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


def client_host(ctx: BrokerContext) -> str:
    """Kafka's ``clientHost`` of a member: ``/`` and the client's IP address."""
    from shmq.net.connection import PEER

    return f"/{PEER.get() or ctx.config.host}"
