"""TxnOffsetCommit (28) v0-5: a transaction's consumer offsets, sent to the group coordinator.

The transaction coordinator checks the producer (its id, epoch and an open transaction); the
group coordinator writes the offsets as the producer's transactional records into the group's
``__consumer_offsets`` partition, where the transaction's marker commits or drops them.  v5 is
transaction version 2: the client sent no AddOffsetsToTxn, and the group's partition joins the
transaction here first, as Kafka's group coordinator adds it through
``AddPartitionsToTxnManager`` (a fenced epoch is then INVALID_PRODUCER_EPOCH, as that manager
answers it).
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._groups import coordinator
from shmq.broker.handlers._txn import (
    INVALID_PRODUCER_EPOCH,
    NOT_COORDINATOR,
    PRODUCER_FENCED,
    downgrade,
    txn_coordinator,
)
from shmq.broker.metadata import OFFSETS_TOPIC

NONE = 0
FIRST_V2_VERSION = 5


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    cls, m = response_module(28, header.api_version)
    topics = [(t.name, [(p.partition_index, p.committed_offset,
                         getattr(p, "committed_leader_epoch", -1), p.committed_metadata)
                        for p in t.partitions]) for t in request.topics]
    groups, txns = coordinator(ctx), txn_coordinator(ctx)
    if groups is None or txns is None:
        errors = [[NOT_COORDINATOR] * len(parts) for _, parts in topics]
    else:
        error = NONE
        v2 = header.api_version >= FIRST_V2_VERSION
        if v2 and not request.group_id:
            pass  # INVALID_GROUP_ID from the group coordinator, before any transaction check
        elif v2:
            error = await txns.add_partition_implicitly(
                request.transactional_id, int(request.producer_id),
                int(request.producer_epoch), OFFSETS_TOPIC, groups.partition_for(request.group_id))
            if error == PRODUCER_FENCED:
                error = INVALID_PRODUCER_EPOCH
        if not error and not (v2 and not request.group_id):
            error = txns.check_txn_offset_commit(request.transactional_id,
                                                 int(request.producer_id),
                                                 int(request.producer_epoch))
        if error:
            errors = [[error] * len(parts) for _, parts in topics]
        else:
            errors = await groups.txn_commit_offsets(request.group_id, int(request.producer_id),
                                                     int(request.producer_epoch), topics)
    v = header.api_version
    return build(cls, topics=tuple(
        build(m.TxnOffsetCommitResponseTopic, name=name, partitions=tuple(
            build(m.TxnOffsetCommitResponsePartition, partition_index=p[0],
                  error_code=downgrade(28, v, e))
            for p, e in zip(parts, errs, strict=True)))
        for (name, parts), errs in zip(topics, errors, strict=True)))
