"""Transactional produce: throughput and commit latency, shmq against Tansu and Apache Kafka in
the same run.

    python perf/bench_txn.py [--quick] [--only shmq|tansu|kafka] [--no-kafka] [--workers 2]
                             [--repeat 3] [--records 200000] [--partitions 6] [--tansu PATH]
                             [--kafka-heap 1g] [--dir /tmp]

Per broker and repeat, for transactions of 1,000 and of 100 records (100 B values, null keys,
spread over ``--partitions`` partitions of a fresh topic): one confluent-kafka Producer with
``transactional.id`` (client defaults otherwise: linger.ms 5, acks=all, idempotence on, as
transactions require) runs ``begin_transaction`` / ``produce`` x N / ``commit_transaction``
until ``--records`` records are committed.  Throughput is records / wall time from the first
``begin_transaction`` to the last commit; commit latency is the time of each
``commit_transaction`` call (it flushes the transaction's outstanding records, then EndTxn:
markers written into every partition and made durable), p50 and p99 over all transactions.
A read_committed consumer then counts the committed records (a note if it differs).

The anchors are Tansu (the same binary and flags as ``perf/bench_broker.py``: memory storage,
so it never fsyncs; shmq fsyncs acks=all batches and markers, flush.on.ack), Apache Kafka 4.3.1
(``perf/bench_broker.py``'s single-node KRaft broker with Kafka's JVM settings and defaults: it
never fsyncs by default, and answers EndTxn once Prepare is written, its markers behind the
answer; librdkafka runs transaction version 0 on both) and, by ratio,
shmq's own non-transactional idempotent producer at the same size (``idempotent`` row), which
shows what transactions cost.  A broker whose transactions fail is reported as such.  Broker
CPU per million records is utime+stime of the broker's process tree.  The client runs on the
same 2 cores as the broker.  Everything on 127.0.0.1; every loop bounded by --phase-timeout.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import apache_kafka  # noqa: E402
from bench_broker import (  # noqa: E402
    Broker,
    cpu_delta,
    create_topic,
    find_tansu,
    start_kafka,
    start_shmq,
    start_tansu,
)

VALUE = b"x" * 100


def txn_phase(broker: Broker, topic: str, records: int, per_txn: int, timeout: float) -> dict:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker.bootstrap,
                  "transactional.id": f"bench-{uuid.uuid4()}", "linger.ms": 5})
    p.init_transactions(timeout)
    cpu0 = broker.cpu()
    commits: list[float] = []
    started = time.perf_counter()
    deadline = time.monotonic() + timeout
    done = 0
    while done < records and time.monotonic() < deadline:
        p.begin_transaction()
        for _ in range(per_txn):
            while True:
                try:
                    p.produce(topic, VALUE)
                    break
                except BufferError:
                    p.poll(0.01)
        t = time.perf_counter()
        p.commit_transaction(timeout)
        commits.append(time.perf_counter() - t)
        done += per_txn
    elapsed = time.perf_counter() - started
    cpu = cpu_delta(cpu0, broker.cpu())
    commits.sort()
    return {"rate": done / elapsed, "records": done, "p50": commits[len(commits) // 2],
            "p99": commits[min(len(commits) - 1, int(len(commits) * 0.99))],
            "cpu_per_m": cpu / done * 1e6}


def idempotent_phase(broker: Broker, topic: str, records: int, timeout: float) -> dict:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                  "linger.ms": 5})
    cpu0 = broker.cpu()
    started = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                p.produce(topic, VALUE)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(timeout)
    elapsed = time.perf_counter() - started
    return {"rate": records / elapsed, "records": records, "p50": float("nan"),
            "p99": float("nan"), "cpu_per_m": cpu_delta(cpu0, broker.cpu()) / records * 1e6}


def count_committed(broker: Broker, topic: str, partitions: int, expect: int,
                    timeout: float) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    n = 0
    deadline = time.monotonic() + timeout
    idle = 0
    while n < expect and time.monotonic() < deadline and idle < 10:
        msgs = c.consume(10000, 0.5)
        idle = idle + 1 if not msgs else 0
        n += sum(1 for m in msgs if not m.error())
    c.close()
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20,000 records, 1 repeat")
    p.add_argument("--only", choices=("shmq", "tansu", "kafka"))
    p.add_argument("--no-kafka", action="store_true", help="leave Apache Kafka out")
    p.add_argument("--kafka-heap", default="1g", help="Kafka's -Xmx/-Xms (its scripts' 1g)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--phase-timeout", type=float, default=300)
    p.add_argument("--tansu")
    p.add_argument("--dir", default=tempfile.gettempdir())
    args = p.parse_args()
    if args.quick:
        args.records, args.repeat = 20_000, 1
    work = Path(tempfile.mkdtemp(prefix="bench-txn-", dir=args.dir))
    brokers: list[Broker] = []
    results: dict[tuple[str, str], list[dict]] = {}
    try:
        names = [args.only] if args.only else ["shmq", "tansu"] + ([] if args.no_kafka
                                                                    else ["kafka"])
        if "shmq" in names:
            brokers.append(start_shmq(args.workers, work / "shmq-data", work))
        if "tansu" in names:
            brokers.append(start_tansu(find_tansu(args.tansu), work))
        if "kafka" in names:
            try:
                apache_kafka.fetch()
            except apache_kafka.KafkaUnavailable as e:
                sys.exit(f"{e} (or run with --no-kafka)")
            (work / "kafka").mkdir()
            brokers.append(start_kafka(work / "kafka", args.kafka_heap))
        for r in range(args.repeat):
            order = brokers if r % 2 == 0 else list(reversed(brokers))
            for b in order:
                for case, per_txn in (("txn 1000", 1000), ("txn 100", 100), ("idempotent", 0)):
                    topic = f"bt-{b.name}-{r}-{case.replace(' ', '')}"
                    create_topic(b.bootstrap, topic, args.partitions, 30)
                    try:
                        if per_txn:
                            res = txn_phase(b, topic, args.records, per_txn, args.phase_timeout)
                            got = count_committed(b, topic, args.partitions, res["records"],
                                                  60)
                            if got != res["records"]:
                                print(f"  note: {b.name} {case}: read_committed counted {got} "
                                      f"of {res['records']}", file=sys.stderr)
                        else:
                            res = idempotent_phase(b, topic, args.records, args.phase_timeout)
                    except Exception as exc:  # noqa: BLE001 - reported in the table
                        print(f"  {b.name} {case} failed: {exc}", file=sys.stderr)
                        res = {"failed": str(exc)}
                    results.setdefault((b.name, case), []).append(res)
                    print(f"  repeat {r + 1} {b.name:5} {case:10} "
                          + (f"{res['rate']:9,.0f} rec/s" if "rate" in res else "failed"),
                          file=sys.stderr)
    finally:
        for b in brokers:
            b.stop()
        shutil.rmtree(work, ignore_errors=True)

    def med(rows: list[dict], key: str) -> tuple[float, float]:
        vals = [x[key] for x in rows if key in x]
        if not vals:
            return float("nan"), float("nan")
        return statistics.median(vals), (max(vals) - min(vals)) / 2

    print(f"\ntransactional produce, 100 B records, {args.records:,} per run, "
          f"{args.partitions} partitions, median of {args.repeat} (± half the spread)")
    print(f"{'broker':6} {'case':11} {'records/s':>18} {'commit p50 ms':>14} "
          f"{'commit p99 ms':>14} {'broker CPU s/M':>15} {'vs tansu':>9} {'vs kafka':>9}")
    for case in ("txn 1000", "txn 100", "idempotent"):
        for name in [b.name for b in brokers]:
            rows = results.get((name, case), [])
            rate, spread = med(rows, "rate")
            p50, _ = med(rows, "p50")
            p99, _ = med(rows, "p99")
            cpu, _ = med(rows, "cpu_per_m")
            ratios = []
            for other in ("tansu", "kafka"):
                anchor, _ = med(results.get((other, case), []), "rate")
                ratios.append(f"{rate / anchor:.2f}x" if name != other and anchor == anchor
                              and anchor > 0 else "")
            print(f"{name:6} {case:11} {rate:10,.0f} ±{spread:6,.0f} {p50 * 1000:14.1f} "
                  f"{p99 * 1000:14.1f} {cpu:15.2f} {ratios[0]:>9} {ratios[1]:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
