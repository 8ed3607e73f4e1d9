"""The log directory as a whole (Kafka ``LogManager``, ``CleanShutdownFileHandler``)."""

from __future__ import annotations

import os
import stat

import pytest
from _storage_util import all_records, kbatch

from shmq.errors import ConfigError
from shmq.storage import LogConfig, LogManager
from shmq.storage.layout import segment_paths

RP = "recovery-point-offset-checkpoint"
LSO = "log-start-offset-checkpoint"
MARKER = ".kafka_cleanshutdown"
T0 = 1_700_000_000_000


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def populate(mgr: LogManager) -> dict[tuple[str, int], int]:
    sizes = {("orders", 0): 3, ("orders", 1): 1, ("events", 0): 5}
    for (topic, p), n in sizes.items():
        log = mgr.get_or_create_log(topic, p)
        for i in range(n):
            log.append(kbatch([b"%s-%d-%d" % (topic.encode(), p, i)], [T0 + i]))
        log.update_high_watermark(log.log_end_offset)
    return sizes


def test_startup_and_shutdown_write_kafka_checkpoints_and_marker(tmp_path) -> None:
    log_dir = tmp_path / "kafka-logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    assert not mgr.had_clean_shutdown
    assert (log_dir / RP).read_text() == "0\n0\n"
    assert (log_dir / LSO).read_text() == "0\n0\n"
    assert not (log_dir / MARKER).exists()
    populate(mgr)
    mgr.shutdown()
    # CheckpointFile format: version, count, "<topic> <partition> <offset>" lines
    assert (log_dir / RP).read_text() == "0\n3\nevents 0 5\norders 0 3\norders 1 1\n"
    assert (log_dir / LSO).read_text() == "0\n3\nevents 0 0\norders 0 0\norders 1 0\n"
    assert (log_dir / MARKER).exists()
    assert not list(log_dir.glob("*.tmp"))

    mgr2 = LogManager(log_dir)
    mgr2.startup()
    try:
        assert mgr2.had_clean_shutdown
        assert not (log_dir / MARKER).exists()  # from now on a crash must look like a crash
        assert sorted(mgr2.logs) == [("events", 0), ("orders", 0), ("orders", 1)]
        assert mgr2.get_log("events", 0).log_end_offset == 5
        assert mgr2.get_log("orders", 0).recovery_point == 3
        assert mgr2.get_log("nope", 0) is None
    finally:
        mgr2.shutdown()


def test_unclean_restart_recovers(tmp_path) -> None:
    log_dir = tmp_path / "kafka-logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    populate(mgr)
    mgr.checkpoint()
    log = mgr.get_log("orders", 0)
    log_path = log.active_segment.log_path
    size = os.path.getsize(log_path)
    for lg in mgr.logs.values():
        lg.crash_close()  # SIGKILL: no flush, no trim, no marker
    with open(log_path, "ab") as f:
        f.write(b"\x00" * 100 + b"torn batch")
    assert not (log_dir / MARKER).exists()

    mgr2 = LogManager(log_dir)
    mgr2.startup()
    try:
        assert not mgr2.had_clean_shutdown
        assert os.path.getsize(log_path) == size       # the torn tail was truncated
        assert mgr2.get_log("orders", 0).log_end_offset == 3
        assert mgr2.get_log("events", 0).log_end_offset == 5
        # the crashed active segment's preallocated index was rebuilt and trimmed
        info = mgr2.get_log("orders", 0).append(kbatch([b"after"]))
        assert info.first_offset == 3
    finally:
        mgr2.shutdown()
    assert [r[3] for r in all_records(log_dir / "orders-0")] == [
        b"orders-0-0", b"orders-0-1", b"orders-0-2", b"after"]


def test_log_start_offset_survives_restart(tmp_path) -> None:
    log_dir = tmp_path / "kafka-logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    populate(mgr)
    assert mgr.get_log("events", 0).delete_records_before(2) == 2
    mgr.shutdown()
    assert "events 0 2" in (log_dir / LSO).read_text().split("\n")
    mgr2 = LogManager(log_dir)
    mgr2.startup()
    try:
        log = mgr2.get_log("events", 0)
        assert log.log_start_offset == 2
        assert log.offset_for_timestamp(-2) == (2, -1)
    finally:
        mgr2.shutdown()


@pytest.mark.parametrize(
    "topic", ["bad name", "a/b", "", ".", "..", "x" * 250, "tópico", "tab\tname", "new\nline"])
def test_get_or_create_log_rejects_illegal_topic_names(tmp_path, topic: str) -> None:
    log_dir = tmp_path / "kafka-logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    try:
        with pytest.raises(ConfigError):
            mgr.get_or_create_log(topic, 0)
        assert mgr.logs == {}
        assert [p.name for p in log_dir.iterdir() if p.is_dir()] == []
    finally:
        mgr.shutdown()


def test_get_or_create_log_accepts_legal_names_and_is_idempotent(tmp_path) -> None:
    mgr = LogManager(tmp_path / "kafka-logs")
    mgr.startup()
    try:
        for topic in ["a.b_c-D", "x" * 249, "with-dash-1"]:
            log = mgr.get_or_create_log(topic, 3)
            assert log.directory.name == f"{topic}-3"
            assert mgr.get_or_create_log(topic, 3) is log
    finally:
        mgr.shutdown()


def test_delete_log_removes_the_directory(tmp_path) -> None:
    log_dir = tmp_path / "kafka-logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    populate(mgr)
    assert (log_dir / "orders-1").is_dir()
    mgr.delete_log("orders", 1)
    assert not (log_dir / "orders-1").exists()
    assert not [p for p in log_dir.iterdir() if p.name.endswith("-delete")]
    assert mgr.get_log("orders", 1) is None
    mgr.delete_log("orders", 1)  # unknown: no error
    mgr.shutdown()
    assert "orders 1" not in (log_dir / RP).read_text()
    mgr2 = LogManager(log_dir)
    mgr2.startup()
    try:
        assert sorted(mgr2.logs) == [("events", 0), ("orders", 0)]
    finally:
        mgr2.shutdown()


def test_startup_skips_strays_and_finishes_deletions(tmp_path) -> None:
    log_dir = tmp_path / "kafka-logs"
    log_dir.mkdir()
    half_deleted = log_dir / "gone-0.0123456789abcdef0123456789abcdef-delete"
    half_deleted.mkdir()
    (half_deleted / "00000000000000000000.log").write_bytes(b"")
    (log_dir / "not a partition").mkdir()
    (log_dir / "meta.properties").write_text("version=1\n")
    (log_dir / "stray-0").write_text("a file, not a directory")
    mgr = LogManager(log_dir)
    mgr.startup()
    try:
        assert mgr.logs == {}
        assert not half_deleted.exists()
        assert (log_dir / "not a partition").is_dir()
        assert (log_dir / "meta.properties").exists()
    finally:
        mgr.shutdown()


def test_directories_0700_and_files_0600(tmp_path) -> None:
    log_dir = tmp_path / "kafka-logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    populate(mgr)
    for log in mgr.logs.values():
        log.write_leader_epoch_checkpoint([(0, 0)])
    mgr.get_log("orders", 0).roll()
    mgr.shutdown()
    assert mode(log_dir) == 0o700
    seen_files = 0
    for root, dirs, files in os.walk(log_dir):
        for d in dirs:
            assert mode(os.path.join(root, d)) == 0o700, d
        for f in files:
            assert mode(os.path.join(root, f)) == 0o600, f
            seen_files += 1
    assert seen_files >= 3 + 3 * 4  # checkpoints, marker, segment files, epoch checkpoints


def test_run_retention_checkpoints_the_new_log_start(tmp_path) -> None:
    log_dir = tmp_path / "kafka-logs"
    cfg = LogConfig(retention_bytes=0, retention_ms=-1)
    mgr = LogManager(log_dir, cfg)
    mgr.startup()
    log = mgr.get_or_create_log("r", 0)
    for i in range(3):
        log.append(kbatch([b"x%d" % i], [T0]))
        log.roll()
    log.update_high_watermark(log.log_end_offset)
    assert mgr.run_retention(now_ms=T0) == 3
    assert (log_dir / LSO).read_text() == "0\n1\nr 0 3\n"
    assert not segment_paths(log.directory, 0)[0].exists()
    mgr.shutdown()


def test_topic_configs_apply_at_startup(tmp_path) -> None:
    log_dir = tmp_path / "kafka-logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    mgr.get_or_create_log("lat", 0)
    mgr.shutdown()
    mgr2 = LogManager(log_dir)
    mgr2.startup({"lat": LogConfig(message_timestamp_type="LogAppendTime")})
    try:
        info = mgr2.get_log("lat", 0).append(kbatch([b"a"], [T0]), now_ms=T0 + 99)
        assert info.log_append_time == T0 + 99
    finally:
        mgr2.shutdown()
