"""CPU per record of the shmq Python client's calls, measured in-process (issue 15).

    python perf/profile_client.py [--records 500000] [--repeat 3] [--dir /tmp]
                                  [--only produce,batch,arrow-batch,poll,arrow]

Steadier than the wall-clock rows of ``bench_client.py`` on a shared machine: each row is the
client process's CPU time (``time.process_time``: every thread of the process, the linger
thread and librdkafka's included) divided by the records, for 100 B records without key,
against a real one-worker broker (``shmq broker``, a fresh data dir under ``--dir``).  The
broker's own CPU is not counted.  Rows:

* ``produce`` -- ``Producer.produce(topic, value, partition=0)`` per record, then ``flush()``.
* ``produce_batch list`` / ``produce_batch Arrow`` -- ``produce_batch`` of 100,000 values
  (a list of bytes; a ``pyarrow`` binary array), then ``flush()``.
* ``poll`` -- ``Consumer.poll()`` per record over what ``produce`` stored.
* ``consume_arrow first`` / ``again`` -- ``consume_arrow(1,000,000)`` over the same records in a
  fresh consumer: its first call, then a second consumer in the same process.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SIZE = 100


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="produce,batch,arrow-batch,poll,arrow")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args(argv)
    only = set(args.only.split(","))

    import pyarrow as pa
    from bench_broker import start_shmq
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    import shmq

    work = Path(tempfile.mkdtemp(prefix="profile-client-", dir=args.dir))
    broker = start_shmq(1, work / "data", work)
    rows: dict[str, list[float]] = {}
    n = args.records
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        conf = {"bootstrap.servers": broker.bootstrap, "shmq.transport": "shm"}
        seq = [0]

        def topic() -> str:
            seq[0] += 1
            name = f"profile-{seq[0]}"
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
            return name

        def row(name: str, cpu: float, count: int) -> None:
            rows.setdefault(name, []).append(cpu / count * 1e6)
            print(f"   {name:<24} {cpu / count * 1e6:7.3f} us CPU a record", flush=True)

        value = b"x" * SIZE
        filled = None
        for rep in range(args.repeat):
            print(f"-- repeat {rep + 1}/{args.repeat}", flush=True)
            if {"produce", "poll", "arrow"} & only:
                filled = topic()
                p = shmq.Producer(conf)
                p.produce(filled, b"w", partition=0)
                p.flush(30)
                produce = p.produce
                c0 = time.process_time()
                for _ in range(n):
                    while True:
                        try:
                            produce(filled, value, partition=0)
                            break
                        except BufferError:
                            p.poll(0.001)
                assert p.flush(120) == 0
                row("produce", time.process_time() - c0, n)
                p.close()
            for kind in ("batch", "arrow-batch"):
                if kind not in only:
                    continue
                t = topic()
                p = shmq.Producer(conf)
                p.produce(t, b"w", partition=0)
                p.flush(30)
                values = [value] * 100_000
                data: object = pa.array(values, pa.binary()) if kind == "arrow-batch" else values
                c0 = time.process_time()
                for _ in range(max(1, n // len(values))):
                    while True:
                        try:
                            p.produce_batch(t, data, partition=0)
                            break
                        except BufferError:
                            p.poll(0.001)
                assert p.flush(120) == 0
                row("produce_batch list" if kind == "batch" else "produce_batch Arrow",
                    time.process_time() - c0, max(1, n // len(values)) * len(values))
                p.close()
            if filled is not None and "poll" in only:
                c = shmq.Consumer({**conf, "group.id": "profile", "enable.auto.commit": False})
                c.assign([TopicPartition(filled, 0, 1)])
                got = 0
                c0 = time.process_time()
                while got < n:
                    m = c.poll(1.0)
                    if m is None:
                        raise RuntimeError(f"poll: {got} of {n} records")
                    got += 1
                row("poll", time.process_time() - c0, n)
                c.close()
            if filled is not None and "arrow" in only:
                for label in ("consume_arrow first", "consume_arrow again"):
                    c = shmq.Consumer({**conf, "group.id": "profile", "enable.auto.commit": False})
                    c.assign([TopicPartition(filled, 0, 1)])
                    got = 0
                    c0 = time.process_time()
                    while got < n:
                        rb = c.consume_arrow(1_000_000, 5.0)
                        if rb is None:
                            raise RuntimeError(f"consume_arrow: {got} of {n} records")
                        got += rb.num_rows
                    row(label, time.process_time() - c0, n)
                    del rb
                    c.close()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\n| call | us CPU a record (median) | min | max |")
    print("|---|---:|---:|---:|")
    for name, xs in rows.items():
        print(f"| {name} | {statistics.median(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
