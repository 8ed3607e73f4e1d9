"""Logs opened at first use (issue 17): a worker started after a clean shutdown opens no log, and
a new partition gets no index files until it is written.  Real broker processes, real files,
confluent-kafka.

* Every API on a partition never opened since the start behaves as before: ListOffsets (latest,
  earliest, by time), Fetch, Produce, DeleteRecords, retention (after AlterConfigs), and
  DeleteTopics (its directories go without being opened).
* After a start, and after creating a topic, the workers map and hold no file of the logs.
* SIGKILL of every process, with one partition opened since the start (its acks=all writes
  checkpointed by the worker's timer) and others never opened: nothing follows any log's
  recovery point, so the next start opens none of them either; nothing
  acknowledged is lost, and the start after the next clean stop opens none again.
* SIGKILL after acks=all writes (checkpointed) and acks=1 writes, with a torn write appended to one log and a record
  garbled below the recovery point of another: the start opens only the logs with bytes after
  their recovery point (the acks=1 tails: kept; the torn write: truncated), every acknowledged
  record is read back by kafka-python (its decoder and CRC check as the oracle), and the record
  garbled below the recovery point is trusted, as Kafka trusts it, and refused by the client's
  CRC check, as Kafka's consumers refuse it.
* An index file cut or garbled while the broker was down is rebuilt when its lazily opened
  partition is first read, as before.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
from _broker import RunningBroker, _remove_stale_shm, start_broker
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

HOUR_MS = 3_600_000
ENV = {k: v for k, v in os.environ.items() if k != "SHMQ_LOG_LEVEL"}  # the INFO ready lines
DEFERRED = re.compile(r"worker (\d+) ready: (\d+) logs opened after a clean shutdown, "
                      r"(\d+) left to open at first use")


def _create(admin: AdminClient, topic: str, partitions: int, **config: str) -> None:
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if len(parts) == partitions and all(p.leader >= 0 for p in parts.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"no leader for every partition of {topic}")


def _produce(bootstrap: str, topic: str, partitions: int | list[int], count: int,
             timestamp: int = 0) -> None:
    """``count`` records into each partition (``partitions``: a count, or a list of them)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    errors: list = []
    for part in range(partitions) if isinstance(partitions, int) else partitions:
        for i in range(count):
            p.produce(topic, b"%s-%d-%d" % (topic.encode(), part, i), partition=part,
                      timestamp=timestamp, on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(30) == 0 and errors == []


def _records(bootstrap: str, topic: str, partition: int, start: int = 0) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "lazy", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, partition, start)])
        out = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(m.error())
            out.append((m.offset(), m.value()))
        raise AssertionError(f"{topic}-{partition}: no end after {out}")
    finally:
        c.close()


def _watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "lazy"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        c.close()


def _deferred(b: RunningBroker, since: int) -> tuple[int, int, int]:
    """(workers, logs opened, logs deferred) summed over the ready lines of clean starts logged
    after byte ``since``."""
    text = b.log_path.read_bytes()[since:].decode(errors="replace")
    found = DEFERRED.findall(text)
    return len(found), sum(int(o) for _, o, _ in found), sum(int(d) for _, _, d in found)


def _recovered(b: RunningBroker, since: int) -> tuple[int, int, int]:
    """(workers, logs opened, logs deferred) from the ready lines of unclean starts after byte
    ``since``."""
    text = b.log_path.read_bytes()[since:].decode(errors="replace")
    found = re.findall(r"worker \d+ ready: (\d+) logs opened after an unclean shutdown"
                       r"(?:, (\d+) left to open at first use)?", text)
    return len(found), sum(int(n) for n, _ in found), sum(int(d or 0) for _, d in found)


def _file_usage(b: RunningBroker) -> tuple[int, int]:
    """(mappings, descriptors) of files under the workers' log dirs, over every process (not
    the log dir itself, which each worker holds open for its clean stop's syncfs)."""
    root = str(b.data_dir.resolve() / "worker-")
    maps = fds = 0
    proc = psutil.Process(b.proc.pid)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            with open(f"/proc/{p.pid}/maps") as f:
                maps += sum(1 for line in f if root in line)
            for fd in os.listdir(f"/proc/{p.pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{p.pid}/fd/{fd}")
                    fds += target.startswith(root) and "/" in target[len(root):]
                except OSError:
                    continue
        except (OSError, psutil.NoSuchProcess):
            continue
    return maps, fds


def _restart(b: RunningBroker) -> tuple[RunningBroker, int]:
    """Stop ``b`` cleanly, start it again: (the new broker, where its log began)."""
    assert b.stop() == 0, b.log_path.read_text()
    since = b.log_path.stat().st_size
    return start_broker(b.data_dir, env=ENV), since


def _checkpointed(b: RunningBroker, topic: str, ends: dict[int, int]) -> None:
    """Wait until each partition's recovery record names its end (``ends``): the worker's timer
    checkpoints a log ``CHECKPOINT_INTERVAL_MS`` after its last acks=all flush (an
    acknowledgement's flush moves the durable offset only: PartitionLog, "Durability")."""
    from shmq.storage import recovery_point
    from shmq.storage.log import CHECKPOINT_INTERVAL_MS

    def done() -> bool:
        for part, end in ends.items():
            (directory,) = b.data_dir.glob(f"worker-*/{topic}-{part}")
            record = recovery_point.read(directory)
            if record is None or record.offset != end:
                return False
        return True

    deadline = time.monotonic() + CHECKPOINT_INTERVAL_MS / 1000 + 10
    while not done():
        assert time.monotonic() < deadline, f"{topic}: no checkpoint at {ends}"
        time.sleep(0.05)


def _power_cut(b: RunningBroker) -> None:
    """SIGKILL of every process of the broker at once (the controller stopped first, so it
    neither restarts a worker nor lets one see its death and stop cleanly)."""
    controller = psutil.Process(b.proc.pid)
    os.kill(controller.pid, signal.SIGSTOP)
    children = controller.children(recursive=True)
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
    os.kill(controller.pid, signal.SIGKILL)
    b.proc.wait(10)
    psutil.wait_procs(children, timeout=10)
    if b.proc.stdout is not None:
        b.proc.stdout.close()
    _remove_stale_shm(b.data_dir)


def _partition_dirs(b: RunningBroker, topic: str) -> list[str]:
    return sorted(p.name for p in b.data_dir.glob(f"worker-*/{topic}-*"))


def test_never_opened_partitions_serve_as_before(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", env=ENV)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        _create(admin, "lz", 6)
        _create(admin, "ret", 2, **{"retention.ms": str(2 * HOUR_MS)})
        hour_ago = int(time.time() * 1000) - HOUR_MS
        _produce(b.bootstrap, "lz", 6, 5, hour_ago)
        _produce(b.bootstrap, "ret", 2, 5, hour_ago)
        b, since = _restart(b)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        assert _deferred(b, since) == (2, 0, 8), b.log_path.read_text()[-3000:]
        assert _file_usage(b) == (0, 0)

        # a new topic's logs exist without index files, and nothing of them is mapped
        _create(admin, "fresh", 20)
        assert len(_partition_dirs(b, "fresh")) == 20
        assert not list(b.data_dir.glob("worker-*/fresh-*/*.index"))
        assert _file_usage(b) == (0, 0)  # no mapping, no descriptor

        # ListOffsets, by time too
        assert _watermarks(b.bootstrap, "lz", 0) == (0, 5)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "lazy"})
        try:
            (found,) = c.offsets_for_times([TopicPartition("lz", 1, hour_ago - 1000)], timeout=10)
            assert found.offset == 0
        finally:
            c.close()
        # Fetch
        assert _records(b.bootstrap, "lz", 2) == [(i, b"lz-2-%d" % i) for i in range(5)]
        # Produce
        _produce(b.bootstrap, "lz", [3], 1)
        assert _records(b.bootstrap, "lz", 3, 5) == [(5, b"lz-3-0")]
        assert _file_usage(b)[0] > 0  # the counter sees what an opened, written log maps
        # DeleteRecords
        (fut,) = admin.delete_records([TopicPartition("lz", 4, 2)]).values()
        assert fut.result(30).low_watermark == 2
        assert _watermarks(b.bootstrap, "lz", 4) == (2, 5)
        # retention, once AlterConfigs shortens it below the records' age
        res = ConfigResource("topic", "ret", incremental_configs=[ConfigEntry(
            "retention.ms", str(HOUR_MS // 2), incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _watermarks(b.bootstrap, "ret", 1) != (5, 5):
            time.sleep(0.2)
        assert [_watermarks(b.bootstrap, "ret", p) for p in (0, 1)] == [(5, 5), (5, 5)]
        # DeleteTopics: lz-5 was never opened
        admin.delete_topics(["lz"])["lz"].result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _partition_dirs(b, "lz"):
            time.sleep(0.1)
        assert _partition_dirs(b, "lz") == []
    finally:
        assert b.stop() == 0, b.log_path.read_text()


def test_sigkill_recovers_opened_and_never_opened_logs(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", env=ENV)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        _create(admin, "rk", 4)
        _produce(b.bootstrap, "rk", 4, 3)
        b, since = _restart(b)
        assert _deferred(b, since) == (2, 0, 4), b.log_path.read_text()[-3000:]
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 0})
        for i in (3, 4):  # rk-0 opened and written; rk-1..3 never opened
            p.produce("rk", b"rk-0-%d" % i, partition=0)
        assert p.flush(30) == 0
        _checkpointed(b, "rk", {0: 5})
        _power_cut(b)
        since = b.log_path.stat().st_size
        b = start_broker(b.data_dir, env=ENV)
        # rk-0's acks=all writes were fsynced and checkpointed, rk-1..3 untouched since their
        # clean close: nothing follows any recovery point, nothing is opened
        assert _recovered(b, since) == (2, 0, 4), b.log_path.read_text()[-3000:]
        assert _deferred(b, since) == (0, 0, 0)
        for part in range(4):
            n = 5 if part == 0 else 3
            assert _records(b.bootstrap, "rk", part) == [(i, b"rk-%d-%d" % (part, i))
                                                         for i in range(n)]
        b, since = _restart(b)
        assert _deferred(b, since) == (2, 0, 4)
        assert _records(b.bootstrap, "rk", 0, 4) == [(4, b"rk-0-4")]
    finally:
        b.stop()


@pytest.mark.parametrize("damage", ["cut", "garbled"])
def test_a_damaged_index_of_a_lazily_opened_log_is_rebuilt(tmp_path: Path, damage: str) -> None:
    b = start_broker(tmp_path / "data", workers=1, env=ENV)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        _create(admin, "ix", 1, **{"index.interval.bytes": "200"})
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 0})
        for i in range(40):
            p.produce("ix", b"v%03d" % i + b"." * 100, partition=0)
            assert p.flush(10) == 0  # a batch each: an index entry every two
        assert b.stop() == 0
        (index,) = b.data_dir.glob("worker-1/ix-0/*.index")
        original = index.read_bytes()
        assert len(original) >= 8 * 10
        if damage == "cut":
            index.write_bytes(original[:-3])
        else:  # an entry naming another batch's position, still in order
            entry = bytearray(original)
            entry[8 * 5 + 4 : 8 * 5 + 8] = (int.from_bytes(original[8 * 5 + 4 : 8 * 5 + 8], "big")
                                            + 1).to_bytes(4, "big")
            index.write_bytes(bytes(entry))
        since = b.log_path.stat().st_size
        b = start_broker(b.data_dir, workers=1, env=ENV)
        assert _deferred(b, since) == (1, 0, 1)
        for start in (0, 17, 39):
            got = _records(b.bootstrap, "ix", 0, start)
            assert got == [(i, b"v%03d" % i + b"." * 100) for i in range(start, 40)]
        assert "rebuilding indexes of" in b.log_path.read_bytes()[since:].decode(errors="replace")
        assert b.stop() == 0
        assert index.read_bytes() == original  # rebuilt as the appends wrote it
    finally:
        b.stop()


def _kafka_python_read(bootstrap: str, topic: str, partition: int, end: int) -> list[tuple[int, bytes]]:
    """Offsets and values of ``topic``-``partition`` up to ``end``, read by kafka-python (its
    record decoder, CRCs checked: ``check_crcs`` is on by default)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    got: list[tuple[int, bytes]] = []
    try:
        tp = KTP(topic, partition)
        c.assign([tp])
        c.seek(tp, 0)
        deadline = time.monotonic() + 30
        while (not got or got[-1][0] < end - 1) and time.monotonic() < deadline:
            for recs in c.poll(500).values():
                got += [(r.offset, r.value) for r in recs]
    finally:
        c.close()
    return got


def test_sigkill_opens_only_logs_with_bytes_after_their_recovery_point(tmp_path: Path) -> None:
    from kafka.errors import CorruptRecordError

    b = start_broker(tmp_path / "data", env=ENV)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        _create(admin, "uc", 8)
        _produce(b.bootstrap, "uc", 8, 20)  # acks=all: fsynced before each acknowledgement
        _checkpointed(b, "uc", {part: 20 for part in range(8)})  # then the recovery points
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "1", "linger.ms": 0})
        for part in (0, 1):  # acknowledged, in the page cache, not fsynced
            for i in range(20, 25):
                p.produce("uc", b"uc-%d-%d" % (part, i), partition=part)
        assert p.flush(30) == 0
        _power_cut(b)
        logs = {int(d.name.rsplit("-", 1)[1]): d / "00000000000000000000.log"
                for d in b.data_dir.glob("worker-*/uc-*")}
        with open(logs[2], "ab") as f:  # a write torn by the crash, after the recovery point
            f.write(bytes(range(7, 47)))
        data = bytearray(logs[3].read_bytes())  # a value byte of offset 5, below it
        at = data.index(b"uc-3-5")
        data[at + 3] ^= 0x01
        logs[3].write_bytes(bytes(data))
        since = b.log_path.stat().st_size
        b = start_broker(b.data_dir, env=ENV)
        text = b.log_path.read_bytes()[since:].decode(errors="replace")
        # uc-0 and uc-1 (unflushed tails) and uc-2 (the torn write) are opened and recovered;
        # the five others are left to open at first use
        assert _recovered(b, since) == (2, 3, 5), text[-3000:]
        assert "40 bytes of invalid tails truncated" in text
        for part in range(8):
            n = 25 if part in (0, 1) else 20
            if part == 3:
                continue
            assert _kafka_python_read(b.bootstrap, "uc", part, n) == [
                (i, b"uc-%d-%d" % (part, i)) for i in range(n)], part
            assert _watermarks(b.bootstrap, "uc", part) == (0, n)
        # below the recovery point nothing is validated at start (Kafka's rule): the garbled
        # record is served as stored, and a client checking CRCs refuses it
        with pytest.raises(CorruptRecordError):
            _kafka_python_read(b.bootstrap, "uc", 3, 20)
        assert _records(b.bootstrap, "uc", 3, 6) == [(i, b"uc-3-%d" % i) for i in range(6, 20)]
        _produce(b.bootstrap, "uc", [2, 5], 1)  # the truncated and a deferred log take appends
        assert _records(b.bootstrap, "uc", 2, 20) == [(20, b"uc-2-0")]
        assert _records(b.bootstrap, "uc", 5, 20) == [(20, b"uc-5-0")]
        b, since = _restart(b)
        assert _deferred(b, since) == (2, 0, 8)
        assert _kafka_python_read(b.bootstrap, "uc", 4, 20) == [(i, b"uc-4-%d" % i)
                                                                 for i in range(20)]
    finally:
        b.stop()


def test_a_clean_stop_after_acks_1_writes_is_clean_and_loses_nothing(tmp_path: Path) -> None:
    """The clean stop syncs each worker's filesystem once (``LogManager``, "Clean shutdown"),
    not each log: what acks=1 acknowledged (never fsynced before the stop) survives it, the next
    start is a clean one that opens no log, and so is the start after a SIGKILL that follows
    it (every record the stop wrote names its log's end).  A partition never written keeps its
    ``.log`` and ``partition.metadata`` only."""
    from shmq.storage import recovery_point

    b = start_broker(tmp_path / "data", env=ENV)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        _create(admin, "cs", 12)
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "1", "linger.ms": 0})
        for part in range(8):
            for i in range(5):
                p.produce("cs", b"cs-%d-%d" % (part, i), partition=part)
        assert p.flush(30) == 0
        b, since = _restart(b)
        assert _deferred(b, since) == (2, 0, 12)
        dirs = {int(d.name.rsplit("-", 1)[1]): d for d in b.data_dir.glob("worker-*/cs-*")}
        for part in range(8, 12):
            assert sorted(os.listdir(dirs[part])) == ["00000000000000000000.log",
                                                      "partition.metadata"]
        for part in range(8):
            assert recovery_point.read(dirs[part]).offset == 5
            assert _kafka_python_read(b.bootstrap, "cs", part, 5) == [
                (i, b"cs-%d-%d" % (part, i)) for i in range(5)]
        _power_cut(b)
        since = b.log_path.stat().st_size
        b = start_broker(b.data_dir, env=ENV)
        assert _recovered(b, since) == (2, 0, 12)  # nothing follows any recovery point
        for part in range(12):
            n = 5 if part < 8 else 0
            assert _watermarks(b.bootstrap, "cs", part) == (0, n)
            if n:
                assert _kafka_python_read(b.bootstrap, "cs", part, n) == [
                    (i, b"cs-%d-%d" % (part, i)) for i in range(n)]
        _produce(b.bootstrap, "cs", [0, 11], 1)
        assert _records(b.bootstrap, "cs", 0, 5) == [(5, b"cs-0-0")]
        assert _records(b.bootstrap, "cs", 11) == [(0, b"cs-11-0")]
        b, since = _restart(b)
        assert _deferred(b, since) == (2, 0, 12)
        assert _records(b.bootstrap, "cs", 11) == [(0, b"cs-11-0")]
    finally:
        b.stop()
