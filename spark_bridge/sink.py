"""``df.write.format("shmq")`` / ``writeStream.format("shmq")``: Kafka's sink, through the broker.

The columns and their rules are those of Spark's Kafka sink (``KafkaWriter``): ``value``
(string or binary, required), ``key`` (string or binary, optional: null keys), ``topic``
(string; the ``topic`` option overrides it, and one of the two must be there), ``partition``
(int, optional: null means the partitioner), ``headers`` (array<struct<key: string, value:
binary>>, optional) and ``timestamp`` (timestamp, optional: null means now).  The schema is
checked on the driver before any task starts; a row with a null topic fails its task.

Records go through a ``RecordSink`` per task, idempotent with ``acks=all`` (Kafka's Java
producer defaults since 3.0), keyed records in the partition Kafka's Java client chooses
(``toPositive(murmur2(key)) % partitions``, ``BuiltInPartitioner``), records without a key
spread over the partitions in blocks (Kafka's sticky partitioning):

* ``RingSink`` when the broker runs on this host (``shmq.transport`` auto or mmap): the rows of
  each Arrow batch are partitioned in Cython (``_fast.murmur2_partitions``), grouped per
  partition, and each group is encoded as RecordBatch v2 straight into the shared-memory submit
  ring of the partition's worker (``shmq.ipc.client``: producer id and sequences, the same
  validation and append as a Produce request, answers on the completion ring).
* ``KafkaProtocolSink`` otherwise (a remote shmq, Apache Kafka, ``shmq.transport=kafka``):
  confluent-kafka, librdkafka's ``murmur2_random`` partitioner.

The guarantee is Kafka's sink's: at least once (a task Spark retries writes its rows again).
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

from spark_bridge.catalog import client_conf, locate_data_dir, read_run_file
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
    data_dir: str | None = None           # the local broker's, for the ring path
    transport: str = "auto"


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
    """The broker to write to (found on the driver, before any task starts)."""
    columns = check_sink_schema(schema, opts.topic)
    data_dir = None
    if opts.transport != "kafka":
        data_dir = locate_data_dir(opts.data_dir, opts.bootstrap, opts.kafka_conf)
        if data_dir is None and opts.transport == "mmap":
            raise BridgeError(f"shmq.transport=mmap, but the broker at {opts.bootstrap} keeps "
                              "no data directory on this host")
    bootstrap = opts.bootstrap
    if bootstrap is None:
        where = data_dir or opts.data_dir or default_data_dir()
        bootstrap = read_run_file(where).get("bootstrap")
        if not bootstrap:
            raise BridgeError(f"{where}/run/broker.json names no bootstrap address")
    return SinkTarget(bootstrap, opts.topic, columns, dict(opts.kafka_conf),
                      str(data_dir) if data_dir else None, opts.transport)


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
    """The transport for a write task: the rings when the driver found a local broker and this
    executor sees it too, the Kafka protocol otherwise."""
    if target.data_dir is not None:
        from shmq.ipc.client import NotLocalError

        try:
            return RingSink(target)
        except (NotLocalError, OSError) as exc:
            if target.transport == "mmap":
                raise BridgeError(f"cannot write through shared memory to the broker in "
                                  f"{target.data_dir}: {exc}") from None
            log.warning("shmq: writing over the Kafka protocol (%s)", exc)
    return KafkaProtocolSink(target)


def _columns(batch: Any, target: SinkTarget, records: bool = True) -> dict[str, Any]:
    """The sink columns of an Arrow batch as Python lists (topic only without the option;
    key and value only for ``records``)."""
    names = batch.schema.names
    out: dict[str, Any] = {}
    wanted = ("key", "value", "partition", "headers") if records else ("partition",)
    for name in wanted:
        if name in target.columns and name in names:
            out[name] = batch.column(name).to_pylist()
    if "timestamp" in target.columns and "timestamp" in names:
        import pyarrow as pa

        micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
        out["timestamp"] = [None if us is None else us // 1000 for us in micros]  # Kafka's ms
    if not target.topic:
        topics = batch.column("topic").to_pylist()
        if None in topics:
            raise BridgeError("null topic present in the data; use the topic option for "
                              "setting a default topic")
        out["topic"] = topics
    return out


class RingSink(RecordSink):
    """Batches encoded straight into the workers' shared-memory rings (``shmq.ipc.client``)."""

    STICKY_ROWS = 1000          # rows without a key go to one partition, then the next
    BATCH_BYTES = 512 * 1024    # encoded batches stay well below max.message.bytes (1 MiB)

    def __init__(self, target: SinkTarget) -> None:
        import random

        from shmq.ipc.client import attach

        assert target.data_dir is not None
        self.target = target
        self.broker = attach(target.data_dir)
        self.futures: list[Any] = []
        self.counts: dict[str, int] = {}
        self.sticky = random.randrange(1 << 30)

    def _partition_count(self, topic: str) -> int:
        count = self.counts.get(topic)
        if count is None:
            count = self._count_from_run_file(topic)
            if count == 0:
                count = self._create(topic)
            self.counts[topic] = count
        return count

    def _count_from_run_file(self, topic: str) -> int:
        self.broker._load_run_info()
        prefix = topic + "/"
        return sum(1 for k in self.broker._info.get("slots", {}) if k.startswith(prefix)
                   and k[len(prefix):].isdigit())

    def _create(self, topic: str) -> int:
        """A topic the run file does not list: a Metadata request creates it where the broker
        creates topics automatically (as a Kafka producer's does), or it is an error."""
        import time

        KafkaProtocolSink(self.target)._check_topic(topic)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            count = self._count_from_run_file(topic)
            if count:
                return count
            time.sleep(0.05)
        raise BridgeError(f"topic {topic!r} exists but the broker's run file does not list it")

    def send_arrow(self, batch: Any) -> int:
        n = batch.num_rows
        if n == 0:
            return 0
        columnar = not {"headers", "timestamp"} & set(self.target.columns)
        cols = _columns(batch, self.target, records=not columnar)
        if "topic" in cols:
            groups: dict[str, list[int]] = {}
            for i, t in enumerate(cols["topic"]):
                groups.setdefault(t, []).append(i)
        else:
            assert self.target.topic is not None
            groups = {self.target.topic: []}  # every row
        for topic, rows in groups.items():
            self._send_topic(topic, batch, cols, rows if "topic" in cols else None)
        self.broker.poll(0)
        self._check()
        return n

    def _partitions(self, topic: str, batch: Any, cols: dict[str, Any], keys: Any) -> Any:
        import numpy as np

        from shmq import _fast

        count = self._partition_count(topic)
        n = batch.num_rows
        parts = np.full(n, -1, np.int32)
        if keys is not None:
            _fast.murmur2_partitions(keys[0], keys[1], keys[2], count, parts)
        nulls = np.flatnonzero(parts < 0)
        if len(nulls):  # Kafka's sticky partitioning: blocks of rows without a key
            blocks = np.arange(len(nulls)) // self.STICKY_ROWS
            parts[nulls] = (self.sticky + blocks) % count
            self.sticky += int(blocks[-1]) + 1
        if "partition" in cols:
            for i, p in enumerate(cols["partition"]):
                if p is not None:
                    if not 0 <= p < count:
                        raise BridgeError(f"cannot write a record to {topic}-{p}: unknown "
                                          f"partition (the topic has {count})")
                    parts[i] = p
        return parts

    def _send_topic(self, topic: str, batch: Any, cols: dict[str, Any],
                    rows: list[int] | None) -> None:
        import numpy as np

        if rows is not None:
            batch = batch.take(rows)
            cols = {k: [v[i] for i in rows] for k, v in cols.items() if k != "topic"}
        keys = _binary_buffers(batch, "key") if "key" in self.target.columns else None
        values = _binary_buffers(batch, "value")
        parts = self._partitions(topic, batch, cols, keys)
        sizes = _sizes(batch)
        order = np.argsort(parts, kind="stable")
        bounds = np.flatnonzero(np.diff(parts[order])) + 1
        columnar = "headers" not in cols and "timestamp" not in cols
        records = None if columnar else _records(cols, batch.num_rows)
        for group in np.split(order, bounds):
            if len(group) == 0:
                continue
            p = int(parts[group[0]])
            # batches of about BATCH_BYTES each
            ends = np.cumsum(sizes[group])
            cuts = np.searchsorted(ends, np.arange(self.BATCH_BYTES, int(ends[-1]),
                                                   self.BATCH_BYTES), side="right")
            for chunk in np.split(group, np.unique(cuts)):
                if len(chunk) == 0:
                    continue
                if columnar:
                    assert values is not None
                    self._submit_columns(topic, p, keys, values, chunk.astype(np.int64))
                else:
                    assert records is not None
                    self._submit(topic, p, [records[i] for i in chunk.tolist()])

    def _submit_columns(self, topic: str, partition: int, keys: Any, values: Any,
                        rows: Any) -> None:
        """Rows of the Arrow batch encoded straight into the ring (no object per record)."""
        import time

        from shmq import _fast

        k_off, k_data, k_valid = keys if keys is not None else (None, None, None)
        v_off, v_data, v_valid = values
        now = int(time.time() * 1000)
        encode = _fast.encode_arrow_batch_into

        def write(view: Any, at: int, size: int, pid: int, epoch: int, seq: int) -> int:
            if size < 0:  # the size alone (nothing fits in 0 bytes: -size comes back)
                return -encode(view, 0, 0, rows, k_off, k_data, k_valid, v_off, v_data,
                               v_valid, now, pid, epoch, seq)
            return encode(view, at, size, rows, k_off, k_data, k_valid, v_off, v_data,
                          v_valid, now, pid, epoch, seq)

        try:
            self.futures.append(self.broker.send_with(topic, partition, len(rows), write,
                                                      acks=-1, timeout=120.0))
        except (BufferError, ValueError, OSError) as exc:
            raise BridgeError(f"cannot write to {topic}-{partition}: {exc}") from None

    def _submit(self, topic: str, partition: int, records: list[Any]) -> None:
        try:
            self.futures.append(self.broker.send_batch(topic, partition, records, acks=-1,
                                                       timeout=120.0))
        except (BufferError, ValueError, OSError) as exc:
            raise BridgeError(f"cannot write to {topic}-{partition}: {exc}") from None

    def _check(self) -> None:
        """Drop answered batches, raising the first error."""
        left = []
        for f in self.futures:
            if not f.done():
                left.append(f)
            elif f.value.error_code:
                v = f.value
                raise BridgeError(f"writing to {v.topic}-{v.partition} failed: Kafka error "
                                  f"{v.error_code} {v.error_message or ''}".rstrip())
        self.futures = left

    def flush(self) -> None:
        left = self.broker.flush(_FLUSH_TIMEOUT_S)
        self._check()
        if left:
            raise BridgeError(f"{left} batches were not acknowledged within "
                              f"{_FLUSH_TIMEOUT_S:.0f} s by the broker in "
                              f"{self.target.data_dir}")

    def close(self) -> None:
        self.broker.close()


def _bitmap(valid: Any, offset: int, n: int) -> Any:
    """The validity bitmap of an array slice, realigned to bit 0 (None: no nulls)."""
    if valid is None:
        return None
    if offset % 8 == 0:
        return memoryview(valid).cast("B")[offset // 8 : offset // 8 + (n + 7) // 8]
    import numpy as np

    bits = np.unpackbits(np.frombuffer(valid, np.uint8), bitorder="little")[offset:offset + n]
    return np.packbits(bits, bitorder="little")


def _binary_buffers(batch: Any, name: str) -> tuple[Any, Any, Any] | None:
    """(offsets, data, validity) of a binary or string column of an Arrow batch, realigned
    to its first row, or None without the column."""
    import numpy as np
    import pyarrow as pa

    if name not in batch.schema.names:
        return None
    arr = batch.column(name)
    if not pa.types.is_binary(arr.type):
        arr = arr.cast(pa.binary())  # a string column: its UTF-8 bytes (zero-copy)
    valid, offsets, data = arr.buffers()
    n = len(arr)
    return (np.frombuffer(offsets, np.int32, n + 1, arr.offset * 4),
            memoryview(data).cast("B") if data is not None else np.zeros(0, np.uint8),
            _bitmap(valid, arr.offset, n) if arr.null_count else None)


def _records(cols: dict[str, Any], n: int) -> list[Any]:
    """Rows as ``shmq.ipc.client`` takes them: a value, or (key, value[, ms[, headers]])."""
    values = cols["value"]
    keys = cols.get("key")
    stamps = cols.get("timestamp")
    headers = cols.get("headers")
    if headers is not None:
        hs = [None if h is None else [(x["key"], x["value"]) for x in h] for h in headers]
        return list(zip(keys or [None] * n, values, stamps or [None] * n, hs, strict=True))
    if stamps is not None:
        return list(zip(keys or [None] * n, values, stamps, strict=True))
    if keys is not None:
        return list(zip(keys, values, strict=True))
    return [(None, v) for v in values]


def _sizes(batch: Any) -> Any:
    """About how many bytes each row takes in a batch (key and value lengths plus framing)."""
    import numpy as np
    import pyarrow.compute as pc

    total = np.full(batch.num_rows, 16, np.int64)
    for name in ("key", "value"):
        if name in batch.schema.names:
            lengths = pc.binary_length(batch.column(name)).fill_null(0)
            total += lengths.to_numpy(zero_copy_only=False)
    return total


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
                if partitions[i] < 0:  # librdkafka would take -1 as "use the partitioner"
                    raise BridgeError(f"cannot write a record to {topics[i]}-{partitions[i]}: "
                                      "a partition number is >= 0")
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
