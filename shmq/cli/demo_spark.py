"""``shmq demo --spark``: an ETL pipeline on Spark through ``format("shmq")``.

1. A broker starts; confluent-kafka produces click events (JSON values, the user id as key)
   into ``clicks`` (6 partitions).
2. A Spark batch job reads ``clicks`` with ``format("shmq")`` (straight from the segment
   files), aggregates views, distinct users and mean time on page per page, and writes the
   result to the topic ``page-stats`` (Kafka's sink columns: key, value) and to Parquet.
3. A streaming job (the same source, ``Trigger.AvailableNow``, a checkpoint) copies the clicks of
   one page into ``checkout-clicks``; more events arrive and the job runs again from its
   checkpoint: it reads only the new ones.
4. Everything is read back through ``format("shmq")`` and checked.

The job is ordinary PySpark: change ``format("shmq")`` to ``format("kafka")`` (with Spark's Kafka
connector) and it runs against an Apache Kafka cluster.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shmq.cli import CommandError

PAGES = ["home", "search", "product", "cart", "checkout", "account", "help", "blog"]


def start_broker(data_dir: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "shmq", "broker", "--listeners", "127.0.0.1:0",
                             "--workers", "2", "--data-dir", str(data_dir)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("shmq broker ready"):
        stop_broker(proc)
        raise CommandError(f"the broker did not start: {line!r}")
    print(line)
    return proc, line.split("bootstrap ", 1)[1].split(" ", 1)[0]


def stop_broker(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode


def produce_clicks(bootstrap: str, n: int, seed: int) -> None:
    from confluent_kafka import Producer

    rng = random.Random(seed)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4",
                  "enable.idempotence": True, "log_level": 0})
    failed: list = []
    for i in range(n):
        user = rng.randrange(5000)
        event = {"user": user, "page": rng.choice(PAGES), "ms": rng.randrange(50, 20_000)}
        while True:
            try:
                p.produce("clicks", key=b"user-%d" % user, value=json.dumps(event).encode(),
                          on_delivery=lambda err, _m: failed.append(err) if err else None)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(60)
    if failed:
        raise CommandError(f"{len(failed)} events were not written: {failed[0]}")


def pipeline(spark: Any, bootstrap: str, out: Path) -> int:
    """The batch job of the README: clicks -> per-page statistics, to a topic and to Parquet."""
    from pyspark.sql import functions as F

    clicks = (spark.read.format("shmq")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", "clicks")
              .load()
              .select(F.from_json(F.col("value").cast("string"),
                                  "user INT, page STRING, ms INT").alias("e"), "timestamp")
              .select("e.*", "timestamp"))
    stats = (clicks.groupBy("page")
             .agg(F.count("*").alias("views"), F.countDistinct("user").alias("users"),
                  F.round(F.avg("ms")).cast("int").alias("avg_ms")))
    stats.cache()
    (stats.selectExpr("page AS key", "to_json(struct(*)) AS value")
     .write.format("shmq")
     .option("kafka.bootstrap.servers", bootstrap)
     .option("topic", "page-stats")
     .mode("append").save())
    stats.write.mode("overwrite").parquet(str(out / "page-stats.parquet"))
    total = 0
    for row in stats.orderBy(F.desc("views")).collect():
        print(f"    {row.page:<9} {row.views:>8,} views {row.users:>6,} users "
              f"{row.avg_ms:>6,} ms on page")
        total += row.views
    stats.unpersist()
    return total


def stream_checkout(spark: Any, bootstrap: str, checkpoint: Path) -> int:
    """The streaming variant: the checkout page's clicks into their own topic, from a
    checkpoint; returns how many clicks this run read."""
    from pyspark.sql import functions as F

    query = (spark.readStream.format("shmq")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", "clicks")
             .option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 50_000)
             .load()
             .where(F.get_json_object(F.col("value").cast("string"), "$.page") == "checkout")
             .select("key", "value")
             .writeStream.format("shmq")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("topic", "checkout-clicks")
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    return sum(p["numInputRows"] for p in query.recentProgress)


def _check_setup() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise CommandError("the Spark pipeline needs pyspark: pip install 'shmq[spark]' "
                           "(make setup installs it)") from None
    if shutil.which("java") is None and not _java_home():
        raise CommandError("the Spark pipeline needs Java 17 or later (install a JDK, e.g. "
                           "apt-get install openjdk-17-jre-headless)")


def _java_home() -> bool:
    import os

    home = os.environ.get("JAVA_HOME")
    return home is not None and Path(home, "bin", "java").exists()


def run_spark_demo(events: int = 200_000, keep: bool = False) -> int:
    _check_setup()
    from confluent_kafka.admin import AdminClient, NewTopic

    import spark_bridge

    work = Path(tempfile.mkdtemp(prefix="shmq-spark-demo-"))
    proc, bootstrap = start_broker(work / "data")
    spark = None
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        for f in admin.create_topics([NewTopic("clicks", 6, 1), NewTopic("page-stats", 3, 1),
                                      NewTopic("checkout-clicks", 3, 1)]).values():
            f.result(30)
        t0 = time.perf_counter()
        produce_clicks(bootstrap, events, seed=1)
        print(f"produced {events:,} click events into clicks (6 partitions) in "
              f"{time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        spark = spark_bridge.session("shmq-etl-demo")
        print(f"Spark {spark.version} session (local[2]) in {time.perf_counter() - t0:.1f} s")

        t0 = time.perf_counter()
        views = pipeline(spark, bootstrap, work)
        dt = time.perf_counter() - t0
        print(f"batch job: read {views:,} events with format(\"shmq\"), aggregated per page, "
              f"wrote page-stats (topic and Parquet) in {dt:.1f} s (the first queries of a "
              "session include starting Spark's Python workers)")
        if views != events:
            raise CommandError(f"the job counted {views} events, not {events}")
        t0 = time.perf_counter()
        n = spark.read.format("shmq").option("kafka.bootstrap.servers", bootstrap) \
            .option("subscribe", "clicks").load().count()
        dt = time.perf_counter() - t0
        print(f"clicks again, warm: {n:,} rows counted in {dt:.2f} s ({n / dt:,.0f} rows/s)")
        stats = spark.read.format("shmq").option("kafka.bootstrap.servers", bootstrap) \
            .option("subscribe", "page-stats").load().count()
        if stats != len(PAGES):
            raise CommandError(f"page-stats holds {stats} records, not {len(PAGES)}")

        checkpoint = work / "checkout-checkpoint"
        t0 = time.perf_counter()
        first = stream_checkout(spark, bootstrap, checkpoint)
        print(f"streaming job (AvailableNow, checkpoint): {first:,} events read, checkout "
              f"clicks copied to checkout-clicks in {time.perf_counter() - t0:.1f} s")
        more = events // 10
        produce_clicks(bootstrap, more, seed=2)
        t0 = time.perf_counter()
        second = stream_checkout(spark, bootstrap, checkpoint)
        print(f"{more:,} new events; the streaming job resumed from its checkpoint and read "
              f"exactly those {second:,} in {time.perf_counter() - t0:.1f} s")
        copied = spark.read.format("shmq").option("kafka.bootstrap.servers", bootstrap) \
            .option("subscribe", "checkout-clicks").load().count()
        expected = spark.read.format("shmq").option("kafka.bootstrap.servers", bootstrap) \
            .option("subscribe", "clicks").load() \
            .where("get_json_object(CAST(value AS STRING), '$.page') = 'checkout'").count()
        if (first, second, copied) != (events, more, expected):
            raise CommandError(f"streaming read {first} + {second} events and copied {copied} "
                               f"checkout clicks; expected {events} + {more} and {expected}")
        print(f"checked: checkout-clicks holds all {copied:,} checkout clicks exactly once")
    finally:
        if spark is not None:
            spark.stop()
        code = stop_broker(proc)
        if keep:
            print(f"kept {work} (broker data in data/, Parquet in page-stats.parquet)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"broker stopped cleanly (exit {code})")
    return 0
