"""The same records through every client the tests use, against any Kafka-compatible broker.

Writers (``WRITERS[name](bootstrap, topic, records, codec=..., idempotent=...)``) produce to
partition 0 and return each record's (partition, offset) from its delivery report; readers
(``READERS[name](bootstrap, topic, count)``) assign partition 0 from the beginning and return
``Got`` tuples.  Clients: confluent-kafka (librdkafka 2.16), kafka-python 3, aiokafka, Debian's
kcat (librdkafka 2.0.2) and Kafka's Java client (tests/integration/java/JavaClient.java, run
through tools/apache_kafka.py).  kcat sets neither timestamps nor per-record headers, so its
records carry the producer's clock and no headers.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import apache_kafka

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
KCAT = shutil.which("kcat") or shutil.which("kafkacat")
JAVA_SOURCE = Path(__file__).parent / "java" / "JavaClient.java"
DEADLINE_S = 60.0


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp: int = -1  # -1: the producer's clock


@dataclass(frozen=True)
class Got:
    partition: int
    offset: int
    rec: Rec
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime


def sample(n: int, base_ts: int, *, text_only: bool = False) -> list[Rec]:
    """n records that compress well, with some null keys or values (never both: kafka-python
    refuses that), empty values, headers (none, one, several, duplicate keys, an empty value)
    and explicit, distinct timestamps.
    ``text_only``: printable keys and values, no headers, no timestamps (what kcat can send)."""
    out = []
    for i in range(n):
        key = None if i % 11 == 3 else b"key-%d" % (i % 50)
        value = b"" if i % 17 == 5 else (b"record %05d of a compressible sample; " % i) * 4
        if text_only:
            out.append(Rec(key or b"key", value or b"v"))
            continue
        if i % 23 == 7 and key is not None:
            value = None
        if i % 7 == 0:
            headers: tuple[tuple[str, bytes | None], ...] = ()
        elif i % 5 == 0:
            headers = (("idx", b"%d" % i), ("dup", b"a"), ("dup", b"b"), ("empty", b""))
        else:
            headers = (("idx", b"%d" % i),)
        out.append(Rec(key, value, headers, base_ts + i))
    return out


# -- writers ------------------------------------------------------------------------------------


def write_confluent(bootstrap: str, topic: str, recs: Sequence[Rec], codec: str = "none",
                    idempotent: bool = True) -> list[tuple[int, int]]:
    from confluent_kafka import Producer

    reports: list = [None] * len(recs)

    def report(i: int) -> Callable:
        def cb(err: object, msg: object) -> None:
            assert err is None, err
            reports[i] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]
        return cb

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": codec,
                  "enable.idempotence": idempotent, "log_level": 0})
    for i, r in enumerate(recs):
        kw = {"timestamp": r.timestamp} if r.timestamp >= 0 else {}
        p.produce(topic, value=r.value, key=r.key, partition=0,
                  headers=list(r.headers) or None, on_delivery=report(i), **kw)
        p.poll(0)
    assert p.flush(DEADLINE_S) == 0
    return reports


def write_kafka_python(bootstrap: str, topic: str, recs: Sequence[Rec], codec: str = "none",
                       idempotent: bool = True) -> list[tuple[int, int]]:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=idempotent,
                      compression_type=None if codec == "none" else codec)
    try:
        futures = [p.send(topic, key=r.key, value=r.value, partition=0,
                          headers=list(r.headers),
                          timestamp_ms=r.timestamp if r.timestamp >= 0 else None)
                   for r in recs]
        p.flush(DEADLINE_S)
        return [(md.partition, md.offset) for md in (f.get(DEADLINE_S) for f in futures)]
    finally:
        p.close()


def write_aiokafka(bootstrap: str, topic: str, recs: Sequence[Rec], codec: str = "none",
                   idempotent: bool = True) -> list[tuple[int, int]]:
    async def run() -> list[tuple[int, int]]:
        from aiokafka import AIOKafkaProducer

        p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5,
                             enable_idempotence=idempotent,
                             compression_type=None if codec == "none" else codec)
        await p.start()
        try:
            futures = [await p.send(topic, key=r.key, value=r.value, partition=0,
                                    headers=list(r.headers),
                                    timestamp_ms=r.timestamp if r.timestamp >= 0 else None)
                       for r in recs]
            return [(md.partition, md.offset) for md in await asyncio.gather(*futures)]
        finally:
            await p.stop()

    return asyncio.run(run())


def write_kcat(bootstrap: str, topic: str, recs: Sequence[Rec], codec: str = "none",
               idempotent: bool = True) -> list[tuple[int, int]]:
    """kcat -P: key and value per line; no delivery offsets (kcat prints none)."""
    assert KCAT is not None, "kcat is not installed"
    lines = "".join(f"{(r.key or b'').decode()}\t{(r.value or b'').decode()}\n" for r in recs)
    args = [KCAT, "-b", bootstrap, "-P", "-t", topic, "-p", "0", "-K", "\t", "-z", codec,
            "-X", f"enable.idempotence={str(idempotent).lower()}", "-X", "linger.ms=5"]
    proc = subprocess.run(args, input=lines, capture_output=True, text=True, timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stderr
    return [(0, -1)] * len(recs)


def _hex(b: bytes | None) -> str:
    return "-" if b is None else b.hex()


def _unhex(s: str) -> bytes | None:
    return None if s == "-" else bytes.fromhex(s)


def java(*args: str, stdin: str | None = None, timeout: float = 120) -> str:
    """Run JavaClient (compiled once per content, cached) with Kafka's client on the classpath."""
    classes = apache_kafka.compile_java(JAVA_SOURCE)
    cmd = apache_kafka.java_command("JavaClient", args, extra_classpath=[classes],
                                    jvm_opts=list(apache_kafka.QUICK_TOOL_OPTS))
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"JavaClient {args[0]} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def write_java(bootstrap: str, topic: str, recs: Sequence[Rec], codec: str = "none",
               idempotent: bool = True) -> list[tuple[int, int]]:
    lines = "".join(
        f"0\t-1\t0\t{r.timestamp}\t{_hex(r.key)}\t{_hex(r.value)}\t"
        + ",".join(f"{k.encode().hex()}:{_hex(v)}" for k, v in r.headers) + "\n"
        for r in recs)
    out = java("produce", bootstrap, topic, f"compression.type={codec}",
               f"enable.idempotence={str(idempotent).lower()}", stdin=lines)
    return [(int(p), int(o)) for p, o in (line.split("\t") for line in out.splitlines())]


WRITERS: dict[str, Callable[..., list[tuple[int, int]]]] = {
    "confluent-kafka": write_confluent, "kafka-python": write_kafka_python,
    "aiokafka": write_aiokafka, "kcat": write_kcat, "java": write_java}


# -- readers ------------------------------------------------------------------------------------


def read_confluent(bootstrap: str, topic: str, count: int) -> list[Got]:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "shmq-read", "log_level": 0,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    got: list[Got] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + DEADLINE_S
        eof = False
        while time.monotonic() < deadline and not (eof and len(got) >= count):
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    eof = True
                    continue
                eof = False
                ts_type, ts = m.timestamp()
                got.append(Got(m.partition(), m.offset(), Rec(
                    m.key(), m.value(), tuple(m.headers() or ()), ts), ts_type - 1))
    finally:
        c.close()
    return got


def read_kafka_python(bootstrap: str, topic: str, count: int) -> list[Got]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    got: list[Got] = []
    try:
        c.assign([KTP(topic, 0)])
        c.seek(KTP(topic, 0), 0)
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < count and time.monotonic() < deadline:
            for tp, recs in c.poll(500, max_records=10_000).items():
                got += [Got(tp.partition, r.offset, Rec(r.key, r.value, tuple(r.headers or ()),
                                                        r.timestamp), r.timestamp_type)
                        for r in recs]
        for tp, recs in c.poll(300).items():  # anything beyond count
            got += [Got(tp.partition, r.offset, Rec(r.key, r.value), r.timestamp_type)
                    for r in recs]
    finally:
        c.close()
    return got


def read_aiokafka(bootstrap: str, topic: str, count: int) -> list[Got]:
    async def run() -> list[Got]:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition as ATP

        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await c.start()
        got: list[Got] = []
        try:
            c.assign([ATP(topic, 0)])
            c.seek(ATP(topic, 0), 0)
            deadline = time.monotonic() + DEADLINE_S
            while len(got) < count and time.monotonic() < deadline:
                for tp, recs in (await c.getmany(timeout_ms=500, max_records=10_000)).items():
                    got += [Got(tp.partition, r.offset, Rec(r.key, r.value,
                                                            tuple(r.headers or ()), r.timestamp),
                                r.timestamp_type) for r in recs]
        finally:
            await c.stop()
        return got

    return asyncio.run(run())


def read_kcat(bootstrap: str, topic: str, count: int) -> list[Got]:
    assert KCAT is not None, "kcat is not installed"
    proc = subprocess.run([KCAT, "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o",
                           "beginning", "-e", "-J"], capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stderr
    got = []
    for line in proc.stdout.splitlines():
        m = json.loads(line)
        headers = m.get("headers") or []
        got.append(Got(m["partition"], m["offset"], Rec(
            None if m["key"] is None else m["key"].encode(),
            None if m["payload"] is None else m["payload"].encode(),
            tuple((headers[i], None if headers[i + 1] is None else headers[i + 1].encode())
                  for i in range(0, len(headers), 2)), m["ts"]), m["tstype"] != "create"))
    return got


def read_java(bootstrap: str, topic: str, count: int) -> list[Got]:
    got = []
    for line in java("consume", bootstrap, topic, str(count)).splitlines():
        p, o, ts_type, ts, key, value, headers = line.split("\t")
        hs = tuple((bytes.fromhex(k).decode(), _unhex(v))
                   for k, v in (h.split(":", 1) for h in headers.split(",") if h))
        got.append(Got(int(p), int(o), Rec(_unhex(key), _unhex(value), hs, int(ts)),
                       int(ts_type)))
    return got


READERS: dict[str, Callable[[str, str, int], list[Got]]] = {
    "confluent-kafka": read_confluent, "kafka-python": read_kafka_python,
    "aiokafka": read_aiokafka, "kcat": read_kcat, "java": read_java}
