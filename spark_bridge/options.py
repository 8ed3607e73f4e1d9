"""The options of Spark's Kafka source and sink, parsed and checked as Spark's
``KafkaSourceProvider`` does (its option names, its rules, its defaults).

Option values arrive as strings in a case-insensitive map.  What differs from Kafka, on
purpose:

* ``kafka.bootstrap.servers`` is optional: without it the bridge reads the local broker whose
  data directory is ``shmq.dataDir`` (default ``$SHMQ_DATA_DIR``, else ``~/.local/share/shmq``).
* ``subscribePattern`` is a Python regular expression (Java's syntax for everything a topic
  pattern usually holds), matched against whole topic names as Kafka does.
* A topic named in ``subscribe`` or ``assign`` that does not exist is an error for a batch query
  (Kafka returns an empty DataFrame); a streaming query waits for it, as Kafka's does.
* shmq-only options: ``shmq.dataDir``, ``shmq.transport`` (``auto``, ``mmap`` or ``kafka``) and
  ``shmq.batchRows`` and ``shmq.batchBytes`` (rows per Arrow batch handed to Spark, at most
  65536 and about 8 MiB of records by default).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shmq.storage.reader import DEFAULT_CHUNK_BYTES
from spark_bridge.errors import BridgeError

EARLIEST, LATEST = -2, -1  # Kafka's KafkaOffsetRangeLimit.EARLIEST / LATEST

# kafka.* keys Spark's source refuses, and why (KafkaSourceProvider.validateGeneralOptions)
_FORBIDDEN_SOURCE = {
    "auto.offset.reset": "set the source option 'startingOffsets' to 'earliest' or 'latest' "
                         "instead (it only applies to a new query; a restarted one resumes "
                         "where it stopped)",
    "key.deserializer": "keys are always bytes; use DataFrame operations to deserialize them",
    "value.deserializer": "values are always bytes; use DataFrame operations to deserialize them",
    "enable.auto.commit": "the source never commits consumer-group offsets",
    "interceptor.classes": "interceptors could change the records",
}
_FORBIDDEN_SINK = {
    "key.serializer": "keys are always written as bytes (cast the key column to string or "
                      "binary)",
    "value.serializer": "values are always written as bytes (cast the value column to string "
                        "or binary)",
}
_TRANSPORTS = ("auto", "mmap", "kafka")
_TIME_UNITS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
               "d": 86_400_000}


@dataclass(frozen=True)
class OffsetSpec:
    """startingOffsets / endingOffsets and their timestamp variants, resolved per partition at
    planning.  ``kind``: "earliest", "latest", "offsets" (``value``: {(topic, partition):
    offset, -2 earliest, -1 latest}), "timestamps" (``value``: {(topic, partition): ms}) or
    "timestamp" (``value``: ms for every partition)."""

    kind: str
    value: Any = None


@dataclass(frozen=True)
class SourceOptions:
    strategy: str                       # "assign" | "subscribe" | "subscribePattern"
    topics: tuple[str, ...] = ()        # subscribe
    pattern: re.Pattern | None = None   # subscribePattern
    assigned: tuple[tuple[str, int], ...] = ()  # assign
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    no_match_latest: bool = False       # startingOffsetsByTimestampStrategy=latest
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    bootstrap: str | None = None
    data_dir: Path | None = None
    transport: str = "auto"
    batch_rows: int = 65536
    batch_bytes: int = DEFAULT_CHUNK_BYTES
    isolation_level: str = "read_uncommitted"
    poll_timeout_ms: int = 120_000
    kafka_conf: dict[str, str] = field(default_factory=dict)

    @property
    def describe_strategy(self) -> str:
        if self.strategy == "assign":
            return "assign " + json.dumps(_assign_json(self.assigned))
        if self.strategy == "subscribe":
            return "subscribe " + ",".join(self.topics)
        assert self.pattern is not None
        return "subscribePattern " + self.pattern.pattern


@dataclass(frozen=True)
class SinkOptions:
    topic: str | None
    bootstrap: str | None
    data_dir: Path | None
    kafka_conf: dict[str, str]
    transport: str = "auto"


def lower(options: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def parse_source(options: Any, *, streaming: bool) -> SourceOptions:
    """Check the source options as Kafka's provider does; raise ``BridgeError`` on bad input."""
    o = lower(options)
    strategies = [k for k in ("assign", "subscribe", "subscribepattern") if k in o]
    names = "assign, subscribe, subscribePattern"
    if not strategies:
        raise BridgeError(f"one of the options {names} must be given (which topics to read)")
    if len(strategies) > 1:
        raise BridgeError(f"only one of the options {names} may be given")
    kw: dict[str, Any] = {}
    kind = strategies[0]
    value = o[kind]
    if kind == "assign":
        kw["strategy"] = "assign"
        kw["assigned"] = _parse_assign(value)
    elif kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise BridgeError(f"no topics to subscribe to: option 'subscribe' is {value!r}")
        kw["strategy"], kw["topics"] = "subscribe", topics
    else:
        if not value.strip():
            raise BridgeError(f"the pattern to subscribe to is empty: option 'subscribePattern' "
                              f"is {value!r}")
        try:
            kw["pattern"] = re.compile(value.strip())
        except re.error as exc:
            raise BridgeError(f"option 'subscribePattern' {value!r} is not a valid regular "
                              f"expression: {exc}") from None
        kw["strategy"] = "subscribePattern"

    if streaming:
        for key, name in (("endingoffsets", "endingOffsets"), ("endingtimestamp", "endingTimestamp"),
                          ("endingoffsetsbytimestamp", "endingOffsetsByTimestamp")):
            if key in o:
                raise BridgeError(f"option '{name}' is not valid in streaming queries (a stream "
                                  "has no end)")
    kw["starting"] = _offset_spec(o, "startingtimestamp", "startingoffsetsbytimestamp",
                                  "startingoffsets", "startingOffsets",
                                  default="latest" if streaming else "earliest")
    if not streaming:
        kw["ending"] = _offset_spec(o, "endingtimestamp", "endingoffsetsbytimestamp",
                                    "endingoffsets", "endingOffsets", default="latest")
        _check_batch_limits(kw["starting"], kw["ending"])
    strategy = o.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise BridgeError(f"option 'startingOffsetsByTimestampStrategy' must be 'error' or "
                          f"'latest', not {strategy!r}")
    kw["no_match_latest"] = strategy == "latest"
    kw["fail_on_data_loss"] = _bool(o, "failondataloss", "failOnDataLoss", True)
    kw["include_headers"] = _bool(o, "includeheaders", "includeHeaders", False)
    kw["min_partitions"] = _positive(o, "minpartitions", "minPartitions")
    kw["max_records_per_partition"] = _positive(o, "maxrecordsperpartition",
                                                "maxRecordsPerPartition")
    kw["max_offsets_per_trigger"] = _positive(o, "maxoffsetspertrigger", "maxOffsetsPerTrigger")
    kw["min_offsets_per_trigger"] = _positive(o, "minoffsetspertrigger", "minOffsetsPerTrigger")
    if (kw["min_offsets_per_trigger"] and kw["max_offsets_per_trigger"]
            and kw["min_offsets_per_trigger"] > kw["max_offsets_per_trigger"]):
        raise BridgeError(f"minOffsetsPerTrigger ({kw['min_offsets_per_trigger']}) is higher "
                          f"than maxOffsetsPerTrigger ({kw['max_offsets_per_trigger']})")
    if "maxtriggerdelay" in o:
        kw["max_trigger_delay_ms"] = _duration_ms(o["maxtriggerdelay"], "maxTriggerDelay")
    kw["poll_timeout_ms"] = _positive(o, "kafkaconsumer.polltimeoutms",
                                      "kafkaConsumer.pollTimeoutMs") or 120_000
    kw["batch_rows"] = _positive(o, "shmq.batchrows", "shmq.batchRows") or 65536
    kw["batch_bytes"] = _positive(o, "shmq.batchbytes", "shmq.batchBytes") or DEFAULT_CHUNK_BYTES
    kw.update(_target(o))
    conf = _kafka_conf(o, _FORBIDDEN_SOURCE)
    level = conf.pop("isolation.level", "read_uncommitted").strip().lower()
    if level not in ("read_uncommitted", "read_committed"):
        raise BridgeError(f"option 'kafka.isolation.level' must be read_uncommitted or "
                          f"read_committed, not {level!r}")
    kw["isolation_level"] = level
    conf.pop("group.id", None)  # the source never joins a group (Kafka warns, shmq ignores it)
    kw["kafka_conf"] = conf
    return SourceOptions(**kw)


def parse_sink(options: Any) -> SinkOptions:
    o = lower(options)
    topic = o.get("topic")
    target = _target(o)
    return SinkOptions(topic=topic.strip() if topic is not None else None,
                       bootstrap=target["bootstrap"], data_dir=target["data_dir"],
                       kafka_conf=_kafka_conf(o, _FORBIDDEN_SINK),
                       transport=target["transport"])


# -- pieces ---------------------------------------------------------------------------------


def _target(o: dict[str, str]) -> dict[str, Any]:
    transport = o.get("shmq.transport", "auto").strip().lower()
    if transport not in _TRANSPORTS:
        raise BridgeError(f"option 'shmq.transport' must be one of {', '.join(_TRANSPORTS)}, "
                          f"not {transport!r}")
    bootstrap = o.get("kafka.bootstrap.servers")
    if bootstrap is not None and not bootstrap.strip():
        raise BridgeError("option 'kafka.bootstrap.servers' is empty")
    data_dir = o.get("shmq.datadir")
    return {"transport": transport,
            "bootstrap": bootstrap.strip() if bootstrap else None,
            "data_dir": Path(data_dir).expanduser() if data_dir else None}


def default_data_dir() -> Path:
    """Where ``shmq broker`` keeps its data when not told otherwise."""
    env = os.environ.get("SHMQ_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".local" / "share" / "shmq"


def _kafka_conf(o: dict[str, str], forbidden: dict[str, str]) -> dict[str, str]:
    conf = {}
    for key, value in o.items():
        if not key.startswith("kafka.") or key == "kafka.bootstrap.servers":
            continue
        name = key[len("kafka."):]
        if name in forbidden:
            raise BridgeError(f"Kafka option '{name}' is not supported: {forbidden[name]}")
        conf[name] = value
    return conf


def _parse_assign(value: str) -> tuple[tuple[str, int], ...]:
    if not value.strip().startswith("{"):
        raise BridgeError(f"no topic partitions to assign: option 'assign' is {value!r}; "
                          'write it as JSON, e.g. {"topicA":[0,1],"topicB":[2]}')
    data = _json(value, "assign", '{"topicA":[0,1],"topicB":[2]}')
    if not isinstance(data, dict) or not all(
            isinstance(t, str) and isinstance(ps, list)
            and all(isinstance(p, int) and not isinstance(p, bool) for p in ps)
            for t, ps in data.items()):
        raise BridgeError(f"option 'assign' must map topics to lists of partition numbers, "
                          f'e.g. {{"topicA":[0,1]}}; got {value!r}')
    out = tuple((t, p) for t, ps in data.items() for p in ps)
    if not out:
        raise BridgeError(f"no topic partitions to assign: option 'assign' is {value!r}")
    if any(p < 0 for _, p in out):
        raise BridgeError(f"option 'assign' names a negative partition: {value!r}")
    return out


def _assign_json(assigned: tuple[tuple[str, int], ...]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for t, p in assigned:
        out.setdefault(t, []).append(p)
    return out


def _json(value: str, name: str, example: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise BridgeError(f"option '{name}' is not valid JSON ({exc}); expected e.g. "
                          f"{example}") from None


def _partition_map(value: str, name: str, example: str) -> dict[tuple[str, int], int]:
    data = _json(value, name, example)
    ok = isinstance(data, dict) and all(
        isinstance(ps, dict) and all(
            isinstance(p, str) and p.strip().lstrip("-").isdigit()
            and isinstance(v, int) and not isinstance(v, bool) for p, v in ps.items())
        for ps in data.values())
    if not ok:
        raise BridgeError(f"option '{name}' must map topics to {{partition: number}} objects, "
                          f"e.g. {example}; got {value!r}")
    return {(t, int(p)): v for t, ps in data.items() for p, v in ps.items()}


def _offset_spec(o: dict[str, str], global_ts: str, by_ts: str, offsets: str, name: str,
                 default: str) -> OffsetSpec:
    """Kafka's precedence: a global timestamp, then timestamps per partition, then offsets."""
    if global_ts in o:
        text = o[global_ts].strip()
        try:
            return OffsetSpec("timestamp", int(text))
        except ValueError:
            raise BridgeError(f"option '{name.replace('Offsets', 'Timestamp')}' must be one "
                              f"number of milliseconds, got {text!r}") from None
    if by_ts in o:
        return OffsetSpec("timestamps", _partition_map(
            o[by_ts], name + "ByTimestamp", '{"topicA":{"0":1700000000000}}'))
    text = o.get(offsets, default).strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(text.lower())
    if not text.startswith("{"):
        raise BridgeError(f"option '{name}' must be earliest, latest or JSON such as "
                          f'{{"topicA":{{"0":23,"1":-2}}}}, not {text!r}')
    spec = _partition_map(text, name, '{"topicA":{"0":23,"1":-2}}')
    bad = {tp: v for tp, v in spec.items() if v < EARLIEST}
    if bad:
        (t, p), v = next(iter(bad.items()))
        raise BridgeError(f"option '{name}' gives offset {v} for {t}-{p}: an offset is >= 0, "
                          "or -2 for earliest, -1 for latest")
    return OffsetSpec("offsets", spec)


def _check_batch_limits(start: OffsetSpec, end: OffsetSpec) -> None:
    if start.kind == "latest":
        raise BridgeError("startingOffsets can't be latest for batch queries (nothing would "
                          "be read)")
    if start.kind == "offsets":
        for (t, p), v in start.value.items():
            if v == LATEST:
                raise BridgeError(f"startingOffsets for {t}-{p} can't be latest (-1) for batch "
                                  "queries")
    if end.kind == "earliest":
        raise BridgeError("endingOffsets can't be earliest for batch queries (nothing would "
                          "be read)")
    if end.kind == "offsets":
        for (t, p), v in end.value.items():
            if v == EARLIEST:
                raise BridgeError(f"endingOffsets for {t}-{p} can't be earliest (-2) for batch "
                                  "queries")
    if start.kind == end.kind and start.kind in ("offsets", "timestamps"):
        if set(start.value) != set(end.value):
            raise BridgeError("startingOffsets and endingOffsets must name the same topic "
                              f"partitions ({_names(start.value)} vs {_names(end.value)})")
        for tp, s in start.value.items():
            e = end.value[tp]
            if s >= 0 and e >= 0 and s > e:
                raise BridgeError(f"the starting {'offset' if start.kind == 'offsets' else 'timestamp'} "
                                  f"{s} of {tp[0]}-{tp[1]} is after the ending one {e}")


def _names(spec: dict[tuple[str, int], int]) -> str:
    return ",".join(f"{t}-{p}" for t, p in sorted(spec))


def _bool(o: dict[str, str], key: str, name: str, default: bool) -> bool:
    if key not in o:
        return default
    text = o[key].strip().lower()
    if text not in ("true", "false"):
        raise BridgeError(f"option '{name}' must be true or false, not {o[key]!r}")
    return text == "true"


def _positive(o: dict[str, str], key: str, name: str) -> int | None:
    if key not in o:
        return None
    try:
        n = int(o[key].strip())
    except ValueError:
        raise BridgeError(f"option '{name}' must be a whole number, not {o[key]!r}") from None
    if n <= 0:
        raise BridgeError(f"option '{name}' must be positive, not {n}")
    return n


def _duration_ms(text: str, name: str) -> int:
    """Spark's ``Utils.timeStringAsMs``: a number with an optional unit (ms by default)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in ("", *_TIME_UNITS):
        raise BridgeError(f"option '{name}' must be a duration such as 15m, 30s or 500ms, not "
                          f"{text!r}")
    return int(int(m.group(1)) * _TIME_UNITS[m.group(2) or "ms"])
