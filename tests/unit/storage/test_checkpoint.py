"""Checkpoint files in Kafka's text format (``CheckpointFile``, ``LeaderEpochCheckpointFile``)."""

from __future__ import annotations

import os
import stat

import pytest

from shmq.storage import checkpoint


def test_offsets_exact_kafka_text(tmp_path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    checkpoint.write_offsets(path, {("orders", 1): 17, ("events", 0): 9, ("orders", 0): 42})
    text = path.read_text()
    # CheckpointFile: version line, entry-count line, one "<topic> <partition> <offset>" per line
    lines = text.split("\n")
    assert text.endswith("\n")
    assert lines[0] == "0"
    assert lines[1] == "3"
    assert sorted(lines[2:5]) == ["events 0 9", "orders 0 42", "orders 1 17"]
    assert lines[5:] == [""]
    # shmq writes them sorted, which makes the file deterministic
    assert text == "0\n3\nevents 0 9\norders 0 42\norders 1 17\n"


def test_offsets_empty_file_format(tmp_path) -> None:
    path = tmp_path / "log-start-offset-checkpoint"
    checkpoint.write_offsets(path, {})
    assert path.read_text() == "0\n0\n"
    assert checkpoint.read_offsets(path) == {}


def test_offsets_round_trip(tmp_path) -> None:
    path = tmp_path / "cp"
    offsets = {(f"topic.{i % 7}-x_{i}", i % 5): i * 1_000_003 for i in range(200)}
    offsets[("big", 0)] = 2**63 - 1
    checkpoint.write_offsets(path, offsets)
    assert checkpoint.read_offsets(path) == offsets


def test_offsets_reads_kafka_written_file(tmp_path) -> None:
    # a file as Kafka's CheckpointFile writes it (insertion order, "\n" line endings)
    path = tmp_path / "replication-offset-checkpoint"
    path.write_text("0\n2\nb 3 100\na 0 7\n")
    assert checkpoint.read_offsets(path) == {("b", 3): 100, ("a", 0): 7}


def test_overwrite_replaces_atomically_and_leaves_no_tmp(tmp_path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    checkpoint.write_offsets(path, {("a", 0): 1})
    inode_before = os.stat(path).st_ino
    checkpoint.write_offsets(path, {("a", 0): 2, ("b", 1): 3})
    assert checkpoint.read_offsets(path) == {("a", 0): 2, ("b", 1): 3}
    # the new file was renamed over the old one (a new inode), and no temporary file remains
    assert os.stat(path).st_ino != inode_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recovery-point-offset-checkpoint"]


def test_file_mode_is_0600(tmp_path) -> None:
    path = tmp_path / "cp"
    checkpoint.write_offsets(path, {("a", 0): 1})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    epochs = tmp_path / "leader-epoch-checkpoint"
    checkpoint.write_leader_epochs(epochs, [(0, 0)])
    assert stat.S_IMODE(os.stat(epochs).st_mode) == 0o600


def test_missing_file_reads_as_empty(tmp_path) -> None:
    assert checkpoint.read_offsets(tmp_path / "nope") == {}
    assert checkpoint.read_leader_epochs(tmp_path / "nope") is None


BAD_OFFSET_FILES = [
    "",                                  # empty
    "0",                                 # no count line
    "0\n",                               # count missing
    "1\n1\na 0 5\n",                     # wrong version
    "x\n1\na 0 5\n",                     # non-numeric version
    "0\nx\na 0 5\n",                     # non-numeric count
    "0\n2\na 0 5\n",                     # truncated: fewer entries than the count
    "0\n2\na 0 5",                       # truncated mid-file
    "0\n1\na 0\n",                       # too few fields
    "0\n1\na 0 5 6\n",                   # too many fields
    "0\n1\na x 5\n",                     # non-numeric partition
    "0\n1\na 0 five\n",                  # non-numeric offset
    "0\n-1\n",                           # negative count
    "\x00\x00\x00\x00\x00\x00",          # zero-filled (a torn write on some filesystems)
]


@pytest.mark.parametrize("text", BAD_OFFSET_FILES)
def test_malformed_offsets_read_as_empty(tmp_path, text: str) -> None:
    path = tmp_path / "cp"
    path.write_text(text)
    assert checkpoint.read_offsets(path) == {}


def test_non_utf8_offsets_read_as_empty(tmp_path) -> None:
    path = tmp_path / "cp"
    path.write_bytes(b"0\n1\n\xff\xfe 0 5\n")
    assert checkpoint.read_offsets(path) == {}


def test_leader_epochs_exact_format_and_round_trip(tmp_path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    entries = [(0, 0), (3, 120), (7, 5000)]
    checkpoint.write_leader_epochs(path, entries)
    # LeaderEpochCheckpointFile: "<epoch> <startOffset>" entries, in order
    assert path.read_text() == "0\n3\n0 0\n3 120\n7 5000\n"
    assert checkpoint.read_leader_epochs(path) == entries
    checkpoint.write_leader_epochs(path, [])
    assert path.read_text() == "0\n0\n"
    assert checkpoint.read_leader_epochs(path) == []
    assert not (tmp_path / "leader-epoch-checkpoint.tmp").exists()


@pytest.mark.parametrize(
    "text",
    ["", "0\n", "1\n1\n0 0\n", "0\n2\n0 0\n", "0\n1\n0\n", "0\n1\n0 0 0\n", "0\n1\nx 0\n",
     "0\n1\n0 y\n", "0\nz\n"],
)
def test_malformed_leader_epochs_read_as_none(tmp_path, text: str) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text(text)
    assert checkpoint.read_leader_epochs(path) is None


def test_write_atomically_fsyncs_a_complete_file(tmp_path) -> None:
    path = tmp_path / "marker"
    checkpoint.write_atomically(path, "hello\n")
    assert path.read_text() == "hello\n"
    checkpoint.write_atomically(path, "x")
    assert path.read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["marker"]
