"""``shmq demo``: start a broker, drive real Kafka traffic through it, show what it did.

The README's main job.  It starts ``shmq broker`` on a free loopback port with a temporary data
dir, creates a 6-partition topic with confluent-kafka's AdminClient, produces records with
librdkafka (lz4, acks=all, idempotent), consumes them back and checks every key and value, then
SIGKILLs a worker in the middle of a produce stream and checks that after its restart every
acknowledged record is there exactly once; then it runs the Spark ETL pipeline of
``shmq/cli/demo_spark.py`` (``--spark`` runs that part alone, ``--no-spark`` skips it).
``--storage`` runs the storage-engine demo instead (partition logs written, read, crashed and
recovered without a broker).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shmq.cli import CommandError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "demo",
        help="write, read, crash and recover partition logs in Kafka's format",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data-dir", help="where to put the logs (default: a temporary directory)")
    p.add_argument("--records", type=int, default=200_000, help="records per partition")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--record-size", type=int, default=100, help="value bytes per record")
    p.add_argument("--batch-records", type=int, default=500, help="records per batch")
    p.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    p.add_argument("--storage", action="store_true",
                   help="the storage-engine demo (no broker): logs written, crashed, recovered")
    p.add_argument("--messages", type=int, default=200_000, help="messages for the broker demo")
    p.add_argument("--spark", action="store_true",
                   help="only the Spark ETL pipeline (format(\"shmq\") batch and streaming jobs)")
    p.add_argument("--no-spark", action="store_true", help="skip the Spark ETL pipeline")
    p.add_argument("--events", type=int, default=200_000, help="click events for the pipeline")
    p.add_argument("--_crash-writer", dest="crash_writer", help=argparse.SUPPRESS)
    return p


def _batches(partition: int, records: int, size: int, per_batch: int, first: int = 0):
    from shmq.protocol import compression
    from shmq.protocol.records import encode_batch

    codecs = list(compression.CODEC_NAMES)
    base_ts = 1_700_000_000_000
    value = (b"shmq" * (size // 4 + 1))[:size]
    for start in range(first, records, per_batch):
        rows = [(b"key-%d" % i, value, base_ts + i, [("p", b"%d" % partition)])
                for i in range(start, min(start + per_batch, records))]
        yield encode_batch(rows, compression_type=codecs[(start // per_batch) % len(codecs)])


def _crash_writer(directory: str) -> int:
    """Child process: append batches forever, printing each acknowledged last offset."""
    from shmq.storage import LogConfig, PartitionLog

    log = PartitionLog.open(Path(directory), LogConfig(segment_bytes=4 << 20))
    out = sys.stdout
    for batch in _batches(0, 10**9, 100, 100, first=log.log_end_offset):
        info = log.append(batch)
        out.write(f"{info.last_offset}\n")
        out.flush()
    return 0


def _produce(producer: Any, **kw: Any) -> None:
    """``produce`` that waits for room when librdkafka's local queue is full."""
    while True:
        try:
            producer.produce(**kw)
            return
        except BufferError:
            producer.poll(0.05)


def _broker_demo(args: argparse.Namespace) -> int:
    import json
    import shutil

    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="shmq-demo-"))
    proc = subprocess.Popen([sys.executable, "-m", "shmq", "broker", "--listeners", "127.0.0.1:0",
                             "--workers", "2", "--data-dir", str(data_dir)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("shmq broker ready"):
            raise CommandError(f"the broker did not start: {line!r}")
        print(line)
        bootstrap = line.split("bootstrap ", 1)[1].split(" ", 1)[0]
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        for f in admin.create_topics([NewTopic("demo", num_partitions=6,
                                               replication_factor=1)]).values():
            f.result(10)
        print("created topic demo with 6 partitions")
        n = args.messages
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                             "compression.type": "lz4", "enable.idempotence": True,
                             "log_level": 0})
        failed: list[Any] = []
        t0 = time.perf_counter()
        for i in range(n):
            _produce(producer, topic="demo", key=b"key-%d" % i, value=b"value-%d" % i,
                     on_delivery=lambda err, msg: failed.append(err) if err else None)
            if i % 10000 == 0:
                producer.poll(0)
        producer.flush(60)
        dt = time.perf_counter() - t0
        if failed:
            raise CommandError(f"{len(failed)} messages failed: {failed[0]}")
        print(f"produced {n:,} messages (lz4, acks=all, idempotent) in {dt:.2f} s: "
              f"{n / dt:,.0f} msg/s")
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo", "log_level": 0,
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition("demo", p, 0) for p in range(6)])
        seen: set[bytes] = set()
        t0 = time.perf_counter()
        while len(seen) < n and time.perf_counter() - t0 < 60:
            for msg in consumer.consume(10000, 1.0):
                key = msg.key()
                if msg.error() is None and key is not None:
                    if msg.value() != b"value-" + key[4:]:
                        raise CommandError(f"corrupt message at offset {msg.offset()}")
                    seen.add(key)
        dt = time.perf_counter() - t0
        consumer.close()
        if len(seen) != n:
            raise CommandError(f"consumed {len(seen)} of {n} messages")
        print(f"consumed all {n:,} back, keys and values intact, in {dt:.2f} s: "
              f"{n / dt:,.0f} msg/s (record bytes sent with sendfile)")
        # crash a worker mid-stream
        info = json.loads((data_dir / "run" / "broker.json").read_text())
        victim = info["workers"][0]
        acked: list[int] = []
        t0 = time.perf_counter()
        for i in range(n, n + 50_000):
            _produce(producer, topic="demo", key=b"key-%d" % i, value=b"value-%d" % i,
                     on_delivery=lambda err, msg: acked.append(int(msg.key()[4:]))
                     if err is None else None)
            if i == n + 10_000:
                producer.flush(30)
                os.kill(victim["pid"], signal.SIGKILL)
                print(f"SIGKILLed worker {victim['node_id']} (pid {victim['pid']}) mid-stream")
            if i % 1000 == 0:
                producer.poll(0)
        producer.flush(60)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo2", "log_level": 0,
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition("demo", p, 0) for p in range(6)])
        counts: dict[int, int] = {}
        total = 0
        t0 = time.perf_counter()
        while total < n + len(acked) and time.perf_counter() - t0 < 60:
            for msg in consumer.consume(10000, 1.0):
                if msg.error() is None and msg.key() is not None:
                    k = int(msg.key()[4:])  # type: ignore[index]
                    counts[k] = counts.get(k, 0) + 1
                    total += 1
        consumer.close()
        lost = [k for k in acked if k not in counts]
        dupes = [k for k, c in counts.items() if c > 1]
        new = json.loads((data_dir / "run" / "broker.json").read_text())["workers"][0]["pid"]
        print(f"worker restarted as pid {new}; {len(acked):,} acknowledged during the crash: "
              f"{len(lost)} lost, {len(dupes)} duplicated")
        if lost or dupes:
            raise CommandError("acknowledged messages were lost or duplicated")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if not args.data_dir and not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(f"broker stopped cleanly (exit {proc.returncode})")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.crash_writer:
        return _crash_writer(args.crash_writer)
    if args.spark or not args.storage:
        from shmq.cli.demo_spark import run_spark_demo

        if args.events < 1:
            raise CommandError("--events must be positive")
        if not args.spark:
            _broker_demo(args)
            if args.no_spark:
                return 0
            print("\nThe pipeline on Spark (shmq demo --spark):")
        return run_spark_demo(args.events, args.keep)
    from shmq import _fast
    from shmq.protocol.records import decode_batches
    from shmq.storage import LogConfig, LogManager

    if args.records < 1 or args.partitions < 1 or args.batch_records < 1 or args.record_size < 0:
        raise CommandError("--records, --partitions and --batch-records must be positive")
    tmp = None
    if args.data_dir:
        data_dir = Path(args.data_dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="shmq-demo-")
        data_dir = Path(tmp.name)
    print(f"shmq demo: data in {data_dir} (compiled hot paths: {_fast.HAVE_FAST}, "
          f"SSE4.2 CRC: {_fast.have_hardware()})")
    config = LogConfig(segment_bytes=8 << 20)
    manager = LogManager(data_dir, config)
    manager.startup()
    try:
        # 1. produce
        t0 = time.perf_counter()
        total_bytes = 0
        for p in range(args.partitions):
            log = manager.get_or_create_log("demo-events", p)
            for batch in _batches(p, args.records, args.record_size, args.batch_records):
                total_bytes += log.append(batch).size
            log.update_high_watermark(log.log_end_offset)
            log.flush()
        dt = time.perf_counter() - t0
        n = args.records * args.partitions
        print(f"appended {n:,} records ({total_bytes / 1e6:.1f} MB, 5 codecs) in {dt:.2f} s: "
              f"{n / dt / 1e6:.2f} M records/s, fsynced")
        # 2. consume everything back by offset
        t0 = time.perf_counter()
        seen = 0
        for p in range(args.partitions):
            log = manager.get_or_create_log("demo-events", p)
            offset = log.log_start_offset
            while offset < log.high_watermark:
                result = log.read(offset, 1 << 20)
                records = decode_batches(result.slices[0].read())
                for rec in records:
                    if rec.offset >= offset:
                        if rec.offset != offset or rec.key != b"key-%d" % offset:
                            raise CommandError(f"partition {p}: offset {rec.offset} out of order")
                        offset += 1
                        seen += 1
        dt = time.perf_counter() - t0
        print(f"read back {seen:,} records in order in {dt:.2f} s: {seen / dt / 1e6:.2f} M records/s")
        log = manager.get_or_create_log("demo-events", 0)
        found = log.offset_for_timestamp(1_700_000_000_000 + args.records // 2)
        print(f"offset for timestamp {1_700_000_000_000 + args.records // 2}: {found}")
        segs = log.segments
        print(f"partition 0: {len(segs)} segments, log start {log.log_start_offset}, "
              f"LEO {log.log_end_offset}, first file {segs[0].log_path.name}")
    finally:
        manager.shutdown()
    print("clean shutdown: indexes trimmed, checkpoints and .kafka_cleanshutdown written")

    # 3. SIGKILL a writer mid-append, then recover what it left
    crash_dir = data_dir / "crash-test-0"
    child = subprocess.Popen(
        [sys.executable, "-m", "shmq", "demo", "--_crash-writer", str(crash_dir)],
        stdout=subprocess.PIPE, text=True)
    acked = -1
    assert child.stdout is not None
    deadline = time.monotonic() + 20
    while acked < 50_000 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        acked = int(line)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    if acked < 0:
        raise CommandError("the crash writer did not start")
    from shmq.storage import PartitionLog
    from shmq.storage.loader import load_log

    t0 = time.perf_counter()
    loaded = load_log(crash_dir, LogConfig(segment_bytes=4 << 20), clean_shutdown=False)
    dt = time.perf_counter() - t0
    leo = loaded.segments[-1].next_offset
    for seg in loaded.segments:
        seg.close()
    print(f"SIGKILLed a writer after {acked + 1:,} acknowledged records; recovery validated "
          f"{len(loaded.recovered_batches):,} batches in {dt * 1e3:.0f} ms, truncated "
          f"{loaded.truncated_bytes} bytes of a torn tail, LEO {leo:,}")
    log = PartitionLog.open(crash_dir, LogConfig(segment_bytes=4 << 20), clean_shutdown=True)
    log.update_high_watermark(log.log_end_offset)
    expected = 0
    offset = 0
    while offset < log.log_end_offset:
        for rec in decode_batches(log.read(offset, 1 << 20).slices[0].read()):
            if rec.offset != expected or rec.key != b"key-%d" % expected:
                raise CommandError(f"recovered log is not a prefix: offset {rec.offset}")
            expected += 1
        offset = expected
    log.close()
    if expected <= acked:
        raise CommandError(f"lost acknowledged records: have {expected}, acked {acked + 1}")
    print(f"every acknowledged record is there exactly once ({expected:,} contiguous offsets)")
    if args.keep or args.data_dir:
        print(f"data kept in {data_dir}; try: shmq dump-log --files "
              f"{data_dir}/demo-events-0/00000000000000000000.log | head")
    if tmp is not None and not args.keep:
        tmp.cleanup()
    return 0
