"""The bridge's errors: one line each, naming the option, topic, partition or file at fault.

Spark shows a Python data source's exception with its traceback; the message itself is the
single line a user reads first, so every message here starts with ``shmq:`` and says what is
wrong and, where there is one, what to do instead.
"""

from __future__ import annotations

from shmq.errors import ShmqError


class BridgeError(ShmqError, ValueError):
    """Bad options or a request the bridge cannot serve (the query never starts)."""

    def __init__(self, message: str) -> None:
        super().__init__("shmq: " + " ".join(message.split()))


class DataLossError(ShmqError):
    """Offsets a query planned to read are gone (retention, DeleteRecords, a deleted topic)
    and ``failOnDataLoss`` is true (Spark's Kafka source raises at the same points)."""

    def __init__(self, message: str) -> None:
        super().__init__("shmq: " + " ".join(message.split()) + " (set the source option "
                         "failOnDataLoss to false to skip lost offsets with a warning)")
