"""Logs opened at first use (``LogManager``, "Opening at first use") and new logs created without
their index files (``PartitionLog.create``, Kafka's ``LazyIndex``): real files in a temp dir."""

from __future__ import annotations

import json
import logging
import os

import pytest
from _storage_util import all_records, kbatch

from shmq.storage import HostedLog, LogConfig, LogManager, PartitionLog
from shmq.storage.log_manager import SUMMARY_FILE

TOPIC_ID = "6f1c2e9a-3b7d-4c5e-8f90-123456789abc"
NEW_TOPIC_ID = "0b8d5f3c-1a2e-4d6f-9b7c-abcdef012345"
ID = TOPIC_ID.encode()
T0 = 1_700_000_000_000
DAY = 86_400_000


def hosted(partitions: int = 3, topic_id: str = TOPIC_ID,
           config: LogConfig | None = None) -> dict:
    return {("t", p): HostedLog(topic_id, config or LogConfig()) for p in range(partitions)}


def fill(log_dir, partitions: int = 3, records: int = 4) -> None:
    """A clean shutdown of a worker-style (lazy) manager holding ``t``-0.. with data."""
    mgr = LogManager(log_dir)
    mgr.startup(hosted=hosted(partitions))
    for p in range(partitions):
        plog = mgr.get_or_create_log("t", p, topic_id=TOPIC_ID)
        for i in range(records):
            plog.append(kbatch([b"t-%d-%d" % (p, i)], [T0 + i]))
        plog.update_high_watermark(plog.log_end_offset)
    mgr.shutdown()


# -- a new log --------------------------------------------------------------------------------------


def test_a_new_log_holds_its_log_file_and_topic_id_only(tmp_path) -> None:
    mgr = LogManager(tmp_path / "logs")
    mgr.startup(hosted={})
    plog = mgr.get_or_create_log("t", 0, topic_id=TOPIC_ID)
    directory = tmp_path / "logs" / "t-0"
    assert sorted(os.listdir(directory)) == ["00000000000000000000.log", "partition.metadata"]
    assert plog.log_end_offset == 0 and plog.read(0, 1024).slices == []
    assert plog.fetch_offset_by_timestamp(T0) is None  # a lookup of an empty log: no file yet
    assert sorted(os.listdir(directory)) == ["00000000000000000000.log", "partition.metadata"]
    plog.append(kbatch([b"a", b"b"], [T0, T0 + 1]))  # not even the first append (the index
    assert sorted(os.listdir(directory)) == [  # entries in memory: test_deferred_index.py)
        "00000000000000000000.log", "partition.metadata"]
    plog.update_high_watermark(2)
    assert [r[3] for r in all_records(directory)] == [b"a", b"b"]
    mgr.shutdown()  # the clean close writes them
    assert {"00000000000000000000.index", "00000000000000000000.timeindex"} <= set(
        os.listdir(directory))


def test_a_new_log_never_written_restarts_without_rebuilding(tmp_path, caplog) -> None:
    """A log never written: its clean close writes no index file (nor snapshot or recovery
    record: nothing to vouch for), and a clean restart takes the empty segment without them for
    the new one it is; after a crash recovery rebuilds the missing ones silently.  No warning
    either way, and it takes appends."""
    log_dir = tmp_path / "logs"
    with caplog.at_level(logging.WARNING, logger="shmq"):
        mgr = LogManager(log_dir)
        mgr.startup()
        mgr.get_or_create_log("t", 0, topic_id=TOPIC_ID)
        mgr.shutdown()
        assert sorted(os.listdir(log_dir / "t-0")) == ["00000000000000000000.log",
                                                       "partition.metadata"]
        again = LogManager(log_dir)
        again.startup()
        assert again.had_clean_shutdown and again.get_log("t", 0).log_end_offset == 0
        again.get_or_create_log("t", 1, topic_id=TOPIC_ID)
        for plog in again.logs.values():
            plog.crash_close()  # SIGKILL: t-1 has no index file at all
        again.logs.clear()
        crashed = LogManager(log_dir)
        crashed.startup()
        assert not crashed.had_clean_shutdown
        for p in (0, 1):
            plog = crashed.get_log("t", p)
            assert plog.log_end_offset == 0
            plog.append(kbatch([b"x"], [T0]))
            plog.update_high_watermark(1)
            assert plog.read(0, 1024).size > 0
        crashed.shutdown()
    assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_creating_over_an_existing_directory_fails_without_harm(tmp_path) -> None:
    (tmp_path / "t-0").mkdir()
    (tmp_path / "t-0" / "keep").write_text("x")
    with pytest.raises(FileExistsError):
        PartitionLog.create(tmp_path / "t-0", topic_id=TOPIC_ID)
    assert os.listdir(tmp_path / "t-0") == ["keep"]


# -- opening at first use ---------------------------------------------------------------------------


def test_a_clean_start_opens_no_log_and_first_use_opens_it(tmp_path) -> None:
    log_dir = tmp_path / "logs"
    fill(log_dir)
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted())
    try:
        assert report.clean and report.opened == 0 and report.deferred == 3
        assert "0 logs opened after a clean shutdown, 3 left to open at first use" in \
            report.describe()
        assert mgr.logs == {} and sorted(mgr.deferred) == [("t", 0), ("t", 1), ("t", 2)]
        assert not (log_dir / SUMMARY_FILE).exists()  # it describes this start only
        d = mgr.deferred[("t", 1)]
        assert (d.log_start_offset, d.high_watermark, d.last_stable_offset,
                d.log_end_offset) == (0, 4, 4, 4)
        assert mgr.holds("t", 1) and not mgr.holds("t", 9) and mgr.logs == {}
        # the checkpoints keep the offsets of logs never opened
        assert "t 1 4" in (log_dir / "recovery-point-offset-checkpoint").read_text()
        plog = mgr.get_log("t", 1)
        assert plog is not None and plog.log_end_offset == 4 and ("t", 1) not in mgr.deferred
        assert [r[0] for r in all_records(log_dir / "t-1")] == [0, 1, 2, 3]
        plog.append(kbatch([b"new"], [T0 + 9]))
    finally:
        mgr.shutdown()
    # the next start defers all three again: t-1 from its new state, t-0 and t-2 carried over
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted())
    try:
        assert report.deferred == 3
        assert {tp: d.log_end_offset for tp, d in mgr.deferred.items()} == {
            ("t", 0): 4, ("t", 1): 5, ("t", 2): 4}
        assert mgr.get_log("t", 2).read(0, 1 << 20, upper_bound=4).size > 0
    finally:
        mgr.shutdown()


def test_an_unclean_start_opens_and_recovers_the_logs_with_bytes_after_their_recovery_point(
        tmp_path) -> None:
    log_dir = tmp_path / "logs"
    fill(log_dir)
    os.unlink(log_dir / ".kafka_cleanshutdown")  # a crash after the summary was written
    with open(log_dir / "t-2" / "00000000000000000000.log", "ab") as f:
        f.write(b"\x00" * 30)  # a torn batch
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted())
    try:
        # the summary is not used; t-0 and t-1 end at their recovery records (written by their
        # clean close): nothing to recover, left to open at first use (test_unclean_deferral.py)
        assert not report.clean and report.deferred == 2 and report.opened == 1
        assert sorted(mgr.deferred) == [("t", 0), ("t", 1)]
        assert report.truncated_bytes == 30
        assert mgr.get_log("t", 2).log_end_offset == 4
    finally:
        mgr.shutdown()


@pytest.mark.parametrize("summary", [
    b"", b"{", b"[]", b'{"version": 1}', b'{"version": 2, "logs": []}',
    b'{"version": 1, "logs": [["t", 0]]}',
    b'{"version": 1, "logs": [["t", 0, "not a uuid", 4, -1, 0, 10, 1, 10, null, null]]}',
    b'{"version": 1, "logs": [["t", "0", null, 4, -1, 0, 10, 1, 10, null, null]]}',
    b'{"version": 1, "logs": [["t", 0, null, -4, -1, 0, 10, 1, 10, null, null]]}',
    b'{"version": 1, "logs": [["t", 0, null, 4, -1, 9, 10, 1, 10, null, null]]}',
    b'{"version": 1, "logs": [["t", 0, "%s", 4, -1, 0, 10, 1, 10, null, null, 1]]}' % ID,
    b'{"version": 1, "logs": [["t", 0, "%s", 4, -1, 0, 10, 1, 10, null, null, true, 0]]}' % ID,
    b"\xff\xfe garbage",
])
def test_a_malformed_summary_opens_every_log(tmp_path, summary: bytes) -> None:
    log_dir = tmp_path / "logs"
    fill(log_dir)
    (log_dir / SUMMARY_FILE).write_bytes(summary)
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted())
    try:
        assert report.deferred == 0 and sorted(mgr.logs) == [("t", 0), ("t", 1), ("t", 2)]
        assert all(plog.log_end_offset == 4 for plog in mgr.logs.values())
    finally:
        mgr.shutdown()


def test_a_summary_naming_another_topic_id_is_not_trusted(tmp_path) -> None:
    """The topic was deleted and created again while the worker was down: the old directory is
    deleted (opened as before, never served from the summary)."""
    log_dir = tmp_path / "logs"
    fill(log_dir)
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted(topic_id=NEW_TOPIC_ID))
    try:
        assert report.deferred == 0 and sorted(report.deleted) == ["t-0", "t-1", "t-2"]
        assert mgr.get_or_create_log("t", 0, topic_id=NEW_TOPIC_ID).log_end_offset == 0
    finally:
        mgr.shutdown()


def test_deleting_a_never_opened_log_removes_its_directory(tmp_path) -> None:
    log_dir = tmp_path / "logs"
    fill(log_dir)
    mgr = LogManager(log_dir)
    mgr.startup(hosted=hosted())
    try:
        removed = mgr.remove_strays({("t", 0): HostedLog(TOPIC_ID, LogConfig()),
                                     ("t", 1): HostedLog(NEW_TOPIC_ID, LogConfig())})
        assert sorted(removed) == ["t-1", "t-2"] and mgr.logs == {}
        assert sorted(p.name for p in log_dir.iterdir() if p.is_dir()) == ["t-0"]
        assert "t 2" not in (log_dir / "recovery-point-offset-checkpoint").read_text()
    finally:
        mgr.shutdown()
    summary = json.loads((log_dir / SUMMARY_FILE).read_text())
    assert [e[:2] for e in summary["logs"]] == [["t", 0]]


def test_retention_opens_a_never_opened_log_only_when_its_oldest_segment_is_due(tmp_path) -> None:
    log_dir = tmp_path / "logs"
    fill(log_dir)
    week = LogConfig(retention_ms=7 * DAY)
    mgr = LogManager(log_dir)
    mgr.startup(hosted=hosted(config=week))
    try:
        newest = T0 + 3
        assert mgr.run_retention(now_ms=newest + 7 * DAY) == 0 and mgr.logs == {}
        mgr.deferred[("t", 2)].config = LogConfig(retention_ms=DAY)  # an AlterConfigs
        assert mgr.run_retention(now_ms=newest + 2 * DAY) == 1  # the active segment, rolled
        assert sorted(mgr.logs) == [("t", 2)]
        assert mgr.get_log("t", 2).log_start_offset == 4
        assert "t 2 4" in (log_dir / "log-start-offset-checkpoint").read_text()
        # Kafka's rule on the summary's figures (one segment of 4 batches, newest T0 + 3)
        d = mgr.deferred[("t", 0)]
        for config, now, due in ((LogConfig(retention_bytes=0), T0, True),
                                 (LogConfig(retention_bytes=d.size_in_bytes - 1), T0, False),
                                 (LogConfig(retention_ms=-1), T0 + 99 * DAY, False),
                                 (LogConfig(retention_ms=DAY), newest + DAY, False),
                                 (LogConfig(retention_ms=DAY), newest + DAY + 1, True),
                                 (LogConfig(cleanup_policy="compact", retention_ms=1),
                                  T0 + DAY, False)):
            d.config = config
            assert d.retention_due(now) == due, (config, now)
    finally:
        mgr.shutdown()


def test_truncating_a_never_opened_log_opens_it(tmp_path) -> None:
    log_dir = tmp_path / "logs"
    fill(log_dir)
    mgr = LogManager(log_dir)
    mgr.startup(hosted=hosted())
    try:
        mgr.truncate_to("t", 0, 2)
        assert mgr.get_log("t", 0).log_end_offset == 2
        assert "t 0 2" in (log_dir / "recovery-point-offset-checkpoint").read_text()
    finally:
        mgr.shutdown()


# -- mapped indexes of inactive segments are bounded ------------------------------------------------


def _mapped(directory) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if str(directory) in line)


def test_inactive_segments_index_mappings_are_bounded(tmp_path) -> None:
    """Reading every segment of a 30-40-segment log from its start with room for 4 mapped ones:
    at most 4 inactive segments keep their index files mapped (released ones map them again when
    read again), and every read answers as before."""
    from shmq.storage.index_mappings import INDEXES

    config = LogConfig(segment_bytes=300, index_interval_bytes=1)
    directory = tmp_path / "t-0"
    plog = PartitionLog.create(directory, config, topic_id=TOPIC_ID)
    for i in range(120):
        plog.append(kbatch([b"r%03d" % i], [T0 + i]))
    plog.close()
    assert len(list(directory.glob("*.log"))) >= 20
    saved = INDEXES.capacity
    INDEXES.configure(4)
    try:
        plog = PartitionLog.open(directory, config, clean_shutdown=True)
        plog.update_high_watermark(plog.log_end_offset)
        for _ in range(2):
            for offset in range(120):
                (s,) = plog.read(offset, 1 << 20, min_one_batch=True).slices
                mapped = [seg for seg in plog.segments[:-1] if seg._opened_indexes()]
                assert len(mapped) <= 4
                assert _mapped(directory) <= 2 * 4 + 2
            assert plog.fetch_offset_by_timestamp(T0 + 7).offset == 7
        assert [r[3] for r in all_records(directory)] == [b"r%03d" % i for i in range(120)]
        assert INDEXES.releases > 0
        plog.close()
    finally:
        INDEXES.configure(saved)
