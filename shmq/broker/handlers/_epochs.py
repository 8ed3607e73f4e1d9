"""Leader-epoch fencing shared by Fetch, ListOffsets and OffsetForLeaderEpoch (KIP-320)."""

from __future__ import annotations

NONE, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 0, 74, 75


def check_leader_epoch(current: int, partition_epoch: int) -> int:
    """``Partition.checkCurrentLeaderEpoch``: the error for a request that expects the leader in
    epoch ``current`` (negative: no expectation, as Kafka's ``optionalEpoch``).  An older epoch is
    FENCED_LEADER_EPOCH (the client's metadata is stale), a newer one UNKNOWN_LEADER_EPOCH (this
    broker's is)."""
    if current < 0 or current == partition_epoch:
        return NONE
    return FENCED_LEADER_EPOCH if current < partition_epoch else UNKNOWN_LEADER_EPOCH
