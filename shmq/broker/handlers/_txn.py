"""What the transaction handlers share: the transaction coordinator (controller only) and
Kafka's error downgrade for old request versions.

Transaction APIs are served by the controller (node 0, where FindCoordinator points for key
type 1); a worker that gets one answers NOT_COORDINATOR and the client asks again.  Clients
from before KIP-588 do not know PRODUCER_FENCED (90): Kafka answers them INVALID_PRODUCER_EPOCH
(47) instead, below the version given per API here (``KafkaApis``).
"""

from __future__ import annotations

import datetime
from typing import Any

from shmq.broker.context import BrokerContext

NOT_COORDINATOR = 16
PRODUCER_FENCED, INVALID_PRODUCER_EPOCH = 90, 47
# the first version of each API whose clients know PRODUCER_FENCED
FENCED_FROM = {22: 4, 24: 2, 25: 2, 26: 2, 28: 3}


def txn_coordinator(ctx: BrokerContext) -> Any:
    return getattr(ctx, "txn_coordinator", None)


def downgrade(api_key: int, version: int, code: int) -> int:
    if code == PRODUCER_FENCED and version < FENCED_FROM.get(api_key, 0):
        return INVALID_PRODUCER_EPOCH
    return code


def millis(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)
