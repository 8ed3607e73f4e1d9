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


# -- the logs a directory hosts: topic ids, strays, configs ------------------------------------

TOPIC_ID = "6f1c2e9a-3b7d-4c5e-8f90-123456789abc"
NEW_TOPIC_ID = "0b8d5f3c-1a2e-4d6f-9b7c-abcdef012345"


def hosted(**topics) -> dict:
    """{(topic, partition): HostedLog} from topic=(topic id, partitions[, LogConfig])."""
    from shmq.storage import HostedLog

    out = {}
    for name, spec in topics.items():
        topic_id, partitions, *config = spec
        for p in range(partitions):
            out[(name, p)] = HostedLog(topic_id, config[0] if config else LogConfig())
    return out


def test_partition_metadata_is_kafkas_file(tmp_path) -> None:
    """``version: 0`` / ``topic_id: <Uuid.toString()>``: 16 bytes, URL-safe base64, no padding."""
    import base64
    import uuid

    from shmq.storage.partition_metadata import kafka_uuid

    assert kafka_uuid("00000000-0000-0000-0000-000000000001") == "AAAAAAAAAAAAAAAAAAAAAQ"
    mgr = LogManager(tmp_path / "logs")
    mgr.startup()
    mgr.get_or_create_log("orders", 0, topic_id=TOPIC_ID)
    text = (tmp_path / "logs" / "orders-0" / "partition.metadata").read_text()
    want = base64.urlsafe_b64encode(uuid.UUID(TOPIC_ID).bytes).decode().rstrip("=")
    assert text == f"version: 0\ntopic_id: {want}"
    mgr.shutdown()


def test_startup_deletes_the_logs_of_topics_it_does_not_host(tmp_path) -> None:
    """Logs of deleted topics (not in the metadata any more) are removed at start, and so are
    those of a topic deleted and created again under the same name: another topic id."""
    log_dir = tmp_path / "logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    for topic, p in (("kept", 0), ("kept", 1), ("gone", 0), ("again", 0)):
        plog = mgr.get_or_create_log(topic, p, topic_id=TOPIC_ID)
        plog.append(kbatch([b"old data of %s-%d" % (topic.encode(), p)], [T0]))
    mgr.shutdown()
    mgr2 = LogManager(log_dir)
    report = mgr2.startup(hosted=hosted(kept=(TOPIC_ID, 2), again=(NEW_TOPIC_ID, 1)))
    try:
        assert sorted(report.deleted) == ["again-0", "gone-0"]
        assert sorted(mgr2.logs) == [("kept", 0), ("kept", 1)]
        assert sorted(p.name for p in log_dir.iterdir() if p.is_dir()) == ["kept-0", "kept-1"]
        assert mgr2.get_log("kept", 0).log_end_offset == 1
        again = mgr2.get_or_create_log("again", 0, topic_id=NEW_TOPIC_ID)
        assert (again.log_start_offset, again.log_end_offset) == (0, 0)
        assert all_records(log_dir / "again-0") == []
    finally:
        mgr2.shutdown()
    assert "gone" not in (log_dir / RP).read_text()


def test_a_directory_without_a_topic_id_is_adopted(tmp_path) -> None:
    """Written before shmq kept topic ids: the hosted topic takes it over (Kafka assigns the id
    to a log that has none) and the file is written."""
    log_dir = tmp_path / "logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    mgr.get_or_create_log("old", 0).append(kbatch([b"before ids"], [T0]))
    mgr.shutdown()
    assert not (log_dir / "old-0" / "partition.metadata").exists()
    mgr2 = LogManager(log_dir)
    report = mgr2.startup(hosted=hosted(old=(TOPIC_ID, 1)))
    try:
        assert report.deleted == () and mgr2.get_log("old", 0).log_end_offset == 1
        assert "topic_id: b" in (log_dir / "old-0" / "partition.metadata").read_text()
    finally:
        mgr2.shutdown()


def test_remove_strays_on_a_metadata_update(tmp_path) -> None:
    mgr = LogManager(tmp_path / "logs")
    mgr.startup(hosted={})
    mgr.get_or_create_log("t", 0, topic_id=TOPIC_ID).append(kbatch([b"x"], [T0]))
    mgr.get_or_create_log("u", 0, topic_id=TOPIC_ID)
    assert mgr.remove_strays(hosted(u=(TOPIC_ID, 1))) == ["t-0"]
    assert mgr.remove_strays(hosted(u=(NEW_TOPIC_ID, 1))) == ["u-0"]
    assert mgr.logs == {} and not [p for p in (tmp_path / "logs").iterdir() if p.is_dir()]
    mgr.shutdown()


def test_creating_a_log_over_an_old_topics_directory_starts_empty(tmp_path) -> None:
    log_dir = tmp_path / "logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    mgr.get_or_create_log("t", 0, topic_id=TOPIC_ID).append(kbatch([b"old"], [T0]))
    mgr.logs.clear()  # forgotten without deleting it, as a worker that was down missed it
    plog = mgr.get_or_create_log("t", 0, topic_id=NEW_TOPIC_ID)
    assert plog.log_end_offset == 0 and all_records(log_dir / "t-0") == []
    mgr.shutdown()


_DELETE_VICTIM = r"""
import os, signal, sys
from shmq.storage import HostedLog, LogConfig, LogManager

log_dir, kill_at = sys.argv[1], int(sys.argv[2])
mgr = LogManager(log_dir)
mgr.startup(hosted={("t", 0): HostedLog(sys.argv[3], LogConfig())})
calls = [0]

def counting(fn):
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash in the middle of the delete
        return fn(*args, **kwargs)
    return wrapper

for name in ("rename", "unlink", "rmdir"):
    setattr(os, name, counting(getattr(os, name)))
mgr.remove_strays({})  # the topic was deleted
print(calls[0])
"""


def test_a_crash_in_the_middle_of_a_delete_leaves_nothing_a_new_topic_picks_up(tmp_path) -> None:
    """A worker SIGKILLed at every step of deleting a log (before the rename to ``-delete``,
    after it, after each file removed): the next start removes what is left, and a topic
    created again under the name gets an empty log, never the old records."""
    import subprocess
    import sys

    pristine = tmp_path / "pristine"
    mgr = LogManager(pristine, LogConfig(segment_bytes=4096))
    mgr.startup()
    plog = mgr.get_or_create_log("t", 0, LogConfig(segment_bytes=4096), topic_id=TOPIC_ID)
    for i in range(30):
        plog.append(kbatch([b"old record %d " % i + b"x" * 300], [T0 + i]))
    mgr.shutdown()
    assert len(list((pristine / "t-0").glob("*.log"))) >= 3

    def run(kill_at: int, log_dir) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _DELETE_VICTIM, str(log_dir), str(kill_at),
                               TOPIC_ID], capture_output=True, text=True, timeout=60)

    import shutil

    shutil.copytree(pristine, tmp_path / "count")
    total = int(run(0, tmp_path / "count").stdout)  # no kill: how many steps there are
    assert total > 10
    # before the rename, right after it, after the first and second removals, halfway, last
    for kill_at in sorted({1, 2, 3, 4, total // 2, total}):
        log_dir = tmp_path / f"kill-{kill_at}"
        shutil.copytree(pristine, log_dir)
        done = run(kill_at, log_dir)
        assert done.returncode == -9, (kill_at, done.stderr)
        mgr = LogManager(log_dir)
        mgr.startup(hosted=hosted(t=(NEW_TOPIC_ID, 1)))  # the topic was created again
        try:
            plog = mgr.get_or_create_log("t", 0, topic_id=NEW_TOPIC_ID)
            assert plog.log_end_offset == 0, kill_at
            assert all_records(log_dir / "t-0") == [], kill_at
            assert sorted(p.name for p in log_dir.iterdir() if p.is_dir()) == ["t-0"], kill_at
        finally:
            mgr.shutdown()


def test_create_logs_makes_many_new_logs_at_once(tmp_path) -> None:
    """A CreateTopics' new partitions (``create_logs``, threads): each a whole new log with its
    topic id; a log held already is returned as it is, an earlier topic's directory is
    replaced through ``get_or_create_log``, and a bad name is returned as its error."""
    from shmq.storage import partition_metadata

    log_dir = tmp_path / "logs"
    mgr = LogManager(log_dir)
    mgr.startup()
    held = mgr.get_or_create_log("t", 0, topic_id=TOPIC_ID)
    old = mgr.get_or_create_log("t", 1, topic_id=NEW_TOPIC_ID)  # an earlier topic's
    old.append(kbatch([b"old"], [T0]))
    mgr.logs.pop(("t", 1))
    old.close()
    config = LogConfig(segment_bytes=1 << 20)
    made = mgr.create_logs([("t", p, config, TOPIC_ID) for p in range(40)]
                           + [("bad/name", 0, config, TOPIC_ID)])
    try:
        assert made[("t", 0)] is held
        assert isinstance(made[("bad/name", 0)], ConfigError)
        for p in range(40):
            plog = made[("t", p)]
            assert mgr.get_log("t", p) is plog and plog.log_end_offset == 0
            assert partition_metadata.read(log_dir / f"t-{p}") == plog.topic_id
            assert str(plog.topic_id) == TOPIC_ID
            assert plog.config.segment_bytes == (1 << 20 if p else LogConfig().segment_bytes)
        assert all_records(log_dir / "t-1") == []  # the earlier topic's records are gone
        assert sorted(os.listdir(log_dir / "t-5")) == ["00000000000000000000.log",
                                                       "partition.metadata"]
        assert mgr.logs[("t", 5)].append(kbatch([b"new"], [T0])).first_offset == 0
    finally:
        mgr.shutdown()
    assert [r[3] for r in all_records(log_dir / "t-5")] == [b"new"]
