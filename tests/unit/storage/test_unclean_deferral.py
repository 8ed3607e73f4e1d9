"""An unclean start opens only the logs with bytes after their recovery point (``LogManager``,
"After an unclean shutdown"): real files, a simulated SIGKILL (``crash_close``: nothing
flushed, trimmed or closed cleanly), kafka-python's record decoder as the oracle for what a log
holds.

Kafka's rule: after an unclean shutdown only what follows each log's recovery point is
validated; what precedes it is trusted (``LogLoader``).  A log whose recovery record names its
exact end is trusted whole and left unopened until its first use.
"""

from __future__ import annotations

import json
import logging
import os
import struct

import crc32c
from _storage_util import all_records, kbatch, split_batches
from kafka.record.default_records import DefaultRecordBatch

from shmq.protocol.records import encode_batch
from shmq.storage import HostedLog, LogConfig, LogManager, recovery_point
from shmq.storage.log_manager import SUMMARY_FILE

TOPIC_ID = "6f1c2e9a-3b7d-4c5e-8f90-123456789abc"
T0 = 1_700_000_000_000
PID = 4000
CFG = LogConfig(index_interval_bytes=1)  # an index entry per batch


def hosted(partitions: int) -> dict:
    return {("t", p): HostedLog(TOPIC_ID, CFG) for p in range(partitions)}


def values(directory) -> list[tuple[int, bytes]]:
    return [(r[0], r[3]) for r in all_records(directory)]


def crash(mgr: LogManager) -> None:
    """SIGKILL of the worker: its files dropped as they are, no clean-shutdown marker."""
    for plog in mgr.logs.values():
        plog.crash_close()
    mgr.logs.clear()
    mgr.deferred.clear()


def written(log_dir, partitions: int, records: int = 5) -> LogManager:
    """A worker-style manager with ``records`` records fsynced in each of ``t``-0.. (acks=all
    with flush.on.ack)."""
    mgr = LogManager(log_dir)
    mgr.startup(hosted=hosted(partitions))
    for p in range(partitions):
        plog = mgr.get_or_create_log("t", p, CFG, topic_id=TOPIC_ID)
        for i in range(records):
            plog.append(kbatch([b"t%d-%d" % (p, i)], [T0 + i]))
        plog.flush()
        plog.update_high_watermark(plog.log_end_offset)
    return mgr


def test_only_logs_with_bytes_after_their_recovery_point_are_opened(tmp_path, caplog) -> None:
    log_dir = tmp_path / "logs"
    mgr = written(log_dir, 4)
    mgr.get_or_create_log("t", 4, CFG, topic_id=TOPIC_ID)  # never written
    unflushed = kbatch([b"t1-tail"], [T0 + 9])
    mgr.logs[("t", 1)].append(unflushed)  # acknowledged with acks=1: in the page cache only
    crash(mgr)
    torn = bytes(range(7, 47))  # a write torn by the crash, after t-2's recovery point
    with open(log_dir / "t-2" / "00000000000000000000.log", "ab") as f:
        f.write(torn)
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted(5))
    try:
        assert not report.clean and sorted(mgr.logs) == [("t", 1), ("t", 2)]
        assert sorted(mgr.deferred) == [("t", 0), ("t", 3), ("t", 4)]
        assert (report.opened, report.recovered, report.deferred) == (2, 2, 3)
        assert report.validated_bytes == len(unflushed) + len(torn)
        assert report.truncated_bytes == len(torn)
        assert "2 logs opened after an unclean shutdown, 3 left to open at first use" in \
            report.describe()
        d = mgr.deferred[("t", 0)]
        assert (d.log_start_offset, d.high_watermark, d.last_stable_offset, d.log_end_offset,
                d.recovery_point) == (0, 5, 5, 5, 5)
        assert d.size_in_bytes == os.path.getsize(log_dir / "t-0" / "00000000000000000000.log")
        assert (d.segment_count, d.first_largest_timestamp) == (1, T0 + 4)
        assert mgr.deferred[("t", 4)].log_end_offset == 0
        assert "t 0 5" in (log_dir / "recovery-point-offset-checkpoint").read_text()
        assert mgr.logs[("t", 1)].log_end_offset == 6  # the tail was intact: kept
        assert mgr.logs[("t", 2)].log_end_offset == 5  # the torn write: cut
        # first use opens it as the unclean start would have: every record there, appends go on
        plog = mgr.get_log("t", 0)
        assert ("t", 0) not in mgr.deferred and plog.log_end_offset == 5
        assert plog.active_segment.offset_index.entries == 4  # adopted at the recorded count (Kafka: none for the first batch)
        assert plog.append(kbatch([b"t0-new"], [T0 + 20])).first_offset == 5
        assert plog.fetch_offset_by_timestamp(T0 + 3).offset == 3
    finally:
        mgr.shutdown()
    assert values(log_dir / "t-0") == [(i, b"t0-%d" % i) for i in range(5)] + [(5, b"t0-new")]
    assert values(log_dir / "t-1") == [(i, b"t1-%d" % i) for i in range(5)] + [(5, b"t1-tail")]
    assert values(log_dir / "t-2") == [(i, b"t2-%d" % i) for i in range(5)]
    # t-3 was never opened since the crash: the clean shutdown's summary says so, and the next
    # (clean) start still opens it as after a crash (its index files were never trimmed)
    entries = {e[1]: e for e in json.loads((log_dir / SUMMARY_FILE).read_text())["logs"]}
    assert entries[3][11:] == [True] and entries[0][11:] == []
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted(5))
    try:
        assert report.clean and report.deferred == 5 and mgr.logs == {}
        assert not mgr.deferred[("t", 3)].clean and mgr.deferred[("t", 0)].clean
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="shmq"):
            plog = mgr.get_log("t", 3)
            assert plog.fetch_offset_by_timestamp(T0 + 2).offset == 2
        # adopted at the recorded entries, not found past the log and rebuilt
        assert [r.message for r in caplog.records] == []
        assert plog.active_segment.offset_index.entries == 4
        assert plog.fetch_offset_by_timestamp(T0 + 2).offset == 2
        assert plog.append(kbatch([b"t3-new"], [T0 + 20])).first_offset == 5
    finally:
        mgr.shutdown()
    assert values(log_dir / "t-3") == [(i, b"t3-%d" % i) for i in range(5)] + [(5, b"t3-new")]
    # opened and closed cleanly now: an ordinary summary entry
    entries = {e[1]: e for e in json.loads((log_dir / SUMMARY_FILE).read_text())["logs"]}
    assert entries[3][11:] == []


def test_the_record_carries_the_last_stable_offset(tmp_path) -> None:
    """An open transaction at the crash: the unopened log's LSO is its first offset, as the
    producer state rebuilt at first use says; once committed, the LEO."""
    log_dir = tmp_path / "logs"
    mgr = written(log_dir, 2, records=2)
    for p in (0, 1):
        plog = mgr.logs[("t", p)]
        plog.append(bytes(encode_batch([(b"k", b"v%d" % i) for i in range(3)], producer_id=PID,
                                       producer_epoch=0, base_sequence=0, transactional=True)))
        if p == 1:
            plog.append_control(PID, 0, 0, commit=True)
        plog.flush()
    crash(mgr)
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted(2))
    try:
        assert report.opened == 0 and report.deferred == 2
        open_, committed = mgr.deferred[("t", 0)], mgr.deferred[("t", 1)]
        assert (open_.last_stable_offset, open_.log_end_offset) == (2, 5)
        assert (committed.last_stable_offset, committed.log_end_offset) == (6, 6)
        plog = mgr.get_log("t", 0)
        plog.update_high_watermark(plog.log_end_offset)
        assert plog.last_stable_offset == 2
        plog.append_control(PID, 0, 0, commit=False)
        plog.update_high_watermark(plog.log_end_offset)
        assert plog.last_stable_offset == plog.log_end_offset == 6
    finally:
        mgr.shutdown()


def test_damage_before_the_recovery_point_is_trusted_as_kafka_trusts_it(tmp_path) -> None:
    """A record garbled below the recovery point (its batch's CRC no longer matches): nothing
    before the recovery point is validated at start, in Kafka (``LogLoader`` recovers only from
    the recovery point) and here; the bytes are served as stored, and a consumer checking CRCs
    (kafka-python and Java by default) refuses the batch instead of returning the record."""
    log_dir = tmp_path / "logs"
    mgr = written(log_dir, 1)
    crash(mgr)
    path = log_dir / "t-0" / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    data[data.index(b"t0-2") + 1] ^= 0x01
    path.write_bytes(bytes(data))
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted(1))
    try:
        assert report.deferred == 1 and report.validated_bytes == 0
        plog = mgr.get_log("t", 0)
        plog.update_high_watermark(plog.log_end_offset)
        (s,) = plog.read(2, 1 << 20, upper_bound=5).slices
        batches = [b for _, b in split_batches(s.read())]
        assert [DefaultRecordBatch(b).validate_crc() for b in batches] == [False, True, True]
        assert crc32c.crc32c(batches[0][21:]) != struct.unpack_from(">I", batches[0], 17)[0]
    finally:
        mgr.shutdown()


def test_a_version_1_record_opens_the_log_and_is_replaced(tmp_path) -> None:
    """A record written before the first unstable offset was recorded (``SRP1``) names the end
    but not the LSO: the log is opened (resuming at the record: nothing validated), and its next
    flush writes version 2."""
    log_dir = tmp_path / "logs"
    mgr = written(log_dir, 1)
    crash(mgr)
    directory = log_dir / "t-0"
    rec = recovery_point.read(directory)
    assert rec is not None and rec.first_unstable == -1
    body = recovery_point._V1_SLOT.pack(b"SRP1", 0, 7, *rec[:9])
    v1 = body[:4] + struct.pack(">I", crc32c.crc32c(body[8:])) + body[8:]
    (directory / recovery_point.FILE_NAME).write_bytes(v1 + bytes(72))
    assert recovery_point.read(directory) == rec._replace(first_unstable=recovery_point.UNKNOWN)
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted(1))
    try:
        assert (report.opened, report.deferred, report.validated_bytes) == (1, 0, 0)
        plog = mgr.logs[("t", 0)]
        plog.append(kbatch([b"t0-5"], [T0 + 5]))
        plog.flush()
        again = recovery_point.read(directory)
        assert (again.offset, again.first_unstable) == (6, -1)
        assert (directory / recovery_point.FILE_NAME).read_bytes()[80:84] == b"SRP2" or \
            (directory / recovery_point.FILE_NAME).read_bytes()[:4] == b"SRP2"
    finally:
        mgr.shutdown()
