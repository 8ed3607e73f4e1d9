"""The two exception classes the compiled leaf raises.

``_fast`` imports nothing from ``shmq`` (dependencies point down), so the root of the error tree
and ``CorruptRecordError`` live here and ``shmq.errors`` re-exports them: there is still one tree.
"""


class ShmqError(Exception):
    """Root of every error shmq raises on purpose."""


class CorruptRecordError(ShmqError, ValueError):
    """Record data failed validation: size, magic, CRC, counts or compression.

    Kafka answers ``CORRUPT_MESSAGE`` (2) for these on produce; recovery truncates the log at the
    first batch that raises it.
    """
