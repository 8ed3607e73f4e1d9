"""``spark.readStream.format("shmq")``: exact resume from a checkpoint (new partitions and new
topics of a pattern picked up from their start), every record exactly once at the sink when the
streaming driver (Spark and its JVM) is SIGKILLed mid-batch while a broker worker is SIGKILLed
too, and a running query that goes on across a SIGKILL and restart of the whole broker."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _spark_data import create_topics, produce_confluent
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions
from shmq_test_broker import start_broker

JOB = Path(__file__).with_name("_stream_job.py")


def exactly_once(spark: Any, output: Path, expected: dict[int, int]) -> None:
    """The Parquet sink holds offsets 0..n-1 of each partition, each once."""
    rows = spark.read.parquet(str(output)).select("partition", "offset").collect()
    seen: dict[int, list[int]] = {}
    for r in rows:
        seen.setdefault(r.partition, []).append(r.offset)
    assert {p: sorted(o) for p, o in seen.items()} == \
        {p: list(range(n)) for p, n in expected.items() if n}


def test_resume_from_checkpoint_picks_up_new_partitions_and_topics(spark: Any, sbroker: Any,
                                                                     tmp_path: Path) -> None:
    b = sbroker.bootstrap
    create_topics(b, {"s-one": 2})
    produce_confluent(b, "s-one", 500, "lz4")

    def run() -> None:
        q = (spark.readStream.format("shmq").option("kafka.bootstrap.servers", b)
             .option("subscribePattern", "s-.*").option("startingOffsets", "earliest").load()
             .selectExpr("topic", "partition", "offset").writeStream.format("parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        assert q.awaitTermination(300)

    run()
    assert spark.read.parquet(str(tmp_path / "out")).count() == 500
    produce_confluent(b, "s-one", 300, "none")
    admin = AdminClient({"bootstrap.servers": b})
    admin.create_partitions([NewPartitions("s-one", 3)])["s-one"].result(30)
    p = Producer({"bootstrap.servers": b})
    for i in range(40):
        p.produce("s-one", value=b"new-partition-%d" % i, partition=2)
    assert p.flush(30) == 0
    create_topics(b, {"s-two": 1})
    produce_confluent(b, "s-two", 70, "gzip")
    run()
    got = spark.read.parquet(str(tmp_path / "out")).collect()
    keys = [(r.topic, r.partition, r.offset) for r in got]
    assert len(keys) == len(set(keys)) == 500 + 300 + 40 + 70
    assert sum(1 for k in keys if k[:2] == ("s-one", 2)) == 40
    assert {k for k in keys if k[0] == "s-two"} == {("s-two", 0, o) for o in range(70)}


def produce_counted(bootstrap: str, topic: str, n: int, partitions: int, counts: dict) -> None:
    """``n`` records round-robin over the partitions, idempotent and acked; ``counts`` gets the
    records acknowledged per partition."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "message.timeout.ms": 60000})
    for i in range(n):
        p.produce(topic, value=b"r%d" % i, partition=i % partitions)
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(90) == 0
    for i in range(n):
        counts[i % partitions] = counts.get(i % partitions, 0) + 1


def start_job(bootstrap: str, topic: str, ck: Path, out: Path, log: Path) -> subprocess.Popen:
    scratch = log.parent / "spark-scratch"  # the job's Spark temp files (removed with tmp_path)
    scratch.mkdir(exist_ok=True)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, str(JOB), bootstrap, topic, str(ck), str(out),
                                 str(scratch)],
                                stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def committed_batches(ck: Path) -> int:
    commits = ck / "commits"
    return len([f for f in commits.iterdir() if f.name.isdigit()]) if commits.exists() else 0


def kill_cycles(spark: Any, broker: Any, tmp_path: Path, cycles: int, seed: int) -> None:
    rng = random.Random(seed)
    topic = f"kill-{seed}"
    create_topics(broker.bootstrap, {topic: 3})
    counts: dict[int, int] = {}
    produce_counted(broker.bootstrap, topic, 3000, 3, counts)
    ck, out, log = tmp_path / "ck", tmp_path / "out", tmp_path / "job.log"
    for cycle in range(cycles):
        job = start_job(broker.bootstrap, topic, ck, out, log)
        try:
            before = committed_batches(ck)
            deadline = time.monotonic() + 240
            while committed_batches(ck) <= before:
                assert job.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            # mid-stream: a worker dies, more records arrive, then the driver dies mid-batch
            worker = rng.choice(sorted(broker.worker_pids().values()))
            os.kill(worker, signal.SIGKILL)
            produce_counted(broker.bootstrap, topic, 600, 3, counts)
            time.sleep(rng.uniform(0.0, 1.5))
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        print(f"cycle {cycle}: killed worker {worker} and the driver after "
              f"{committed_batches(ck)} committed batches")
    # restart from the checkpoint (here, in the test's own driver) and finish
    finish(spark, broker.bootstrap, topic, ck, out)
    exactly_once(spark, out, counts)


def finish(spark: Any, bootstrap: str, topic: str, ck: Path, out: Path) -> None:
    """The job of ``_stream_job.py`` with Trigger.AvailableNow: everything there is, then stop."""
    q = (spark.readStream.format("shmq").option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", topic).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "300").load()
         .selectExpr("partition", "offset", "value")
         .writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    assert q.awaitTermination(600)


def test_sigkill_driver_and_worker_exactly_once(spark: Any, sbroker: Any,
                                                tmp_path: Path) -> None:
    kill_cycles(spark, sbroker, tmp_path, cycles=1, seed=11)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sigkill_driver_and_worker_exactly_once_soak(spark: Any, sbroker: Any,
                                                     tmp_path: Path) -> None:
    kill_cycles(spark, sbroker, tmp_path, cycles=int(os.environ.get("SHMQ_SPARK_KILLS", "6")),
                seed=int(os.environ.get("SHMQ_SPARK_SEED", "29")))


def test_a_running_query_goes_on_across_a_broker_sigkill_and_restart(spark: Any,
                                                                     tmp_path: Path) -> None:
    """The whole broker (controller and workers) is SIGKILLed under a running query and
    restarted on the same data directory and port: the query neither fails nor loses or
    repeats a record (the tasks read the segments, which outlive the processes; the driver
    follows the new broker's state table)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path / "data"
    listeners = ("--listeners", f"127.0.0.1:{port}")
    b = start_broker(data, *listeners)
    try:
        create_topics(b.bootstrap, {"bk": 2})
        counts: dict[int, int] = {}
        produce_counted(b.bootstrap, "bk", 1000, 2, counts)
        ck, out = tmp_path / "ck", tmp_path / "out"
        q = (spark.readStream.format("shmq").option("kafka.bootstrap.servers", b.bootstrap)
             .option("subscribe", "bk").option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "300").load()
             .selectExpr("partition", "offset").writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(ck))
             .trigger(processingTime="200 milliseconds").start())
        try:
            deadline = time.monotonic() + 120
            while committed_batches(ck) < 1:
                assert q.isActive and time.monotonic() < deadline, q.exception()
                time.sleep(0.1)
            info = b.run_info
            for w in info["workers"]:
                if w["pid"]:
                    os.kill(w["pid"], signal.SIGKILL)
            os.kill(info["controller_pid"], signal.SIGKILL)
            b.stop()
            time.sleep(1.0)  # micro-batches run against the dead broker's files meanwhile
            assert q.isActive, q.exception()
            b = start_broker(data, *listeners)
            produce_counted(b.bootstrap, "bk", 600, 2, counts)
            q.processAllAvailable()
            assert q.isActive and q.exception() is None
        finally:
            q.stop()
        exactly_once(spark, out, counts)
    finally:
        b.stop()
