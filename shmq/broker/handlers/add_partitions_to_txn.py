"""AddPartitionsToTxn (24) v0-3: the partitions a transaction is about to write.

v4+ (KIP-890's batched broker-to-coordinator verification) is not offered.  Unknown partitions
are UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED, as Kafka answers.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._txn import NOT_COORDINATOR, downgrade, txn_coordinator


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(24, header.api_version)
    topics = [(t.name, list(t.partitions)) for t in request.v3_and_below_topics]
    wanted = [(name, int(p)) for name, parts in topics for p in parts]
    coord = txn_coordinator(ctx)
    if coord is None:
        errors = {tp: NOT_COORDINATOR for tp in wanted}
    else:
        errors = await coord.add_partitions(
            request.v3_and_below_transactional_id, int(request.v3_and_below_producer_id),
            int(request.v3_and_below_producer_epoch), wanted)
    return build(cls, results_by_topic_v3_and_below=tuple(
        build(m.AddPartitionsToTxnTopicResult, name=name, results_by_partition=tuple(
            build(m.AddPartitionsToTxnPartitionResult, partition_index=p,
                  partition_error_code=ErrorCode(
                      downgrade(24, header.api_version, errors[(name, int(p))])))
            for p in parts))
        for name, parts in topics))
