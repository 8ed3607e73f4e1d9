"""Spark over shmq: ``format("shmq")`` against the ceiling of the API and the other ways in.

One run, Spark local[2], a shmq broker with 2 workers on loopback, two 6-partition topics
produced by confluent-kafka (no compression, the client default): ``--records`` records of 100 B
values (default 5,000,000) and ``--records-1k`` of 1 KiB (default 1,000,000), 8-byte keys.

Reads: one query, ``groupBy("partition").agg(count(*), sum(length(value)))`` (every row and
every value goes through Spark), over the whole topic, each way, median of ``--repeat`` runs:

  shmq       ``format("shmq")`` from the segment files (the Cython decoder into Arrow).
  ceiling    a Python data source that yields pre-built Arrow batches of the same rows
             (memory-mapped Arrow IPC files, zero-copy): what the Python Data Source API
             allows at best.  Target: shmq >= 0.8x its rate.
  pandas     confluent-kafka consuming the topic in the driver into pandas, then
             ``createDataFrame`` (Arrow enabled).  Target: shmq >= 4x its rate.
  connector  Spark's own Kafka connector, ``format("kafka")``, reading the same topic from the
             shmq broker over the wire.  Target: shmq >= 2x its rate.

Write: ``spark.range(n)`` with 100 B values written with ``format("shmq")`` (idempotent, acks=all,
through the workers' shared-memory rings), rows/s.  Target >= 1,000,000 rows/s.  Anchor: Spark's Kafka sink writing
the same rows to the same broker (informational).

Streaming: ``Trigger.AvailableNow`` over the 100 B topic into Spark's noop sink (rows/s), and
micro-batch latency while a producer writes 10,000 records/s (``--stream-seconds``): per
micro-batch, the age of its oldest record when the batch is handled (p50, p95), shmq and the
connector side by side.

    python perf/bench_spark.py [--records 5000000 --records-1k 1000000 --repeat 3]
    python perf/bench_spark.py --quick        # a small load: checks the whole run works
    python perf/bench_spark.py --only write   # one part (read, write, stream)

Timings are wall clock (the work runs in the JVM and Python workers, not in this process).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _common as c

sys.path.insert(0, str(c.REPO))

CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"


def parser() -> argparse.ArgumentParser:
    p = c.base_parser(__doc__.splitlines()[0])
    p.set_defaults(repeat=3, clock="wall")
    p.add_argument("--records", type=int, default=5_000_000, help="records of 100 B")
    p.add_argument("--records-1k", type=int, default=1_000_000, help="records of 1 KiB")
    p.add_argument("--write-records", type=int, default=5_000_000)
    p.add_argument("--stream-seconds", type=float, default=30.0,
                   help="how long each latency run produces 10,000 records/s")
    p.add_argument("--stream-rate", type=int, default=10_000, help="records/s for latency")
    p.add_argument("--quick", action="store_true",
                   help="200,000 / 50,000 records, 1 repeat, 8 s latency runs")
    p.add_argument("--no-connector", action="store_true",
                   help="skip Spark's Kafka connector rows (no Maven Central)")
    p.add_argument("--only", default="read,write,stream",
                   help="which parts to run (comma list of read, write, stream)")
    c.add_dir_arg(p)
    return p


# -- data -------------------------------------------------------------------------------------


def start_broker(data_dir: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "shmq", "broker", "--listeners",
                             "127.0.0.1:0", "--workers", "2", "--data-dir", str(data_dir)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("shmq broker ready"):
        proc.kill()
        raise SystemExit(f"broker did not start: {line!r}")
    return proc, line.split("bootstrap ", 1)[1].split(" ", 1)[0]


def produce(bootstrap: str, topic: str, n: int, value_bytes: int) -> float:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                  "enable.idempotence": True, "log_level": 0})
    value = (b"shmq-bench-" * (value_bytes // 11 + 1))[:value_bytes]
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value, key=b"k%07d" % (i % 10_000_000))
                break
            except BufferError:
                p.poll(0.01)
        if i % 20_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    return time.perf_counter() - t0


# -- the ceiling: pre-built Arrow batches ---------------------------------------------------


def prebuilt_source() -> Any:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Part(InputPartition):
        def __init__(self, path: str) -> None:
            super().__init__(path)
            self.path = path

    class Reader(DataSourceReader):
        def __init__(self, directory: str) -> None:
            self.directory = directory

        def partitions(self) -> list:
            return [Part(os.path.join(self.directory, f))
                    for f in sorted(os.listdir(self.directory))]

        def read(self, part: Any) -> Any:
            import pyarrow as pa

            with pa.memory_map(part.path) as source:
                f = pa.ipc.open_file(source)
                for i in range(f.num_record_batches):
                    yield f.get_batch(i)

    class Prebuilt(DataSource):
        @classmethod
        def name(cls) -> str:
            return "prebuilt"

        def schema(self) -> str:
            from shmq.protocol.kafka_arrow import DDL

            return DDL

        def reader(self, schema: Any) -> Any:
            return Reader(self.options["path"])

    return Prebuilt


def write_prebuilt(data_dir: Path, topic: str, out: Path) -> None:
    """The topic's rows, exactly as format("shmq") yields them, in Arrow IPC files (one per
    partition)."""
    import pyarrow as pa

    from spark_bridge.catalog import LocalCatalog, find_partition_dir
    from spark_bridge.reading import ReadPlan, read_range

    out.mkdir(parents=True, exist_ok=True)
    with LocalCatalog(data_dir) as cat:
        tps = [(topic, p) for p in range(cat.topics()[topic])]
        latest = cat.latest(tps)
        plan = ReadPlan("mmap", str(data_dir), cat.cluster_id)
        for tp in tps:
            batches = list(read_range(plan, tp[0], tp[1], 0, latest[tp],
                                      find_partition_dir(data_dir, tp)))
            with pa.OSFile(str(out / f"{tp[1]:03d}.arrow"), "wb") as f, \
                    pa.ipc.new_file(f, batches[0].schema) as w:
                for b in batches:
                    w.write_batch(b)


# -- the ways in ----------------------------------------------------------------------------


def aggregate(df: Any) -> list:
    from pyspark.sql import functions as F

    return df.groupBy("partition").agg(F.count("*").alias("n"),
                                       F.sum(F.length("value")).alias("bytes")).collect()


def via_pandas(spark: Any, bootstrap: str, topic: str, partitions: int, n: int) -> Any:
    """confluent-kafka in the driver -> pandas -> createDataFrame (Arrow on)."""
    import pandas as pd
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-pandas",
                         "enable.auto.commit": False, "log_level": 0,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    cols: dict[str, list] = {k: [] for k in ("key", "value", "topic", "partition", "offset",
                                             "timestamp", "timestampType")}
    eof = 0
    while eof < partitions:
        for m in consumer.consume(10_000, 1.0):
            if m.error():
                eof += 1
                continue
            kind, ts = m.timestamp()
            cols["key"].append(m.key())
            cols["value"].append(m.value())
            cols["topic"].append(m.topic())
            cols["partition"].append(m.partition())
            cols["offset"].append(m.offset())
            cols["timestamp"].append(ts)
            cols["timestampType"].append(kind - 1)
    consumer.close()
    pdf = pd.DataFrame(cols)
    pdf["timestamp"] = pd.to_datetime(pdf["timestamp"], unit="ms", utc=True)
    from shmq.protocol.kafka_arrow import DDL

    assert len(pdf) == n, (len(pdf), n)
    return spark.createDataFrame(pdf, DDL)


def read_rows(spark: Any, args: argparse.Namespace, bootstrap: str, data_dir: Path,
              work: Path, topic: str, n: int, label: str, connector: bool) -> list[c.Row]:
    print(f"reading {topic}: {n:,} records of {label} ...", flush=True)
    write_prebuilt(data_dir, topic, work / f"pre-{topic}")

    def shmq() -> Any:
        return aggregate(spark.read.format("shmq").option("kafka.bootstrap.servers", bootstrap)
                         .option("subscribe", topic).load())

    def ceiling() -> Any:
        return aggregate(spark.read.format("prebuilt").option("path", str(work / f"pre-{topic}"))
                         .load())

    def pandas() -> Any:
        return aggregate(via_pandas(spark, bootstrap, topic, 6, n))

    def kafka() -> Any:
        return aggregate(spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                         .option("subscribe", topic).load())

    expected = sorted((r.partition, r.n, r.bytes) for r in shmq())
    assert sum(r[1] for r in expected) == n
    for fn in [ceiling, pandas] + ([kafka] if connector else []):
        assert sorted((r.partition, r.n, r.bytes) for r in fn()) == expected, fn.__name__
    cases = {"shmq": c.Case(shmq), "ceiling": c.Case(ceiling), "pandas": c.Case(pandas)}
    if connector:
        cases["connector"] = c.Case(kafka)
    t = c.measure(cases, args.repeat, warmup=0)  # warmed up by the checks above
    rate = {k: n / v.median for k, v in t.items()}
    note = "; ".join(c.spread_note(k, v) for k, v in t.items())
    rows = [
        c.Row(f"read {label}: shmq vs pre-built Arrow", rate["shmq"], "rows/s",
              rate["ceiling"], "ceiling", "ratio>=", 0.8, note=note),
        c.Row(f"read {label}: shmq vs confluent-kafka+pandas", rate["shmq"], "rows/s",
              rate["pandas"], "pandas", "ratio>=", 4.0),
    ]
    if connector:
        rows.append(c.Row(f"read {label}: shmq vs Spark's Kafka connector", rate["shmq"],
                          "rows/s", rate["connector"], "format(kafka)", "ratio>=", 2.0))
    return rows


def write_rows(spark: Any, args: argparse.Namespace, bootstrap: str,
               connector: bool) -> list[c.Row]:
    from confluent_kafka.admin import AdminClient, NewTopic

    n = args.write_records
    print(f"writing {n:,} rows of 100 B ...", flush=True)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    names = [f"w-{fmt}-{i}" for fmt in ("shmq", "kafka") for i in range(args.repeat)]
    names += [f"w-{fmt}-warmup" for fmt in ("shmq", "kafka")]
    for f in admin.create_topics([NewTopic(t, 6, 1) for t in names]).values():
        f.result(30)
    df = spark.range(n).selectExpr("CAST(id AS STRING) AS key",
                                   "rpad(CAST(id AS STRING), 100, 'x') AS value").cache()
    assert df.count() == n
    runs: dict[str, list[float]] = {"shmq": [], "kafka": []}
    formats = ("shmq", "kafka") if connector else ("shmq",)
    for _ in range(args.warmup):  # a session's first write starts its Python workers (~10 s)
        for fmt in formats:
            (df.limit(10_000).write.format(fmt).option("kafka.bootstrap.servers", bootstrap)
             .option("topic", f"w-{fmt}-warmup").mode("append").save())
    for i in range(args.repeat):
        for fmt in formats:
            t0 = time.perf_counter()
            (df.write.format(fmt).option("kafka.bootstrap.servers", bootstrap)
             .option("topic", f"w-{fmt}-{i}").mode("append").save())
            runs[fmt].append(time.perf_counter() - t0)
    df.unpersist()
    shmq = c.Timing(runs["shmq"], runs["shmq"])
    note = c.spread_note("shmq", shmq)
    anchor = None
    if connector:
        kafka = c.Timing(runs["kafka"], runs["kafka"])
        anchor = n / kafka.median
        note += "; " + c.spread_note("kafka", kafka)
    return [c.Row("write 100 B rows with format(shmq)", n / shmq.median, "rows/s", anchor,
                  "format(kafka) sink" if connector else "", "value>=", 1e6, note=note)]


def stream_rows(spark: Any, args: argparse.Namespace, bootstrap: str, topic: str, n: int,
                work: Path, connector: bool) -> list[c.Row]:
    print("streaming ...", flush=True)
    times = []
    for i in range(args.repeat):
        t0 = time.perf_counter()
        q = (spark.readStream.format("shmq").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest").load()
             .writeStream.format("noop").option("checkpointLocation", str(work / f"ck-{i}"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        assert sum(p["numInputRows"] for p in q.recentProgress) == n
        times.append(time.perf_counter() - t0)
    t = c.Timing(times, times)
    rows = [c.Row("stream AvailableNow 100 B (noop sink)", n / t.median, "rows/s",
                  note=c.spread_note("stream", t))]
    for fmt in ("shmq", "kafka") if connector else ("shmq",):
        p50, p95, batches = latency(spark, args, bootstrap, fmt, work)
        rows.append(c.Row(f"stream latency at {args.stream_rate:,} rec/s, {fmt} (p50)", p50,
                          "ms", note=f"p95 {p95:.0f} ms over {batches} micro-batches"))
    return rows


def latency(spark: Any, args: argparse.Namespace, bootstrap: str, fmt: str,
            work: Path) -> tuple[float, float, int]:
    """Micro-batch latency under a steady produce: per batch, now - its oldest record's
    CreateTime, when foreachBatch runs."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql import functions as F

    topic = f"lat-{fmt}-{time.monotonic_ns()}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(30)
    ages: list[float] = []

    def handle(batch: Any, batch_id: int) -> None:
        oldest = batch.agg(F.min("timestamp").alias("t")).collect()[0].t
        if oldest is not None:
            ages.append(time.time() * 1000 - oldest.timestamp() * 1000)

    q = (spark.readStream.format(fmt).option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", topic).option("startingOffsets", "earliest").load()
         .writeStream.foreachBatch(handle).option("checkpointLocation",
                                                  str(work / f"ck-lat-{topic}"))
         .start())
    stop = threading.Event()

    def feed() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "log_level": 0})
        step = args.stream_rate // 100
        next_t = time.perf_counter()
        i = 0
        while not stop.is_set():
            for _ in range(step):
                p.produce(topic, value=b"x" * 100, key=b"k%d" % i)
                i += 1
            p.poll(0)
            next_t += 0.01
            time.sleep(max(0.0, next_t - time.perf_counter()))
        p.flush(30)

    feeder = threading.Thread(target=feed)
    time.sleep(3)  # the query's first (empty) batches
    feeder.start()
    time.sleep(args.stream_seconds)
    stop.set()
    feeder.join()
    time.sleep(2)
    failure = q.exception()
    q.stop()
    if failure is not None:
        print(f"latency query ({fmt}) failed: {str(failure)[:2000]}", flush=True)
    ages = ages[2:] or ages  # the first batches after start carry the warm-up
    if not ages:
        return float("nan"), float("nan"), 0
    ages.sort()
    return statistics.median(ages), ages[min(len(ages) - 1, int(0.95 * len(ages)))], len(ages)


def run(args: argparse.Namespace) -> list[c.Row]:
    if args.quick:
        args.records, args.records_1k, args.write_records = 200_000, 50_000, 200_000
        args.repeat, args.stream_seconds = 1, 8.0
    os.environ["PYSPARK_PYTHON"] = sys.executable
    import pyspark

    import spark_bridge

    work = Path(tempfile.mkdtemp(prefix="bench-spark-", dir=args.dir))
    proc, bootstrap = start_broker(work / "data")
    spark = None
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        for f in admin.create_topics([NewTopic("b100", 6, 1), NewTopic("b1k", 6, 1)]).values():
            f.result(30)
        if {"read", "stream"} & set(args.only.split(",")):
            dt = produce(bootstrap, "b100", args.records, 100)
            print(f"produced {args.records:,} x 100 B in {dt:.1f} s", flush=True)
        if "read" in args.only.split(","):
            dt = produce(bootstrap, "b1k", args.records_1k, 1024)
            print(f"produced {args.records_1k:,} x 1 KiB in {dt:.1f} s", flush=True)
        scratch = work / "spark-scratch"  # Spark's block manager and artifacts, removed with work
        scratch.mkdir()
        conf = {"spark.driver.memory": "6g", "spark.sql.shuffle.partitions": "2",
                "spark.sql.execution.arrow.pyspark.enabled": "true",
                "spark.local.dir": str(scratch),
                "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}"}
        connector = not args.no_connector
        if connector:
            conf["spark.jars.packages"] = CONNECTOR.format(version=pyspark.__version__)
            conf["spark.jars.ivy"] = str(c.REPO / ".cache" / "ivy")
        spark = spark_bridge.session("bench-spark", conf=conf)
        spark.dataSource.register(prebuilt_source())
        print(f"Spark {spark.version}, local[2], connector: "
              f"{conf.get('spark.jars.packages', 'not loaded')}\n", flush=True)
        parts = set(args.only.split(","))
        rows = []
        if "read" in parts:
            rows += read_rows(spark, args, bootstrap, work / "data", work, "b100", args.records,
                              "100 B", connector)
            rows += read_rows(spark, args, bootstrap, work / "data", work, "b1k",
                              args.records_1k, "1 KiB", connector)
        if "write" in parts:
            rows += write_rows(spark, args, bootstrap, connector)
        if "stream" in parts:
            rows += stream_rows(spark, args, bootstrap, "b100", args.records, work, connector)
        return rows
    finally:
        if spark is not None:
            spark.stop()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(c.main_for("bench_spark: format(\"shmq\") against the ceiling, pandas and the "
                        "connector", parser(), run))
