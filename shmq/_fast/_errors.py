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


class InvalidRecordError(CorruptRecordError):
    """A batch that breaks a rule Kafka answers ``INVALID_RECORD`` (87) for on produce rather than
    ``CORRUPT_MESSAGE``: a record count that does not match lastOffsetDelta, a client-written
    control batch, a producer id without a base sequence, a batch of magic 0 or 1, a declared
    length past the bytes sent (``LogValidator.validateBatch``, ``ProduceRequest.validateRecords``),
    records that do not parse as the header says.  Still a ``CorruptRecordError`` for callers that
    only care that the data is bad."""


class ProtocolError(ShmqError):
    """The Kafka wire protocol was violated; the connection must end."""


class LocalProtocolError(ProtocolError):
    """We were about to send bytes that break the protocol."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol."""
