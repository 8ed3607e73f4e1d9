"""The ``shmq`` data source: Spark's Kafka source and sink, reading a local broker's segments.

    spark.read.format("shmq").option("subscribe", "events").load()          # batch
    spark.readStream.format("shmq").option("subscribe", "events").load()    # micro-batches
    df.write.format("shmq").option("topic", "out").save()                   # through the broker

Where each part runs (pyspark's Python Data Source API, 4.2+):

* ``DataSource.reader(...).partitions()`` and the stream reader's offset methods run on the
  driver, in Python planner processes: they open a ``Catalog`` (shared memory or the Kafka
  protocol), fix the offset ranges and close it.
* ``read(partition)`` runs in executors' Python workers with only the pickled partition: an
  ``OffsetRange`` and the ``ReadPlan`` saying where to read it.
* Writers run per task (``sink.py``).

The stream reader lives in Spark's long-lived streaming runner process; its catalog (an attached
state table, an AdminClient) is opened on first use and dropped when the reader is pickled.
"""

from __future__ import annotations

import time
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from spark_bridge import planning
from spark_bridge.catalog import Catalog, open_catalog
from spark_bridge.errors import BridgeError
from spark_bridge.options import SourceOptions, parse_source
from spark_bridge.reading import ReadPlan, read_range


class RangePartition(InputPartition):
    """One Spark task: offsets [start, end) of one topic partition, and how to read them."""

    def __init__(self, topic: str, partition: int, start: int, end: int, plan: ReadPlan,
                 directory: str | None = None) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.plan = plan
        self.directory = directory

    def __repr__(self) -> str:
        return f"RangePartition({self.topic}-{self.partition} [{self.start}, {self.end}))"


def _read_plan(catalog: Catalog, opts: SourceOptions) -> ReadPlan:
    return ReadPlan(
        transport=catalog.transport,
        data_dir=str(catalog.data_dir) if catalog.data_dir else None,
        cluster_id=catalog.cluster_id,
        bootstrap=catalog.bootstrap,
        kafka_conf=dict(opts.kafka_conf),
        isolation_level=opts.isolation_level,
        include_headers=opts.include_headers,
        fail_on_data_loss=opts.fail_on_data_loss,
        batch_rows=opts.batch_rows,
        batch_bytes=opts.batch_bytes,
        poll_timeout_ms=opts.poll_timeout_ms,
    )


def _partitions(catalog: Catalog, plan: ReadPlan,
                ranges: list[planning.OffsetRange]) -> list[RangePartition]:
    dirs: dict[tuple[str, int], str | None] = {}
    out = []
    for r in ranges:
        tp = (r.topic, r.partition)
        if tp not in dirs:
            dirs[tp] = catalog.partition_dir(tp)
        out.append(RangePartition(r.topic, r.partition, r.start, r.end, plan, dirs[tp]))
    return out


def _read(partition: InputPartition) -> Any:
    if not isinstance(partition, RangePartition):
        return iter(())  # no ranges: Spark plans one InputPartition(None) and reads it
    return read_range(partition.plan, partition.topic, partition.partition, partition.start,
                      partition.end, partition.directory)


class ShmqBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[RangePartition]:
        with open_catalog(self.opts) as catalog:
            plan = _read_plan(catalog, self.opts)
            return _partitions(catalog, plan, planning.batch_ranges(catalog, self.opts))

    def read(self, partition: RangePartition) -> Any:  # type: ignore[override]
        return _read(partition)


class ShmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches with Kafka's offsets (``{"topic": {"0": 42}}``) and admission control."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._catalog: Catalog | None = None
        self._available_now: dict | None = None
        self._available_now_requested = False
        self._latest: dict | None = None
        self._last_trigger_ms = 0.0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_catalog"] = None  # shared memory and clients stay in the process that made them
        return state

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = open_catalog(self.opts)
        elif hasattr(self._catalog, "refresh"):
            self._catalog.refresh()
        return self._catalog

    def _assigned(self) -> list[tuple[str, int]]:
        return planning.assigned_partitions(self.catalog, self.opts, strict=False)

    def initialOffset(self) -> dict:
        tps = self._assigned()
        return planning.to_json(planning.resolve(
            self.catalog, self.opts.starting, tps, starting=True,
            no_match_latest=self.opts.no_match_latest))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_requested = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = planning.from_json(start)
        if self._available_now_requested:
            if self._available_now is None:
                self._available_now = self.catalog.latest(self._assigned())
            latest = dict(self._available_now)
        else:
            latest = self.catalog.latest(self._assigned())
        self._latest = latest
        if isinstance(limit, ReadAllAvailable):
            return planning.to_json(latest)
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else \
            self.opts.min_offsets_per_trigger
        if min_rows and self._delay(min_rows, begin, latest):
            return planning.to_json(begin)
        if isinstance(limit, ReadMaxRows):
            new = [tp for tp in latest if tp not in begin]
            earliest_new = self.catalog.earliest(new) if new else {}
            return planning.to_json(planning.rate_limit(limit.max_rows, begin, latest,
                                                        earliest_new))
        return planning.to_json(latest)

    def _delay(self, min_rows: int, begin: dict, latest: dict) -> bool:
        """``minOffsetsPerTrigger``: wait for that many new records, at most
        ``maxTriggerDelay`` since the last micro-batch (``KafkaMicroBatchStream.delayBatch``)."""
        now = time.time() * 1000
        if now - self._last_trigger_ms >= self.opts.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        new = sum(off - begin.get(tp, 0) for tp, off in latest.items())
        if new < min_rows:
            return True
        self._last_trigger_ms = now
        return False

    def reportLatestOffset(self) -> dict | None:
        return planning.to_json(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:  # type: ignore[override]
        begin, until = planning.from_json(start), planning.from_json(end)
        if self._available_now is not None:
            over = {tp for tp, off in until.items() if off > self._available_now.get(tp, off)}
            if over:
                raise BridgeError(f"the end offset of this batch is past the offsets "
                                  f"Trigger.AvailableNow fixed for {sorted(over)}")
        catalog = self.catalog
        plan = _read_plan(catalog, self.opts)
        return _partitions(catalog, plan, planning.stream_ranges(catalog, begin, until,
                                                                 self.opts))

    def read(self, partition: RangePartition) -> Any:  # type: ignore[override]
        return _read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: like Kafka's source, shmq's never commits consumer-group offsets
        (the checkpoint is the truth)."""

    def stop(self) -> None:
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None


class ShmqDataSource(DataSource):
    """``format("shmq")``: Spark's Kafka source and sink over a shmq broker (or any Kafka)."""

    @classmethod
    def name(cls) -> str:
        return "shmq"

    def _include_headers(self) -> bool:
        return str(self.options.get("includeHeaders", "false")).strip().lower() == "true"

    def schema(self) -> str:
        from shmq.protocol.kafka_arrow import DDL, DDL_WITH_HEADERS

        return DDL_WITH_HEADERS if self._include_headers() else DDL

    def _check_schema(self, schema: Any) -> None:
        from shmq.protocol.kafka_arrow import kafka_schema

        names = [f.name for f in schema.fields]
        want = kafka_schema(self._include_headers()).names
        if names != want:
            raise BridgeError("the Kafka source has a fixed schema and cannot be given another "
                              f"one (got {', '.join(names)}; it is {', '.join(want)})")

    def reader(self, schema: Any) -> DataSourceReader:
        self._check_schema(schema)
        return ShmqBatchReader(parse_source(self.options, streaming=False))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        self._check_schema(schema)
        return ShmqStreamReader(parse_source(self.options, streaming=True))

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from spark_bridge.sink import ShmqBatchWriter

        return ShmqBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from spark_bridge.sink import ShmqStreamWriter

        return ShmqStreamWriter(self.options, schema)
