"""Shared memory between the broker's processes and local clients (DESIGN.md §4).

``state_table``: the per-partition seqlocked state (leader, epoch, HW, LSO, LEO, log start) and
the tracker that keeps crashed owners from leaving ``/dev/shm`` objects behind.
"""

from shmq.ipc.state_table import (
    UNKNOWN,
    PartitionState,
    ShmRecord,
    ShmTracker,
    StateTable,
    StateTableError,
    owner_alive,
    remove_stale,
    stale_names,
)

__all__ = [
    "UNKNOWN",
    "PartitionState",
    "ShmRecord",
    "ShmTracker",
    "StateTable",
    "StateTableError",
    "owner_alive",
    "remove_stale",
    "stale_names",
]
