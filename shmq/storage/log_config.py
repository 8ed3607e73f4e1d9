"""Per-topic log settings with Kafka's names and defaults (``LogConfig``, ``ServerLogConfigs``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from shmq.errors import ConfigError

LONG_MAX = 2**63 - 1


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 1 << 30                 # segment.bytes
    segment_ms: int = 7 * 24 * 3600 * 1000       # segment.ms
    segment_index_bytes: int = 10 << 20          # segment.index.bytes
    index_interval_bytes: int = 4096             # index.interval.bytes
    retention_ms: int = 7 * 24 * 3600 * 1000     # retention.ms (-1: keep forever)
    retention_bytes: int = -1                    # retention.bytes (-1: no size limit)
    flush_messages: int = LONG_MAX               # flush.messages
    flush_ms: int = LONG_MAX                     # flush.ms
    max_message_bytes: int = 1048588             # max.message.bytes (1 MiB + 12)
    cleanup_policy: str = "delete"               # cleanup.policy
    message_timestamp_type: str = "CreateTime"   # message.timestamp.type
    message_timestamp_before_max_ms: int = LONG_MAX     # message.timestamp.before.max.ms
    message_timestamp_after_max_ms: int = 3_600_000     # message.timestamp.after.max.ms (Kafka 4: 1 h)
    file_delete_delay_ms: int = 60000            # file.delete.delay.ms

    KAFKA_NAMES = {
        "segment.bytes": "segment_bytes",
        "segment.ms": "segment_ms",
        "segment.index.bytes": "segment_index_bytes",
        "index.interval.bytes": "index_interval_bytes",
        "retention.ms": "retention_ms",
        "retention.bytes": "retention_bytes",
        "flush.messages": "flush_messages",
        "flush.ms": "flush_ms",
        "max.message.bytes": "max_message_bytes",
        "cleanup.policy": "cleanup_policy",
        "message.timestamp.type": "message_timestamp_type",
        "message.timestamp.before.max.ms": "message_timestamp_before_max_ms",
        "message.timestamp.after.max.ms": "message_timestamp_after_max_ms",
        "file.delete.delay.ms": "file_delete_delay_ms",
    }

    def __post_init__(self) -> None:
        if self.segment_bytes < 14 + 61:
            raise ConfigError(f"segment.bytes {self.segment_bytes} is too small")
        if self.segment_index_bytes < 12:
            raise ConfigError(f"segment.index.bytes {self.segment_index_bytes} is too small")
        if self.segment_ms < 1 or self.index_interval_bytes < 0 or self.max_message_bytes < 0:
            raise ConfigError("segment.ms, index.interval.bytes and max.message.bytes must be positive")
        if self.message_timestamp_before_max_ms < 0 or self.message_timestamp_after_max_ms < 0:
            raise ConfigError("message.timestamp.before.max.ms and message.timestamp.after.max.ms "
                              "must not be negative")
        if self.flush_messages < 1 or self.flush_ms < 0:
            raise ConfigError("flush.messages must be >= 1 and flush.ms >= 0")
        if self.message_timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise ConfigError(f"message.timestamp.type {self.message_timestamp_type!r} is invalid")
        if not {p.strip() for p in self.cleanup_policy.split(",")} <= {"delete", "compact"}:
            raise ConfigError(f"cleanup.policy {self.cleanup_policy!r} is invalid")

    @classmethod
    def from_kafka(cls, props: dict[str, Any], base: LogConfig | None = None) -> LogConfig:
        """Build from Kafka property names (``{"segment.bytes": "1048576"}``) over ``base``."""
        values: dict[str, Any] = {}
        for key, raw in props.items():
            field = cls.KAFKA_NAMES.get(key)
            if field is None:
                raise ConfigError(f"unknown topic config {key!r}")
            if field in ("cleanup_policy", "message_timestamp_type"):
                values[field] = str(raw)
            else:
                try:
                    values[field] = int(raw)
                except (TypeError, ValueError):
                    raise ConfigError(f"{key} must be an integer, got {raw!r}") from None
        return dataclasses.replace(base or cls(), **values)

    @property
    def delete_enabled(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"
