"""One error tree for shmq (STYLE.md §7).

    ShmqError
     ├─ ProtocolError            a peer broke the wire protocol; ends that connection
     │   ├─ LocalProtocolError   we were about to send something invalid
     │   └─ RemoteProtocolError  the peer sent something invalid
     ├─ KafkaApiError            a Kafka error code carried in a response; never ends a connection
     ├─ CorruptRecordError       corrupt or invalid record data (also a ValueError)
     │   └─ InvalidRecordError   ... of the kind Kafka answers INVALID_RECORD for on produce
     ├─ CorruptIndexError        an index file failed its sanity check (rebuilt from the log)
     ├─ OffsetOutOfRangeError    a read below the log start or above the log end
     └─ ConfigError              an invalid configuration value (also a ValueError)

OS failures stay ``OSError``.
"""

from __future__ import annotations

# The compiled leaf raises these, and it may not import shmq: it owns them, we re-export.
from shmq._fast._errors import (
    CorruptRecordError,
    InvalidRecordError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    ShmqError,
)


class KafkaApiError(ShmqError):
    """A Kafka error code to be answered in a response (``code`` is Kafka's number)."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message or f"Kafka error code {code}")
        self.code = code


class CorruptIndexError(ShmqError):
    """An offset or time index file is inconsistent with its segment; it is rebuilt."""


class OffsetOutOfRangeError(ShmqError):
    """A read asked for an offset below the log start offset or above the log end offset."""

    def __init__(self, offset: int, log_start: int, log_end: int) -> None:
        super().__init__(f"offset {offset} is outside [{log_start}, {log_end}]")
        self.offset = offset
        self.log_start = log_start
        self.log_end = log_end


class ConfigError(ShmqError, ValueError):
    """A configuration value is invalid."""


__all__ = [
    "ConfigError",
    "CorruptIndexError",
    "CorruptRecordError",
    "InvalidRecordError",
    "KafkaApiError",
    "LocalProtocolError",
    "OffsetOutOfRangeError",
    "ProtocolError",
    "RemoteProtocolError",
    "ShmqError",
]
