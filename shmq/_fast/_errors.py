"""The exception classes the compiled leaf raises.

``_fast`` imports nothing from ``shmq`` (dependencies point down), so the root of the error tree,
``CorruptRecordError`` and the protocol errors (raised by ``wire``) live here and
``shmq.errors`` re-exports them: there is still one tree.
"""


class ShmqError(Exception):
    """Root of every error shmq raises on purpose."""


class CorruptRecordError(ShmqError, ValueError):
    """Record data failed validation: size, magic, CRC, counts or compression.

    Kafka answers ``CORRUPT_MESSAGE`` (2) for these on produce; recovery truncates the log at the
    first batch that raises it.
    """


class ProtocolError(ShmqError):
    """The Kafka wire protocol was violated; the connection must end."""


class LocalProtocolError(ProtocolError):
    """We were about to send bytes that break the protocol."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol."""
