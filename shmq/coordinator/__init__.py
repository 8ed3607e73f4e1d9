"""The group coordinator (Kafka's classic group protocol) and ``__consumer_offsets``.

It runs in the controller process (Kafka node 0); workers answer group APIs with NOT_COORDINATOR.
``coordinator.py`` holds the state machine and timers, ``group.py`` the group model,
``offsets_log.py`` the durable log, ``records.py`` Kafka's record layouts.  The transaction
coordinator (``transactions.py``) runs beside it, its ``__transaction_state`` in an
``OffsetsLog`` of its own.
"""

from shmq.coordinator.coordinator import CoordinatorConfig, GroupCoordinator

__all__ = ["CoordinatorConfig", "GroupCoordinator"]
