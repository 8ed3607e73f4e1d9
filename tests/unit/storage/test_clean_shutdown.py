"""A clean shutdown makes its logs durable with one ``syncfs`` of their filesystem, in Kafka's
order (``LogManager``, "Clean shutdown"): no recovery point, recovery record, checkpoint or
marker vouches for a byte before that syncfs made it durable; a syncfs that fails, or a stop
killed before it, leaves an unclean shutdown that loses nothing acknowledged; and a start after
the new stop is still a clean one.  Also what a close no longer writes: the index files of a
log never written, a producer snapshot the log already has, a leader-epoch checkpoint that did
not change.

Real files; ``os.fsync``, ``os.fdatasync`` and ``disk.syncfs`` are wrapped to record each call
(the real call still runs); kafka-python's decoder reads the records back (``all_records``).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
from _storage_util import all_records, kbatch

from shmq.protocol.records import encode_batch
from shmq.storage import HostedLog, LogConfig, LogManager, checkpoint, disk, layout, recovery_point
from shmq.storage.log import PartitionLog

pytestmark = pytest.mark.skipif(not disk.HAVE_SYNCFS,
                                reason="needs syncfs(2) that reports errors (Linux >= 5.8)")

TOPIC_ID = "2b7c1d9e-4a5f-4e6d-9c8b-abcdef012345"
T0 = 1_700_000_000_000
PID = 7000
CFG = LogConfig(index_interval_bytes=1)  # an index entry per batch
MARKER = layout.CLEAN_SHUTDOWN_FILE
EMPTY = ["00000000000000000000.log", layout.PARTITION_METADATA]


def hosted(partitions: int) -> dict:
    return {("t", p): HostedLog(TOPIC_ID, CFG) for p in range(partitions)}


def started(log_dir: Path, partitions: int) -> LogManager:
    """A worker-style manager (logs a clean shutdown described are opened at first use)."""
    mgr = LogManager(log_dir)
    mgr.startup(hosted=hosted(partitions))
    return mgr


def write(mgr: LogManager, p: int, records: int = 3, *, start: int = 0, epoch: int = 0,
          flush: bool = False) -> None:
    """``records`` records into t-``p``, acknowledged as acks=1 (page cache only) unless
    ``flush`` (acks=all)."""
    plog = mgr.get_or_create_log("t", p, CFG, topic_id=TOPIC_ID)
    for i in range(start, start + records):
        plog.append(kbatch([b"t%d-%d" % (p, i)], [T0 + i]), leader_epoch=epoch)
    if flush:
        plog.flush()
    plog.update_high_watermark(plog.log_end_offset)


def values(directory: Path) -> list[tuple[int, bytes | None]]:
    return [(r[0], r[3]) for r in all_records(directory)]


def expected(p: int, n: int) -> list[tuple[int, bytes]]:
    return [(i, b"t%d-%d" % (p, i)) for i in range(n)]


@pytest.fixture
def syncs(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync, fdatasync and syncfs from now on, in order: (call, path of the descriptor)."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_fdatasync, real_syncfs = os.fsync, os.fdatasync, disk.syncfs

    def named(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def fsync(fd: int) -> None:
        calls.append(("fsync", named(fd)))
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        calls.append(("fdatasync", named(fd)))
        real_fdatasync(fd)

    def syncfs(fd: int, *, slowed: bool = False) -> None:
        calls.append(("syncfs", named(fd)))
        real_syncfs(fd, slowed=slowed)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(disk, "syncfs", syncfs)
    return calls


def test_a_clean_stop_syncs_the_filesystem_once_then_vouches_for_the_logs(
        tmp_path, syncs, monkeypatch, caplog) -> None:
    log_dir = tmp_path / "logs"
    mgr = started(log_dir, 30)
    for p in range(20):
        write(mgr, p)  # acks=1: nothing fsynced yet
    for p in range(20, 30):
        mgr.get_or_create_log("t", p, CFG, topic_id=TOPIC_ID)  # created, never written
    seen_at_syncfs: list[tuple[bool, dict, list]] = []
    recorded = syncs  # the fixture's wrapper runs the real syncfs after this check
    wrapped = disk.syncfs

    def checked(fd: int, *, slowed: bool = False) -> None:
        # at the syncfs nothing on disk vouches for the unsynced bytes yet
        seen_at_syncfs.append((
            (log_dir / MARKER).exists(),
            checkpoint.read_offsets(log_dir / layout.RECOVERY_POINT_CHECKPOINT),
            [recovery_point.read(log_dir / f"t-{p}") for p in range(30)]))
        wrapped(fd, slowed=slowed)

    monkeypatch.setattr(disk, "syncfs", checked)
    truncated: list[int] = []
    real_ftruncate = os.ftruncate
    monkeypatch.setattr(os, "ftruncate", lambda fd, n: (truncated.append(n),
                                                        real_ftruncate(fd, n))[1])
    recorded.clear()
    mgr.shutdown()
    monkeypatch.setattr(os, "ftruncate", real_ftruncate)
    # one syncfs, first; after it only the checkpoints', the summary's and the marker's own
    # fsyncs (each file and the directory): none per log (there were three to five each)
    assert [c for c, _ in recorded].count("syncfs") == 1 and recorded[0][0] == "syncfs"
    assert Path(recorded[0][1]) == log_dir
    assert {Path(path).name for _, path in recorded[1:]} <= {
        "logs", f"{layout.RECOVERY_POINT_CHECKPOINT}.tmp",
        f"{layout.LOG_START_OFFSET_CHECKPOINT}.tmp", "shmq-log-summary.tmp", f"{MARKER}.tmp"}
    assert len(recorded) <= 1 + 4 * 2
    # the deferred index files were written at their valid size: nothing preallocated, nothing
    # cut back
    assert truncated == []
    ((marker, checkpointed, records),) = seen_at_syncfs
    assert not marker and all(checkpointed.get(("t", p), 0) == 0 for p in range(30))
    assert records == [None] * 30  # no log was ever flushed: no record at all
    # after it: the records and the checkpoint name each log's end, the marker is there
    assert (log_dir / MARKER).exists()
    checkpointed = checkpoint.read_offsets(log_dir / layout.RECOVERY_POINT_CHECKPOINT)
    for p in range(20):
        assert checkpointed[("t", p)] == 3 and recovery_point.read(log_dir / f"t-{p}").offset == 3
        assert values(log_dir / f"t-{p}") == expected(p, 3)
        assert checkpoint.read_leader_epochs(log_dir / f"t-{p}" / layout.LEADER_EPOCH_CHECKPOINT) \
            == [(0, 0)]
    for p in range(20, 30):  # a log never written: no index file, snapshot or record
        assert sorted(os.listdir(log_dir / f"t-{p}")) == EMPTY
    # the next start is a clean one: every log left to open at first use, opened without
    # recovery, index rebuilds or warnings, and appends go on
    mgr = started(log_dir, 30)
    try:
        assert mgr.had_clean_shutdown and len(mgr.deferred) == 30 and mgr.logs == {}
        with caplog.at_level(logging.WARNING, logger="shmq"):
            for p in range(30):
                plog = mgr.get_log("t", p)
                assert plog.load_summary.validated_bytes == 0
                assert plog.load_summary.rebuilt_segments == 0
                n = 3 if p < 20 else 0
                assert (plog.log_end_offset, plog.recovery_point) == (n, n)
                assert plog.read(0, 1 << 20).size == (0 if p >= 20 else
                                                       os.path.getsize(
                                                           log_dir / f"t-{p}" / EMPTY[0]))
                write(mgr, p, 1, start=n, flush=True)
        assert caplog.records == []
    finally:
        mgr.shutdown()
    for p in range(30):
        n = 3 if p < 20 else 0
        assert values(log_dir / f"t-{p}") == expected(p, n) + [(n, b"t%d-%d" % (p, n))]
        assert (log_dir / f"t-{p}" / "00000000000000000000.index").exists()


def test_a_failed_syncfs_leaves_an_unclean_stop_that_loses_nothing(
        tmp_path, monkeypatch, caplog) -> None:
    log_dir = tmp_path / "logs"
    mgr = started(log_dir, 4)
    write(mgr, 0)
    write(mgr, 1)
    write(mgr, 2, flush=True)  # acks=all: its record names its end
    mgr.get_or_create_log("t", 3, CFG, topic_id=TOPIC_ID)
    real = disk.syncfs

    def failing(fd: int, *, slowed: bool = False) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(disk, "syncfs", failing)
    with caplog.at_level(logging.ERROR, logger="shmq"):
        mgr.shutdown()
    assert "syncfs of" in caplog.text and "the next start recovers the logs" in caplog.text
    # nothing moved: no marker, the checkpoint and the records as the last fsync left them
    assert not (log_dir / MARKER).exists()
    checkpointed = checkpoint.read_offsets(log_dir / layout.RECOVERY_POINT_CHECKPOINT)
    assert (checkpointed[("t", 0)], checkpointed[("t", 2)]) == (0, 3)
    assert recovery_point.read(log_dir / "t-0") is None
    assert recovery_point.read(log_dir / "t-2").offset == 3
    monkeypatch.setattr(disk, "syncfs", real)
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted(4))
    try:
        # the logs with bytes after their recovery points are recovered, the others deferred
        assert not report.clean and sorted(mgr.logs) == [("t", 0), ("t", 1)]
        assert sorted(mgr.deferred) == [("t", 2), ("t", 3)]
        assert report.truncated_bytes == 0
        for p in range(3):
            assert mgr.get_log("t", p).log_end_offset == 3
    finally:
        mgr.shutdown()
    for p in range(3):
        assert values(log_dir / f"t-{p}") == expected(p, 3)


_KILLED_IN_ITS_STOP = r"""
import os, signal, sys
from shmq.protocol.records import encode_batch
from shmq.storage import HostedLog, LogConfig, LogManager, disk

log_dir, topic_id, t0 = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = LogConfig(index_interval_bytes=1)
mgr = LogManager(log_dir)
mgr.startup(hosted={("t", 0): HostedLog(topic_id, config)})
plog = mgr.get_or_create_log("t", 0, config, topic_id=topic_id)
for i in range(5):
    plog.append(encode_batch([(None, b"t0-%d" % i, t0 + i)]), leader_epoch=0 if i < 3 else 1)
    if i == 2:
        plog.flush()        # acks=all for the first three records
        mgr.checkpoint()    # the worker's periodic checkpoint
# the last two: acks=1, in a new leader epoch (the epoch checkpoint changes at the close)
disk.syncfs = lambda fd, slowed=False: os.kill(os.getpid(), signal.SIGKILL)
mgr.shutdown()
"""


def test_a_stop_killed_before_its_syncfs_is_recovered_and_resynced(tmp_path, syncs) -> None:
    """A worker SIGKILLed in its clean stop, after every log's close and before the syncfs:
    the next start is an unclean one and loses nothing, and the files the killed stop wrote
    (read back from the page cache, never fsynced) are fsynced by the first flush."""
    import subprocess
    import sys

    log_dir = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-c", _KILLED_IN_ITS_STOP, str(log_dir), TOPIC_ID,
                           str(T0)], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    # every close wrote its files, none was synced; no record or checkpoint moved, no marker
    directory = log_dir / "t-0"
    assert not (log_dir / MARKER).exists()
    assert recovery_point.read(directory).offset == 3
    assert checkpoint.read_offsets(log_dir / layout.RECOVERY_POINT_CHECKPOINT)[("t", 0)] == 3
    assert checkpoint.read_leader_epochs(directory / layout.LEADER_EPOCH_CHECKPOINT) == [
        (0, 0), (1, 3)]
    mgr = LogManager(log_dir)
    report = mgr.startup(hosted=hosted(1))
    try:
        assert not report.clean and report.validated_bytes > 0 and report.truncated_bytes == 0
        plog = mgr.get_log("t", 0)
        assert (plog.log_end_offset, plog.recovery_point) == (5, 3)
        assert plog.epoch_entries == [(0, 0), (1, 3)]
        # what was read from the page cache is fsynced by the first flush, before its
        # recovery point counts on it; once
        syncs.clear()
        write(mgr, 0, 1, start=5, epoch=1, flush=True)
        synced = {Path(path).name for _, path in syncs}
        assert {layout.LEADER_EPOCH_CHECKPOINT, layout.PARTITION_METADATA} <= synced
        syncs.clear()
        write(mgr, 0, 1, start=6, epoch=1, flush=True)
        assert {Path(path).name for _, path in syncs} == {"00000000000000000000.log"}
    finally:
        mgr.shutdown()
    assert values(directory) == expected(0, 7)


def test_an_unchanged_leader_epoch_checkpoint_is_not_written_again(tmp_path) -> None:
    plog = PartitionLog.create(tmp_path / "t-0", CFG)
    plog.append(kbatch([b"a"]), leader_epoch=0)
    plog.flush()
    path = tmp_path / "t-0" / layout.LEADER_EPOCH_CHECKPOINT
    inode = path.stat().st_ino
    plog.write_leader_epoch_checkpoint([(0, 0)])  # the same entries: the file stays
    assert path.stat().st_ino == inode
    plog.write_leader_epoch_checkpoint([(0, 0), (2, 1)])
    assert path.stat().st_ino != inode
    assert checkpoint.read_leader_epochs(path) == [(0, 0), (2, 1)]
    plog.close()


def test_a_close_takes_no_producer_snapshot_the_log_already_has(tmp_path) -> None:
    directory = tmp_path / "t-0"
    plog = PartitionLog.create(directory, CFG)
    plog.close()
    assert sorted(os.listdir(directory)) == ["00000000000000000000.log"]  # empty: no snapshot
    plog = PartitionLog.open(directory, CFG, clean_shutdown=True)
    for seq in (0, 1):
        plog.append(bytes(encode_batch([(b"k", b"v%d" % seq)], producer_id=PID, producer_epoch=0,
                                       base_sequence=seq)))
    plog.close()
    snapshot = directory / "00000000000000000002.snapshot"
    inode = snapshot.stat().st_ino
    plog = PartitionLog.open(directory, CFG, clean_shutdown=True)
    plog.close()  # nothing appended since it was loaded: the snapshot at the LEO holds
    assert snapshot.stat().st_ino == inode
    assert sorted(p.name for p in directory.glob("*.snapshot")) == [snapshot.name]
    plog = PartitionLog.open(directory, CFG, clean_shutdown=True)
    try:
        assert plog.producer_state.last_entry(PID).last_seq == 1
        info = plog.append(bytes(encode_batch([(b"k", b"v1")], producer_id=PID,
                                              producer_epoch=0, base_sequence=1)))
        assert info.first_offset == 1  # the duplicate is answered with its original offset
    finally:
        plog.close()


def test_a_log_never_written_closes_without_files_and_opens_as_new(tmp_path, caplog) -> None:
    """Opened at start (no summary: a storage tool's manager), not only at first use."""
    log_dir = tmp_path / "logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    plog = mgr.get_or_create_log("t", 0, CFG, topic_id=TOPIC_ID)
    assert plog.read(0, 1 << 20).size == 0  # a lookup makes its (deferred) indexes
    mgr.shutdown()
    assert sorted(os.listdir(log_dir / "t-0")) == EMPTY
    mgr = LogManager(log_dir)
    with caplog.at_level(logging.WARNING, logger="shmq"):
        report = mgr.startup()
    try:
        assert report.clean and report.rebuilt_segments == 0 and caplog.records == []
        assert sorted(os.listdir(log_dir / "t-0")) == EMPTY
        plog = mgr.get_log("t", 0)
        assert plog.append(kbatch([b"first"], [T0])).first_offset == 0
        assert plog.fetch_offset_by_timestamp(T0).offset == 0
    finally:
        mgr.shutdown()
    assert values(log_dir / "t-0") == [(0, b"first")]
