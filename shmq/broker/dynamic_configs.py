"""Topic and broker configs as DescribeConfigs shows them and (Incremental)AlterConfigs changes them.

Theory of operation (Kafka ``LogConfig``, ``ConfigHelper``, ``ConfigAdminManager``)
----------------------------------------------------------------------------------
A topic config's value is looked up, highest priority first, in::

    TOPIC_CONFIG                    the topic's overrides            metadata.topics[t].configs
    DYNAMIC_BROKER_CONFIG           one broker's dynamic configs     metadata.broker_configs["1"]
    DYNAMIC_DEFAULT_BROKER_CONFIG   the cluster-wide dynamic ones    metadata.broker_configs[""]
    STATIC_BROKER_CONFIG            ``shmq broker --override``       BrokerConfig.log
    DEFAULT_CONFIG                  Kafka's default

Broker-level names (``log.retention.ms``) are the topic configs' *synonyms*; DescribeConfigs lists
them in that order when asked.  Every change goes through the controller, which validates it
here, persists the new metadata (atomic rewrite) and pushes it to the workers; a worker turns the
result into a ``LogConfig`` per partition (``effective_log_config``) and applies it to the live
log at once (a shorter retention deletes old segments right away).

shmq acts on the configs ``LogConfig`` has; the other Kafka topic configs are accepted, validated
and stored so that tools and clients that set them keep working (``min.insync.replicas`` with one
replica, compaction settings without a cleaner).  ``compression.type`` is the one exception:
shmq appends batches as the producer compressed them, so only ``producer`` is accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shmq.errors import ConfigError
from shmq.storage.log_config import LONG_MAX, LogConfig

# ConfigResource.Type
TOPIC, BROKER = 2, 4
# DescribeConfigsResponse.ConfigSource
TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5
# DescribeConfigsResponse.ConfigType
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, CLASS, PASSWORD = 1, 2, 3, 4, 5, 6, 7, 8, 9
# AlterConfigOp.OpType
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

INVALID_CONFIG, INVALID_REQUEST, UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC = 40, 42, 3, 17
INT_MAX = 2**31 - 1
LONG_MIN = -(2**63)

TYPE_NAMES = {BOOLEAN: "BOOLEAN", STRING: "STRING", INT: "INT", SHORT: "SHORT", LONG: "LONG",
              DOUBLE: "DOUBLE", LIST: "LIST", CLASS: "CLASS", PASSWORD: "PASSWORD"}


class ConfigChangeError(ConfigError):
    """A config change Kafka refuses, with the error code to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ConfigDef:
    name: str
    type: int
    default: str | None                  # Kafka's default, as DescribeConfigs prints it
    doc: str
    synonyms: tuple[str, ...] = ()       # broker-level names, highest priority first
    at_least: int | None = None
    choices: tuple[str, ...] = ()        # allowed values (every item, for LIST)
    log_field: str | None = None         # the LogConfig field shmq enforces it with
    default_synonym: tuple[str, str] | None = None   # (broker name, value) of DEFAULT_CONFIG


def _d(name: str, type_: int, default: str | None, doc: str, *synonyms: str,
       **kw: Any) -> ConfigDef:
    return ConfigDef(name, type_, default, doc, tuple(synonyms), **kw)


_LONG_MAX = str(LONG_MAX)
# Kafka 4.3's topic configs (``TopicConfig``), with the LogConfig field where shmq acts on one.
TOPIC_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in (
    _d("cleanup.policy", LIST, "delete", "The retention policy of old log segments: delete "
       "(by time or size) or compact (shmq stores the setting but does not compact).",
       "log.cleanup.policy", choices=("compact", "delete"), log_field="cleanup_policy"),
    _d("compression.type", STRING, "producer", "The final compression type: shmq keeps the "
       "producer's compression, so only 'producer' is accepted.", "compression.type",
       choices=("producer",)),
    _d("compression.gzip.level", INT, "-1", "The gzip level if compression.type is gzip.",
       "compression.gzip.level"),
    _d("compression.lz4.level", INT, "9", "The lz4 level if compression.type is lz4.",
       "compression.lz4.level"),
    _d("compression.zstd.level", INT, "3", "The zstd level if compression.type is zstd.",
       "compression.zstd.level"),
    _d("delete.retention.ms", LONG, "86400000", "How long delete tombstones are retained "
       "for compacted topics.", "log.cleaner.delete.retention.ms", at_least=0),
    _d("file.delete.delay.ms", LONG, "60000", "The time to wait before deleting a file from "
       "the filesystem.", "log.segment.delete.delay.ms", at_least=0,
       log_field="file_delete_delay_ms"),
    _d("flush.messages", LONG, _LONG_MAX, "Force an fsync after this many messages.",
       "log.flush.interval.messages", at_least=1, log_field="flush_messages"),
    _d("flush.ms", LONG, _LONG_MAX, "Force an fsync after this many milliseconds.",
       "log.flush.interval.ms", "log.flush.scheduler.interval.ms", at_least=0,
       log_field="flush_ms", default_synonym=("log.flush.scheduler.interval.ms", _LONG_MAX)),
    _d("follower.replication.throttled.replicas", LIST, "", "Replicas throttled on the "
       "follower side (no effect in shmq)."),
    _d("index.interval.bytes", INT, "4096", "How often an entry is added to the offset index.",
       "log.index.interval.bytes", at_least=0, log_field="index_interval_bytes"),
    _d("leader.replication.throttled.replicas", LIST, "", "Replicas throttled on the leader "
       "side (no effect in shmq)."),
    _d("local.retention.bytes", LONG, "-2", "Local retention size with tiered storage (no "
       "effect in shmq).", "log.local.retention.bytes", at_least=-2),
    _d("local.retention.ms", LONG, "-2", "Local retention time with tiered storage (no effect "
       "in shmq).", "log.local.retention.ms", at_least=-2),
    _d("max.compaction.lag.ms", LONG, _LONG_MAX, "The maximum time a message stays "
       "uncompacted.", "log.cleaner.max.compaction.lag.ms", at_least=1),
    _d("max.message.bytes", INT, "1048588", "The largest record batch size allowed.",
       "message.max.bytes", at_least=0, log_field="max_message_bytes"),
    _d("message.timestamp.after.max.ms", LONG, "3600000", "How far in the future a message "
       "timestamp may be (CreateTime; INVALID_TIMESTAMP beyond).",
       "log.message.timestamp.after.max.ms", at_least=0,
       log_field="message_timestamp_after_max_ms"),
    _d("message.timestamp.before.max.ms", LONG, _LONG_MAX, "How far in the past a message "
       "timestamp may be (CreateTime; INVALID_TIMESTAMP beyond).",
       "log.message.timestamp.before.max.ms", at_least=0,
       log_field="message_timestamp_before_max_ms"),
    _d("message.timestamp.type", STRING, "CreateTime", "Whether the timestamp in the message "
       "is the create time or the log append time.", "log.message.timestamp.type",
       choices=("CreateTime", "LogAppendTime"), log_field="message_timestamp_type"),
    _d("min.cleanable.dirty.ratio", DOUBLE, "0.5", "The dirty ratio that triggers compaction.",
       "log.cleaner.min.cleanable.ratio"),
    _d("min.compaction.lag.ms", LONG, "0", "The minimum time a message stays uncompacted.",
       "log.cleaner.min.compaction.lag.ms", at_least=0),
    _d("min.insync.replicas", INT, "1", "The minimum number of in-sync replicas for acks=all.",
       "min.insync.replicas", at_least=1),
    _d("preallocate", BOOLEAN, "false", "Preallocate the file of a new segment.",
       "log.preallocate"),
    _d("remote.log.copy.disable", BOOLEAN, "false", "Whether tiered data of a topic is read "
       "only (tiered storage: no effect in shmq)."),
    _d("remote.log.delete.on.disable", BOOLEAN, "false", "Whether tiered data is deleted when "
       "tiered storage is disabled for a topic (no effect in shmq)."),
    _d("remote.storage.enable", BOOLEAN, "false", "Tiered storage (not available in shmq).",
       choices=("false",)),
    _d("retention.bytes", LONG, "-1", "The maximum size a partition can grow to before old "
       "segments are deleted (-1: no limit).", "log.retention.bytes", log_field="retention_bytes"),
    _d("retention.ms", LONG, "604800000", "The maximum time a segment is retained before it is "
       "deleted (-1: no time limit).", "log.retention.ms", "log.retention.minutes",
       "log.retention.hours", at_least=-1, log_field="retention_ms",
       default_synonym=("log.retention.hours", "168")),
    _d("segment.bytes", INT, "1073741824", "The segment file size.", "log.segment.bytes",
       at_least=1048576, log_field="segment_bytes"),
    # Kafka's internal override of segment.bytes below its 1 MiB minimum, "for testing only";
    # listed by DescribeConfigs only where a topic sets it
    _d("internal.segment.bytes", INT, None, "The maximum size of a single log file. This "
       "should be used for testing only.", at_least=75, log_field="segment_bytes"),
    _d("segment.index.bytes", INT, "10485760", "The size of the index of a new segment.",
       "log.index.size.max.bytes", at_least=12, log_field="segment_index_bytes"),
    _d("segment.jitter.ms", LONG, "0", "Random jitter subtracted from segment.ms.",
       "log.roll.jitter.ms", "log.roll.jitter.hours", at_least=0,
       default_synonym=("log.roll.jitter.hours", "0")),
    _d("segment.ms", LONG, "604800000", "The time after which a segment is rolled even if it "
       "is not full.", "log.roll.ms", "log.roll.hours", at_least=1, log_field="segment_ms",
       default_synonym=("log.roll.hours", "168")),
    _d("unclean.leader.election.enable", BOOLEAN, "false", "Whether an out-of-sync replica "
       "may become leader.", "unclean.leader.election.enable"),
)}

INTERNAL_SEGMENT_BYTES = "internal.segment.bytes"

# broker-level name -> topic config, for the broker configs that set a topic default
BROKER_TO_TOPIC = {d.synonyms[0]: d.name for d in TOPIC_CONFIGS.values() if d.synonyms}

# Broker configs that may change at run time: Kafka's ``DynamicLogConfig``, the broker name of
# every topic config (shmq acts on those LogConfig has, stores and validates the others).
DYNAMIC_BROKER_CONFIGS = frozenset(d.synonyms[0] for d in TOPIC_CONFIGS.values() if d.synonyms)

# Broker configs of their own (no topic config behind them), with the BrokerConfig field of their
# static value and whether they may change at run time: Kafka's ``ProducerStateManagerConfig``
# (``producer.id.expiration.ms`` is reconfigurable, per broker or cluster-wide; its check interval
# is not).  The workers read the dynamic value from the metadata pushed to them
# (``producer_id_expiration_ms``).
BROKER_OWN: dict[str, tuple[ConfigDef, str, bool]] = {
    "producer.id.expiration.ms": (ConfigDef(
        "producer.id.expiration.ms", INT, "86400000", "The time in ms that a topic partition "
        "leader will wait before expiring producer IDs (idle idempotent producers are "
        "forgotten).", at_least=1), "producer_id_expiration_ms", True),
    "producer.id.expiration.check.interval.ms": (ConfigDef(
        "producer.id.expiration.check.interval.ms", INT, "600000", "The interval at which to "
        "remove producer IDs that have expired due to producer.id.expiration.ms passing.",
        at_least=1), "producer_id_expiration_check_interval_ms", False),
}
DYNAMIC_BROKER_OWN = frozenset(name for name, (_, _, dynamic) in BROKER_OWN.items() if dynamic)


# --- validation ----------------------------------------------------------------------------


class InvalidValueError(ConfigChangeError):
    """A value its config's type or range refuses: INVALID_CONFIG for a topic; for a broker
    config Kafka 4.3's controller answers the same message as INVALID_REQUEST."""


def _invalid(value: Any, name: str, why: str) -> ConfigChangeError:
    return InvalidValueError(INVALID_CONFIG, f"Invalid value {value} for configuration {name}: "
                                             f"{why}")


def validate_value(d: ConfigDef, value: str | None, name: str | None = None) -> str:
    """The value as stored (trimmed), or ConfigChangeError(INVALID_CONFIG, Kafka's message)."""
    name = name or d.name
    if value is None:
        raise _invalid(value, name, "Value must be non-null")
    text = value.strip()
    if d.type in (INT, LONG, SHORT):
        lo, hi = (LONG_MIN, LONG_MAX) if d.type == LONG else (-(2**31), INT_MAX)
        try:
            number = int(text)
        except ValueError:
            raise _invalid(value, name, f"Not a number of type {TYPE_NAMES[d.type]}") from None
        if not lo <= number <= hi:
            raise _invalid(value, name, f"Not a number of type {TYPE_NAMES[d.type]}")
        if d.at_least is not None and number < d.at_least:
            raise _invalid(value, name, f"Value must be at least {d.at_least}")
        return str(number)
    if d.type == DOUBLE:
        try:
            ratio = float(text)
        except ValueError:
            raise _invalid(value, name, "Not a number of type DOUBLE") from None
        if not 0 <= ratio <= 1:
            raise _invalid(value, name, "Value must be between 0 and 1")
        return text
    if d.type == BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise _invalid(value, name, "Expected value to be either true or false")
        text = text.lower()
    if d.type == LIST:
        items = [i.strip() for i in text.split(",") if i.strip()]
        bad = [i for i in items if d.choices and i not in d.choices]
        if bad or (d.choices and not items):
            raise _invalid(value, name, f"String must be one of: {', '.join(d.choices)}")
        return ",".join(items)
    if d.choices and text not in d.choices:
        raise _invalid(value, name, f"String must be one of: {', '.join(d.choices)}")
    return text


def topic_def(name: str) -> ConfigDef:
    d = TOPIC_CONFIGS.get(name)
    if d is None:
        raise ConfigChangeError(INVALID_CONFIG, f"Unknown topic config name: {name}")
    return d


def validate_topic_configs(configs: Mapping[str, str | None], base: LogConfig) -> dict[str, str]:
    """CreateTopics / AlterConfigs: every name known, every value valid, and the LogConfig they
    make over ``base`` consistent.  Returns the normalized overrides."""
    out = {name: validate_value(topic_def(name), value) for name, value in configs.items()}
    try:
        log_config(base, out)
    except ConfigError as exc:
        raise ConfigChangeError(INVALID_CONFIG, str(exc)) from None
    return out


def broker_def(name: str) -> ConfigDef:
    """The definition of a dynamic broker config (its topic config's, under the broker name)."""
    if name in DYNAMIC_BROKER_CONFIGS:
        return dataclasses.replace(TOPIC_CONFIGS[BROKER_TO_TOPIC[name]], name=name)
    if name in DYNAMIC_BROKER_OWN:
        return BROKER_OWN[name][0]
    if name in BROKER_STATIC_NAMES:
        raise ConfigChangeError(INVALID_REQUEST,
                                f"Cannot update these configs dynamically: [{name}]")
    raise ConfigChangeError(INVALID_CONFIG, f"Unknown broker config name: {name}")


# --- effective values ------------------------------------------------------------------------


def log_config(base: LogConfig, *layers: dict[str, str]) -> LogConfig:
    """``base`` with the topic-named ``layers`` applied in order (later wins); only the configs
    LogConfig has take part."""
    values: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.items():
            d = TOPIC_CONFIGS.get(name)
            if d is not None and d.log_field is not None:
                values[name] = value
    if INTERNAL_SEGMENT_BYTES in values:  # wins over segment.bytes, as in Kafka's LogConfig
        values["segment.bytes"] = values.pop(INTERNAL_SEGMENT_BYTES)
    return LogConfig.from_kafka(values, base) if values else base


def broker_layers(meta: Any, node_id: int) -> list[dict[str, str]]:
    """The dynamic broker configs of ``node_id`` as topic-named layers: cluster default first."""
    stored = getattr(meta, "broker_configs", None) or {}
    return [{BROKER_TO_TOPIC[k]: v for k, v in stored.get(key, {}).items() if k in BROKER_TO_TOPIC}
            for key in ("", str(node_id))]


def effective_log_config(meta: Any, base: LogConfig, node_id: int, topic: str) -> LogConfig:
    """The LogConfig a partition of ``topic`` runs with on worker ``node_id``."""
    info = meta.topics.get(topic)
    overrides = info.configs if info is not None else {}
    return log_config(base, *broker_layers(meta, node_id), overrides)


def _static_value(d: ConfigDef, base: LogConfig) -> str | None:
    """The value ``shmq broker --override`` set for ``d``, if it differs from Kafka's default."""
    if d.log_field is None:
        return None
    value = str(getattr(base, d.log_field))
    default = str(getattr(LogConfig(), d.log_field))
    return value if value != default else None


@dataclass
class Entry:
    name: str
    value: str | None
    source: int
    read_only: bool
    type: int
    doc: str
    synonyms: list[tuple[str, str | None, int]]     # (name, value, source)
    sensitive: bool = False


def describe_topic(meta: Any, base: LogConfig, node_id: int, topic: str,
                   keys: Iterable[str] | None,
                   overrides: Mapping[str, str] | None = None) -> list[Entry]:
    """Every config of ``topic`` (or the ``keys`` asked for), with value, source and synonyms,
    sorted by name.  ``overrides`` replaces the topic's stored ones (CreateTopics describes a
    topic before it exists)."""
    if overrides is None:
        overrides = meta.topics[topic].configs
    stored = getattr(meta, "broker_configs", None) or {}
    names = sorted(TOPIC_CONFIGS) if keys is None else [k for k in keys if k in TOPIC_CONFIGS]
    if INTERNAL_SEGMENT_BYTES not in overrides:
        names = [n for n in names if n != INTERNAL_SEGMENT_BYTES]
    out = []
    for name in names:
        d = TOPIC_CONFIGS[name]
        chain: list[tuple[str, str | None, int]] = []
        if name in overrides:
            chain.append((name, overrides[name], TOPIC_CONFIG))
        chain += _broker_chain(d, stored, base, node_id)
        value, source = (chain[0][1], chain[0][2]) if chain else (d.default, DEFAULT_CONFIG)
        if source == DEFAULT_CONFIG:  # the synonym may be in other units (log.retention.hours)
            value = d.default
        out.append(Entry(name, value, source, False, d.type, d.doc, chain))
    return out


def _broker_chain(d: ConfigDef, stored: dict[str, dict[str, str]], base: LogConfig,
                  node_id: int) -> list[tuple[str, str | None, int]]:
    """The broker-level synonyms of topic config ``d``, highest priority first.  As Kafka's
    ``ConfigHelper.configSynonyms`` does, the list starts at the first entry that has the main
    broker name: Kafka's default of ``log.retention.ms`` is null (the default lives in
    ``log.retention.hours``), so an unset retention lists no synonym at all."""
    chain: list[tuple[str, str | None, int]] = []
    if d.synonyms:
        broker_name = d.synonyms[0]
        for key, source in ((str(node_id), DYNAMIC_BROKER_CONFIG), ("", DYNAMIC_DEFAULT_BROKER_CONFIG)):
            if broker_name in stored.get(key, {}):
                chain.append((broker_name, stored[key][broker_name], source))
        static = _static_value(d, base)
        if static is not None:
            chain.append((broker_name, static, STATIC_BROKER_CONFIG))
        chain.append(d.default_synonym + (DEFAULT_CONFIG,) if d.default_synonym
                     else (broker_name, d.default, DEFAULT_CONFIG))
        while chain and chain[0][0] != broker_name:
            chain.pop(0)
    return chain


# Read-only broker configs: name -> (type, value of a BrokerConfig and node id, doc)
BROKER_STATIC: dict[str, tuple[int, Callable[[Any, int], str | None], str]] = {
    "auto.create.topics.enable": (BOOLEAN, lambda c, n: str(c.auto_create_topics).lower(),
                                  "Enable auto creation of topics on the server."),
    "broker.id": (INT, lambda c, n: str(n), "The broker id (shmq: the worker's node id)."),
    "default.replication.factor": (INT, lambda c, n: "1", "The replication factor of "
                                   "automatically created topics."),
    "fetch.max.bytes": (INT, lambda c, n: str(c.fetch_max_bytes), "The maximum number of "
                        "bytes a Fetch response returns (one batch more if the first is "
                        "larger)."),
    "flush.on.ack": (BOOLEAN, lambda c, n: str(c.flush_on_ack).lower(), "shmq: acks=all waits "
                     "for an fsync (group commit)."),
    "listeners": (STRING, lambda c, n: None, "The listener of this broker."),
    "log.dirs": (STRING, lambda c, n: str(c.data_dir / f"worker-{n}") if n else None,
                 "The directory in which the log data is kept."),
    "node.id": (INT, lambda c, n: str(n), "The node id (0: the controller)."),
    "num.partitions": (INT, lambda c, n: str(c.num_partitions), "The default number of log "
                       "partitions per topic."),
    "socket.request.max.bytes": (INT, lambda c, n: str(c.socket_request_max_bytes),
                                 "The maximum number of bytes in a socket request."),
}
_BROKER_STATIC_DEFAULTS = {"auto.create.topics.enable": "true", "num.partitions": "1",
                           "socket.request.max.bytes": str(100 * 1024 * 1024),
                           "flush.on.ack": "true", "default.replication.factor": "1",
                           "fetch.max.bytes": str(55 * 1024 * 1024)}
BROKER_STATIC_NAMES = (frozenset(BROKER_STATIC) | frozenset(BROKER_OWN) | frozenset(
    s for d in TOPIC_CONFIGS.values() for s in d.synonyms)) - DYNAMIC_BROKER_CONFIGS \
    - DYNAMIC_BROKER_OWN


def producer_id_expiration_ms(meta: Any, node_id: int, static: int) -> int:
    """``producer.id.expiration.ms`` on worker ``node_id``: its own dynamic value, else the
    cluster-wide one, else ``static`` (``--override`` or Kafka's default)."""
    stored = getattr(meta, "broker_configs", None) or {}
    for key in (str(node_id), ""):
        value = stored.get(key, {}).get("producer.id.expiration.ms")
        if value is not None:
            return int(value)
    return static


def describe_broker(meta: Any, config: Any, node_id: int, keys: Iterable[str] | None,
                    default_entity: bool = False) -> list[Entry]:
    """A broker's configs (``default_entity``: only the cluster-wide dynamic ones, Kafka's
    answer for the resource name "")."""
    stored = getattr(meta, "broker_configs", None) or {}
    entries: list[Entry] = []
    if default_entity:
        for name, value in sorted(stored.get("", {}).items()):
            d = broker_def(name)
            entries.append(Entry(name, value, DYNAMIC_DEFAULT_BROKER_CONFIG, False, d.type,
                                 d.doc, [(name, value, DYNAMIC_DEFAULT_BROKER_CONFIG)]))
        return [e for e in entries if keys is None or e.name in keys]
    host, port = meta.brokers.get(node_id, (config.host, 0))
    for name, (type_, get, doc) in BROKER_STATIC.items():
        value = f"PLAINTEXT://{host}:{port}" if name == "listeners" else get(config, node_id)
        default = _BROKER_STATIC_DEFAULTS.get(name)
        source = DEFAULT_CONFIG if default is not None and value == default else STATIC_BROKER_CONFIG
        entries.append(Entry(name, value, source, True, type_, doc, [(name, value, source)]))
    for name, (d, field_name, dynamic) in BROKER_OWN.items():
        chain = []
        if dynamic:
            for key, source in ((str(node_id), DYNAMIC_BROKER_CONFIG),
                                ("", DYNAMIC_DEFAULT_BROKER_CONFIG)):
                if name in stored.get(key, {}):
                    chain.append((name, stored[key][name], source))
        static = str(getattr(config, field_name))
        if static != d.default:
            chain.append((name, static, STATIC_BROKER_CONFIG))
        chain.append((name, d.default, DEFAULT_CONFIG))
        entries.append(Entry(name, chain[0][1], chain[0][2], not dynamic, d.type, d.doc, chain))
    for name in sorted(DYNAMIC_BROKER_CONFIGS):
        d = broker_def(name)
        topic = TOPIC_CONFIGS[BROKER_TO_TOPIC[name]]
        chain = _broker_chain(topic, stored, config.log, node_id)
        if chain:
            value, source = chain[0][1], chain[0][2]
        else:  # Kafka's default is null: log.retention.ms (168 is log.retention.hours')
            value, source = None, DEFAULT_CONFIG
        entries.append(Entry(name, value, source, False, d.type, d.doc, chain))
        if topic.default_synonym:  # log.retention.hours=168: read-only, Kafka's default
            other, default = topic.default_synonym
            entries.append(Entry(other, default, DEFAULT_CONFIG, True, INT if "hours" in other
                                 else d.type, d.doc, [(other, default, DEFAULT_CONFIG)]))
    entries.sort(key=lambda e: e.name)
    return [e for e in entries if keys is None or e.name in keys]


# --- changes -----------------------------------------------------------------------------------


def apply_ops(current: dict[str, str], ops: list[tuple[str, int, str | None]],
              lookup: Callable[[str], ConfigDef], incremental: bool) -> dict[str, str]:
    """The new override map after AlterConfigs (``incremental`` False: the given configs replace
    all overrides) or IncrementalAlterConfigs (SET / DELETE / APPEND / SUBTRACT)."""
    names = [name for name, _, _ in ops]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigChangeError(INVALID_REQUEST, "Error due to duplicate config keys")
    new = dict(current) if incremental else {}
    for name, op, value in ops:
        d = lookup(name)
        if not incremental or op == SET:
            if value is None and not incremental:
                continue
            new[name] = validate_value(d, value, name)
        elif op == DELETE:
            new.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            if d.type != LIST:
                verb = "APPEND" if op == APPEND else "SUBTRACT"
                raise ConfigChangeError(INVALID_CONFIG, f"Can't {verb} to key {name} because "
                                                        "its type is not LIST.")
            have = [i for i in (new.get(name, d.default) or "").split(",") if i]
            given = [i.strip() for i in (value or "").split(",") if i.strip()]
            if op == APPEND:
                items = have + [i for i in given if i not in have]
            else:
                items = [i for i in have if i not in given]
            new[name] = validate_value(d, ",".join(items), name) if items else ""
            if not items and d.choices:
                raise _invalid("", name, f"String must be one of: {', '.join(d.choices)}")
        else:
            raise ConfigChangeError(INVALID_REQUEST, f"Unknown alter configs operation {op} for "
                                                     f"config key: {name}")
    return new
