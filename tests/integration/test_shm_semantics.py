"""Produce and Fetch semantics over the shared-memory path are those of the Kafka wire path.

Every case is played twice against one live broker: over TCP (raw Produce / Fetch requests built
with kafka-python's protocol classes) into topic ``<name>-tcp``, and over the rings
(``LocalBroker.send_encoded`` / ``read``) into the identically configured ``<name>-ring``.  The
batches are built by kafka-python's ``DefaultRecordBatchBuilder`` (an independent encoder), so
both paths get the same bytes; the answers (error code, base offset, log start offset, whether a
log-append time came back) must be equal, case by case.  Fetch parity reads one log both ways
and compares the records decoded by kafka-python with the ring reader's.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from _broker import RunningBroker, start_broker
from _shm_util import Wire, build_batch, decode_records
from confluent_kafka.admin import AdminClient, NewTopic

from shmq import _fast as fast
from shmq.errors import OffsetOutOfRangeError
from shmq.ipc.client import LocalBroker, attach

MAX_MESSAGE = 10000


@pytest.fixture(scope="module")
def shm_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path_factory.mktemp("shm") / "data")
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        topics = []
        for side in ("tcp", "ring"):
            topics.append(NewTopic(f"sem-{side}", 2, 1,
                                   config={"max.message.bytes": str(MAX_MESSAGE)}))
            topics.append(NewTopic(f"lat-{side}", 1, 1,
                                   config={"message.timestamp.type": "LogAppendTime"}))
        for f in admin.create_topics(topics).values():
            f.result(30)
        yield b
    finally:
        assert b.stop() == 0, b.log_path.read_text()


def _relabel(batch: bytes, **fields: int) -> bytes:
    """Rewrite header fields (after the CRC) and recompute the CRC."""
    buf = bytearray(batch)
    offsets = {"attributes": (21, ">h"), "last_offset_delta": (23, ">i"), "magic": (16, ">b")}
    for name, value in fields.items():
        at, fmt = offsets[name]
        struct.pack_into(fmt, buf, at, value)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


class TcpSide:
    def __init__(self, broker: RunningBroker) -> None:
        self.broker = broker
        self.conns: dict[int, Wire] = {}
        any_port = next(iter(broker.run_info["workers"]))["port"]
        self.meta = Wire(any_port)

    def _conn(self, topic: str, partition: int) -> Wire:
        try:
            port = self.meta.leaders(topic)[partition]
        except (KeyError, IndexError, AttributeError):
            port = next(iter(self.broker.run_info["workers"]))["port"]
        if port not in self.conns:
            self.conns[port] = Wire(port)
        return self.conns[port]

    def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1):
        r = self._conn(topic, partition).produce(topic, partition, batch, acks)
        if r is None:
            return None
        return (r.error_code, r.base_offset, r.log_append_time_ms != -1, r.log_start_offset)

    def init_producer_id(self) -> tuple[int, int]:
        return self.meta.init_producer_id()

    def close(self) -> None:
        for c in [self.meta, *self.conns.values()]:
            c.close()


class RingSide:
    def __init__(self, broker: RunningBroker) -> None:
        self.local: LocalBroker = attach(broker.data_dir)

    def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1):
        f = self.local.send_encoded(topic, partition, batch, acks=acks)
        if acks == 0:
            self.local.flush(10)
            return None
        self.local.flush(10)
        r = f.value
        assert r is not None
        return (r.error_code, r.base_offset, r.log_append_time != -1, r.log_start_offset)

    def init_producer_id(self) -> tuple[int, int]:
        session = self.local._session(1)
        reply = session.request({"op": "init_producer_id"}, 10)
        return reply["producer_id"], reply["producer_epoch"]

    def close(self) -> None:
        self.local.close()


def _play(side, suffix: str) -> list:
    """The case list; returns one answer per case, in order."""
    t, lat = f"sem-{suffix}", f"lat-{suffix}"
    good = build_batch([b"a", b"b", b"c"])
    out = []

    def case(name: str, *args, **kw) -> None:
        out.append((name, side.produce(*args, **kw)))

    case("good", t, 0, good)
    bad_crc = bytearray(good)
    bad_crc[-2] ^= 0x40
    case("bad crc", t, 0, bytes(bad_crc))
    case("too large", t, 0, build_batch([b"x" * (MAX_MESSAGE + 50)]))
    case("two batches", t, 0, good + good)
    case("empty", t, 0, b"")
    case("short", t, 0, good[:40])
    case("magic 1", t, 0, _relabel(good, magic=1))
    case("control batch", t, 0, _relabel(good, attributes=0x20))
    case("delta mismatch", t, 0, _relabel(good, last_offset_delta=7))
    case("lz4", t, 0, build_batch([b"lz4-%d" % i for i in range(20)], compression=3))
    case("keys and headers", t, 0, build_batch([b"v"], key=b"k", headers=[("h", b"x")]))
    case("unknown partition", t, 9, good)
    case("unknown topic", f"nope-{suffix}", 0, good)
    case("internal topic", "__consumer_offsets", 0, good)
    pid, epoch = side.init_producer_id()
    first = build_batch([b"i0", b"i1"], pid=pid, epoch=epoch, seq=0)
    case("idempotent", t, 1, first)
    case("duplicate", t, 1, first)
    case("next sequence", t, 1, build_batch([b"i2"], pid=pid, epoch=epoch, seq=2))
    case("sequence gap", t, 1, build_batch([b"i9"], pid=pid, epoch=epoch, seq=9))
    case("old epoch", t, 1, build_batch([b"e"], pid=pid, epoch=epoch - 1 if epoch else 5,
                                        seq=3))
    case("unknown producer", t, 1, build_batch([b"u"], pid=pid + 1000, epoch=0, seq=5))
    case("acks=0", t, 0, good, acks=0)
    case("acks=1", t, 0, good, acks=1)
    case("after acks=0", t, 0, good, acks=-1)
    case("log append time", lat, 0, good)
    return out


@pytest.fixture(scope="module")
def played(shm_broker: RunningBroker) -> tuple[list, list]:
    """Every case over both paths, once per module (the Fetch test reads what they wrote)."""
    tcp, ring = TcpSide(shm_broker), RingSide(shm_broker)
    try:
        return _play(tcp, "tcp"), _play(ring, "ring")
    finally:
        tcp.close()
        ring.close()


def test_produce_answers_are_the_same_over_tcp_and_rings(played: tuple[list, list]) -> None:
    over_tcp, over_ring = played
    assert [n for n, _ in over_tcp] == [n for n, _ in over_ring]
    mismatched = [(n, a, b) for (n, a), (_, b) in zip(over_tcp, over_ring, strict=True)
                  if a != b]
    assert not mismatched, mismatched
    answers = dict(over_ring)
    # the answers themselves are Kafka's (not merely equal)
    assert answers["good"] == (0, 0, False, 0)
    assert answers["bad crc"][0] == 2 and answers["too large"][0] == 10
    assert answers["two batches"][0] == 87 and answers["empty"][0] == 87
    assert answers["unknown partition"][0] == 3 and answers["unknown topic"][0] == 3
    assert answers["internal topic"][0] == 17
    # a duplicate gets the original's offset, and the original batch's timestamp as its log
    # append time on every topic (Kafka's UnifiedLog.append for a duplicate)
    assert answers["idempotent"] == (0, 0, False, 0)
    assert answers["duplicate"] == (0, 0, True, 0)
    assert answers["sequence gap"][0] == 45
    assert answers["log append time"] == (0, 0, True, 0)
    # acks=0 got no answer but its batch is there: the next two batches come 3 offsets later each
    assert answers["acks=1"][1] == answers["keys and headers"][1] + 1 + 3
    assert answers["after acks=0"][1] == answers["acks=1"][1] + 3


def _fetch_all(wire: Wire, topic: str, partition: int) -> list[tuple]:
    got, offset = [], 0
    while True:
        p = wire.fetch(topic, partition, offset)
        assert p.error_code == 0, p
        recs = [r for r in decode_records(p.records) if r[0] >= offset]
        if not recs:
            return got
        got += recs
        offset = recs[-1][0] + 1


def _read_all(local: LocalBroker, topic: str, partition: int) -> list[tuple]:
    got, offset = [], 0
    while True:
        r = local.read(topic, partition, offset, 7)  # small reads: cursors and batch splits
        if not len(r):
            return got
        got += [(x.offset, x.timestamp, x.key, x.value, x.headers) for x in r.records()]
        offset = r.next_offset


def test_fetch_and_ring_reads_return_the_same_records(shm_broker: RunningBroker,
                                                       played: tuple[list, list]) -> None:
    local = attach(shm_broker.data_dir)
    leader = Wire(next(iter(shm_broker.run_info["workers"]))["port"])
    try:
        for topic in ("sem-tcp", "sem-ring"):
            for partition in (0, 1):
                port = leader.leaders(topic)[partition]
                wire = Wire(port)
                try:
                    over_tcp = _fetch_all(wire, topic, partition)
                    hw = wire.fetch(topic, partition, 0).high_watermark
                    beyond = wire.fetch(topic, partition, hw + 1).error_code
                finally:
                    wire.close()
                over_ring = _read_all(local, topic, partition)
                assert over_tcp, (topic, partition)
                assert over_ring == over_tcp, (topic, partition)
                assert [r[0] for r in over_ring] == list(range(len(over_ring)))
                assert beyond == 1  # OFFSET_OUT_OF_RANGE, and the reader says the same
                with pytest.raises(OffsetOutOfRangeError):
                    local.read(topic, partition, hw + 1)
                assert not len(local.read(topic, partition, hw))  # at the HW: nothing, no error
        # the Arrow form holds the same records
        batch, _ = local.read_arrow("sem-tcp", 0, 0, 10_000, include_headers=True)
        rows = batch.to_pylist()
        expected = _read_all(local, "sem-tcp", 0)
        assert [(r["offset"], r["key"], r["value"]) for r in rows] == [
            (e[0], e[2], e[3]) for e in expected]
        assert all(r["topic"] == "sem-tcp" and r["partition"] == 0 for r in rows)
        assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [e[1] for e in expected]
        assert [r["headers"] for r in rows] == [
            [{"key": k, "value": v} for k, v in e[4]] if e[4] else None for e in expected]
    finally:
        leader.close()
        local.close()


def test_a_waiting_reader_wakes_within_milliseconds(shm_broker: RunningBroker) -> None:
    """A read with a timeout sleeps on the state table's futex and returns as soon as the
    produce publishes the new high watermark."""
    import threading

    local, writer = attach(shm_broker.data_dir), attach(shm_broker.data_dir)
    try:
        writer.send_batch("sem-ring", 0, [b"warm-up"], acks=1).result(5)
        hw = local.reader("sem-ring", 0).state().high_watermark
        lags = []
        for i in range(20):
            sent: list[float] = []

            def produce(i: int = i, sent: list[float] = sent) -> None:
                time.sleep(0.01)
                sent.append(time.monotonic())
                writer.send_batch("sem-ring", 0, [b"wake-%d" % i], acks=1)

            th = threading.Thread(target=produce)
            th.start()
            got = local.read("sem-ring", 0, hw, 10, timeout=5)
            woke = time.monotonic()
            th.join()
            writer.flush(5)
            assert len(got) == 1 and got.records()[0].value == b"wake-%d" % i
            lags.append(woke - sent[0])
            hw += 1
        lags.sort()
        assert lags[len(lags) // 2] < 0.005, lags  # median (shared 2-core machine: generous)
        t0 = time.monotonic()
        assert not len(local.read("sem-ring", 0, hw, 10, timeout=0.2))
        assert 0.19 <= time.monotonic() - t0 < 1.0
    finally:
        writer.close()
        local.close()


def test_reader_follows_rolls_and_deletions(tmp_path: Path) -> None:
    """Small segments: a reader walks across many rolls; DeleteRecords moves the log start and
    the reader then refuses offsets below it, as Fetch does."""
    b = start_broker(tmp_path / "data", "--override", "log.segment.bytes=4096")
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("roll", 1, 1)])["roll"].result(30)
        local = attach(b.data_dir)
        try:
            reader = local.reader("roll", 0)
            values = []
            for i in range(60):
                batch = [b"r%03d-%d" % (i, j) + b"." * 200 for j in range(4)]
                values += batch
                local.send_batch("roll", 0, batch, acks=1)
                if i == 30:  # read half-way, so the reader holds old segments when more roll
                    local.flush(10)
                    assert len(local.read("roll", 0, 0, 10**6)) > 0
            local.flush(10)
            got, offset = [], 0
            while offset < len(values):
                r = local.read("roll", 0, offset, 50)
                assert len(r), offset
                got += [x.value for x in r.records()]
                offset = r.next_offset
            assert got == values
            # Arrow batches decoded ahead by threads, in order, across the rolls; every batch
            # kept alive (the reader's pool must not reuse a buffer still in use)
            kept = list(local.iter_arrow("roll", 0, 0, 37, end=len(values)))
            assert [v for rb, _ in kept for v in rb.column("value").to_pylist()] == values
            assert [nxt for _, nxt in kept] == [rb.column("offset")[-1].as_py() + 1
                                                for rb, _ in kept]
            # without an end: until a read finds nothing new
            offsets = [o for rb, _ in local.iter_arrow("roll", 0, 5, 50, ahead=3)
                       for o in rb.column("offset").to_pylist()]
            assert offsets == list(range(5, len(values)))
            del kept
            segments = sorted(p.name for p in (b.data_dir / "worker-1" / "roll-0").glob("*.log")) \
                or sorted(p.name for p in (b.data_dir / "worker-2" / "roll-0").glob("*.log"))
            assert len(segments) > 10
            from confluent_kafka import TopicPartition

            fut = admin.delete_records([TopicPartition("roll", 0, 100)])
            list(fut.values())[0].result(30)
            st = reader.state()
            assert st.log_start >= 100
            with pytest.raises(OffsetOutOfRangeError):
                local.read("roll", 0, 10, 5)
            r = local.read("roll", 0, st.log_start, 5)
            assert [x.value for x in r.records()] == values[st.log_start : st.log_start + 5]
        finally:
            local.close()
    finally:
        assert b.stop() == 0, b.log_path.read_text()


def test_attach_by_bootstrap_address(shm_broker: RunningBroker, monkeypatch) -> None:
    """By bootstrap: broker.json of the default data dirs first, else the broker's log.dirs over
    the Kafka protocol (DescribeConfigs); a broker that is not here is NotLocalError."""
    from shmq.ipc.client import NotLocalError, find_data_dir

    monkeypatch.setenv("SHMQ_DATA_DIR", str(shm_broker.data_dir))
    assert find_data_dir(shm_broker.bootstrap) == shm_broker.data_dir
    monkeypatch.setenv("SHMQ_DATA_DIR", str(shm_broker.data_dir.parent / "elsewhere"))
    monkeypatch.setenv("HOME", str(shm_broker.data_dir.parent / "home"))
    assert find_data_dir(shm_broker.bootstrap) == shm_broker.data_dir  # via log.dirs
    with attach(bootstrap=shm_broker.bootstrap) as local:
        assert local.send_batch("sem-ring", 1, [b"by bootstrap"], acks=1).result(10).error_code == 0
    import socket as sk

    with sk.socket() as s:  # a port nobody serves
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(NotLocalError):
        find_data_dir(f"127.0.0.1:{port}", timeout=2)


def test_a_failed_batch_does_not_wedge_the_idempotent_producer(shm_broker: RunningBroker) -> None:
    """A batch the broker refuses before it checks sequences (too large) leaves its sequence
    unused: the next batch takes it, with the same producer id."""
    with attach(shm_broker.data_dir) as local:
        ok = local.send_batch("sem-ring", 0, [b"before"]).result(10)
        with pytest.raises(Exception) as err:
            local.send_batch("sem-ring", 0, [b"x" * (MAX_MESSAGE + 10)]).result(10)
        assert getattr(err.value, "code", None) == 10
        pid = local.producer_id
        after = local.send_batch("sem-ring", 0, [b"after"]).result(10)
        assert after.base_offset == ok.base_offset + 1
        assert local.producer_id == pid


def test_a_send_with_nothing_to_wait_for_goes_in_one_call(shm_broker: RunningBroker,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A send to a ready partition with room in flight and in the ring (the common case) goes
    through ``_send_now``, not the general path's layers (``_stamp_and_enqueue`` /
    ``_enqueue``, made to fail here); a send that must wait (``max_in_flight`` batches
    unanswered) still takes the general path, which waits for an answer, and every record is
    stored in order with its sequence."""
    with attach(shm_broker.data_dir, max_in_flight=1) as local:
        first = local.send_batch("sem-ring", 0, [b"warm"]).result(10)  # session, producer id
        general = LocalBroker._stamp_and_enqueue
        calls: list[int] = []

        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError("the general path")

        monkeypatch.setattr(LocalBroker, "_stamp_and_enqueue", refuse)
        fut = local.send_batch("sem-ring", 0, [b"one", b"two"], acks=1)
        assert fut.result(10).base_offset == first.base_offset + 1
        fut = local.send_batch("sem-ring", 0, [(b"k", b"three")])

        def counted(self: LocalBroker, *args: object, **kwargs: object) -> object:
            calls.append(1)
            return general(self, *args, **kwargs)

        monkeypatch.setattr(LocalBroker, "_stamp_and_enqueue", counted)
        waited = local.send_batch("sem-ring", 0, [b"four"])  # one unanswered: it waits
        assert calls == [1]
        assert fut.result(10).base_offset == first.base_offset + 3
        assert waited.result(10).base_offset == first.base_offset + 4
        got = _read_all(local, "sem-ring", 0)
        assert [r[3] for r in got][-5:] == [b"warm", b"one", b"two", b"three", b"four"]


def test_batches_in_flight_behind_a_refused_one_are_renumbered(shm_broker: RunningBroker) -> None:
    """Batches sent behind a refused one (still unanswered when it failed) come back
    OUT_OF_ORDER_SEQUENCE_NUMBER from the broker; the client sends them again with their
    sequences moved down (Java's adjustSequencesDueToFailedBatch): all are stored, in order."""
    with attach(shm_broker.data_dir) as local:
        first = local.send_batch("sem-ring", 1, [b"first"]).result(10)
        pid = local.producer_id
        refused = local.send_batch("sem-ring", 1, [b"x" * (MAX_MESSAGE + 10)])
        later = [local.send_batch("sem-ring", 1, [b"later-%d" % i, b"more-%d" % i])
                 for i in range(3)]
        with pytest.raises(Exception) as err:
            refused.result(10)
        assert getattr(err.value, "code", None) == 10
        offsets = [f.result(10).base_offset for f in later]
        assert offsets == [first.base_offset + 1 + 2 * i for i in range(3)]
        assert local.producer_id == pid
        got = _read_all(local, "sem-ring", 1)
        assert [r[3] for r in got][-7:] == [b"first"] + [
            v for i in range(3) for v in (b"later-%d" % i, b"more-%d" % i)]


def test_not_leader_is_retried_at_the_leader(shm_broker: RunningBroker) -> None:
    """A batch sent to a worker that does not lead the partition (a stale leader) is answered
    NOT_LEADER_OR_FOLLOWER by that worker and sent again, after the retry backoff, to the
    leader the state table names: stored once, in order, with the same producer id."""
    with attach(shm_broker.data_dir) as local:
        first = local.send_batch("sem-ring", 0, [b"first"]).result(10)
        leader = local.leader_of("sem-ring", 0)
        wrong = next(n for n in local._nodes() if n != leader)
        real = local.leader_of
        stale = {"left": 1}

        def leader_of(topic: str, partition: int) -> int | None:
            if stale["left"] and (topic, partition) == ("sem-ring", 0):
                stale["left"] -= 1
                return wrong
            return real(topic, partition)

        local.leader_of = leader_of  # type: ignore[method-assign]
        moved = local.send_batch("sem-ring", 0, [b"moved"]).result(10)
        assert moved.base_offset == first.base_offset + 1
        assert moved.error_code == 0 and stale["left"] == 0
        got = _read_all(local, "sem-ring", 0)
        assert [r[3] for r in got][-2:] == [b"first", b"moved"]


_NO_PANDAS_SCRIPT = r"""
import sys
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewTopic)
import shmq
from shmq.ipc.client import attach

data_dir, bootstrap, topic = sys.argv[1:]
admin = AdminClient({"bootstrap.servers": bootstrap})
admin.create_topics([NewTopic(topic, 2, 1, config={"message.timestamp.type": "LogAppendTime"})]
                    )[topic].result(30)
b = attach(data_dir)
b.send_batch(topic, 1, [b"v%d" % i for i in range(50)], acks=1).result(10)
# a read across both timestamp types takes the mixed path of the timestampType column
res = ConfigResource("topic", topic, incremental_configs=[ConfigEntry(
    "message.timestamp.type", "CreateTime", incremental_operation=AlterConfigOpType.SET)])
for f in admin.incremental_alter_configs([res]).values():
    f.result(30)
b.send_batch(topic, 1, [b"w%d" % i for i in range(50)], acks=1).result(10)
hw = b.reader(topic, 1).state().high_watermark
batch, _ = b.read_arrow(topic, 1, 0, 1000)
assert batch.num_rows == hw == 100, (batch.num_rows, hw)
kinds = batch.column("timestampType").to_pylist()
assert kinds == [1] * 50 + [0] * 50, kinds
empty, _ = b.read_arrow(topic, 1, hw, 10)
assert empty.num_rows == 0
b.close()
c = shmq.Consumer({"bootstrap.servers": bootstrap, "group.id": "no-pandas"})
c.assign([TopicPartition(topic, 1, 0)])
rb = c.consume_arrow(1000, 10.0)
assert rb is not None and rb.num_rows == hw, rb
assert rb.column("timestampType").to_pylist() == kinds
c.close()
print("pandas" in sys.modules)
"""


def test_arrow_reads_do_not_import_pandas(shm_broker: RunningBroker) -> None:
    """A reader's first Arrow read must not pay for importing pandas: ``pa.array`` and
    ``Array.to_numpy`` import it (0.3 s and ~8,000 page faults here), which was the once-a-run
    300-400 ms stall of bench_shm's 10,000/s latency row (the bench's own ``to_numpy``).  The read
    spans a change of ``message.timestamp.type``, whose timestampType column used both."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _NO_PANDAS_SCRIPT, str(shm_broker.data_dir), shm_broker.bootstrap,
         "no-pandas"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False", out.stdout


def test_tail_reads_map_each_page_once(shm_broker: RunningBroker) -> None:
    """A reader that follows the tail one record at a time asks the kernel to map (populate) a
    page once, not on every read: the records of one page come without a system call.  Every
    read still returns the right records, a read back into older pages too."""
    admin = AdminClient({"bootstrap.servers": shm_broker.bootstrap})
    for f in admin.create_topics([NewTopic("pop-ring", 1, 1)]).values():
        f.result(30)
    local, writer = attach(shm_broker.data_dir), attach(shm_broker.data_dir)
    try:
        for _ in range(100):  # the worker takes the partition a moment after the topic exists
            try:
                writer.send_batch("pop-ring", 0, [b"first"], acks=1).result(5)
                break
            except Exception:  # noqa: BLE001 - not led yet: UNKNOWN_TOPIC_OR_PARTITION
                time.sleep(0.05)
        reader = local.reader("pop-ring", 0)
        offset = reader.state().high_watermark
        values = [b"v%04d" % i + b"." * 100 for i in range(200)]  # ~170 B batches: 24 a page
        for value in values:
            writer.send_batch("pop-ring", 0, [value], acks=1).result(5)
            got = local.read("pop-ring", 0, offset, 1 << 16, timeout=5).records()
            assert [(r.offset, r.value) for r in got] == [(offset, value)]
            offset += 1
        # ~34 KB: 9 pages, each asked for once (the first read's, then one a page crossed); the
        # twin's mapping follows the file's size, so each read at the tail maps it anew
        if fast.HAVE_FAST:
            assert reader.populates <= 12, reader.populates  # 200 when every read asked
        again = local.read("pop-ring", 0, offset - 150, 150).records()
        assert [r.value for r in again] == values[-150:]
        again = local.read("pop-ring", 0, offset - 1, 1).records()
        assert [r.value for r in again] == values[-1:]
    finally:
        local.close()
        writer.close()


def test_a_wait_for_answers_shorter_than_a_millisecond_sleeps(shm_broker: RunningBroker) -> None:
    """A wait for answers of less than 1 ms sleeps its time out: its milliseconds were cut to
    0 (a look, no sleep), so ``LocalBroker.poll`` with less than 1 ms left went round as a busy
    loop of 200 us spins and looks -- produce_batch's acks=all waits (poll(0.001)) cost 45-320
    ns of CPU a record."""
    local = attach(shm_broker.data_dir)
    try:
        local.send_batch("sem-ring", 0, [b"session"], acks=1).result(5)
        session = local.sessions[local.leader_of("sem-ring", 0)]
        for wanted in (0.0003, 0.0008):
            began = time.monotonic()
            session.wait(wanted)  # nothing to answer: asleep until the time is up
            assert time.monotonic() - began >= wanted * 0.9, wanted
    finally:
        local.close()


def test_a_client_sleeps_at_once_after_a_long_wait_for_answers(
        shm_broker: RunningBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait for answers looks at the completion ring for SPIN_S before it sleeps, unless the
    last wait lasted longer than that (a lagging worker): then it sleeps at once, and spins
    again once a wait was short."""
    import os

    from shmq.ipc import client as client_mod

    local = attach(shm_broker.data_dir)
    try:
        local.send_batch("sem-ring", 0, [b"session"], acks=1).result(5)
        session = local.sessions[local.leader_of("sem-ring", 0)]
        yields: list[int] = []
        real = os.sched_yield
        monkeypatch.setattr(client_mod.os, "sched_yield", lambda: yields.append(1) or real())
        # the session batch's own wait may have been long (a loaded box): start from a short one
        session.answer_wait = 0.0
        local._await_answer(session, 0.003)  # nothing to answer: spins, then sleeps it out
        assert yields and session.answer_wait >= 0.003 > client_mod.SPIN_S
        yields.clear()
        local._await_answer(session, 0.003)  # after a long wait: asleep at once
        assert not yields
        done = local.send_batch("sem-ring", 0, [b"answered"], acks=1)
        deadline = time.monotonic() + 5
        while session.completion.published() == session.completion.head:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        local._await_answer(session, 0.003)  # the answer is there: a short wait
        assert session.answer_wait < client_mod.SPIN_S
        local.poll(0)
        assert done.done()
        yields.clear()
        local._await_answer(session, 0.003)  # so this one spins first again
        assert yields
    finally:
        local.close()


def _short_slices_supported() -> bool:
    """Whether this kernel takes a custom slice for a SCHED_OTHER thread (EEVDF, Linux 6.12+),
    asked from a throwaway thread."""
    import threading

    from shmq.ipc import sched

    took: list[bool] = []
    th = threading.Thread(target=lambda: took.append(sched.request_slice(100)))
    th.start()
    th.join()
    return took == [True]


def test_a_waiting_reader_and_the_worker_ask_for_short_slices(shm_broker: RunningBroker) -> None:
    """The worker's event loop thread asks the kernel for 100 us slices (``shmq.ipc.sched``),
    and a thread has them while it sleeps in a local read: woken by a publish they preempt a
    task that has run longer instead of waiting out its slice (bench_shm --stages: the waiting
    reader's run-queue time was most of the 10,000/s p99).  The reader's thread is the
    caller's: its own slice is back once the read returns."""
    import threading

    from shmq.ipc import reader, sched

    if not _short_slices_supported():
        pytest.skip("this kernel takes no custom slice for SCHED_OTHER threads")
    assert reader.WAIT_SLICE_US == 100.0
    for pid in shm_broker.worker_pids().values():
        assert sched.slice_ns(pid) == 100_000, pid  # a process id is its main thread's id
    seen: dict[str, int | None] = {}
    during: list[int | None] = []
    tid: list[int] = []
    waiting = threading.Event()

    local = attach(shm_broker.data_dir)

    def waits() -> None:
        try:
            assert sched.request_slice(3000)  # the caller's own choice, kept
            seen["before"] = sched.slice_ns()
            tid.append(threading.get_native_id())
            hw = local.reader("sem-ring", 1).state().high_watermark
            waiting.set()
            assert not len(local.read("sem-ring", 1, hw, 10, timeout=0.6))
            seen["after"] = sched.slice_ns()
        finally:
            local.close()

    th = threading.Thread(target=waits)
    th.start()
    assert waiting.wait(10)
    deadline = time.monotonic() + 0.4
    while time.monotonic() < deadline:
        during.append(sched.slice_ns(tid[0]))
        time.sleep(0.01)
    th.join()
    assert seen["before"] == 3_000_000 and seen["after"] == 3_000_000, seen
    assert 100_000 in during, during


def test_the_ring_trace_stages(tmp_path: Path) -> None:
    """``SHMQ_RING_TRACE`` + ``SHMQ_RING_TRACE_STAGES`` (bench_shm --trace --stages): a session
    writes, per entry, the partition, base offset, when its drain took it and published it,
    when that drain began and whether a kick began it, the worker thread's end / CPU / run
    queue at the previous drain's end and at this one's start, and its place in the drain;
    and the worker's gc collections and housekeeping turns beside it."""
    import os

    env = {**os.environ, "SHMQ_RING_TRACE": str(tmp_path), "SHMQ_RING_TRACE_STAGES": "1"}
    b = start_broker(tmp_path / "data", workers=1, env=env)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("traced", 1, 1)])["traced"].result(30)
        local = attach(b.data_dir)
        try:
            for i in range(5):
                local.send_batch("traced", 0, [b"v%d" % i, b"w"], acks=1).result(10)
                time.sleep(0.002)  # each its own drain, begun by a kick
        finally:
            local.close()
        deadline = time.monotonic() + 10
        while not list(tmp_path.glob("ring-trace-*.txt")) and time.monotonic() < deadline:
            time.sleep(0.05)
        rows = [[int(x) for x in line.split()]
                for f in tmp_path.glob("ring-trace-*.txt") for line in f.read_text().splitlines()]
        assert [r[1] for r in rows] == [0, 2, 4, 6, 8], rows  # base offsets, in order
        for part, _, taken, published, began, _, prev_end, _, _, cpu, queued, taken_before in rows:
            assert part == 0 and began <= taken <= published and taken_before == 0
            assert prev_end <= began and cpu > 0 and queued >= 0
        assert sum(r[5] for r in rows) >= 1  # at least one drain began with a kick
        assert list(tmp_path.glob("ring-events-*.txt"))
    finally:
        assert b.stop() == 0
