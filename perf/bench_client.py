"""shmq's Python client (``shmq.Producer`` / ``Consumer``) against confluent-kafka, same broker.

    python perf/bench_client.py [--records 1000000] [--batch-records 2000000] [--repeat 3]
                                [--latency-seconds 3] [--dir /tmp] [--only produce,batch,poll,
                                arrow,latency] [--trace] [--stages]

Every row moves 100 B records (no key) through a real ``shmq broker`` (one worker, a fresh data
dir under ``--dir``); each client runs in its own process (spawn; start-up and connections are
not timed: a producer sends a warm-up record first, consume_arrow reads it first).  Default client
settings everywhere, except the rows that name another setting beside the default row.

* ``produce + flush``: ``produce()`` per record, then ``flush()`` (every record acknowledged,
  acks=all: in the log).  ``shmq.Producer`` over shared memory vs confluent-kafka's Producer
  over loopback TCP to the same broker (the anchor).
* ``produce_batch (lists)``: ``shmq.Producer.produce_batch(topic, values)`` with lists of
  100,000 distinct values, then ``flush()``; ``produce_batch (Arrow)``: the same values as one
  ``pyarrow`` binary array (made before the clock starts, as a caller's data is).  A call that
  does not fit whole in the producer's queue (``queue.buffering.max.messages``, 100,000)
  queues the prefix that does and returns its length, as confluent-kafka's ``produce_batch``;
  the next call passes the rest.  Each again
  with ``acks=1`` (the default is acks=all, which waits for the broker's ``flush.on.ack``
  fsync).  "broker CPU" is the broker processes' CPU time over the row, per record.
* ``poll``: ``Consumer.poll()`` per record from offset 1 of a partition holding the records
  (``assign``), until all were returned; shmq over the mapped log vs confluent-kafka.
* ``consume_arrow``: ``shmq.Consumer.consume_arrow()`` in a loop, with its defaults (up to
  100,000 records a call, the spark_bridge schema), over the ``--batch-records`` records the
  ``produce_batch (lists)`` row stored.
* ``latency``: one record per ``produce`` at 10,000 records/s (paced; ``poll(0)`` after each),
  read by a ``shmq.Consumer`` in another process (``poll(0.1)``); the send time travels in the
  value; p50 / p99 / max over ``--latency-seconds``.  Default settings (acks=all, which waits
  for the group-commit fsync of ``flush.on.ack``), then the row with ``acks=1`` named beside
  it: the consumer sees a record at its append either way (the high watermark moves at the
  append, as a one-replica Kafka partition's), but acks=all holds each batch in flight until
  its fsync, and an idempotent producer has at most 5 batches in flight.  The producer sleeps
  between records (timer slack 1 ns), never spins.  ``--trace`` adds the CPU per record of the
  producer and the consumer (``getrusage`` over their loops) and of the partition worker
  (``psutil`` over the row): on a shared box these, not the p99, say what the path costs.
  ``--stages`` splits each record's time, joined by offset: ``produce()`` -> its batch handed
  to the ring (and by whom: ``produce``, ``poll`` or the linger thread) -> the worker takes
  it -> appended and published (the worker's ring trace, ``SHMQ_RING_TRACE``) -> the
  consumer's wait returned -> ``poll`` returned it; with the share of records produced while
  ``max.in.flight`` batches were unanswered (they wait for an answer: at acks=all, an
  fsync).  Its tracing costs CPU in all three processes: CPU rows come from runs without it.

Targets (issue 15): produce + flush >= 2 M records/s and >= 2x confluent-kafka; poll >= 2 M/s;
produce_batch >= 10 M/s; consume_arrow >= 20 M/s; latency p99 <= 200 us at 10 k/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SIZE = 100
# --trace: the producer's and the worker's traces of the produce_batch rows (the worker reads it
# at start: ``shmq.worker.rings.TRACE_DIR``)
TRACE_DIR = os.environ.get("SHMQ_RING_TRACE") or None
# the latency rows: the client's defaults, then one changed setting, named beside the default row
LATENCY_ROWS: list[tuple[str, dict[str, Any]]] = [("defaults (acks=all)", {}),
                                                   ("acks=1", {"acks": 1})]


def _conf(bootstrap: str, shm: bool, **extra: Any) -> dict[str, Any]:
    conf = {"bootstrap.servers": bootstrap, **extra}
    if shm:
        conf["shmq.transport"] = "shm"
    return conf


def produce_role(bootstrap: str, topic: str, n: int, kind: str, ready, go, out) -> None:
    import confluent_kafka

    import shmq

    kind, _, acks = kind.partition("@")  # "batch@1": acks=1
    shm = kind != "confluent"
    extra = {"acks": acks} if acks else {}
    p = shmq.Producer(_conf(bootstrap, True, **extra)) if shm else confluent_kafka.Producer(
        _conf(bootstrap, False, **extra))
    p.produce(topic, b"w", partition=0)
    p.flush(30)
    v = b"x" * SIZE
    # distinct values (a record's bytes are not the previous record's), as a user's are
    values: Any = [b"%08d" % i + v[8:] for i in range(100_000)]
    if kind == "arrow-batch":  # the caller's data is an Arrow array already: not timed
        import pyarrow as pa

        values = pa.array(values, pa.binary())
    sends = _trace_sends(p) if shm and TRACE_DIR else None
    ready.set()
    go.wait()
    c0 = time.process_time()
    t0 = time.monotonic()
    if kind in ("batch", "arrow-batch"):
        # the values over and over: each call passes what is left of them, and goes on from
        # the count produce_batch returns (the prefix the queue had room for)
        sent = at = 0
        while sent < n:
            k = min(len(values) - at, n - sent)
            try:
                queued = p.produce_batch(topic, values if k == len(values) else
                                         values[at : at + k], partition=0)
            except BufferError:  # not one record fits: serve reports, then again
                p.poll(0.001)
                continue
            sent += queued
            at = (at + queued) % len(values)
    else:
        produce = p.produce
        for _ in range(n):
            while True:
                try:
                    produce(topic, v, partition=0)
                    break
                except BufferError:  # librdkafka's back-pressure: serve reports, then again
                    p.poll(0.001)
    left = p.flush(120)
    t1 = time.monotonic()
    cpu = time.process_time() - c0
    # persisted, not only reported: a row whose batches were refused must not count
    wm = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-wm"})
    _, high = wm.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=30)
    wm.close()
    if high != n + 1:  # the warm-up record and n
        raise RuntimeError(f"{kind}: {high - 1} of {n} records stored")
    out.put(("producer", t0, t1, left, cpu))
    if sends:
        with open(Path(TRACE_DIR) / f"client-trace-{os.getpid()}.txt", "w") as f:
            f.writelines(f"{b} {s} {a} {c}\n" for b, s, a, c in sends)
    p.close() if shm else p.flush(1)


def _trace_sends(p: Any, where: list[int] | None = None) -> list[tuple[int, ...]]:
    """``--trace``: every batch the producer hands to the ring, as (base offset, handed over,
    answer read, records) in ``time.monotonic_ns`` (the hand-over's copy into the ring counted
    in the batch's time); with ``where`` (the latency rows' ``--stages``) also who handed it
    over (``where[0]`` then: 1 in produce, 2 in poll, 0 elsewhere: the linger thread) and the
    batches unanswered before it."""
    sends: list[tuple[int, ...]] = []
    broker = p._broker
    send = broker.try_send_with
    main = threading.get_ident()

    def traced(topic: str, partition: int, count: int, write: Any, *, acks: Any = -1,
               on_delivery: Any = None) -> Any:
        at = time.monotonic_ns()
        extra = () if where is None else (
            where[0] if threading.get_ident() == main else 0, broker.unanswered(topic, partition))

        def done(result: Any) -> None:
            sends.append((result.base_offset, at, time.monotonic_ns(), count, *extra))
            if on_delivery is not None:
                on_delivery(result)
        return send(topic, partition, count, write, acks=acks, on_delivery=done)

    broker.try_send_with = traced
    return sends


def batch_breakdown(trace_dir: Path) -> list[tuple[str, Any]]:
    """``--trace`` of a produce_batch row: where each batch's time from the producer's hand-over
    to its answer went, from the producer's sends (``_trace_sends``), the worker's ring trace
    (taken, appended) and its acks=all trace (the fsync that covered the batch: flush called,
    flush lock taken, fsync done; the flush's return seen by the loop; the answer written),
    joined by base offset."""
    import numpy as np

    client, ring, answers, flushes = [], [], [], []
    for f in sorted(trace_dir.glob("*-trace-*.txt")):
        for line in f.read_text().splitlines():
            w = line.split()
            if f.name.startswith("client-"):
                client.append(tuple(int(x) for x in w))
            elif f.name.startswith("ring-"):
                ring.append(tuple(int(x) for x in w))
            elif w[0] == "A":
                answers.append(tuple(int(x) for x in w[1:]))
            else:
                flushes.append(tuple(int(x) for x in w[1:]))
        f.unlink()
    if not client:
        return []
    c = np.array(sorted(client), dtype=np.int64)
    r = {row[1]: row for row in ring}
    a = {row[0]: row for row in answers}
    fl = np.array(sorted(flushes, key=lambda x: x[2]), dtype=np.int64).reshape(-1, 4)
    # the flushes of this row's log only (the trace holds every log's): within its sends
    fl = fl[(fl[:, 1] >= c[:, 1].min()) & (fl[:, 2] <= c[:, 2].max())]
    wb, fl = fl[fl[:, 3] < 0], fl[fl[:, 3] >= 0]  # start_writeback calls, fsyncs
    out: dict[str, list[int]] = {}

    def add(name: str, v: int) -> None:
        out.setdefault(name, []).append(v)

    for base, sent, read, _ in c:
        add("hand-over -> answer read (ring-to-answer)", read - sent)
        rr = r.get(base)
        if rr is None:
            continue
        add("  hand-over -> worker takes it", rr[2] - sent)
        add("  worker: validate + append", rr[3] - rr[2])
        aa = a.get(base)
        if aa is None:  # acks=1
            add("  appended -> answer read", read - rr[3])
            continue
        add("  appended -> its flush handed to a thread", aa[1] - rr[3])
        if len(fl):
            # the fsync that made it durable: the first to finish with the batch below its target
            cover = fl[fl[:, 3] > base]
            if len(cover):
                f0 = cover[0]
                add("  handed over -> its fsync starts (thread, previous fsync)", f0[1] - aa[1])
                add("  its fsync (fdatasync)", f0[2] - f0[1])
                add("  fsync done -> the loop sees it", aa[2] - f0[2])
        add("  loop -> answer written (earlier answers first)", aa[3] - aa[2])
        add("  answer written -> producer reads it", read - aa[3])
    if len(wb):
        out["start_writeback on the worker's loop"] = list(wb[:, 2] - wb[:, 1])
    if len(fl) > 1:
        out["fsyncs: duration"] = list(fl[:, 2] - fl[:, 1])
        gap = fl[1:, 1] - fl[:-1, 2]
        waited = fl[1:, 0] < fl[:-1, 2]  # its flush was called before the previous fsync ended
        out["fsyncs: flush() called -> flush lock taken"] = list(fl[:, 1] - fl[:, 0])
        out["fsyncs: gap after the previous one, a flush waiting"] = list(gap[waited])
        out["fsyncs: gap after the previous one, none waiting"] = list(gap[~waited])
        # the fsyncs' share of the row's time: the disk's busy time (as the worker sees it)
        out["fsyncs: busy share (x 1 ms = 100 %)"] = [int(1e6 * (fl[:, 2] - fl[:, 1]).sum()
                                                          / (fl[-1, 2] - fl[0, 1]))]
    return [(k, np.array(v)) for k, v in out.items() if v]


def poll_role(bootstrap: str, topic: str, n: int, kind: str, ready, go, out) -> None:
    import confluent_kafka
    from confluent_kafka import TopicPartition

    import shmq

    conf = {"group.id": f"bench-{kind}", "enable.auto.commit": False}
    shm = kind != "confluent"
    c = shmq.Consumer(_conf(bootstrap, True, **conf)) if shm else confluent_kafka.Consumer(
        _conf(bootstrap, False, **conf))
    if kind == "arrow":
        # start-up not timed, as the producers' warm-up record: the warm-up record (offset 0)
        # is read first (the mapped segment, librdkafka's queue served once).  Not for the poll
        # rows: confluent-kafka's consumer would prefetch the records while it waits for the
        # clock.
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rb = c.consume_arrow(1, 1.0)
            if rb is not None and rb.num_rows:
                break
        else:
            raise RuntimeError(f"{kind}: the warm-up record was not read")
        rb = None
    else:
        c.assign([TopicPartition(topic, 0, 1)])
    ready.set()
    go.wait()
    c0 = time.process_time()
    t0 = time.monotonic()
    got = 0
    deadline = t0 + 300
    if kind == "arrow":
        import resource

        consume_arrow = c.consume_arrow
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        q0 = _runq_ms()
        calls: list[float] = []
        while got < n and time.monotonic() < deadline:
            t = time.perf_counter()
            rb = consume_arrow(timeout=1.0)  # the defaults: up to 100,000 records a call
            calls.append(time.perf_counter() - t)
            if rb is not None:
                got += rb.num_rows
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        # what the row's wall time holds besides decoding (printed by the consumer itself):
        # fresh output pages (minor faults of the first two calls), log pages read back from
        # disk (major faults), and the CPU other processes took (run-queue wait)
        rest = sorted(calls[2:]) or [0.0]
        print(f"     consume_arrow: {len(calls)} calls, first two {calls[0] * 1e3:.1f} / "
              f"{calls[1] * 1e3 if len(calls) > 1 else 0:.1f} ms, median of the rest "
              f"{rest[len(rest) // 2] * 1e3:.1f} ms; minor faults {ru1.ru_minflt - ru0.ru_minflt:,}"
              f", major faults {ru1.ru_majflt - ru0.ru_majflt:,}, run-queue wait "
              f"{_runq_ms() - q0:.0f} ms", flush=True)
    else:
        poll = c.poll
        while got < n and time.monotonic() < deadline:
            m = poll(1.0)
            if m is not None and m.error() is None:
                got += 1
    t1 = time.monotonic()
    out.put(("consumer", t0, t1, got, time.process_time() - c0))
    c.close()


def _io_pressure() -> tuple[int, int] | None:
    """The box's IO stall totals (``/proc/pressure/io``: some, full; microseconds)."""
    try:
        with open("/proc/pressure/io") as f:
            some, full = (int(line.rsplit("total=", 1)[1]) for line in f.read().splitlines())
    except (OSError, ValueError, IndexError):
        return None
    return some, full


def _runq_ms() -> float:
    """This thread's time on the run queue so far (waiting for a CPU), ms."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) / 1e6


def _pace(due: float) -> None:
    """Sleep until ``due`` (timer slack 1 ns: ``bench_shm._fine_sleep``), never spin: a pacing
    loop that spun its last 80 us held a CPU the worker and the consumer wanted on a 2-core box,
    and its CPU counted in the producer's."""
    left = due - time.monotonic()
    if left > 0:
        time.sleep(left)


def lat_producer(bootstrap: str, topic: str, rate: int, seconds: float, extra: dict[str, Any],
                 ready, go, out) -> None:
    import shmq

    p = shmq.Producer(_conf(bootstrap, True, **extra))
    p.produce(topic, struct.pack("=d", 0.0) + b"x" * (SIZE - 8), partition=0)
    p.flush(30)
    stages = bool(os.environ.get("SHMQ_LAT_STAGES"))
    # --stages: who handed each batch over (1 produce, 2 poll(0), 0 the linger thread) and the
    # batches unanswered at each produce (at max.in.flight the record waits for an answer)
    where = [0]
    sends = _trace_sends(p, where) if stages else None
    busy: list[int] = []
    broker = p._broker
    ready.set()
    go.wait()
    from bench_shm import _cpu, _fine_sleep

    _fine_sleep()
    n = int(rate * seconds)
    pad = b"x" * (SIZE - 8)
    import resource

    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    cpu = _cpu()
    t0 = time.monotonic()
    if stages:
        for i in range(n):
            _pace(t0 + i / rate)
            busy.append(broker.unanswered(topic, 0))
            where[0] = 1
            p.produce(topic, struct.pack("=d", time.monotonic()) + pad, partition=0)
            where[0] = 2
            p.poll(0)
            where[0] = 0
    else:
        for i in range(n):
            _pace(t0 + i / rate)
            p.produce(topic, struct.pack("=d", time.monotonic()) + pad, partition=0)
            p.poll(0)
    p.flush(30)
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches
    out.put(("producer", t0, time.monotonic(), n, (_cpu() - cpu, n), sends, busy,
             broker.max_in_flight, switches))
    p.close()


def lat_consumer(bootstrap: str, topic: str, expect: int, ready, go, out) -> None:
    from confluent_kafka import TopicPartition

    import shmq

    c = shmq.Consumer(_conf(bootstrap, True, **{"group.id": "bench-lat",
                                                "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, 0, 1)])
    c.poll(0.01)
    ready.set()
    from bench_shm import _cpu

    lat: list[float] = []
    # --stages: per record its offset, when poll returned it and when the consumer's last wait
    # for the log (``ShmConsumer._wait``) before it returned
    stages = bool(os.environ.get("SHMQ_LAT_STAGES"))
    marks: list[int] = []
    woke = [0]
    if stages:
        wait = c._wait

        def traced_wait(timeout: float) -> None:
            wait(timeout)
            woke[0] = time.monotonic_ns()
        c._wait = traced_wait
    go.wait()
    cpu = _cpu()
    deadline = time.monotonic() + 120
    while len(lat) < expect and time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and m.error() is None:
            sent = struct.unpack_from("=d", m.value())[0]
            if sent:  # not the warm-up record
                lat.append(time.monotonic() - sent)
                if stages:
                    marks.extend((m.offset(), int(sent * 1e9), time.monotonic_ns(), woke[0]))
    out.put(("consumer", 0, 0, lat, (_cpu() - cpu, len(lat)), marks))
    c.close()


def latency_stages(res: dict[str, Any], trace_dir: Path) -> list[str]:
    """``--stages``: each record's path from ``produce()`` to the ``poll()`` that returned it,
    joined by offset: the producer's hand-overs (``_trace_sends``: by whom, batches in flight),
    the worker's ring trace (taken, appended and published) and the consumer's marks; the
    median record and the slowest 1 % per stage, and how often records met a full
    max.in.flight.  The worker stamps "published" after the state table's publish: a worker
    preempted between the two (a loaded box) stamps it after the consumer had the record, and
    that record's e comes out negative."""
    import numpy as np

    rows = []
    for f in sorted(trace_dir.glob("*-trace-*.txt")):
        if f.name.startswith("ring-"):
            rows.extend(tuple(int(x) for x in line.split()) for line in f.read_text().splitlines())
        f.unlink()
    _, _, _, n, _, sends, busy, cap, switches = res["producer"]
    marks = res["consumer"][5]
    if not sends or not marks or not rows:
        return ["stages: no trace"]
    s = np.array(sorted(sends), dtype=np.int64)  # base, handed over, answer read, count, who, busy
    m = np.array(marks, dtype=np.int64).reshape(-1, 4)  # offset, stamp, poll returned, woke
    # this row's entries only (part, base, taken, published): a trace written late by an
    # earlier row's session holds other partitions' base offsets
    lo, hi = int(s[:, 1].min()), int(m[:, 2].max())
    t = np.array(sorted(r[1:4] for r in rows if r[1] >= 0 and lo <= r[2] <= hi),
                 dtype=np.int64).reshape(-1, 3)
    t = np.concatenate([np.zeros((len(t), 1), np.int64), t], axis=1)
    m = m[np.argsort(m[:, 0])]
    i = np.searchsorted(s[:, 0], m[:, 0], side="right") - 1
    j = np.searchsorted(t[:, 1], m[:, 0], side="right") - 1
    ok = (i >= 0) & (j >= 0)
    m, b, w = m[ok], s[i[ok]], t[j[ok]]
    woke = np.maximum(m[:, 3], w[:, 3])  # a wait that returned before the publish: none waited
    stages = [
        ("a produce() -> batch handed over", b[:, 1] - m[:, 1]),
        ("b handed over -> worker takes it", w[:, 2] - b[:, 1]),
        ("c worker: append + publish", w[:, 3] - w[:, 2]),
        ("d published -> consumer's wait returned", woke - w[:, 3]),
        ("e wait returned -> poll returns it", m[:, 2] - woke),
    ]
    total = m[:, 2] - m[:, 1]
    order = np.argsort(total)
    slow = order[int(len(order) * 0.99):]
    mid = order[int(len(order) * 0.45): int(len(order) * 0.55)]
    out = [f"  stages ({len(total):,} records; slowest 1 %: {len(slow)}, >= "
           f"{total[slow[0]] / 1000:.0f} us)           p50     p90     p99   median rec  slow median"]
    for name, v in stages:
        out.append(f"    {name:<42} {np.median(v) / 1000:7.1f} {np.percentile(v, 90) / 1000:7.1f}"
                   f" {np.percentile(v, 99) / 1000:7.1f} {np.median(v[mid]) / 1000:11.1f} {np.median(v[slow]) / 1000:12.1f}")
    main = np.stack([v for _, v in stages])
    largest = np.bincount(main[:, slow].argmax(axis=0), minlength=len(stages))
    out.append("    largest stage of each slow record: " + ", ".join(
        f"{n.split()[0]} {c}" for (n, _), c in zip(stages, largest, strict=True) if c))
    who = b[:, 4]
    recs_per = np.bincount(s[:, 4], weights=s[:, 3], minlength=3)
    out.append(f"    batches {len(s):,} ({len(m) / max(1, len(np.unique(b[:, 0]))):.2f} records "
               f"each); records handed over by produce {recs_per[1] / s[:, 3].sum():.0%}, "
               f"poll {recs_per[2] / s[:, 3].sum():.0%}, the linger thread "
               f"{recs_per[0] / s[:, 3].sum():.0%}; slow records by the linger thread "
               f"{(who[slow] == 0).mean():.0%}; the producer's voluntary context switches "
               f"{switches / n:.2f} a record")
    full = np.array(busy, dtype=np.int64)
    at = m[:, 0] - 1  # record i of the loop is offset i + 1 (the warm-up record is offset 0)
    at_cap = full[at[at < len(full)]] >= cap
    wait = stages[0][1]
    out.append(f"    records produced with {cap} batches unanswered (max.in.flight): "
               f"{at_cap.mean():.1%} (slowest 1 %: {at_cap[slow[slow < len(at_cap)]].mean():.0%})"
               f"; their produce -> hand-over p50 {np.median(wait[:len(at_cap)][at_cap]) / 1000 if at_cap.any() else 0:.0f} us"
               f"; hand-overs that filled the cap {(s[:, 5] >= cap - 1).mean():.0%}; "
               f"hand-over -> answer p50 {np.median(s[:, 2] - s[:, 1]) / 1000:.0f} us")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch-records", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency-seconds", type=float, default=3.0)
    ap.add_argument("--phase-timeout", type=float, default=300.0)
    ap.add_argument("--only", default="produce,batch,poll,arrow,latency")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--trace", action="store_true",
                    help="latency rows: the CPU per record of the producer, the worker and the "
                         "consumer; produce_batch rows: where each batch's time from the "
                         "hand-over to its answer went (worker's ring trace, its fsyncs)")
    ap.add_argument("--stages", action="store_true",
                    help="latency rows: each record's path from produce() to poll() in stages "
                         "(the producer's hand-overs, the worker's ring trace, the consumer's "
                         "wait), and how often records met max.in.flight batches unanswered; "
                         "the tracing costs CPU: the CPU rows of --trace are for runs without it")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    global TRACE_DIR

    import numpy as np
    from _common import print_environment
    from bench_broker import cpu_delta, start_shmq
    from bench_shm import Harness, _cpu_rows, _worker_cpu

    print_environment("shmq Python client vs confluent-kafka")
    print(f"  records     {args.records:,} x {SIZE} B per-record rows, {args.batch_records:,} "
          f"produce_batch, repeat {args.repeat}; wall time in the client processes\n")
    work = Path(tempfile.mkdtemp(prefix="bench-client-", dir=args.dir))
    if (args.trace and "batch" in only) or args.stages:  # inherited by the broker, the clients
        TRACE_DIR = os.environ["SHMQ_RING_TRACE"] = str(work / "trace")
        (work / "trace").mkdir()
    if args.stages:
        os.environ["SHMQ_LAT_STAGES"] = "1"
    broker = start_shmq(1, work / "data", work)
    h = Harness(args)
    rows: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    broker_cpu: dict[str, list[float]] = {}
    lat_rows: dict[str, list[list[float]]] = {}
    cpu_lines: list[str] = []
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        seq = [0]

        def topic() -> str:
            seq[0] += 1
            name = f"bench-client-{seq[0]}"
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
            time.sleep(0.2)
            return name

        def run(name: str, role: Any, rargs: tuple, n: int, producer: bool = False) -> None:
            before = broker.cpu()
            io0, w0 = _io_pressure(), time.monotonic()
            r = h.run_one(role, rargs, args.phase_timeout)
            io1, w1 = _io_pressure(), time.monotonic()
            _, t0, t1, info, cpu_s = r
            rate = n / (t1 - t0)
            rows.setdefault(name, []).append(rate)
            cpu.setdefault(name, []).append(cpu_s / (t1 - t0))
            extra = ""
            if producer:  # the broker's CPU for the row's records (its idle time included)
                per = cpu_delta(before, broker.cpu()) / n * 1e6
                broker_cpu.setdefault(name, []).append(per)
                extra = f"  broker CPU {per:.3f} us/record"
                if io0 is not None and io1 is not None:  # the box's IO stalls over the row
                    extra += (f"  IO pressure some {(io1[0] - io0[0]) / 1e4 / (w1 - w0):.1f} %"
                              f" full {(io1[1] - io0[1]) / 1e4 / (w1 - w0):.1f} %")
            print(f"   {name:<44} {rate:>13,.0f} rec/s  client CPU {cpu_s / (t1 - t0):.2f}"
                  f" ({cpu_s / n * 1e9:.1f} ns/record){extra}", flush=True)
            if TRACE_DIR and "produce_batch" in name:
                time.sleep(0.5)  # the worker writes its traces when the session ends
                for label, v in batch_breakdown(Path(TRACE_DIR)):
                    q = [float(x) / 1e6 for x in np.percentile(v, [10, 50, 90, 99])]
                    print(f"     {label:<58} p10 {q[0]:6.2f}  p50 {q[1]:6.2f}  p90 {q[2]:6.2f}"
                          f"  p99 {q[3]:6.2f} ms  (n {len(v)})", flush=True)

        n = args.records
        nb = args.batch_records
        for rep in range(args.repeat):
            print(f"-- repeat {rep + 1}/{args.repeat}", flush=True)
            filled = batched = None
            if "produce" in only or "poll" in only or "arrow" in only:
                filled = topic()
                run("shmq produce + flush", produce_role, (broker.bootstrap, filled, n, "shm"),
                    n, True)
                if "produce" in only:
                    t = topic()
                    run("confluent-kafka produce + flush (anchor)", produce_role,
                        (broker.bootstrap, t, n, "confluent"), n, True)
            if "batch" in only or "arrow" in only:
                batched = topic()
                run("shmq produce_batch + flush (lists)", produce_role,
                    (broker.bootstrap, batched, nb, "batch"), nb, True)
            if "batch" in only:
                t = topic()
                run("shmq produce_batch + flush (lists, acks=1)", produce_role,
                    (broker.bootstrap, t, nb, "batch@1"), nb, True)
                t = topic()
                run("shmq produce_batch (Arrow) + flush", produce_role,
                    (broker.bootstrap, t, nb, "arrow-batch"), nb, True)
                t = topic()
                run("shmq produce_batch (Arrow, acks=1) + flush", produce_role,
                    (broker.bootstrap, t, nb, "arrow-batch@1"), nb, True)
            if filled is not None and "poll" in only:
                run("shmq poll", poll_role, (broker.bootstrap, filled, n, "shm"), n)
                run("confluent-kafka poll (anchor)", poll_role,
                    (broker.bootstrap, filled, n, "confluent"), n)
            if "arrow" in only:  # the produce_batch topic: --batch-records records
                assert batched is not None
                run("shmq consume_arrow", poll_role, (broker.bootstrap, batched, nb, "arrow"),
                    nb)
            if "latency" in only:
                for label, extra in LATENCY_ROWS:
                    t = topic()
                    expect = int(10_000 * args.latency_seconds)
                    w0 = _worker_cpu(str(work / "data"))
                    res = h.run_pair(lat_producer, (broker.bootstrap, t, 10_000,
                                                    args.latency_seconds, extra),
                                     lat_consumer, (broker.bootstrap, t, expect),
                                     args.phase_timeout)
                    worker = cpu_delta(w0, _worker_cpu(str(work / "data")))
                    if args.stages:
                        time.sleep(0.5)  # the worker writes its trace when the session ends
                        for line in latency_stages(res, Path(TRACE_DIR or ".")):
                            print(line, flush=True)
                    if args.trace:
                        cpu_lines.extend(_cpu_rows(f"latency 10k/s, {label}", res["producer"][4],
                                                   worker, res["consumer"][4], "consumer"))
                    lat = sorted(res["consumer"][3])
                    if lat:
                        q = [lat[len(lat) // 2], lat[int(len(lat) * 0.99)], lat[-1]]
                        lat_rows.setdefault(label, []).append(q)
                        print(f"   latency at 10k/s, {label}: p50 {q[0] * 1e6:.0f} us  p99 "
                              f"{q[1] * 1e6:.0f} us  max {q[2] * 1e6:.0f} us ({len(lat)} "
                              f"records)", flush=True)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)

    def med(xs: list[float]) -> tuple[float, float]:
        m = statistics.median(xs)
        return m, (max(xs) - min(xs)) / m if m else 0.0

    print("\n| row | records/s (median) | spread | client CPU (cores) | broker CPU us/record "
          "| vs anchor | target |")
    print("|---|---:|---:|---:|---:|---:|---|")
    anchors = {"shmq produce + flush": "confluent-kafka produce + flush (anchor)",
               "shmq poll": "confluent-kafka poll (anchor)"}
    targets = {"shmq produce + flush": ">= 2 M/s and >= 2x", "shmq poll": ">= 2 M/s",
               "shmq produce_batch + flush (lists)": ">= 10 M/s",
               "shmq produce_batch (Arrow) + flush": ">= 10 M/s",
               "shmq produce_batch + flush (lists, acks=1)": "(acks=1 beside the default)",
               "shmq produce_batch (Arrow, acks=1) + flush": "(acks=1 beside the default)",
               "shmq consume_arrow": ">= 20 M/s"}
    for name, xs in rows.items():
        m, sp = med(xs)
        a = anchors.get(name)
        ratio = f"{m / med(rows[a])[0]:.2f}x" if a in rows else "-"
        bcpu = f"{statistics.median(broker_cpu[name]):.3f}" if name in broker_cpu else "-"
        print(f"| {name} | {m:,.0f} | {sp:.0%} | {statistics.median(cpu[name]):.2f} | {bcpu} "
              f"| {ratio} | {targets.get(name, '')} |")
    for label, qs in lat_rows.items():
        p50 = statistics.median(r[0] for r in qs) * 1e6
        p99 = statistics.median(r[1] for r in qs) * 1e6
        mx = statistics.median(r[2] for r in qs) * 1e6
        target = "p99 <= 200 us" if label == LATENCY_ROWS[0][0] else ""
        print(f"| latency 10k/s, {label}: p50 / p99 / max (us) | {p50:.0f} / {p99:.0f} / {mx:.0f} "
              f"| | | | | {target} |")
    for line in cpu_lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
