"""The load processes of ``perf/suite.py``: one confluent-kafka client per process.

    python perf/suite_load.py produce  BOOTSTRAP TOPIC COUNT SIZE TIMEOUT
    python perf/suite_load.py consume  BOOTSTRAP TOPIC PARTITIONS COUNT TIMEOUT
    python perf/suite_load.py paced    BOOTSTRAP TOPIC RATE WARMUP_S SECONDS SIZE TIMEOUT
    python perf/suite_load.py receive  BOOTSTRAP TOPIC PARTITIONS COUNT TIMEOUT

Each connects and fetches the topic's metadata, prints ``ready`` and waits for a line on stdin,
so that ``suite.py`` starts the clock of several processes at once (interpreter start-up and
connection set-up are not measured).  Then it runs, and prints one JSON line: the monotonic
times it started and ended (CLOCK_MONOTONIC is one clock for every process on the host, so the
suite can take the earliest start and the latest end of 4 producers), what it counted, and
``cpu``: the CPU seconds the whole process (Python and librdkafka's threads) spent between the
two (``time.process_time``), which the suite compares with the phase's wall time to mark rows
bound by the client.

* ``produce``: COUNT records of SIZE bytes as fast as librdkafka takes them (linger.ms=5,
  batch.size=1 MiB, acks=1, no compression, null keys: the sticky partitioner); ends when every
  delivery report is in.
* ``consume``: ``assign`` every partition from the beginning and read COUNT records.
* ``paced`` / ``receive``: the end-to-end latency pair.  ``paced`` sends RATE records/s in 1 ms
  ticks, WARMUP_S seconds of warm-up then SECONDS measured; each value starts with the
  sender's ``time.monotonic_ns()`` and a warm-up flag.  It reports librdkafka's per-record
  acknowledgement latency (``Message.latency()``: ``produce()`` to the broker's answer).
  ``receive`` reads them and reports, for the measured records, the time from the stamp to the
  moment ``consume()`` handed the record over: produce + broker + fetch + client, end to end.

Every loop is bounded by its count and by TIMEOUT seconds.  Loopback only.
"""

from __future__ import annotations

import json
import struct
import sys
import time

CLIENT_CONF = {"linger.ms": 5, "batch.size": 1048576, "acks": 1, "compression.type": "none"}
# fetch.queue.backoff.ms: librdkafka's default (1000) postpones a partition's next fetch by up to
# 1 s once its local queue is full, about half the consume time of either broker; 0 makes every
# librdkafka broker thread busy-wait on full queues, which on 2 cores measures the client's spin
# (one thread per broker node: shmq has two, Tansu one).  10 ms avoids both (bench_broker.py's
# measurements, commit a28a29f).
CONSUMER_CONF = {"fetch.queue.backoff.ms": 10, "enable.auto.commit": False,
                 "enable.auto.offset.store": False}
STAMP = struct.Struct(">qB")  # monotonic ns at produce(), 1 = warm-up record


def _ready_then_wait() -> None:
    print("ready", flush=True)
    if not sys.stdin.readline():
        sys.exit("suite_load: stdin closed before the start signal")


def _emit(result: dict) -> None:
    print(json.dumps(result), flush=True)


def produce(bootstrap: str, topic: str, count: int, size: int, timeout: float,
            keyed: bool = False) -> None:
    """``count`` records of ``size`` bytes; ``keyed``: record i has the key ``keys(count)[i]``
    (distinct keys, so librdkafka's default partitioner spreads them over every partition),
    built before the clock starts; otherwise null keys (the sticky partitioner)."""
    from confluent_kafka import Producer

    errors = [0]

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            errors[0] += 1

    producer = Producer({"bootstrap.servers": bootstrap, **CLIENT_CONF,
                         "on_delivery": delivered})
    producer.list_topics(topic, timeout=10)
    value = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    send, poll = producer.produce, producer.poll
    key_of = keys(count) if keyed else [None] * count
    _ready_then_wait()
    c0 = time.process_time()
    t0 = time.monotonic()
    deadline = t0 + timeout
    sent = 0
    while sent < count:
        try:
            send(topic, value, key_of[sent])
        except BufferError:  # the local queue is full: let librdkafka drain it
            poll(0.001)
            if time.monotonic() > deadline:
                break
            continue
        sent += 1
        if not sent & 4095:
            poll(0)
            if time.monotonic() > deadline:
                break
    left = producer.flush(max(0.1, deadline - time.monotonic()))
    t1 = time.monotonic()
    _emit({"t0": t0, "t1": t1, "count": sent - left - errors[0], "errors": errors[0], "sent": sent,
           "undelivered": left, "cpu": time.process_time() - c0})


def keys(count: int) -> list[bytes]:
    """``count`` distinct 10-digit keys (``0000000000``, ``0000000001``, ...): both librdkafka's
    default partitioner (``consistent_random``: CRC-32 of the key) and Kafka's Java one (murmur2)
    spread them over every partition of a 1,000-partition topic (tests/unit/test_perf_scale.py
    checks both)."""
    return [b"%010d" % i for i in range(count)]


def consume(bootstrap: str, topic: str, partitions: int, count: int, timeout: float) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "shmq-suite",
                         **CONSUMER_CONF})
    consumer.list_topics(topic, timeout=10)
    _ready_then_wait()
    c0 = time.process_time()
    t0 = time.monotonic()
    deadline = t0 + timeout
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got = nbytes = 0
    t1 = t0
    c1 = c0
    while got < count and time.monotonic() < deadline:
        # consume() waits for the full count or the timeout: never ask for more than is left
        for m in consumer.consume(min(10000, count - got), 0.5):
            if m.error() is None:
                got += 1
                nbytes += len(m)
        t1 = time.monotonic()
        c1 = time.process_time()
    consumer.close()
    _emit({"t0": t0, "t1": t1, "count": got, "bytes": nbytes, "cpu": c1 - c0})


def paced(bootstrap: str, topic: str, rate: int, warmup_s: float, seconds: float, size: int,
          timeout: float) -> None:
    from confluent_kafka import Producer

    acks: list[float] = []
    errors = [0]

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            errors[0] += 1
        elif msg.value()[8] == 0:  # type: ignore[attr-defined]
            acks.append(msg.latency())  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": bootstrap, **CLIENT_CONF,
                         "on_delivery": delivered})
    producer.list_topics(topic, timeout=10)
    pad = b"p" * max(0, size - STAMP.size)
    _ready_then_wait()
    warm = int(rate * warmup_s)
    total = warm + int(rate * seconds)
    t0 = time.monotonic()
    deadline = t0 + timeout
    sent = 0
    while sent < total and time.monotonic() < deadline:
        due = min(total, int((time.monotonic() - t0) * rate) + 1)
        while sent < due:
            producer.produce(topic, STAMP.pack(time.monotonic_ns(), sent < warm) + pad)
            sent += 1
        producer.poll(0.001)  # serve delivery reports; sleeps up to 1 ms
    t1 = time.monotonic()
    left = producer.flush(max(0.1, deadline - time.monotonic()))
    _emit({"t0": t0, "t1": t1, "sent": sent, "measured": sent - warm, "errors": errors[0],
           "undelivered": left, "ack_ms": [a * 1e3 for a in acks]})


def receive(bootstrap: str, topic: str, partitions: int, count: int, timeout: float) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "shmq-suite-e2e",
                         **CONSUMER_CONF})
    consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    _ready_then_wait()
    t0 = time.monotonic()
    deadline = t0 + timeout
    e2e: list[float] = []
    while len(e2e) < count and time.monotonic() < deadline:
        # poll(), not consume(n, t): consume waits for n records or t, which would be latency
        m = consumer.poll(0.1)
        now = time.monotonic_ns()
        if m is not None and m.error() is None:
            stamp, warm = STAMP.unpack_from(m.value())
            if not warm:
                e2e.append((now - stamp) / 1e6)
    consumer.close()
    _emit({"t0": t0, "t1": time.monotonic(), "count": len(e2e), "e2e_ms": e2e})


def main(argv: list[str]) -> None:
    kind, bootstrap, topic, *rest = argv
    if kind == "produce":
        produce(bootstrap, topic, int(rest[0]), int(rest[1]), float(rest[2]),
                rest[3:4] == ["keyed"])
    elif kind == "consume":
        consume(bootstrap, topic, int(rest[0]), int(rest[1]), float(rest[2]))
    elif kind == "paced":
        paced(bootstrap, topic, int(rest[0]), float(rest[1]), float(rest[2]), int(rest[3]),
              float(rest[4]))
    elif kind == "receive":
        receive(bootstrap, topic, int(rest[0]), int(rest[1]), float(rest[2]))
    else:
        sys.exit(f"suite_load: unknown load {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
