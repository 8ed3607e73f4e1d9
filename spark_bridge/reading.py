"""Executor side: one offset range of one partition as Arrow batches in the Kafka schema.

Two transports, chosen by the driver and checked again here (an executor on another host has
no such data directory):

* **mmap** - the segment files of the local broker, mapped read-only and decoded in Cython
  straight into Arrow buffers (``shmq.storage.reader`` and ``shmq.protocol.kafka_arrow``).
  The log start offset is read again from the state table when the task runs, so offsets that
  retention or DeleteRecords removed after planning are data loss exactly as for Kafka's
  consumer, never rows read from a segment about to go.
* **kafka** - the same range through confluent-kafka's consumer (assign, no group, no commits,
  ``auto.offset.reset=error``), for a broker whose files are not here: a remote shmq or Apache
  Kafka.  Same schema, same data-loss rules.

Everything here must pickle (Spark ships the reader and its partitions to Python workers), so
the plan holds only strings and numbers; files, mappings and clients live inside ``read``.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shmq.storage.reader import DEFAULT_CHUNK_BYTES
from spark_bridge.errors import BridgeError
from spark_bridge.planning import report_data_loss

log = logging.getLogger("shmq.spark")


@dataclass(frozen=True)
class ReadPlan:
    """How a task reads: everything but the range (shared by a query's partitions)."""

    transport: str                       # "mmap" | "kafka"
    data_dir: str | None = None
    cluster_id: str | None = None
    bootstrap: str | None = None
    kafka_conf: dict[str, str] = field(default_factory=dict)
    isolation_level: str = "read_uncommitted"
    include_headers: bool = False
    fail_on_data_loss: bool = True
    batch_rows: int = 65536
    batch_bytes: int = DEFAULT_CHUNK_BYTES
    poll_timeout_ms: int = 120_000


def read_range(plan: ReadPlan, topic: str, partition: int, start: int, end: int,
               directory: str | None = None) -> Iterator[Any]:
    """The records of ``topic``-``partition`` at offsets [start, end) as ``pyarrow``
    RecordBatches (none for an empty range)."""
    if end <= start:
        return
    if plan.transport == "mmap":
        directory = _local_directory(plan, topic, partition, directory)
        if directory is not None:
            yield from _read_mmap(plan, topic, partition, start, end, directory)
            return
        if not plan.bootstrap:
            raise BridgeError(f"the segments of {topic}-{partition} are not on this host "
                              f"({plan.data_dir}) and no bootstrap address is known to read "
                              "them over the Kafka protocol")
        log.warning("shmq: %s-%d is not stored on this host; reading it over the Kafka protocol",
                    topic, partition)
    yield from _read_kafka(plan, topic, partition, start, end)


# -- mmap ----------------------------------------------------------------------------------

_tables: dict[str, Any] = {}  # state tables attached by this worker process, by name


def _run_info(data_dir: str) -> dict[str, Any] | None:
    try:
        return json.loads((Path(data_dir) / "run" / "broker.json").read_text())
    except (OSError, ValueError):
        return None


def _local_directory(plan: ReadPlan, topic: str, partition: int,
                     directory: str | None) -> str | None:
    """The partition's directory if this host holds the driver's broker (same cluster id)."""
    if plan.data_dir is None:
        return None
    info = _run_info(plan.data_dir)
    if info is None or info.get("cluster_id") != plan.cluster_id:
        return None
    if directory and os.path.isdir(directory):
        return directory
    from spark_bridge.catalog import find_partition_dir

    return find_partition_dir(plan.data_dir, (topic, partition), _slot_state(info, topic,
                                                                             partition))


def _slot_state(info: dict[str, Any], topic: str, partition: int) -> Any:
    """The partition's published state, or None (no table, no slot, not published)."""
    from shmq.ipc.state_table import StateTable, StateTableError

    name = info.get("state_table")
    slot = info.get("slots", {}).get(f"{topic}/{partition}")
    if not name or slot is None:
        return None
    table = _tables.get(name)
    if table is None:
        for old in _tables.values():
            old.close()
        _tables.clear()
        try:
            table = _tables[name] = StateTable.attach(name)
        except (OSError, StateTableError):
            return None
    state = table.read(slot)
    return state if state is not None and state.leader >= 0 else None


def _read_mmap(plan: ReadPlan, topic: str, partition: int, start: int, end: int,
               directory: str) -> Iterator[Any]:
    from shmq.protocol.kafka_arrow import sections_to_arrow
    from shmq.storage.reader import PartitionReader

    def gap(first: int, after: int) -> None:
        report_data_loss(plan.fail_on_data_loss,
                         f"offsets {first} to {after - 1} of {topic}-{partition} are no longer "
                         f"in the log (deleted by retention, DeleteRecords or a topic deletion "
                         f"after the query was planned for offsets {start} to {end - 1})")

    info = _run_info(plan.data_dir) if plan.data_dir else None
    state = _slot_state(info, topic, partition) if info else None
    if state is not None and state.log_start > start:
        gap(start, min(state.log_start, end))
        start = state.log_start
    from shmq.errors import CorruptRecordError

    reader = PartitionReader(directory)
    try:
        if plan.isolation_level == "read_committed":  # `end` is at most the last stable offset
            reader.aborted = reader.aborted_transactions(start, end)
        for chunk in reader.read(start, end, chunk_records=plan.batch_rows,
                                 chunk_bytes=plan.batch_bytes, on_gap=gap):
            batch = sections_to_arrow(chunk.bodies, chunk.meta, topic, partition,
                                      min_offset=chunk.first_offset, max_offset=chunk.next_offset,
                                      include_headers=plan.include_headers)
            if batch.num_rows:
                yield batch
    except FileNotFoundError:
        gap(start, end)  # the partition directory went away: the topic was deleted
    except OSError as exc:  # permissions, not a directory, an I/O error
        raise BridgeError(f"cannot read the segments of {topic}-{partition} in {directory}: "
                          f"{exc.strerror or exc}") from None
    except CorruptRecordError as exc:
        raise BridgeError(f"corrupt data in {topic}-{partition} (nothing was read past it): "
                          f"{exc}") from None


# -- Kafka protocol ------------------------------------------------------------------------


def make_client(factory: Any, conf: dict[str, Any]) -> Any:
    """``factory(conf)``, dropping (with a warning) the ``kafka.*`` settings librdkafka does
    not know (Java-only consumer settings Spark users pass, e.g. ``max.poll.records``)."""
    from confluent_kafka import KafkaException

    conf = dict(conf)
    while True:
        try:
            return factory(conf)
        except (KafkaException, ValueError) as exc:
            text = str(exc.args[0] if exc.args else exc)
            marker = "No such configuration property: \""
            i = text.find(marker)
            if i < 0:
                raise BridgeError(f"bad Kafka client setting: {text}") from None
            name = text[i + len(marker):].split('"', 1)[0]
            if name not in conf:
                raise BridgeError(f"bad Kafka client setting: {text}") from None
            log.warning("shmq: ignoring Kafka option 'kafka.%s' (librdkafka does not know it)",
                        name)
            conf.pop(name)


def _read_kafka(plan: ReadPlan, topic: str, partition: int, start: int, end: int) -> Iterator[Any]:
    import pyarrow as pa
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as TP

    from shmq.protocol.kafka_arrow import HEADERS_TYPE, kafka_schema

    if not plan.bootstrap:
        raise BridgeError("no bootstrap address to read from")
    from spark_bridge.catalog import client_conf

    conf = client_conf(plan.bootstrap, plan.kafka_conf)
    conf.update({"group.id": f"spark-kafka-source-{uuid.uuid4()}-executor",
                 "enable.auto.commit": False, "auto.offset.reset": "error",
                 "enable.partition.eof": True, "isolation.level": plan.isolation_level,
                 "enable.auto.offset.store": False})
    consumer = make_client(Consumer, conf)
    schema = kafka_schema(plan.include_headers)
    columns: dict[str, list] = {name: [] for name in schema.names}

    def flush() -> Any:
        n = len(columns["offset"])
        arrays = [
            pa.array(columns["key"], pa.binary()),
            pa.array(columns["value"], pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(columns["offset"], pa.int64()),
            pa.array(columns["timestamp"], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array(columns["timestampType"], pa.int32()),
        ]
        if plan.include_headers:
            arrays.append(pa.array(columns["headers"], HEADERS_TYPE))
        for values in columns.values():
            values.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    position = start
    try:
        consumer.assign([TP(topic, partition, start)])
        last_progress = time.monotonic()
        while position < end:
            messages = consumer.consume(num_messages=min(10_000, plan.batch_rows), timeout=1.0)
            if not messages:
                if (time.monotonic() - last_progress) * 1000 > plan.poll_timeout_ms:
                    raise BridgeError(f"no records of {topic}-{partition} from offset {position} "
                                      f"within kafkaConsumer.pollTimeoutMs "
                                      f"({plan.poll_timeout_ms} ms)")
                continue
            last_progress = time.monotonic()
            for m in messages:
                err = m.error()
                if err is not None:
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        if m.offset() < end:  # the log ends before the range does
                            report_data_loss(plan.fail_on_data_loss,
                                             f"offsets {m.offset()} to {end - 1} of "
                                             f"{topic}-{partition} are not in the log")
                        position = end
                        break
                    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        low, high = consumer.get_watermark_offsets(TP(topic, partition),
                                                                   timeout=10, cached=False)
                        lost_to = min(max(low, position), end)
                        report_data_loss(plan.fail_on_data_loss,
                                         f"offsets {position} to {lost_to - 1} of "
                                         f"{topic}-{partition} are no longer in the log (it "
                                         f"starts at {low} now)")
                        if low >= end or low <= position:
                            position = end
                            break
                        position = low
                        consumer.assign([TP(topic, partition, low)])
                        break
                    raise BridgeError(f"reading {topic}-{partition}: {err.str()}")
                offset = m.offset()
                if offset >= end:
                    position = end
                    break
                if offset < position:
                    continue
                kind, ts = m.timestamp()
                columns["key"].append(m.key())
                columns["value"].append(m.value())
                columns["offset"].append(offset)
                columns["timestamp"].append(ts * 1000)
                columns["timestampType"].append(_TIMESTAMP_TYPES.get(kind, -1))
                if plan.include_headers:
                    hs = m.headers()
                    columns["headers"].append(
                        [{"key": k, "value": v} for k, v in hs] if hs else None)
                position = offset + 1
                if len(columns["offset"]) >= plan.batch_rows:
                    yield flush()
        if columns["offset"]:
            yield flush()
    finally:
        consumer.close()


# confluent_kafka.TIMESTAMP_CREATE_TIME (1) / TIMESTAMP_LOG_APPEND_TIME (2) -> Kafka's ids
_TIMESTAMP_TYPES = {1: 0, 2: 1}
