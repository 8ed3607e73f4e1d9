"""The descriptor cache (issue 19): segment files open on demand, at most ``capacity`` at once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shmq.protocol.records import encode_batch
from shmq.storage import LogConfig
from shmq.storage.descriptors import CACHE
from shmq.storage.log import PartitionLog


def _read(log: PartitionLog, offset: int, max_bytes: int = 1 << 20) -> bytes:
    return b"".join(s.read() for s in log.read(offset, max_bytes).slices)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def small_cache() -> Iterator[None]:
    before = CACHE.capacity
    CACHE.configure(8)
    try:
        yield
    finally:
        CACHE.configure(before)


def test_many_segments_use_a_bounded_number_of_descriptors(tmp_path: Path,
                                                           small_cache: None) -> None:
    config = LogConfig(segment_bytes=200, segment_index_bytes=4096)
    log = PartitionLog.open(tmp_path / "t-0", config)
    values = [b"v%03d" % i + b"x" * 100 for i in range(60)]
    base_fds = _fds()
    for v in values:
        log.append(encode_batch([(None, v)]))
    assert len(log.segments) >= 50
    log.update_high_watermark(log.log_end_offset)
    assert _fds() - base_fds <= 8 + 1, "one descriptor per segment"
    # every segment is read (reopened on demand), the bound holds, the bytes are right
    for offset, v in enumerate(values):
        assert v in _read(log, offset)
        assert _fds() - base_fds <= 8 + 1
    assert len(CACHE) <= 8
    # a slice handed out keeps its file open after an eviction (a fetch in flight)
    held = log.read(0, 1 << 20).slices[0]
    for offset in range(10, 40):
        _read(log, offset, 100)
    assert not log.segments[0].has_descriptor  # evicted
    assert values[0] in held.read()
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", config, clean_shutdown=True)
    assert log.log_end_offset == 60
    log.update_high_watermark(60)
    assert values[59] in _read(log, 59)
    log.close()


def test_out_of_descriptors_at_reopen_shrinks_the_cache_and_retries(
        tmp_path: Path, small_cache: None) -> None:
    import resource

    config = LogConfig(segment_bytes=200, segment_index_bytes=4096)
    log = PartitionLog.open(tmp_path / "t-0", config)
    for i in range(20):
        log.append(encode_batch([(None, b"%03d" % i + b"y" * 100)]))
    log.update_high_watermark(log.log_end_offset)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # every descriptor but a few taken; the cache holds 8: a reopen must make room itself
    fillers: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (_fds() + 16, hard))
        try:
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        for offset in range(20):
            assert (b"%03d" % offset) in _read(log, offset)
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    log.close()
