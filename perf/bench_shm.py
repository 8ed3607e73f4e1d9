"""The shared-memory data path against the Python IPC peers and the Kafka wire path, in one run.

    python perf/bench_shm.py [--records 2000000] [--per-message 200000] [--batch 1000]
                             [--repeat 3] [--latency-seconds 3] [--workers 1] [--dir /tmp]
                             [--only ring,peers,tcp,latency,cpu] [--trace [--stages]] [--kafka]

Every row moves 100 B records from one producer process to one consumer process (both started
with ``multiprocessing``'s spawn context; their start-up is not timed).  The shmq rows go
through a real ``shmq broker`` (``--workers`` partition workers, data dir in a fresh temporary
directory under ``--dir``): the records are persisted in the partition's log (page cache, as
Kafka's acks=1/all without fsync... except that acks=all fsyncs with ``flush.on.ack``), not only
handed over.  The peers persist nothing; they are the anchors.

Rows (median of ``--repeat`` runs, with the spread (max - min) / median):

* ``ring produce``: ``LocalBroker.send_batch`` of ``--batch`` records per call to one partition,
  pipelined (``poll(0)`` after each call, at most 5 unanswered batches per partition: Kafka's
  idempotent-producer bound), timed from the first call to the end of ``flush()`` (every batch
  acknowledged: in the log).  acks=all is the client default (Kafka's); acks=1 is named beside.
* ``ring read -> Arrow``: another process reads the partition from offset 0 with
  ``LocalBroker.read_arrow`` (the spark_bridge schema) until it has every record; ``ring
  iter_arrow`` the same through ``LocalBroker.iter_arrow`` (reads in order, two threads
  decoding); ``ring read (views)`` with zero-copy ``read`` only (batches found, not decoded).
  Start-up (imports, the segment listing, one read of the warm-up record) is not timed, as the
  producer's warm-up record is not.
* Every row's values are distinct 100 B strings (one object repeated would be pickled once by
  multiprocessing.Queue, with a memo reference per record).
* ``multiprocessing.Queue``, ``pyzmq ipc://`` (PUSH/PULL), ``posix_ipc MessageQueue``: per
  message (one ``put``/``send`` per record, ``--per-message`` records) and packed (``--batch``
  records joined into one message; posix_ipc: as many as fit its 8 KiB message limit).  Timed
  from the producer's first send to the consumer's last receive.
* ``confluent-kafka TCP``: a default-config librdkafka Producer to the same broker over loopback
  (``produce`` per record, ``flush``), and a default-config Consumer (``assign`` from the start)
  in another process reading them back; end to end.
* ``latency``: the produce call to a waiting reader (another process in ``read(timeout=...)``,
  asleep on the state table's futex), the send time carried in each record, at 10,000 records/s
  (one record per call) and at 1,000,000 records/s (100 records per call every 100 us);
  p50 and p99 as the median of the repeats' own (each repeat's p99 printed beside it), p99.9 /
  max / n over all repeats' records together.  The producer sleeps between calls (timer slack 1 ns), never spins.  The
  anchor row is confluent-kafka at 10,000 msg/s (defaults, so linger.ms 5).  ``--trace`` adds
  where the records waited, from the worker's ring trace (``SHMQ_RING_TRACE``) joined by offset:
  produce call -> the worker's drain takes the entry -> appended and published in the state
  table -> the reader has it; how long the reader sat on the run queue (runnable, no CPU:
  ``/proc/thread-self/schedstat``) before the read that returned each record; the CPU
  time the hypervisor stole during each row (``/proc/stat``); and the CPU per record of each
  process of the row (producer and reader: ``getrusage`` over their loops, all threads; the
  partition worker: ``psutil`` over the row), the numbers to judge on a shared box, where the
  p99 is the scheduler's.  ``--stages`` (with ``--trace``) splits each record's path in six,
  joined by stamp and offset: the client's ``send_batch``, its return to the worker's drain
  start (with the worker's run-queue time since its last drain), the drain's earlier entries,
  append + publish, the publish to the reader's wait returning (with the reader's run-queue
  and CPU time in that wait), and the read; then prints what the slowest 1 % spent in each
  against the median record, which stage was each slow record's largest, and how many
  overlapped a gc collection or a housekeeping turn of the worker (``SHMQ_RING_TRACE_STAGES``:
  two ``pread`` a drain in the worker, four in the reader a read, so its CPU rows cost more).  ``--kafka`` runs the confluent-kafka row against Apache Kafka 4.3.1
  too (``tools/apache_kafka.py``), same clients, same rate.
* ``broker CPU per record``: utime+stime of the broker's processes (controller and workers)
  during the ring produce and during the confluent-kafka produce of the same records.

Targets (issue 14): batched produce >= 11 M records/s persisted and >= 2x the best peer's packed
rate; read into Arrow >= 20 M records/s; latency p99 <= 100 us at 10 k/s and <= 1 ms at 1 M/s;
broker CPU per record <= 0.5x the TCP path's.  Only loopback and Unix sockets; every loop is
bounded by a count and by --phase-timeout; the broker is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SIZE = 100
MQ_LIMIT = 8192


# -- child roles (module level: the spawn context imports them) -------------------------------

def _payload(n: int) -> list[bytes]:
    """``n`` distinct 100 B values.  Not one object ``n`` times: pickle (multiprocessing.Queue)
    would send it once and ``n`` memo references, ~5 B a record instead of 100."""
    return [b"%08d" % i + b"x" * (SIZE - 8) for i in range(n)]


def ring_producer(data_dir: str, topic: str, n: int, batch: int, acks: Any, ready, go, out) -> None:
    from shmq.ipc.client import attach

    broker = attach(data_dir)
    values = _payload(batch)
    broker.send_batch(topic, 0, values[:1], acks=acks).result(30)  # session, producer id
    ready.set()
    go.wait()
    t0 = time.monotonic()
    sent = 0
    while sent < n:
        k = min(batch, n - sent)
        broker.send_batch(topic, 0, values if k == batch else values[:k], acks=acks)
        broker.poll(0)
        sent += k
    left = broker.flush(120)
    t1 = time.monotonic()
    out.put(("producer", t0, t1, left, time.process_time()))
    broker.close()


def ring_reader(data_dir: str, topic: str, n: int, arrow: Any, chunk: int, ready, go,
                out) -> None:
    """``arrow``: False (zero-copy views), True (``read_arrow`` calls) or "iter"
    (``iter_arrow``: reads in order, two threads decoding)."""
    from shmq.ipc.client import attach

    broker = attach(data_dir)
    # start-up, as the producer's warm-up record: imports (pyarrow), the segment listing and
    # mapping, one read of the warm-up record at offset 0
    if arrow:
        broker.read_arrow(topic, 0, 0, 1, timeout=30.0)
    else:
        broker.read(topic, 0, 0, 1, timeout=30.0)
    ready.set()
    go.wait()
    import resource

    from bench_client import _runq_ms

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    q0 = _runq_ms()
    t0 = time.monotonic()
    offset, got = 1, 0  # offset 0 is the warm-up record
    deadline = t0 + 300
    if arrow == "iter":
        for rb, _ in broker.iter_arrow(topic, 0, offset, chunk, end=offset + n, timeout=1.0):
            got += rb.num_rows
            del rb
    while got < n and time.monotonic() < deadline:
        if arrow:
            rb, nxt = broker.read_arrow(topic, 0, offset, chunk, timeout=1.0)
            got += rb.num_rows
        else:
            r = broker.read(topic, 0, offset, chunk, timeout=1.0)
            nxt = r.next_offset
            got += len(r)
        offset = nxt
    t1 = time.monotonic()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    if arrow:  # what the wall time holds besides decoding (see bench_client's consume_arrow)
        print(f"     reader: minor faults {ru1.ru_minflt - ru0.ru_minflt:,}, major faults "
              f"{ru1.ru_majflt - ru0.ru_majflt:,}, run-queue wait {_runq_ms() - q0:.0f} ms",
              flush=True)
    out.put(("reader", t0, t1, got, time.process_time()))
    broker.close()


def mpq_producer(q, n: int, packed: int, ready, go, out) -> None:
    ready.set()
    go.wait()
    t0 = time.monotonic()
    if packed:
        chunk = _payload(packed)
        for _ in range(n // packed):
            q.put(chunk)
    else:
        v = b"x" * SIZE
        for _ in range(n):
            q.put(v)
    out.put(("producer", t0, time.monotonic(), 0, 0))


def mpq_consumer(q, n: int, packed: int, ready, go, out) -> None:
    ready.set()
    got = 0
    while got < n:
        item = q.get()
        got += len(item) if packed else 1
    out.put(("consumer", 0, time.monotonic(), got, 0))


def zmq_producer(addr: str, n: int, packed: int, ready, go, out) -> None:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.connect(addr)
    ready.set()
    go.wait()
    t0 = time.monotonic()
    if packed:
        blob = b"x" * (SIZE * packed)  # fixed-size records: no length prefixes needed
        for _ in range(n // packed):
            s.send(blob)
    else:
        v = b"x" * SIZE
        for _ in range(n):
            s.send(v)
    out.put(("producer", t0, time.monotonic(), 0, 0))
    s.close(linger=10_000)
    ctx.term()


def zmq_consumer(addr: str, n: int, packed: int, ready, go, out) -> None:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.bind(addr)
    ready.set()
    got = 0
    while got < n:
        m = s.recv()
        got += len(m) // SIZE
    out.put(("consumer", 0, time.monotonic(), got, 0))
    s.close()
    ctx.term()


def mq_producer(name: str, n: int, packed: int, ready, go, out) -> None:
    import posix_ipc

    q = posix_ipc.MessageQueue(name)
    ready.set()
    go.wait()
    t0 = time.monotonic()
    if packed:
        blob = b"x" * (SIZE * packed)
        for _ in range(n // packed):
            q.send(blob)
    else:
        v = b"x" * SIZE
        for _ in range(n):
            q.send(v)
    out.put(("producer", t0, time.monotonic(), 0, 0))
    q.close()


def mq_consumer(name: str, n: int, packed: int, ready, go, out) -> None:
    import posix_ipc

    q = posix_ipc.MessageQueue(name)
    ready.set()
    got = 0
    while got < n:
        m, _ = q.receive()
        got += len(m) // SIZE
    out.put(("consumer", 0, time.monotonic(), got, 0))
    q.close()


def tcp_producer(bootstrap: str, topic: str, n: int, ready, go, out) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, b"w", partition=0)
    p.flush(30)
    ready.set()
    go.wait()
    t0 = time.monotonic()
    v = b"x" * SIZE
    for _ in range(n):
        while True:
            try:
                p.produce(topic, v, partition=0)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(120)
    out.put(("producer", t0, time.monotonic(), left, time.process_time()))


def tcp_consumer(bootstrap: str, topic: str, n: int, ready, go, out) -> None:
    from confluent_kafka import Consumer, TopicPartition

    # from offset 1, after the producer's warm-up record; a first Fetch that comes before that
    # record is appended is out of range (offset 1 past the log end 0, as Kafka answers): it
    # then starts from the earliest, and offset 0 is not counted
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-shm",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 1)])
    got = sum(1 for m in c.consume(1, 0.5)  # connected before the clock starts
              if not m.error() and m.offset() >= 1)
    ready.set()
    deadline = time.monotonic() + 300
    while got < n and time.monotonic() < deadline:
        for m in c.consume(10_000, 1.0):
            if not m.error() and m.offset() >= 1:
                got += 1
    out.put(("consumer", 0, time.monotonic(), got, 0))
    c.close()


def _pace(due: float) -> None:
    """Sleep until ``due`` (the process's timer slack set to 1 us by ``_fine_sleep``).  No spin:
    on a 2-core box a spinning producer takes a whole core from the worker and the reader,
    whose wake-ups then wait for a CPU (the latency rows measured that run queue).  A late
    wake-up delays the send, not the measured latency (stamped at the send); the schedule is
    absolute, so the rate holds."""
    left = due - time.monotonic()
    if left > 0:
        time.sleep(left)


def _fine_sleep() -> None:
    """prctl(PR_SET_TIMERSLACK, 1 ns): sleeps end when asked, not up to 50 us later."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


WARMUP_S = 0.5  # records sent first and not measured (stamp 0): connections, caches, offsets


def lat_ring_producer(data_dir: str, topic: str, rate: int, per_call: int, seconds: float,
                      ready, go, out) -> None:
    from shmq.ipc.client import attach

    broker = attach(data_dir)
    broker.send_batch(topic, 0, [b"w" * SIZE], acks=1).result(30)
    ready.set()
    go.wait()
    _fine_sleep()
    interval = per_call / rate
    calls = int(seconds / interval)
    warm = int(WARMUP_S / interval)
    pad = b"x" * (SIZE - 8)
    stages = bool(os.environ.get("SHMQ_RING_TRACE_STAGES"))
    marks: list[int] = []  # --stages: per measured call, its stamp, the send's end, kicks so far
    cpu = _cpu()
    start = time.monotonic()
    for i in range(warm + calls):
        _pace(start + i * interval)
        stamp = time.monotonic_ns() if i >= warm else 0
        broker.send_batch(topic, 0, [stamp.to_bytes(8, "little") + pad] * per_call, acks=1)
        if stages and stamp:
            marks.extend((stamp, time.monotonic_ns(),
                          sum(s.kicks for s in broker.sessions.values())))
        broker.poll(0)
    broker.flush(60)
    out.put(("producer", start, time.monotonic(), calls * per_call,
             (_cpu() - cpu, (warm + calls) * per_call), marks))
    broker.close()


def lat_ring_reader(data_dir: str, topic: str, expect: int, ready, go, out) -> None:
    import numpy as np

    from shmq.ipc.client import attach

    broker = attach(data_dir)
    offset = broker.reader(topic, 0).state().high_watermark
    broker.read_arrow(topic, 0, max(0, offset - 1), 1)  # imports and buffers before the clock
    # --trace: this process's time on the run queue (runnable, no CPU) per read, from schedstat
    sched = os.open("/proc/thread-self/schedstat", os.O_RDONLY) \
        if os.environ.get("SHMQ_RING_TRACE") else -1
    queued = int(os.pread(sched, 64, 0).split()[1]) if sched >= 0 else 0
    ready.set()
    sent: list[Any] = []
    seen: list[Any] = []
    offsets: list[Any] = []
    waited: list[Any] = []
    few: tuple[list[int], ...] = ([], [], [], [])  # sent, seen, offset, waited: small reads
    got = 0
    read = 0  # records read, the warm-up ones too (the CPU below is for all of them)
    reads = 0  # the reads that returned records (a loaded box batches them: CPU a read)
    # --stages: per read that returned records, its first offset, when its wait ended, the run
    # queue time during the wait and the CPU the wait took (spin), from schedstat
    stages = sched >= 0 and bool(os.environ.get("SHMQ_RING_TRACE_STAGES"))
    reader = broker.reader(topic, 0)
    woke: list[int] = []
    go.wait()
    cpu = _cpu()
    deadline = time.monotonic() + 300
    while got < expect and time.monotonic() < deadline:
        if stages:
            q0, c0 = int(os.pread(sched, 64, 0).split()[1]), time.thread_time_ns()
            reader.wait(offset, 1.0)
            w = time.monotonic_ns()
            c1, q1 = time.thread_time_ns(), int(os.pread(sched, 64, 0).split()[1])
            r = broker.read(topic, 0, offset, 1 << 16)
            if len(r):
                woke.extend((offset, w, q1 - q0, c1 - c0))
        else:
            r = broker.read(topic, 0, offset, 1 << 16, timeout=1.0)
        now = time.monotonic_ns()
        if sched >= 0:
            was, queued = queued, int(os.pread(sched, 64, 0).split()[1])
        if not len(r):
            continue
        reads += 1
        if len(r) < 64:  # a few records: decoded as objects (cheaper than Arrow's set-up),
            recs = r.records()  # noted in lists (numpy's per-call cost was ~1 us an array op)
            read += len(recs)
            for x in recs:
                stamp = int.from_bytes(x.value[:8], "little")
                if stamp:
                    few[0].append(stamp)
                    few[1].append(now)
                    few[2].append(x.offset)
                    if sched >= 0:
                        few[3].append(queued - was)
                    got += 1
            offset = r.next_offset
            continue
        else:  # each value's first 8 bytes, from the Arrow columns (no object per record)
            rb = r.to_arrow(topic, 0)
            values = rb.column("value")
            ends = np.frombuffer(values.buffers()[1], np.int32, len(values) + 1,
                                 values.offset * 4)
            data = np.frombuffer(values.buffers()[2], np.uint8)
            stamps = data[ends[:-1, None] + np.arange(8)].copy().view("<i8").ravel()
            col = rb.column("offset")  # not to_numpy: its first call imports pandas (0.3 s)
            offs = np.frombuffer(col.buffers()[1], np.int64, len(col), 8 * col.offset).copy()
            del col
            del values, rb, data, ends
        read += len(stamps)
        keep = stamps != 0
        sent.append(stamps[keep])
        seen.append(np.full(int(keep.sum()), now, np.int64))
        offsets.append(offs[keep])
        if sched >= 0:  # since the end of the previous read (decoding it included)
            waited.append(np.full(int(keep.sum()), queued - was, np.int64))
        got += int(keep.sum())
        offset = r.next_offset
    cpu = _cpu() - cpu

    def cat(xs: list[Any], small: list[int]) -> Any:
        xs = [*xs, np.array(small, np.int64)]
        return np.concatenate(xs)

    sent_, seen_, offsets_, waited_ = (cat(xs, small) for xs, small in
                                       zip((sent, seen, offsets, waited), few, strict=True))
    order = np.argsort(offsets_, kind="stable")  # the small reads' lists and the large reads'
    if len(waited_) == len(order):               # arrays, back in read order
        waited_ = waited_[order]
    out.put(("reader", 0, 0, got, (sent_[order], seen_[order], offsets_[order], waited_,
                                   (cpu, read, reads)), woke))
    broker.close()


def _cpu() -> float:
    """This process's CPU seconds so far (user + system, all its threads)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _worker_switches(data_dir: str) -> tuple[int, int]:
    """Voluntary and involuntary context switches of the partition workers so far (psutil):
    the involuntary ones are preemptions (``--stages`` prints them a record)."""
    import json

    import psutil

    vol = inv = 0
    try:
        info = json.loads((Path(data_dir) / "run" / "broker.json").read_text())
    except (OSError, ValueError):
        return 0, 0
    for w in info.get("workers", []):
        try:
            c = psutil.Process(int(w["pid"])).num_ctx_switches()
        except (psutil.Error, KeyError, ValueError):
            continue
        vol, inv = vol + c.voluntary, inv + c.involuntary
    return vol, inv


def _worker_cpu(data_dir: str) -> dict[int, float]:
    """CPU seconds of each partition worker (pids from ``run/broker.json``), by pid."""
    import json

    import psutil

    try:
        info = json.loads((Path(data_dir) / "run" / "broker.json").read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for w in info.get("workers", []):
        try:
            t = psutil.Process(int(w["pid"])).cpu_times()
        except (psutil.Error, KeyError, ValueError):
            continue
        out[int(w["pid"])] = t.user + t.system
    return out


def _cpu_rows(name: str, producer: tuple[float, int], worker: float, reader: tuple[int | float, ...],
              consumer_name: str = "reader") -> list[str]:
    """CPU us per record of each process of a latency row (and per read, when the reader counted
    its reads: records come several to a read once the reader lags)."""
    def per(cpu: float, n: int) -> str:
        return f"{cpu / n * 1e6:8.1f}" if n else "       -"

    p_cpu, p_n = producer
    r_cpu, r_n = reader[0], int(reader[1])
    reads = f" in {int(reader[2]):,} reads, {per(r_cpu, int(reader[2])).strip()} a read" \
        if len(reader) > 2 else ""
    return [f"{name}: CPU us per record: producer {per(p_cpu, p_n)} ({p_n:,} records), "
            f"worker {per(worker, p_n)}, {consumer_name} {per(r_cpu, r_n)} ({r_n:,} read{reads})"]


def _steal() -> int:
    """Clock ticks stolen from this VM's CPUs so far (/proc/stat's "cpu" line, 8th value)."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8])
    except (OSError, IndexError, ValueError):
        return 0


def trace_breakdown(trace_dir: Path, sent: Any, seen: Any, offsets: Any,
                    waited: Any = None) -> list[tuple[str, Any]]:
    """Where each record waited, from the worker's ring trace (``SHMQ_RING_TRACE``) joined by
    offset: produce call -> the worker's drain takes the entry -> appended and published ->
    the reader has it; and how long the reader sat on the run queue (runnable, no CPU: the
    scheduler's doing, not a missed wake-up) from the end of its previous read to the read
    that returned the record."""
    import numpy as np

    rows = []
    for f in sorted(trace_dir.glob("ring-trace-*.txt")):
        rows.extend(tuple(int(x) for x in line.split()) for line in f.read_text().splitlines())
        f.unlink()
    if not rows or not len(offsets):
        return []
    t = np.array(sorted(r for r in rows if r[1] >= 0), dtype=np.int64)  # by base offset
    t = t[np.argsort(t[:, 1], kind="stable")]
    at = np.searchsorted(t[:, 1], offsets, side="right") - 1
    ok = at >= 0
    taken, published = t[at[ok], 2], t[at[ok], 3]
    out = [("produce call -> worker takes the entry", taken - sent[ok]),
           ("worker: append + publish", published - taken),
           ("publish -> reader has it", seen[ok] - published)]
    if waited is not None and len(waited) == len(offsets):
        out.append(("  reader on the run queue meanwhile", waited[ok]))
    return out


def stage_breakdown(trace_dir: Path, sent: Any, seen: Any, offsets: Any, marks: list[int],
                    woke: list[int]) -> list[str]:
    """``--stages``: each record's path in six stages, joined by stamp (the producer's marks),
    by offset (the worker's trace, the reader's wake-ups), and what the slowest 1 % spent in
    each against the median record; then which stage was the largest for each of them, and
    how many overlapped a gc collection or a housekeeping turn of the worker."""
    import numpy as np

    rows = []
    for f in sorted(trace_dir.glob("ring-trace-*.txt")):
        rows.extend(tuple(int(x) for x in line.split()) for line in f.read_text().splitlines())
        f.unlink()
    events = []
    for f in sorted(trace_dir.glob("ring-events-*.txt")):
        events.extend(tuple(int(x) for x in line.split()) for line in f.read_text().splitlines())
        f.unlink()
    rows = [r for r in rows if len(r) >= 12 and r[1] >= 0]
    if not rows or not marks or not woke:
        return ["stages: no stage trace (SHMQ_RING_TRACE_STAGES)"]
    t = np.array(rows, dtype=np.int64)
    t = t[np.argsort(t[:, 1], kind="stable")]
    at = np.searchsorted(t[:, 1], offsets, side="right") - 1
    ok = at >= 0
    t = t[at[ok]]
    sent, seen, offsets = sent[ok], seen[ok], offsets[ok]
    m = np.array(marks, dtype=np.int64).reshape(-1, 3)
    m = m[np.argsort(m[:, 0], kind="stable")]
    j = np.clip(np.searchsorted(m[:, 0], sent), 0, len(m) - 1)
    sent_end = np.where(m[j, 0] == sent, m[j, 1], sent)
    kicked = np.diff(np.concatenate(([m[0, 2]], m[:, 2])))[j] > 0
    w = np.array(woke, dtype=np.int64).reshape(-1, 4)
    k = np.clip(np.searchsorted(w[:, 0], offsets, side="right") - 1, 0, len(w) - 1)
    woke_at, r_queued, r_cpu = w[k, 1], w[k, 2], w[k, 3]
    # worker columns: part, base, taken, published, began, kicked, prev end, prev cpu,
    # prev queued, cpu, queued, index in the drain
    began, wkick = t[:, 4], t[:, 5] > 0
    prev_end, prev_cpu, prev_q, cpu_now, q_now = t[:, 6], t[:, 7], t[:, 8], t[:, 9], t[:, 10]
    stages = [
        ("a client: stamp -> send_batch returned", sent_end - sent),
        ("b send returned -> worker's drain began", began - sent_end),
        ("b'  worker run queue, last drain -> this one", np.where(prev_end > 0, q_now - prev_q, 0)),
        ("b'' worker CPU, last drain -> this one", np.where(prev_end > 0, cpu_now - prev_cpu, 0)),
        ("c drain began -> entry taken", t[:, 2] - began),
        ("d append + publish", t[:, 3] - t[:, 2]),
        ("e published -> reader's wait returned", woke_at - t[:, 3]),
        ("e'  reader run queue during its wait", r_queued),
        ("e'' reader CPU during its wait (spin)", r_cpu),
        ("f wait returned -> reader has it", seen - woke_at),
    ]
    total = seen - sent
    order = np.argsort(total)
    slow = order[int(len(order) * 0.99):]
    mid = order[int(len(order) * 0.45): int(len(order) * 0.55)]
    out = [f"stages ({len(total):,} records; slowest 1 %: {len(slow):,}, total >= "
           f"{total[slow[0]] / 1000:.1f} us)       median rec  slow: median    mean     p90"]
    for name, v in stages:
        out.append(f"  {name:<48} {np.median(v[mid]) / 1000:9.1f} {np.median(v[slow]) / 1000:9.1f}"
                   f" {v[slow].mean() / 1000:8.1f} {np.percentile(v[slow], 90) / 1000:8.1f}")
    main = np.stack([s for n, s in stages if "'" not in n.split()[0]])
    names = [n.split()[0] for n, _ in stages if "'" not in n.split()[0]]
    largest = np.bincount(main[:, slow].argmax(axis=0), minlength=len(names))
    out.append("  largest stage of each slow record: " + ", ".join(
        f"{n} {c}" for n, c in zip(names, largest, strict=True) if c))
    out.append(f"  slow records kicked the worker: {kicked[slow].mean():.0%} (all: "
               f"{kicked.mean():.0%}); drain began by a kick: {wkick[slow].mean():.0%} (all: "
               f"{wkick.mean():.0%}); index in the drain, slow median {np.median(t[slow, 11]):.0f}, "
               f"max {t[slow, 11].max()}")
    if events:
        ev = np.array(events, dtype=np.int64)
        for kind, label in ((1, "housekeeping turn"), (10, "gc gen 0"), (11, "gc gen 1"),
                            (12, "gc gen 2")):
            e = ev[ev[:, 0] == kind]
            if not len(e):
                continue
            e = e[np.argsort(e[:, 1])]
            # a record overlaps an event when the event began before it was seen and ended after
            # it was sent
            i = np.searchsorted(e[:, 1], seen[slow], side="right") - 1
            hit = (i >= 0) & (e[np.maximum(i, 0), 2] > sent[slow])
            dur = (e[:, 2] - e[:, 1]) / 1000
            out.append(f"  {label}: {len(e)} events (median {np.median(dur):.0f} us, max "
                       f"{dur.max():.0f}); slow records overlapping one: {hit.mean():.0%}")
    return out


def lat_tcp_producer(bootstrap: str, topic: str, rate: int, seconds: float, ready, go, out) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, b"w" * SIZE, partition=0)
    p.flush(30)
    ready.set()
    go.wait()
    _fine_sleep()
    interval = 1 / rate
    calls = int(seconds * rate)
    warm = int(WARMUP_S / interval)
    pad = b"x" * (SIZE - 8)
    cpu = _cpu()
    start = time.monotonic()
    for i in range(warm + calls):
        _pace(start + i * interval)
        now = time.monotonic_ns() if i >= warm else 0
        p.produce(topic, now.to_bytes(8, "little") + pad, partition=0)
        p.poll(0)
    p.flush(60)
    out.put(("producer", start, time.monotonic(), calls, (_cpu() - cpu, warm + calls)))


def lat_tcp_consumer(bootstrap: str, topic: str, expect: int, ready, go, out) -> None:
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-shm-lat",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, OFFSET_END)])
    c.consume(1, 1.0)
    ready.set()
    lat = []
    read = 0
    go.wait()
    cpu = _cpu()
    deadline = time.monotonic() + 300
    while len(lat) < expect and time.monotonic() < deadline:
        # poll, not consume(n, t): librdkafka's consume_batch waits until it has n messages or
        # the timeout passed, which at 10,000/s made this row 50 ms of waiting for 1,000
        m = c.poll(0.5)
        now = time.monotonic_ns()
        if m is not None and not m.error() and len(m.value()) == SIZE:
            read += 1
            sent = int.from_bytes(m.value()[:8], "little")
            if sent:
                lat.append(now - sent)
    out.put(("reader", 0, 0, len(lat), (lat, (_cpu() - cpu, read))))
    c.close()


# -- driver -------------------------------------------------------------------------------------

class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ctx = mp.get_context("spawn")

    def run_pair(self, producer: Any, pargs: tuple, consumer: Any, cargs: tuple,
                 timeout: float) -> dict[str, tuple]:
        """Start both roles, wait until both are ready, release the producer, collect."""
        ctx = self.ctx
        out = ctx.Queue()
        go = ctx.Event()
        r1, r2 = ctx.Event(), ctx.Event()
        procs = [ctx.Process(target=consumer, args=(*cargs, r2, go, out)),
                 ctx.Process(target=producer, args=(*pargs, r1, go, out))]
        procs[0].start()
        if not r2.wait(60):
            raise RuntimeError("consumer did not start")
        procs[1].start()
        try:
            if not r1.wait(60):
                raise RuntimeError("producer did not start")
            go.set()
            results: dict[str, tuple] = {}
            deadline = time.monotonic() + timeout
            while len(results) < 2:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("phase timed out")
                item = out.get(timeout=left)
                results[item[0]] = item
            return results
        finally:
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()  # by its handle: a process we started
                    p.join()

    def run_one(self, producer: Any, pargs: tuple, timeout: float) -> tuple:
        ctx = self.ctx
        out, go, ready = ctx.Queue(), ctx.Event(), ctx.Event()
        p = ctx.Process(target=producer, args=(*pargs, ready, go, out))
        p.start()
        try:
            if not ready.wait(60):
                raise RuntimeError("did not start")
            go.set()
            return out.get(timeout=timeout)
        finally:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def _noop_consumer(ready, go, out) -> None:
    ready.set()
    out.put(("consumer", 0, 0, 0, 0))


def stats(xs: list[float]) -> tuple[float, float]:
    med = statistics.median(xs)
    return med, ((max(xs) - min(xs)) / med if med else 0.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--records", type=int, default=2_000_000, help="records of the batched rows")
    p.add_argument("--per-message", type=int, default=200_000, help="records of per-message rows")
    p.add_argument("--batch", type=int, default=1000, help="records per send_batch / packed msg")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--read-chunk", type=int, default=65536, help="max_records of each read")
    p.add_argument("--latency-rates", default="10000:1,1000000:100",
                   help="rate:records-per-call pairs of the ring latency rows")
    p.add_argument("--latency-seconds", type=float, default=3.0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--phase-timeout", type=float, default=300.0)
    p.add_argument("--only", default="ring,peers,tcp,latency,cpu")
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--trace", action="store_true",
                   help="latency rows: where records wait, from the worker's ring trace, and "
                        "the CPU per record of each process")
    p.add_argument("--stages", action="store_true",
                   help="with --trace: each record's six stages (client send, drain start, "
                        "append, publish, reader wake, read) and what the slowest 1 %% spent "
                        "in each (costs the worker two preads a drain, the reader four)")
    p.add_argument("--kafka", action="store_true",
                   help="latency: the confluent-kafka row against Apache Kafka too "
                        "(tools/apache_kafka.py, fetched from Maven Central on first use)")
    args = p.parse_args(argv)
    only = set(args.only.split(","))

    from _common import print_environment
    from bench_broker import cpu_delta, create_topic, start_kafka, start_shmq

    print_environment("shmq shared-memory data path vs IPC peers")
    print(f"  records     {args.records:,} x {SIZE} B (batched rows), {args.per_message:,} "
          f"(per-message rows), batch {args.batch}, repeat {args.repeat}")
    print("  timing      wall time (time.monotonic) in the producer and consumer processes (the "
          "clock line above is _common's default and does not apply here)\n")
    work = Path(tempfile.mkdtemp(prefix="bench-shm-", dir=args.dir))
    if args.trace:
        os.environ["SHMQ_RING_TRACE"] = str(work)  # inherited by the broker's workers
        if args.stages:
            os.environ["SHMQ_RING_TRACE_STAGES"] = "1"
    broker = start_shmq(args.workers, work / "data", work)
    kafka = None
    data_dir = str(work / "data")
    h = Harness(args)
    rows: list[tuple[str, list[float], str]] = []
    cpu_rows: dict[str, list[float]] = {}
    extra: list[str] = []
    try:
        if args.kafka and "latency" in only:
            kafka = start_kafka(work / "kafka", "1g")
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        topic_no = [0]

        def topic() -> str:
            topic_no[0] += 1
            name = f"bench-{topic_no[0]}"
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
            time.sleep(0.2)  # broker.json lists the new slot
            return name

        def rate(name: str, values: list[float], note: str = "") -> None:
            rows.append((name, values, note))
            if values:
                print(f"   {name:<50} {values[0]:>13,.0f}", flush=True)

        for rep in range(args.repeat):
            print(f"-- repeat {rep + 1}/{args.repeat}", flush=True)
            if "ring" in only:
                for acks, label in ((-1, "acks=all (default)"), (1, "acks=1")):
                    t = topic()
                    before = broker.cpu()
                    res = h.run_one(ring_producer, (data_dir, t, args.records, args.batch, acks),
                                    args.phase_timeout)
                    cpu = cpu_delta(before, broker.cpu())
                    _, t0, t1, left, _ = res
                    assert left == 0
                    rate(f"ring produce, {args.batch}/call, {label}", [args.records / (t1 - t0)])
                    cpu_rows.setdefault(f"ring produce {label}", []).append(cpu / args.records)
                    if acks == 1:
                        for arrow, label2 in (
                                (True, f"ring read -> Arrow (spark schema), {args.read_chunk}/read"),
                                ("iter", f"ring iter_arrow (2 decoding threads), {args.read_chunk}/read"),
                                (False, f"ring read (zero-copy views), {args.read_chunk}/read")):
                            res = h.run_one(ring_reader, (data_dir, t, args.records, arrow,
                                                          args.read_chunk), args.phase_timeout)
                            _, t0, t1, got, _ = res
                            assert got == args.records, (got, args.records)
                            rate(label2, [args.records / (t1 - t0)])
                rate("ring produce, 1/call, acks=1", [])
                t = topic()
                n1 = args.per_message
                res = h.run_one(ring_producer, (data_dir, t, n1, 1, 1), args.phase_timeout)
                rows[-1][1].append(n1 / (res[2] - res[1]))
            if "peers" in only:
                for packed in (0, args.batch):
                    n = args.per_message if not packed else args.records
                    kind = "per message" if not packed else f"packed {packed}"
                    q = h.ctx.Queue(maxsize=1000)
                    r = h.run_pair(mpq_producer, (q, n, packed), mpq_consumer, (q, n, packed),
                                   args.phase_timeout)
                    rate(f"multiprocessing.Queue, {kind}", [n / (r["consumer"][2] - r["producer"][1])])
                    addr = f"ipc://{work}/zmq-{rep}-{packed}"
                    r = h.run_pair(zmq_producer, (addr, n, packed), zmq_consumer, (addr, n, packed),
                                   args.phase_timeout)
                    rate(f"pyzmq ipc://, {kind}", [n / (r["consumer"][2] - r["producer"][1])])
                    import posix_ipc

                    per = min(packed, MQ_LIMIT // SIZE) if packed else 0
                    nm = n - n % per if per else n
                    name = f"/bench-shm-{os.getpid()}-{rep}-{packed}"
                    mq = posix_ipc.MessageQueue(name, posix_ipc.O_CREX, mode=0o600,
                                                max_message_size=max(SIZE * per, SIZE))
                    try:
                        r = h.run_pair(mq_producer, (name, nm, per), mq_consumer, (name, nm, per),
                                       args.phase_timeout)
                    finally:
                        mq.close()
                        mq.unlink()
                    label = "per message" if not per else f"packed {per} (8 KiB limit)"
                    rate(f"posix_ipc MessageQueue, {label}", [nm / (r["consumer"][2] - r["producer"][1])])
            if "tcp" in only:
                n = args.per_message * 5
                t = topic()
                before = broker.cpu()
                r1 = h.run_one(tcp_producer, (broker.bootstrap, t, n), args.phase_timeout)
                cpu = cpu_delta(before, broker.cpu())
                rate("confluent-kafka TCP produce (defaults)", [n / (r1[2] - r1[1])])
                cpu_rows.setdefault("TCP produce (confluent-kafka, defaults)", []).append(cpu / n)
                t = topic()
                r = h.run_pair(tcp_producer, (broker.bootstrap, t, n), tcp_consumer,
                               (broker.bootstrap, t, n), args.phase_timeout)
                rate("confluent-kafka TCP end to end", [n / (r["consumer"][2] - r["producer"][1])])
            if "latency" in only:
                for pair in args.latency_rates.split(","):
                    rate_, per_call = (int(x) for x in pair.split(":"))
                    t = topic()
                    expect = int(args.latency_seconds * rate_ / per_call) * per_call
                    for f in work.glob("ring-*.txt"):  # earlier sessions' (other topics)
                        f.unlink()
                    steal0 = _steal()
                    w0, sw0 = _worker_cpu(data_dir), _worker_switches(data_dir)
                    r = h.run_pair(lat_ring_producer, (data_dir, t, rate_, per_call,
                                                       args.latency_seconds),
                                   lat_ring_reader, (data_dir, t, expect), args.phase_timeout)
                    worker = cpu_delta(w0, _worker_cpu(data_dir))
                    stolen = _steal() - steal0
                    sent, seen, offsets, waited, reader_cpu = r["reader"][4]
                    rows.append((f"latency ring {rate_:,}/s", (seen - sent).tolist(), "ns"))
                    if args.trace:
                        extra.extend(_cpu_rows(f"latency ring {rate_:,}/s", r["producer"][4],
                                               worker, reader_cpu))
                        time.sleep(0.5)  # the session's trace is written when it ends
                        if args.stages:
                            sw1 = _worker_switches(data_dir)
                            n_ = r["producer"][4][1]
                            extra.append(f"latency ring {rate_:,}/s, repeat {rep + 1}: worker "
                                         f"context switches a record: voluntary "
                                         f"{(sw1[0] - sw0[0]) / n_:.2f}, involuntary "
                                         f"{(sw1[1] - sw0[1]) / n_:.3f}")
                            extra.extend(stage_breakdown(work, sent, seen, offsets,
                                                         r["producer"][5], r["reader"][5]))
                            continue
                        for part, values in trace_breakdown(work, sent, seen, offsets, waited):
                            rows.append((f"  {rate_:,}/s: {part}", values.tolist(), "ns"))
                        extra.append(f"latency ring {rate_:,}/s: CPU time stolen by the "
                                     f"hypervisor during the row (/proc/stat steal, all CPUs): "
                                     f"{stolen * 1000 // os.sysconf('SC_CLK_TCK')} ms")
                t = topic()
                expect = int(args.latency_seconds * 10_000)
                w0 = _worker_cpu(data_dir)
                r = h.run_pair(lat_tcp_producer, (broker.bootstrap, t, 10_000, args.latency_seconds),
                               lat_tcp_consumer, (broker.bootstrap, t, expect), args.phase_timeout)
                worker = cpu_delta(w0, _worker_cpu(data_dir))
                lat, consumer_cpu = r["reader"][4]
                rows.append(("latency confluent-kafka TCP 10,000/s", lat, "ns"))
                if args.trace:
                    extra.extend(_cpu_rows("latency confluent-kafka TCP 10,000/s",
                                           r["producer"][4], worker, consumer_cpu, "consumer"))
                if kafka is not None:
                    t = f"bench-kafka-{rep}"
                    create_topic(kafka.bootstrap, t, 1, 60)
                    k0 = kafka.cpu()
                    r = h.run_pair(lat_tcp_producer, (kafka.bootstrap, t, 10_000,
                                                      args.latency_seconds),
                                   lat_tcp_consumer, (kafka.bootstrap, t, expect),
                                   args.phase_timeout)
                    jvm = cpu_delta(k0, kafka.cpu())
                    lat, consumer_cpu = r["reader"][4]
                    rows.append(("latency confluent-kafka -> Apache Kafka 10,000/s", lat, "ns"))
                    if args.trace:
                        extra.extend(_cpu_rows("latency confluent-kafka -> Apache Kafka "
                                               "10,000/s (worker: the JVM)", r["producer"][4],
                                               jvm, consumer_cpu, "consumer"))
    finally:
        broker.stop()
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(work, ignore_errors=True)

    # -- table ----------------------------------------------------------------------------------
    merged: dict[str, list[float]] = {}
    lat_rows: dict[str, list[float]] = {}
    lat_runs: dict[str, list[list[float]]] = {}  # each repeat's values: p50 / p99 a run
    for name, values, note in rows:
        (lat_rows if note == "ns" else merged).setdefault(name, []).extend(values)
        if note == "ns":
            lat_runs.setdefault(name, []).append(values)
    packed_peers = [statistics.median(v) for k, v in merged.items()
                    if "packed" in k and ("Queue" in k or "zmq" in k or "posix" in k)]
    best_packed = max(packed_peers) if packed_peers else None
    print(f"\n{'row':<52} {'records/s':>13} {'spread':>7} {'x best packed peer':>19}")
    for name, values in merged.items():
        if not values:
            continue
        med, spread = stats(values)
        ratio = f"{med / best_packed:.2f}x" if best_packed else "-"
        print(f"{name:<52} {med:>13,.0f} {spread:>6.0%} {ratio:>19}")
    if lat_rows:
        import numpy as np

        # p50 and p99: the median of the repeats' own (the method: a row is the median of its
        # runs, with their spread); p99.9, max and n over all repeats' records together
        print(f"\n{'latency (produce call -> waiting reader)':<52} {'p50 us':>9} {'p99 us':>9} "
              f"{'p99 of each run':>24} {'p99.9 us':>9} {'max us':>9} {'n':>9}")
        for name, values in lat_rows.items():
            a = np.asarray(values, dtype=np.float64) / 1000
            runs = [np.asarray(v, dtype=np.float64) / 1000 for v in lat_runs[name] if len(v)]
            p50 = statistics.median(float(np.percentile(r, 50)) for r in runs)
            p99s = [float(np.percentile(r, 99)) for r in runs]
            each = " / ".join(f"{x:.0f}" for x in p99s)
            print(f"{name:<52} {p50:>9.1f} {statistics.median(p99s):>9.1f} {each:>24} "
                  f"{np.percentile(a, 99.9):>9.1f} {a.max():>9.1f} {len(a):>9,}")
    if cpu_rows:
        print(f"\n{'broker CPU per record':<52} {'us':>9}")
        for name, values in cpu_rows.items():
            print(f"{name:<52} {statistics.median(values) * 1e6:>9.3f}")
    for line in extra:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
