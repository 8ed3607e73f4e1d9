"""``df.write.format("shmq")`` / ``writeStream.format("shmq")``: Kafka's sink, through the broker.

The columns and their rules are those of Spark's Kafka sink (``KafkaWriter``): ``value``
(string or binary, required), ``key`` (string or binary, optional: null keys), ``topic``
(string; the ``topic`` option overrides it, and one of the two must be there), ``partition``
(int, optional: null means the partitioner), ``headers`` (array<struct<key: string, value:
binary>>, optional) and ``timestamp`` (timestamp, optional: null means now).  The schema is
checked on the driver before any task starts; a row with a null topic fails its task.

Records go through a ``RecordSink`` per task.  Today that is ``KafkaProtocolSink``:
confluent-kafka with idempotence and ``acks=all`` (Kafka's Java producer defaults since 3.0)
and librdkafka's ``murmur2_random`` partitioner, which puts a keyed record in the partition
Kafka's Java client would choose (murmur2 of the key, as ``BuiltInPartitioner``).  When shmq's
shared-memory produce path exists, ``open_sink`` returns it for a local broker instead; the
writers do not change.  The guarantee is Kafka's sink's: at least once (a task Spark retries
writes its rows again).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from spark_bridge.catalog import client_conf, read_run_file
from spark_bridge.errors import BridgeError
from spark_bridge.options import SinkOptions, default_data_dir, parse_sink

log = logging.getLogger("shmq.spark")
_FLUSH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class SinkTarget:
    bootstrap: str
    topic: str | None                     # the topic option (overrides the column)
    columns: tuple[str, ...]              # the sink columns present in the DataFrame
    kafka_conf: dict[str, str] = field(default_factory=dict)


@dataclass
class SinkCommit(WriterCommitMessage):
    rows: int


def _type_name(dt: Any) -> str:
    return dt.simpleString() if hasattr(dt, "simpleString") else str(dt)


def check_sink_schema(schema: Any, topic_option: str | None) -> tuple[str, ...]:
    """``KafkaWriter.validateQuery``: the sink columns present, or a ``BridgeError``."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        StringType,
        StructType,
        TimestampType,
    )

    fields = {f.name: f.dataType for f in schema.fields}
    headers_type = ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))
    allowed: dict[str, tuple[Any, ...]] = {
        "topic": (StringType(),), "key": (StringType(), BinaryType()),
        "value": (StringType(), BinaryType()), "headers": (headers_type,),
        "partition": (IntegerType(),), "timestamp": (TimestampType(),),
    }
    if "value" not in fields:
        raise BridgeError("required attribute 'value' not found (the sink writes a value column "
                          "of type string or binary)")
    if topic_option is None and "topic" not in fields:
        raise BridgeError("topic option required when no 'topic' attribute is present; use the "
                          "topic option for setting a topic")
    for name, types in allowed.items():
        if name in fields and not any(_same_type(fields[name], t) for t in types):
            want = " or ".join(_type_name(t) for t in types)
            raise BridgeError(f"{name} attribute unsupported type {_type_name(fields[name])}; "
                              f"{name} must be a(n) {want}")
    return tuple(n for n in allowed if n in fields and not (n == "topic" and topic_option))


def _same_type(a: Any, b: Any) -> bool:
    """Spark's ``sameType``: equal ignoring nullability."""
    from pyspark.sql.types import ArrayType, StructType

    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return _same_type(a.elementType, b.elementType)
    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and _same_type(x.dataType, y.dataType)
            for x, y in zip(a.fields, b.fields, strict=True))
    return type(a) is type(b)


def resolve_target(opts: SinkOptions, schema: Any) -> SinkTarget:
    columns = check_sink_schema(schema, opts.topic)
    bootstrap = opts.bootstrap
    if bootstrap is None:
        data_dir = opts.data_dir or default_data_dir()
        bootstrap = read_run_file(data_dir).get("bootstrap")
        if not bootstrap:
            raise BridgeError(f"{data_dir}/run/broker.json names no bootstrap address")
    return SinkTarget(bootstrap, opts.topic, columns, dict(opts.kafka_conf))


# -- where records go ----------------------------------------------------------------------


class RecordSink(ABC):
    """Sends the rows of Arrow batches to the broker; ``flush`` returns once every row is
    acknowledged, or raises."""

    @abstractmethod
    def send_arrow(self, batch: Any) -> int:
        """Queue the rows of one ``pyarrow.RecordBatch``; returns how many."""

    @abstractmethod
    def flush(self) -> None:
        """Wait for every acknowledgement; raise ``BridgeError`` on the first failure."""

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        pass


def open_sink(target: SinkTarget) -> RecordSink:
    """The transport for a write task.  Only the Kafka protocol exists today; the
    shared-memory produce path (rings into the worker) will be chosen here for a local broker
    once it exists, behind the same interface."""
    return KafkaProtocolSink(target)


class KafkaProtocolSink(RecordSink):
    """confluent-kafka, one producer per task.  Delivery reports come only for failures
    (``delivery.report.only.error``: no Python call per acknowledged record), and rows without
    headers or timestamps go through ``produce_batch`` (one call per Arrow batch and topic;
    measured 150k -> 260k records/s in one Python process on the loaded 2-core box)."""

    def __init__(self, target: SinkTarget) -> None:
        from confluent_kafka import Producer

        from spark_bridge.reading import make_client

        self.target = target
        conf = client_conf(target.bootstrap, target.kafka_conf)
        conf.setdefault("enable.idempotence", True)
        conf.setdefault("acks", "all")
        conf.setdefault("partitioner", "murmur2_random")  # Java's choice for keyed records
        conf["delivery.report.only.error"] = True
        conf["on_delivery"] = self._on_delivery
        self.producer = make_client(Producer, conf)
        self.error: str | None = None
        self.known_topics: set[str] = set()

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None and self.error is None:
            self.error = f"writing to {msg.topic()}-{msg.partition()} failed: {err.str()}"

    def _check_topic(self, topic: str) -> None:
        """A topic that does not exist is an error now, not a delivery timeout later (the
        Metadata request auto-creates it where the broker allows that)."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            md = self.producer.list_topics(topic, timeout=30)
        except KafkaException as exc:
            raise BridgeError(f"cannot reach the broker at {self.target.bootstrap}: "
                              f"{exc.args[0].str() if exc.args else exc}") from None
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            code = t.error.code() if t is not None and t.error is not None else None
            if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise BridgeError(f"not allowed to write to topic {topic!r}")
            if code == KafkaError.TOPIC_EXCEPTION:
                raise BridgeError(f"{topic!r} is not a valid topic name")
            raise BridgeError(f"topic {topic!r} does not exist and the broker does not create "
                              "topics automatically (auto.create.topics.enable=false); create "
                              "it first")
        self.known_topics.add(topic)

    def send_arrow(self, batch: Any) -> int:
        n = batch.num_rows
        if n == 0:
            return 0
        names = batch.schema.names
        cols = self.target.columns

        def column(name: str) -> list | None:
            if name not in cols or name not in names:
                return None
            return batch.column(name).to_pylist()

        values = column("value")
        assert values is not None
        keys = column("key")
        partitions = column("partition")
        headers = column("headers")
        stamps = None
        if "timestamp" in cols and "timestamp" in names:
            import pyarrow as pa

            micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
            stamps = [None if us is None else us // 1000 for us in micros]  # Kafka's ms
        topics = None if self.target.topic else column("topic")
        if topics is not None:
            if None in topics:
                raise BridgeError("null topic present in the data; use the topic option for "
                                  "setting a default topic")
            distinct = set(topics)
        else:
            assert self.target.topic is not None
            distinct = {self.target.topic}
        for t in distinct - self.known_topics:
            self._check_topic(t)
        if headers is None and stamps is None and partitions is None and len(distinct) == 1:
            # produce_batch takes neither headers nor timestamps, and confluent-kafka 2.16
            # drops a record for an unknown partition without an error: explicit partitions go
            # through produce(), which refuses them
            self._send_batch(next(iter(distinct)), keys, values)
        else:
            self._send_rows(topics or [self.target.topic] * n, keys, values, partitions,
                            headers, stamps)
        if self.error is not None:
            raise BridgeError(self.error)
        self.producer.poll(0)
        return n

    def _send_batch(self, topic: str, keys: list | None, values: list) -> None:
        from confluent_kafka import KafkaError

        if keys is None:
            msgs = [{"value": v} for v in values]
        else:
            msgs = [{"key": k, "value": v} for k, v in zip(keys, values, strict=True)]
        pending = msgs
        while pending:
            queued = self.producer.produce_batch(topic, pending)
            if queued == len(pending):
                return
            failed = [m for m in pending if "_error" in m]
            for m in failed:
                err = m.pop("_error")
                if err.code() != KafkaError._QUEUE_FULL:
                    raise BridgeError(f"cannot write a record to {topic}: {err.str()}")
            pending = failed  # the local queue was full: let deliveries drain it, then go on
            self.producer.poll(0.05)

    def _send_rows(self, topics: list, keys: list | None, values: list,
                   partitions: list | None, headers: list | None,
                   stamps: list | None) -> None:
        produce = self.producer.produce
        poll = self.producer.poll
        for i, value in enumerate(values):
            kw: dict[str, Any] = {}
            if keys is not None and keys[i] is not None:
                kw["key"] = keys[i]
            if partitions is not None and partitions[i] is not None:
                kw["partition"] = partitions[i]
            if headers is not None and headers[i] is not None:
                kw["headers"] = [(h["key"], h["value"]) for h in headers[i]]
            if stamps is not None and stamps[i] is not None:
                kw["timestamp"] = stamps[i]
            t = topics[i]
            while True:
                try:
                    produce(t, value, **kw)
                    break
                except BufferError:
                    poll(0.05)  # the local queue is full: let deliveries drain it
                except Exception as exc:  # noqa: BLE001 - librdkafka's errors as one line
                    err = exc.args[0] if exc.args else exc
                    text = err.str() if hasattr(err, "str") else str(err)
                    where = f"{t}-{kw['partition']}" if "partition" in kw else t
                    raise BridgeError(f"cannot write a record to {where}: {text}") from None

    def flush(self) -> None:
        left = self.producer.flush(_FLUSH_TIMEOUT_S)
        if self.error is not None:
            raise BridgeError(self.error)
        if left:
            raise BridgeError(f"{left} records were not acknowledged within "
                              f"{_FLUSH_TIMEOUT_S:.0f} s by {self.target.bootstrap}")


# -- Spark writers -------------------------------------------------------------------------


def _write(target: SinkTarget, batches: Any) -> SinkCommit:
    sink = open_sink(target)
    try:
        rows = 0
        for batch in batches:
            rows += sink.send_arrow(batch)
        sink.flush()
        return SinkCommit(rows)
    finally:
        sink.close()


class ShmqBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: Any, schema: Any, overwrite: bool) -> None:
        if overwrite:
            raise BridgeError("save mode overwrite is not supported: a topic is appended to "
                              "(use mode('append'))")
        self.target = resolve_target(parse_sink(options), schema)

    def write(self, iterator: Any) -> SinkCommit:
        return _write(self.target, iterator)

    def commit(self, messages: list) -> None:
        pass

    def abort(self, messages: list) -> None:
        pass  # acknowledged records stay (Kafka's sink is at least once)


class ShmqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Any, schema: Any) -> None:
        self.target = resolve_target(parse_sink(options), schema)

    def write(self, iterator: Any) -> SinkCommit:
        return _write(self.target, iterator)

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 (Spark's name)
        pass

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803
        pass
