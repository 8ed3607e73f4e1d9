"""Broker settings with Kafka's names and defaults (``server.properties``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shmq.errors import ConfigError
from shmq.storage.log_config import LogConfig

DEFAULT_DATA_DIR = Path(os.environ.get("SHMQ_DATA_DIR", Path.home() / ".local/share/shmq"))


@dataclass(frozen=True)
class BrokerConfig:
    data_dir: Path = DEFAULT_DATA_DIR
    host: str = "127.0.0.1"                         # listeners host (loopback by default)
    port: int = 9092                                # bootstrap (controller) port; 0 = any free
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    num_partitions: int = 1                         # num.partitions
    auto_create_topics: bool = True                 # auto.create.topics.enable
    message_max_bytes: int = 1048588                # message.max.bytes
    socket_request_max_bytes: int = 100 * 1024 * 1024   # socket.request.max.bytes
    # bytes of requests read and not yet handled, per process (Kafka's default is -1, no cap:
    # 500 queued requests of up to 100 MiB); reading pauses past it (shmq/net/connection.py)
    queued_max_request_bytes: int = 256 * 1024 * 1024   # queued.max.request.bytes
    fetch_max_bytes: int = 55 * 1024 * 1024         # fetch.max.bytes: cap of a Fetch response
    flush_on_ack: bool = True                       # acks=all waits for an fsync (group commit)
    log: LogConfig = field(default_factory=LogConfig)   # topic defaults (log.* / segment.* ...)
    cluster_id: str = ""
    # the controller's HTTP listener (/metrics, /api/v1, the dashboard): host:port or "none"
    http_listener: str = "127.0.0.1:8090"
    metrics_enabled: bool = True                    # count into the shared metrics table
    # group coordinator (Kafka's names; the delay is 3000 ms in Kafka: a lone consumer on a local
    # broker would wait 3 s for its first partition, so shmq waits just long enough for consumers
    # started together to land in one generation)
    group_initial_rebalance_delay_ms: int = 100     # group.initial.rebalance.delay.ms
    group_min_session_timeout_ms: int = 6000        # group.min.session.timeout.ms
    group_max_session_timeout_ms: int = 1_800_000   # group.max.session.timeout.ms
    offsets_retention_minutes: int = 10080          # offsets.retention.minutes (7 days)
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms
    offset_metadata_max_bytes: int = 4096           # offset.metadata.max.bytes
    offsets_topic_num_partitions: int = 50          # offsets.topic.num.partitions
    offsets_topic_segment_bytes: int = 16 << 20     # offsets.topic.segment.bytes (Kafka: 100 MiB)
    # idempotent producers idle this long are forgotten (Kafka's ProducerStateManager)
    producer_id_expiration_ms: int = 86_400_000     # producer.id.expiration.ms (1 day)
    producer_id_expiration_check_interval_ms: int = 600_000  # producer.id.expiration.check.interval.ms
    # transaction coordinator (Kafka's names and defaults)
    transaction_max_timeout_ms: int = 900_000       # transaction.max.timeout.ms
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    transaction_state_log_num_partitions: int = 50  # transaction.state.log.num.partitions

    KAFKA_NAMES = {
        "num.partitions": "num_partitions",
        "auto.create.topics.enable": "auto_create_topics",
        "message.max.bytes": "message_max_bytes",
        "socket.request.max.bytes": "socket_request_max_bytes",
        "queued.max.request.bytes": "queued_max_request_bytes",
        "fetch.max.bytes": "fetch_max_bytes",
        "flush.on.ack": "flush_on_ack",
        "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
        "group.min.session.timeout.ms": "group_min_session_timeout_ms",
        "group.max.session.timeout.ms": "group_max_session_timeout_ms",
        "offsets.retention.minutes": "offsets_retention_minutes",
        "offsets.retention.check.interval.ms": "offsets_retention_check_interval_ms",
        "offset.metadata.max.bytes": "offset_metadata_max_bytes",
        "offsets.topic.num.partitions": "offsets_topic_num_partitions",
        "offsets.topic.segment.bytes": "offsets_topic_segment_bytes",
        "producer.id.expiration.ms": "producer_id_expiration_ms",
        "producer.id.expiration.check.interval.ms": "producer_id_expiration_check_interval_ms",
        "transaction.max.timeout.ms": "transaction_max_timeout_ms",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms":
            "transaction_abort_timed_out_transaction_cleanup_interval_ms",
        "transaction.state.log.num.partitions": "transaction_state_log_num_partitions",
    }
    LOG_NAMES = {
        "log.segment.bytes": "segment.bytes",
        "segment.bytes": "segment.bytes",
        "log.roll.ms": "segment.ms",
        "log.retention.ms": "retention.ms",
        "retention.ms": "retention.ms",
        "log.retention.bytes": "retention.bytes",
        "retention.bytes": "retention.bytes",
        "log.index.interval.bytes": "index.interval.bytes",
        "log.segment.index.bytes": "segment.index.bytes",
        "log.flush.interval.messages": "flush.messages",
        "log.flush.interval.ms": "flush.ms",
        "log.message.timestamp.type": "message.timestamp.type",
        "log.message.timestamp.before.max.ms": "message.timestamp.before.max.ms",
        "log.message.timestamp.after.max.ms": "message.timestamp.after.max.ms",
        "log.cleanup.policy": "cleanup.policy",
    }

    def with_properties(self, props: dict[str, Any]) -> BrokerConfig:
        """Apply Kafka property names (``server.properties`` / ``--override k=v``)."""
        values: dict[str, Any] = {}
        log_props: dict[str, Any] = {}
        for key, raw in props.items():
            if key in self.KAFKA_NAMES:
                name = self.KAFKA_NAMES[key]
                current = getattr(self, name)
                if isinstance(current, bool):
                    if str(raw).lower() not in ("true", "false"):
                        raise ConfigError(f"{key} must be true or false, got {raw!r}")
                    values[name] = str(raw).lower() == "true"
                else:
                    try:
                        values[name] = int(raw)
                    except ValueError:
                        raise ConfigError(f"{key} must be an integer, got {raw!r}") from None
            elif key in self.LOG_NAMES:
                log_props[self.LOG_NAMES[key]] = raw
            elif key == "log.dirs" or key == "log.dir":
                values["data_dir"] = Path(str(raw))
            else:
                raise ConfigError(f"unknown broker config {key!r}")
        if log_props:
            values["log"] = LogConfig.from_kafka(log_props, self.log)
        cfg = dataclasses.replace(self, **values)
        if cfg.message_max_bytes != self.message_max_bytes and "max.message.bytes" not in log_props:
            cfg = dataclasses.replace(cfg, log=dataclasses.replace(
                cfg.log, max_message_bytes=cfg.message_max_bytes))
        return cfg

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError("--workers must be at least 1")
        if self.num_partitions < 1:
            raise ConfigError("num.partitions must be at least 1")
        if self.fetch_max_bytes < 0:
            raise ConfigError("fetch.max.bytes must be at least 0")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is out of range")
        if self.group_initial_rebalance_delay_ms < 0 or self.offsets_retention_minutes < 1 \
                or self.offsets_retention_check_interval_ms < 1 or self.offset_metadata_max_bytes < 0:
            raise ConfigError("group.initial.rebalance.delay.ms, offsets.retention.minutes, "
                              "offsets.retention.check.interval.ms and offset.metadata.max.bytes "
                              "must not be negative (retention and interval at least 1)")
        if not 0 < self.group_min_session_timeout_ms <= self.group_max_session_timeout_ms:
            raise ConfigError("group.min.session.timeout.ms must be positive and at most "
                              "group.max.session.timeout.ms")
        if self.producer_id_expiration_ms < 1 or self.producer_id_expiration_check_interval_ms < 1:
            raise ConfigError("producer.id.expiration.ms and "
                              "producer.id.expiration.check.interval.ms must be at least 1")
        if self.transaction_max_timeout_ms < 1 \
                or self.transaction_abort_timed_out_transaction_cleanup_interval_ms < 1 \
                or not 1 <= self.transaction_state_log_num_partitions <= 1000:
            raise ConfigError("transaction.max.timeout.ms and transaction.abort.timed.out."
                              "transaction.cleanup.interval.ms must be at least 1, "
                              "transaction.state.log.num.partitions 1..1000")
        if not 1 <= self.offsets_topic_num_partitions <= 1000 or self.offsets_topic_segment_bytes < 1024:
            raise ConfigError("offsets.topic.num.partitions must be 1..1000 and "
                              "offsets.topic.segment.bytes at least 1024")
