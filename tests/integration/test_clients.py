"""Real clients against a real ``shmq broker``: confluent-kafka (librdkafka 2.16), kafka-python
3.x, aiokafka and Debian's kcat (librdkafka 2.0.2).

Every produced message must come back with the same key, value, headers and timestamp, in order
per partition, at contiguous offsets.  One broker serves the whole module (startup is the slow
part); each test uses its own topics.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from shmq.protocol.records import iter_batches

BASE_TS = (int(time.time()) - 3600) * 1000  # an hour ago: recent, so retention never deletes it
DEADLINE_S = 60.0


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def kbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path_factory.mktemp("clients") / "data")
    try:
        yield b
    finally:
        code = b.stop()
        if b.proc.stdout is not None:
            b.proc.stdout.close()
        log = b.log_path.read_text()
        assert code == 0, log
        # a handler that crashed (connection dropped, client retried) leaves a traceback here
        assert "Traceback" not in log and " ERROR " not in log, log[-5000:]


@dataclass(frozen=True)
class Msg:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


def make_messages(n: int, partitions: int, *, seed: int = 1, null_headers: bool = True,
                  ts_step: int = 1) -> list[Msg]:
    """n messages over ``partitions`` partitions: varied keys (some null), values (some null,
    some empty, sizes up to ~1.5 KiB), headers (none, one, several, duplicates, null values) and
    explicit, distinct CreateTime timestamps."""
    rnd = random.Random(seed)
    blob = bytes(rnd.getrandbits(8) for _ in range(2048))
    out = []
    for i in range(n):
        key = None if i % 101 == 7 else b"key-%d" % i
        if i % 211 == 5:
            value = None
        elif i % 97 == 3:
            value = b""
        else:
            start = (i * 31) % 512
            value = b"value-%d-" % i + blob[start:start + (i * 7) % 1500]
        if i % 13 == 0:
            headers: tuple[tuple[str, bytes | None], ...] = ()
        elif i % 5 == 0:
            headers = (("idx", b"%d" % i), ("dup", b"a"), ("dup", b"b"),
                       ("null", None if null_headers else b""), ("utf8-h\u00e9", b"\x00\xff"))
        else:
            headers = (("idx", b"%d" % i),)
        out.append(Msg(i % partitions, key, value, headers, BASE_TS + i * ts_step))
    return out


def by_partition(msgs: Sequence[Msg]) -> dict[int, list[Msg]]:
    out: dict[int, list[Msg]] = {}
    for m in msgs:
        out.setdefault(m.partition, []).append(m)
    return out


def compare(expected: Sequence[Msg], got: dict[int, list[tuple[int, Msg]]]) -> None:
    """``got``: partition -> [(offset, message)] in consumption order.  Reports the first
    difference only (a 100,000-element diff would take pytest minutes)."""
    want = by_partition(expected)
    assert sorted(got) == sorted(want), f"partitions: got {sorted(got)}, want {sorted(want)}"
    for p, msgs in want.items():
        recv = got[p]
        offsets = [o for o, _ in recv]
        if offsets != list(range(len(msgs))):
            bad = next((i for i, o in enumerate(offsets) if o != i), len(offsets))
            pytest.fail(f"partition {p}: {len(offsets)} messages, want {len(msgs)}; offsets "
                        f"not contiguous from 0 at index {bad}: {offsets[max(bad - 2, 0):bad + 3]}")
        for i, (m, (_, r)) in enumerate(zip(msgs, recv, strict=True)):
            if m != r:
                pytest.fail(f"partition {p} offset {i}:\n got  {r}\n want {m}")


def create_topic(bootstrap: str, name: str, partitions: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, partitions, config=configs)], operation_timeout=30)
    fs[name].result(30)


def stored_batches(broker: RunningBroker, topic: str, partition: int) -> list[Any]:
    """Every batch of a partition, read from the segment files in the owning worker's dir."""
    dirs = list(broker.data_dir.glob(f"worker-*/{topic}-{partition}"))
    assert len(dirs) == 1, f"{topic}-{partition} in {dirs}"
    out = []
    for seg in sorted(dirs[0].glob("*.log")):
        data = seg.read_bytes()
        out.extend(iter_batches(data))
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of processes, from /proc/<pid>/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


# -- confluent-kafka ----------------------------------------------------------------------------


def confluent_produce(bootstrap: str, topic: str, msgs: Sequence[Msg], **conf: Any) -> list:
    """Produce with explicit partitions and timestamps; returns the delivery reports."""
    reports: list = []

    def on_delivery(err: Any, m: Any) -> None:
        reports.append((err, m.partition(), m.offset(), m.key()))

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    for m in msgs:
        while True:
            try:
                p.produce(topic, value=m.value, key=m.key, partition=m.partition,
                          timestamp=m.timestamp, headers=list(m.headers) or None,
                          on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
    remaining = p.flush(DEADLINE_S)
    assert remaining == 0, f"{remaining} messages not delivered"
    return reports


def confluent_consume(bootstrap: str, topic: str, partitions: Sequence[int], count: int,
                      **conf: Any) -> dict[int, list[tuple[int, Msg]]]:
    """assign() every partition from offset 0 and read ``count`` messages (then a little more,
    to notice extra messages)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "shmq-it-assign",
                  "enable.auto.commit": False, "enable.partition.eof": True, **conf})
    got: dict[int, list[tuple[int, Msg]]] = {p: [] for p in partitions}
    n = 0
    eof: set[int] = set()
    try:
        c.assign([TopicPartition(topic, p, 0) for p in partitions])
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and (n < count or len(eof) < len(partitions)):
            for m in c.consume(10_000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    pytest.fail(f"consumer error: {err}")
                eof.discard(m.partition())
                ts_type, ts = m.timestamp()
                assert ts_type == TIMESTAMP_CREATE_TIME, (m.partition(), m.offset(), ts_type)
                got[m.partition()].append((m.offset(), Msg(
                    m.partition(), m.key(), m.value(), tuple(m.headers() or ()), ts)))
                n += 1
    finally:
        c.close()
    assert n == count, f"consumed {n} messages, want {count}"
    return got


ACKS = [0, 1, "all"]
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
BIG = ("all", "none")  # the representative combination gets 100,000 messages


def assert_codec(batches: Sequence[Any], codec: str) -> None:
    """Most record bytes are stored compressed with ``codec`` (librdkafka sends a batch
    uncompressed when compression would not make it smaller, so small ones may be plain)."""
    want = CODEC_IDS[codec]
    sizes: dict[int, int] = {}
    for b in batches:
        sizes[b.compression_type] = sizes.get(b.compression_type, 0) + b.size
    assert set(sizes) <= {0, want}, sizes
    assert sizes.get(want, 0) > sum(sizes.values()) // 2, \
        f"stored batches by codec id (bytes): {sizes}, want mostly {want} ({codec})"


@pytest.mark.parametrize("compression", CODECS)
@pytest.mark.parametrize("acks", ACKS)
def test_confluent_produce_consume(kbroker: RunningBroker, acks: Any, compression: str) -> None:
    n = 100_000 if (acks, compression) == BIG else 10_000
    partitions = 4
    topic = f"ck-acks{acks}-{compression}"
    create_topic(kbroker.bootstrap, topic, partitions)
    msgs = make_messages(n, partitions, seed=zlib.crc32(topic.encode()))
    reports = confluent_produce(kbroker.bootstrap, topic, msgs, acks=str(acks),
                                **{"compression.type": compression})
    errors = [r for r in reports if r[0] is not None]
    assert not errors, errors[:5]
    if acks != 0:  # acks=0 has no response, hence no offsets: checked by consuming only
        delivered: dict[int, list[int]] = {}
        for _, p, off, _ in reports:
            delivered.setdefault(p, []).append(off)
        for p, offs in delivered.items():
            assert sorted(offs) == list(range(len(offs))), f"partition {p} delivery offsets"
    # librdkafka's default isolation.level is read_committed (LSO path)
    compare(msgs, confluent_consume(kbroker.bootstrap, topic, range(partitions), n))
    if (acks, compression) == BIG:
        compare(msgs, confluent_consume(kbroker.bootstrap, topic, range(partitions), n,
                                        **{"isolation.level": "read_uncommitted"}))
    # the broker keeps the batches as the client sent them: compressed with the codec asked for
    # (librdkafka sends a batch uncompressed when compressing does not make it smaller)
    for p in range(partitions):
        assert_codec(stored_batches(kbroker, topic, p), compression)


def test_confluent_admin(kbroker: RunningBroker) -> None:
    admin = AdminClient({"bootstrap.servers": kbroker.bootstrap})
    fs = admin.create_topics([NewTopic("adm-a", 3), NewTopic("adm-b", 1)], operation_timeout=30)
    for f in fs.values():
        assert f.result(30) is None
    md = admin.list_topics(timeout=30)
    assert len(md.topics["adm-a"].partitions) == 3
    assert len(md.topics["adm-b"].partitions) == 1
    assert md.topics["adm-a"].error is None
    brokers = {b.id: (b.host, b.port) for b in md.brokers.values()}
    workers = {w["node_id"]: w["port"] for w in kbroker.run_info["workers"]}
    assert brokers == {0: ("127.0.0.1", int(kbroker.bootstrap.rsplit(":", 1)[1])),
                       **{n: ("127.0.0.1", port) for n, port in workers.items()}}
    for p in md.topics["adm-a"].partitions.values():
        assert p.leader in workers and p.replicas == [p.leader] and p.isrs == [p.leader]

    # an existing topic, in a request together with a new one
    fs = admin.create_topics([NewTopic("adm-a", 2), NewTopic("adm-c", 2)], operation_timeout=30)
    with pytest.raises(KafkaException) as info:
        fs["adm-a"].result(30)
    assert info.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    assert fs["adm-c"].result(30) is None
    # illegal names: INVALID_TOPIC_EXCEPTION (17)
    for bad in ("bad/name", "a" * 250, "..", "sp ace"):
        fs = admin.create_topics([NewTopic(bad, 1)], operation_timeout=30)
        with pytest.raises(KafkaException) as info:
            fs[bad].result(30)
        assert info.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, bad
    md = admin.list_topics(timeout=30)
    assert {"adm-a", "adm-b", "adm-c"} <= set(md.topics)
    assert len(md.topics["adm-a"].partitions) == 3  # not changed by the failed create
    assert not {"bad/name", "..", "sp ace"} & set(md.topics)

    fs = admin.delete_topics(["adm-a", "adm-c"], operation_timeout=30)
    for f in fs.values():
        assert f.result(30) is None
    fs = admin.delete_topics(["adm-a"], operation_timeout=30)
    with pytest.raises(KafkaException) as info:
        fs["adm-a"].result(30)
    assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    md = admin.list_topics(timeout=30)
    assert "adm-a" not in md.topics and "adm-c" not in md.topics
    assert "adm-b" in md.topics
    assert not list(kbroker.data_dir.glob("worker-*/adm-a-*/*.log"))


def test_confluent_recreated_topic_starts_empty(kbroker: RunningBroker) -> None:
    topic = "recreate"
    create_topic(kbroker.bootstrap, topic, 2)
    msgs = make_messages(200, 2)
    confluent_produce(kbroker.bootstrap, topic, msgs, acks="all")
    admin = AdminClient({"bootstrap.servers": kbroker.bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
    create_topic(kbroker.bootstrap, topic, 2)
    msgs = make_messages(50, 2, seed=9)
    confluent_produce(kbroker.bootstrap, topic, msgs, acks="all")
    compare(msgs, confluent_consume(kbroker.bootstrap, topic, range(2), len(msgs)))


def test_fetch_from_offset_inside_compressed_batch(kbroker: RunningBroker) -> None:
    """A fetch offset in the middle of a batch: the broker returns the whole batch holding it,
    the client drops the records before the offset."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    topic = "mid-batch"
    create_topic(kbroker.bootstrap, topic, 1)
    msgs = make_messages(3000, 1, seed=5, null_headers=False)
    confluent_produce(kbroker.bootstrap, topic, msgs, acks=1, **{"compression.type": "zstd",
                                                                 "linger.ms": 50})
    batches = stored_batches(kbroker, topic, 0)
    inside = [b.base_offset + 1 for b in batches if b.records_count > 2]
    assert inside, "no multi-record batch"
    for start in (inside[0], inside[-1], 1, 2999):
        c = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "shmq-it-mid",
                      "enable.auto.commit": False})
        try:
            c.assign([TopicPartition(topic, 0, start)])
            got: list[Any] = []
            deadline = time.monotonic() + 30
            while len(got) < len(msgs) - start and time.monotonic() < deadline:
                got.extend(m for m in c.consume(5000, 0.5) if m.error() is None)
        finally:
            c.close()
        assert [m.offset() for m in got] == list(range(start, len(msgs))), start
        assert [(m.key(), m.value(), m.timestamp()[1]) for m in got] == \
            [(m.key, m.value, m.timestamp) for m in msgs[start:]]
        kc = KafkaConsumer(bootstrap_servers=kbroker.bootstrap, group_id=None,
                           enable_auto_commit=False)
        try:
            kc.assign([KTP(topic, 0)])
            kc.seek(KTP(topic, 0), start)
            recs: list[Any] = []
            deadline = time.monotonic() + 30
            while len(recs) < len(msgs) - start and time.monotonic() < deadline:
                for rs in kc.poll(500).values():
                    recs.extend(rs)
        finally:
            kc.close()
        assert [r.offset for r in recs] == list(range(start, len(msgs))), start
        assert [(r.key, r.value) for r in recs] == [(m.key, m.value) for m in msgs[start:]]


@pytest.mark.parametrize("reset,first", [("earliest", 0), ("latest", 100)])
def test_offset_out_of_range_resets(kbroker: RunningBroker, reset: str, first: int) -> None:
    """A fetch beyond the log end gets OFFSET_OUT_OF_RANGE; the client then resets by
    auto.offset.reset (ListOffsets earliest/latest) and consumes from there."""
    topic = f"oor-{reset}"
    create_topic(kbroker.bootstrap, topic, 1)
    msgs = make_messages(100, 1)
    confluent_produce(kbroker.bootstrap, topic, msgs, acks=1)
    c = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "shmq-it-oor",
                  "enable.auto.commit": False, "auto.offset.reset": reset})
    try:
        c.assign([TopicPartition(topic, 0, 5000)])
        got = None
        if reset == "latest":
            settle = time.monotonic() + 2
            while time.monotonic() < settle:  # let it reset to the end, then add one
                assert c.poll(0.2) is None
            confluent_produce(kbroker.bootstrap, topic, [Msg(0, b"late", b"x", (), BASE_TS)])
        deadline = time.monotonic() + 20
        while got is None and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None:
                assert m.error() is None, m.error()
                got = m
    finally:
        c.close()
    assert got is not None, "nothing consumed after the reset"
    assert got.offset() == first


def test_large_messages_and_kip74(kbroker: RunningBroker) -> None:
    """Messages near the 1 MB limit come back whole even with fetch limits far below their
    size (KIP-74: the first batch is returned whole)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    topic = "large"
    create_topic(kbroker.bootstrap, topic, 1)
    rnd = random.Random(3)
    msgs = [Msg(0, b"k%d" % i, rnd.randbytes(size), (("n", b"%d" % i),), BASE_TS + i)
            for i, size in enumerate([900_000, 10, 950_000, 500_000, 1, 990_000])]
    confluent_produce(kbroker.bootstrap, topic, msgs, acks="all")
    got = confluent_consume(kbroker.bootstrap, topic, [0], len(msgs),
                            **{"fetch.max.bytes": 100_000, "message.max.bytes": 100_000,
                               "max.partition.fetch.bytes": 100_000,
                               "receive.message.max.bytes": 2_000_000})
    compare(msgs, got)
    kc = KafkaConsumer(bootstrap_servers=kbroker.bootstrap, group_id=None,
                       enable_auto_commit=False, max_partition_fetch_bytes=50_000,
                       fetch_max_bytes=50_000)
    try:
        kc.assign([KTP(topic, 0)])
        kc.seek(KTP(topic, 0), 0)
        recs: list[Any] = []
        deadline = time.monotonic() + 30
        while len(recs) < len(msgs) and time.monotonic() < deadline:
            for rs in kc.poll(500).values():
                recs.extend(rs)
    finally:
        kc.close()
    assert [(r.offset, r.key, r.value) for r in recs] == \
        [(i, m.key, m.value) for i, m in enumerate(msgs)]


def test_message_too_large_is_refused(kbroker: RunningBroker) -> None:
    """A batch over message.max.bytes (1048588) gets MESSAGE_TOO_LARGE, nothing is stored."""
    topic = "too-large"
    create_topic(kbroker.bootstrap, topic, 1)
    reports = confluent_produce(kbroker.bootstrap, topic,
                                [Msg(0, b"big", os.urandom(1_200_000), (), BASE_TS)],
                                acks="all", **{"message.max.bytes": 5_000_000,
                                               "compression.type": "none"})
    assert len(reports) == 1 and reports[0][0] is not None
    assert reports[0][0].code() == KafkaError.MSG_SIZE_TOO_LARGE, reports[0][0]
    c = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "shmq-it-tl",
                  "enable.auto.commit": False})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30,
                                       cached=False) == (0, 0)
    finally:
        c.close()


# -- ListOffsets -------------------------------------------------------------------------------


def test_list_offsets_confluent(kbroker: RunningBroker) -> None:
    topic = "lo-confluent"
    create_topic(kbroker.bootstrap, topic, 2)
    msgs = make_messages(2000, 2, ts_step=10)  # timestamps BASE_TS + 10 * i, i % 2 = partition
    confluent_produce(kbroker.bootstrap, topic, msgs, acks="all")
    for isolation in ("read_committed", "read_uncommitted"):
        c = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "shmq-it-lo",
                      "enable.auto.commit": False, "isolation.level": isolation})
        try:
            for p in range(2):
                assert c.get_watermark_offsets(TopicPartition(topic, p), timeout=30,
                                               cached=False) == (0, 1000), (isolation, p)
        finally:
            c.close()
    # one query per partition per request (Kafka refuses duplicate partitions in ListOffsets)
    parts = by_partition(msgs)
    ts = {p: [m.timestamp for m in parts[p]] for p in range(2)}
    cases = [(ts[0][i], ts[1][j], i, j) for i, j in ((0, 999), (1, 500), (17, 17), (999, 0))]
    cases += [(ts[0][i] - 5, ts[1][j] - 5, i, j) for i, j in ((0, 1), (500, 999))]  # between
    cases.append((BASE_TS - 10**6, ts[1][-1] + 1, 0, -1))  # before all: first; after all: -1
    c = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "shmq-it-lo",
                  "enable.auto.commit": False})
    try:
        for t0, t1, want0, want1 in cases:
            got = c.offsets_for_times([TopicPartition(topic, 0, t0), TopicPartition(topic, 1, t1)],
                                      timeout=30)
            assert all(t.error is None for t in got), got
            assert [(t.partition, t.offset) for t in got] == [(0, want0), (1, want1)], (t0, t1)
    finally:
        c.close()


def test_list_offsets_by_time_within_batch_unordered(kbroker: RunningBroker) -> None:
    """Kafka answers a timestamp query with the first *record* whose timestamp is >= the target,
    even when timestamps are not monotonic inside a batch or across batches."""
    topic = "lo-unordered"
    create_topic(kbroker.bootstrap, topic, 1)
    stamps = [500, 300, 700, 100, 900, 800]
    asyncio.run(_aiokafka_send_batches(kbroker.bootstrap, topic, [
        [(b"k%d" % i, b"v", BASE_TS + s) for i, s in enumerate(stamps[:3])],
        [(b"k%d" % i, b"v", BASE_TS + s) for i, s in enumerate(stamps[3:], 3)]]))
    batches = stored_batches(kbroker, topic, 0)
    assert [(b.base_offset, b.records_count) for b in batches] == [(0, 3), (3, 3)]
    c = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "shmq-it-lo2",
                  "enable.auto.commit": False})
    try:
        cases = {250: 0, 500: 0, 501: 2, 700: 2, 701: 4, 850: 4, 900: 4, 901: -1, 50: 0}
        got = {t: c.offsets_for_times([TopicPartition(topic, 0, BASE_TS + t)], timeout=30)[0]
               for t in cases}
        assert {t: g.offset for t, g in got.items()} == cases
    finally:
        c.close()


async def _aiokafka_send_batches(bootstrap: str, topic: str,
                                 batches: Sequence[Sequence[tuple[bytes, bytes, int]]]) -> None:
    """Each inner list becomes exactly one record batch on partition 0."""
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await p.start()
    try:
        for items in batches:
            batch = p.create_batch()
            for key, value, ts in items:
                assert batch.append(key=key, value=value, timestamp=ts) is not None
            batch.close()
            await (await p.send_batch(batch, topic, partition=0))
    finally:
        await p.stop()


def test_list_offsets_kafka_python(kbroker: RunningBroker) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    topic = "lo-kpy"
    create_topic(kbroker.bootstrap, topic, 2)
    msgs = make_messages(600, 2, ts_step=10)
    confluent_produce(kbroker.bootstrap, topic, msgs, acks="all")
    c = KafkaConsumer(bootstrap_servers=kbroker.bootstrap, group_id=None,
                      enable_auto_commit=False)
    try:
        tps = [KTP(topic, p) for p in range(2)]
        assert c.beginning_offsets(tps) == {tp: 0 for tp in tps}
        assert c.end_offsets(tps) == {tp: 300 for tp in tps}
        parts = by_partition(msgs)
        found = c.offsets_for_times({KTP(topic, 1): parts[1][123].timestamp - 1,
                                     KTP(topic, 0): parts[0][299].timestamp})
        assert found[KTP(topic, 1)].offset == 123
        assert found[KTP(topic, 1)].timestamp == parts[1][123].timestamp
        assert found[KTP(topic, 0)].offset == 299
        assert found[KTP(topic, 0)].timestamp == parts[0][299].timestamp
        none = c.offsets_for_times({KTP(topic, 0): parts[0][-1].timestamp + 1})
        assert none[KTP(topic, 0)] is None
    finally:
        c.close()


# -- long poll ----------------------------------------------------------------------------------


def test_long_poll_idle_consumer_does_not_spin(kbroker: RunningBroker) -> None:
    topic = "longpoll-idle"
    create_topic(kbroker.bootstrap, topic, 2)  # one partition on each worker
    leaders = {p.leader for p in AdminClient({"bootstrap.servers": kbroker.bootstrap})
               .list_topics(topic, timeout=30).topics[topic].partitions.values()}
    assert leaders == {1, 2}
    pids = list(kbroker.worker_pids().values())
    c = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "shmq-it-lp",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(2)])
        deadline = time.monotonic() + 1.5   # connect, list offsets, first fetches
        while time.monotonic() < deadline:
            assert c.poll(0.1) is None
        before = cpu_seconds(pids)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            assert m is None or m.error() is None, m.error()
            assert m is None, "an empty topic returned a message"
        used = cpu_seconds(pids) - before
    finally:
        c.close()
    # librdkafka re-fetches at once after an empty response: a broker that does not hold the
    # fetch for fetch.wait.max.ms (500 ms) burns close to a core here
    assert used < 0.3, f"workers used {used:.2f} CPU-seconds in 3 s of idle fetching"


def test_long_poll_wakes_on_produce(kbroker: RunningBroker) -> None:
    topic = "longpoll-wake"
    create_topic(kbroker.bootstrap, topic, 1)
    # the fetch waits up to 5 s: only a wake-up on append makes delivery prompt
    c = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "shmq-it-lpw",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 5000})
    p = Producer({"bootstrap.servers": kbroker.bootstrap, "linger.ms": 0, "acks": 1})
    try:
        p.produce(topic, b"warm-up", partition=0)
        assert p.flush(30) == 0
        c.assign([TopicPartition(topic, 0, 1)])
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert c.poll(0.1) is None
        latencies = []
        for i in range(3):
            sent = time.monotonic()
            p.produce(topic, b"m%d" % i, partition=0)
            p.poll(0)
            while time.monotonic() - sent < 10:
                m = c.poll(0.01)
                if m is not None:
                    assert m.error() is None, m.error()
                    assert m.value() == b"m%d" % i and m.offset() == i + 1
                    break
            latencies.append(time.monotonic() - sent)
            p.flush(30)
            time.sleep(1.0)  # let the next fetch park at the broker
    finally:
        c.close()
        p.flush(30)
    assert max(latencies) < 0.5, f"latencies {latencies}"


# -- kafka-python ---------------------------------------------------------------------------------


def kafka_python_consume(bootstrap: str, topic: str, partitions: int, count: int,
                         isolation: str = "read_uncommitted"
                         ) -> dict[int, list[tuple[int, Msg]]]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      isolation_level=isolation)
    got: dict[int, list[tuple[int, Msg]]] = {p: [] for p in range(partitions)}
    n = 0
    try:
        c.assign([KTP(topic, p) for p in range(partitions)])
        for p in range(partitions):
            c.seek(KTP(topic, p), 0)
        deadline = time.monotonic() + DEADLINE_S
        while n < count and time.monotonic() < deadline:
            for tp, recs in c.poll(500, max_records=10_000).items():
                for r in recs:
                    assert r.timestamp_type == 0, r
                    got[tp.partition].append((r.offset, Msg(
                        tp.partition, r.key, r.value, tuple(r.headers or ()), r.timestamp)))
                    n += 1
        assert n == count, f"consumed {n}, want {count}"
        extra = c.poll(500)
        assert not extra, f"extra messages: {extra}"
    finally:
        c.close()
    return got


@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_kafka_python_idempotent(kbroker: RunningBroker, compression: str | None) -> None:
    from kafka import KafkaProducer

    topic = f"kpy-{compression}"
    partitions, n = 3, 6000
    create_topic(kbroker.bootstrap, topic, partitions)
    msgs = make_messages(n, partitions, seed=7, null_headers=False)
    p = KafkaProducer(bootstrap_servers=kbroker.bootstrap, compression_type=compression,
                      linger_ms=5)
    try:
        assert p.config["enable_idempotence"] is True  # kafka-python 3.x default
        futures = [p.send(topic, key=m.key, value=m.value, partition=m.partition,
                          timestamp_ms=m.timestamp, headers=list(m.headers))
                   for m in msgs]
        p.flush(DEADLINE_S)
        meta = [f.get(DEADLINE_S) for f in futures]
    finally:
        p.close()
    parts = by_partition(msgs)
    for part in range(partitions):
        offs = [md.offset for md in meta if md.partition == part]
        assert offs == list(range(len(parts[part])))
    compare(msgs, kafka_python_consume(kbroker.bootstrap, topic, partitions, n))
    if compression == "zstd":
        compare(msgs, kafka_python_consume(kbroker.bootstrap, topic, partitions, n,
                                           isolation="read_committed"))

    # the producer used InitProducerId: every stored batch has its producer id, epoch 0, and
    # sequence numbers that continue batch after batch from 0
    pids = set()
    for part in range(partitions):
        batches = stored_batches(kbroker, topic, part)
        assert batches
        seq = 0
        offset = 0
        for b in batches:
            assert b.producer_id >= 0 and b.producer_epoch >= 0, b
            assert b.base_sequence == seq, (part, b.base_offset, b.base_sequence, seq)
            assert b.base_offset == offset
            seq += b.records_count
            offset += b.records_count
            pids.add((b.producer_id, b.producer_epoch))
        assert seq == len(parts[part])
    assert len(pids) == 1, pids


# -- aiokafka ---------------------------------------------------------------------------------------


async def _aiokafka_roundtrip(bootstrap: str, topic: str, msgs: Sequence[Msg], partitions: int,
                              idempotent: bool, compression: str | None
                              ) -> dict[int, list[tuple[int, Msg]]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATP

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=idempotent,
                         compression_type=compression, linger_ms=5)
    await p.start()
    try:
        futures = [await p.send(topic, key=m.key, value=m.value, partition=m.partition,
                                timestamp_ms=m.timestamp, headers=list(m.headers))
                   for m in msgs]
        meta = await asyncio.gather(*futures)
    finally:
        await p.stop()
    for part in range(partitions):
        offs = [md.offset for md in meta if md.partition == part]
        assert offs == list(range(len(offs))), part
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         isolation_level="read_committed" if idempotent else "read_uncommitted")
    await c.start()
    got: dict[int, list[tuple[int, Msg]]] = {q: [] for q in range(partitions)}
    n = 0
    try:
        c.assign([ATP(topic, q) for q in range(partitions)])
        for q in range(partitions):
            c.seek(ATP(topic, q), 0)
        deadline = time.monotonic() + DEADLINE_S
        while n < len(msgs) and time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=500, max_records=10_000)
            for tp, recs in batch.items():
                for r in recs:
                    assert r.timestamp_type == 0, r
                    got[tp.partition].append((r.offset, Msg(
                        tp.partition, r.key, r.value, tuple(r.headers or ()), r.timestamp)))
                    n += 1
        extra = await c.getmany(timeout_ms=300)
        assert not any(extra.values()), extra
    finally:
        await c.stop()
    return got


@pytest.mark.parametrize("idempotent,compression", [(False, None), (True, None), (True, "lz4"),
                                                    (False, "snappy")])
def test_aiokafka(kbroker: RunningBroker, idempotent: bool, compression: str | None) -> None:
    topic = f"aio-{idempotent}-{compression}"
    partitions, n = 2, 4000
    create_topic(kbroker.bootstrap, topic, partitions)
    msgs = make_messages(n, partitions, seed=11, null_headers=False)
    got = asyncio.run(_aiokafka_roundtrip(kbroker.bootstrap, topic, msgs, partitions,
                                          idempotent, compression))
    compare(msgs, got)
    for part in range(partitions):
        batches = stored_batches(kbroker, topic, part)
        if idempotent:
            assert all(b.producer_id >= 0 and b.base_sequence >= 0 for b in batches)
        else:
            assert all(b.producer_id == -1 for b in batches)


# -- kcat (librdkafka 2.0.2) ------------------------------------------------------------------------

KCAT = shutil.which("kcat")
# installed by `make setup`: skipped without it, except in CI, where that is a failure
needs_kcat = pytest.mark.skipif(KCAT is None and not os.environ.get("CI"),
                                reason="kcat is not installed")


def kcat(broker: RunningBroker, *args: str, stdin: str | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess:
    assert KCAT is not None, "kcat (Debian package kcat) is not installed: `make setup` installs it"
    proc = subprocess.run([KCAT, "-b", broker.bootstrap, *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (args, proc.returncode, proc.stderr)
    return proc


@needs_kcat
def test_kcat_metadata(kbroker: RunningBroker) -> None:
    create_topic(kbroker.bootstrap, "kcat-meta", 3)
    data = json.loads(kcat(kbroker, "-L", "-J").stdout)
    workers = {w["node_id"]: w["port"] for w in kbroker.run_info["workers"]}
    brokers = {b["id"]: b["name"] for b in data["brokers"]}
    assert brokers == {0: kbroker.bootstrap,
                       **{n: f"127.0.0.1:{port}" for n, port in workers.items()}}
    topics = {t["topic"]: t for t in data["topics"]}
    t = topics["kcat-meta"]
    assert "error" not in t or not t["error"]
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2]
    assert all(p["leader"] in workers for p in t["partitions"])
    text = kcat(kbroker, "-L").stdout
    assert f"{len(workers) + 1} brokers:" in text
    assert f"broker 0 at {kbroker.bootstrap} (controller)" in text
    assert 'topic "kcat-meta" with 3 partitions:' in text
    one = kcat(kbroker, "-L", "-t", "kcat-meta").stdout
    assert 'topic "kcat-meta" with 3 partitions:' in one and "1 topics:" in one


@needs_kcat
def test_kcat_produce_consume(kbroker: RunningBroker) -> None:
    topic = "kcat-pc"
    create_topic(kbroker.bootstrap, topic, 2)
    lines = [f"key{i}:value {i} \u00e9" for i in range(50)]
    kcat(kbroker, "-P", "-t", topic, "-p", "1", "-K:", "-H", "hk=hv", "-H", "h2=",
         stdin="\n".join(lines) + "\n")
    fmt = "%p|%o|%k|%s|%h\\n"
    out = kcat(kbroker, "-C", "-t", topic, "-p", "1", "-o", "beginning", "-e", "-f", fmt).stdout
    want = [f"1|{i}|key{i}|value {i} \u00e9|hk=hv,h2=" for i in range(50)]
    assert out.splitlines() == want
    # every partition when -p is not given; partition 0 is empty
    out = kcat(kbroker, "-C", "-t", topic, "-o", "beginning", "-e", "-f", fmt).stdout
    assert out.splitlines() == want
    assert kcat(kbroker, "-C", "-t", topic, "-p", "1", "-o", "end", "-e", "-f", fmt).stdout == ""
    out = kcat(kbroker, "-C", "-t", topic, "-p", "1", "-o", "37", "-e", "-f", fmt).stdout
    assert out.splitlines() == want[37:]
    # relative to the end (ListOffsets latest, then seek)
    out = kcat(kbroker, "-C", "-t", topic, "-p", "1", "-o", "-3", "-e", "-f", fmt).stdout
    assert out.splitlines() == want[-3:]
    # -c: message count
    out = kcat(kbroker, "-C", "-t", topic, "-p", "1", "-o", "10", "-c", "5", "-f", fmt).stdout
    assert out.splitlines() == want[10:15]
    # no -p: the partitioner picks (one partition here), key and value split at ':'
    kcat(kbroker, "-P", "-t", "kcat-plain", "-K:", stdin="a:1\nb:2\n:3\nd:\n")
    out = kcat(kbroker, "-C", "-t", "kcat-plain", "-o", "beginning", "-e",
               "-f", "%o|%k|%s|%K|%S\\n").stdout
    assert out.splitlines() == ["0|a|1|1|1", "1|b|2|1|1", "2||3|0|1", "3|d||1|0"]


@needs_kcat
def test_kcat_timestamps_and_offset_by_time(kbroker: RunningBroker) -> None:
    topic = "kcat-ts"
    create_topic(kbroker.bootstrap, topic, 1)
    msgs = make_messages(40, 1, ts_step=1000)
    confluent_produce(kbroker.bootstrap, topic, msgs, acks="all")
    out = kcat(kbroker, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
               "-f", "%o %T %K\\n").stdout.splitlines()
    want = [f"{i} {m.timestamp} {len(m.key) if m.key is not None else -1}"
            for i, m in enumerate(msgs)]
    assert out == want
    # -o s@<ts>: ListOffsets by timestamp
    out = kcat(kbroker, "-C", "-t", topic, "-p", "0", "-o", f"s@{msgs[25].timestamp - 500}",
               "-e", "-f", "%o\\n").stdout.split()
    assert out == [str(i) for i in range(25, 40)]


@needs_kcat
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_kcat_compression(kbroker: RunningBroker, codec: str) -> None:
    """librdkafka 2.0.2 only compresses if the broker advertises Produce v0 (KAFKA-18659)."""
    topic = f"kcat-z-{codec}"
    create_topic(kbroker.bootstrap, topic, 1)
    lines = [f"k{i}:{'abc' * (i % 50)}{i}" for i in range(300)]
    kcat(kbroker, "-P", "-t", topic, "-p", "0", "-K:", "-z", codec, stdin="\n".join(lines) + "\n")
    assert_codec(stored_batches(kbroker, topic, 0), codec)
    out = kcat(kbroker, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
               "-f", "%k:%s\\n").stdout
    assert out.splitlines() == lines
