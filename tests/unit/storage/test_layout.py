"""File and directory names (Kafka ``LogFileUtils``, ``UnifiedLog.parseTopicPartitionName``)."""

from __future__ import annotations

import pytest

from shmq.storage import layout


@pytest.mark.parametrize(
    ("offset", "name"),
    [
        (0, "00000000000000000000"),
        (1234, "00000000000000001234"),
        (10**19, "10000000000000000000"),
        (2**63 - 1, "09223372036854775807"),  # Long.MAX_VALUE still takes 20 digits
    ],
)
def test_filename_prefix_is_20_digits(offset: int, name: str) -> None:
    # LogFileUtils.filenamePrefixFromOffset: NumberFormat with minimumIntegerDigits = 20
    assert layout.filename_prefix(offset) == name
    assert len(layout.filename_prefix(offset)) == 20


def test_segment_paths(tmp_path) -> None:
    log, index, timeindex = layout.segment_paths(tmp_path, 42)
    assert log == tmp_path / "00000000000000000042.log"
    assert index == tmp_path / "00000000000000000042.index"
    assert timeindex == tmp_path / "00000000000000000042.timeindex"


@pytest.mark.parametrize(
    ("name", "offset"),
    [
        ("00000000000000000000.log", 0),
        ("00000000000000001234.index", 1234),
        ("00000000000000001234.timeindex", 1234),
        ("00000000000000001234.txnindex", 1234),
        ("00000000000000005678.snapshot", 5678),
        ("00000000000000001234.log.deleted", 1234),  # LogFileUtils.offsetFromFileName: up to '.'
        ("09223372036854775807.log", 2**63 - 1),
    ],
)
def test_offset_from_filename(name: str, offset: int) -> None:
    assert layout.offset_from_filename(name) == offset


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".log",
        "1234.log",                       # not zero-padded
        "0000000000000000001.log",        # 19 digits
        "000000000000000000001.log",      # 21 digits
        "0000000000000000123a.log",
        "-0000000000000000001.log",
        "leader-epoch-checkpoint",
        "partition.metadata",
        "0000000000000000000x",
    ],
)
def test_offset_from_filename_rejects(name: str) -> None:
    with pytest.raises(ValueError):
        layout.offset_from_filename(name)


def test_partition_dir_name_round_trip() -> None:
    for topic, partition in [("orders", 0), ("my-topic", 12), ("a.b_c-d", 7), ("t-1", 2)]:
        name = layout.partition_dir_name(topic, partition)
        assert name == f"{topic}-{partition}"
        assert layout.parse_partition_dir(name) == (topic, partition)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("orders-0", ("orders", 0)),
        ("my-topic-12", ("my-topic", 12)),           # the last dash separates the partition
        ("a.b_c-D-3", ("a.b_c-D", 3)),
        ("x" * 249 + "-0", ("x" * 249, 0)),          # Kafka's maximum topic name length
    ],
)
def test_parse_partition_dir_valid(name: str, expected: tuple[str, int]) -> None:
    assert layout.parse_partition_dir(name) == expected


@pytest.mark.parametrize(
    "name",
    [
        # directories of deleted topics (UnifiedLog.logDeleteDirName: <tp>.<uuid>-delete)
        "orders-0.6c1f2d1b0e2a4b5c8d7e9f0a1b2c3d4e-delete",
        "orders-0-delete",
        "orders-delete",
        # not partition directories
        "orders",
        "orders-",
        "-0",
        "orders-x",
        "orders-1a",
        "bad topic-0",
        "bad/topic-0",
        "tópico-0",
        "x" * 250 + "-0",
        ".hidden-0",
        "..-0",
        ".-0",
        "orders-0.abc-future",
        "recovery-point-offset-checkpoint",
    ],
)
def test_parse_partition_dir_rejects(name: str) -> None:
    assert layout.parse_partition_dir(name) is None


def test_temp_suffixes_and_file_names_match_kafka() -> None:
    assert layout.DELETED_SUFFIX == ".deleted"
    assert layout.CLEANED_SUFFIX == ".cleaned"
    assert layout.SWAP_SUFFIX == ".swap"
    assert layout.CLEAN_SHUTDOWN_FILE == ".kafka_cleanshutdown"
    assert layout.RECOVERY_POINT_CHECKPOINT == "recovery-point-offset-checkpoint"
    assert layout.LOG_START_OFFSET_CHECKPOINT == "log-start-offset-checkpoint"
    assert layout.LEADER_EPOCH_CHECKPOINT == "leader-epoch-checkpoint"
