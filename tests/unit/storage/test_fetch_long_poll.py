"""The Fetch handler's long poll over many partitions, in process: a parked fetch costs one
future (not a task per partition), wakes on the append, answers what a fresh fetch answers, and
leaves nothing registered; a partition read at its bound answers what ``log.read`` answers.

librdkafka keeps no KIP-227 fetch session, so every Fetch names every partition it consumes:
the per-partition cost of parking is paid on every long poll."""

from __future__ import annotations

import asyncio
import os

import pytest
from _storage_util import kbatch

from shmq.broker.config import BrokerConfig
from shmq.broker.context import BrokerContext
from shmq.broker.handlers import fetch
from shmq.broker.metadata import ClusterMetadata, PartitionInfo, TopicInfo
from shmq.protocol.fetch_request import FetchPartition, FetchRequest, FetchTopic
from shmq.storage.log import LogConfig, PartitionLog

TOPIC = "many"


class _Logs:
    def __init__(self, logs: dict[tuple[str, int], PartitionLog]) -> None:
        self.logs = logs

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))


def _context(tmp_path, partitions: int) -> BrokerContext:
    info = TopicInfo(TOPIC, "00000000-0000-0000-0000-000000000001",
                     [PartitionInfo(i, 1, [1], [1]) for i in range(partitions)])
    logs = {(TOPIC, i): PartitionLog.open(tmp_path / f"{TOPIC}-{i}", LogConfig())
            for i in range(partitions)}
    for i in range(0, partitions, 7):  # some partitions hold data, most are empty
        logs[(TOPIC, i)].append(kbatch([b"a%d" % i, b"b%d" % i]), leader_epoch=0)
        logs[(TOPIC, i)].update_high_watermark(logs[(TOPIC, i)].log_end_offset)
    return BrokerContext(node_id=1, config=BrokerConfig(data_dir=tmp_path),
                         metadata=ClusterMetadata(cluster_id="x", topics={TOPIC: info}),
                         controller=None, logs=_Logs(logs))  # type: ignore[arg-type]


def _request(ctx: BrokerContext, max_wait_ms: int, committed: bool = False) -> FetchRequest:
    """Every partition at its high watermark (caught up), as librdkafka sends it (v11: no
    session, current leader epoch known)."""
    parts = [FetchPartition(i, 0, ctx.logs.logs[(TOPIC, i)].high_watermark, -1, -1, 1 << 20)
             for i in range(len(ctx.logs.logs))]
    return FetchRequest(-1, max_wait_ms, 1, 50 << 20, int(committed), 0, -1,
                        [FetchTopic(TOPIC, parts)], [], "")


def _bytes(pieces: list) -> bytes:
    out = bytearray()
    for piece in pieces:
        if isinstance(piece, (bytes, bytearray, memoryview)):
            out += piece
        else:
            out += os.pread(piece.fd, piece.length, piece.position)
    return bytes(out)


def _close(ctx: BrokerContext) -> None:
    for log in ctx.logs.logs.values():
        log.close()


@pytest.mark.parametrize("version", [11, 12])
def test_a_parked_fetch_of_many_partitions_is_one_future_and_wakes_on_append(tmp_path,
                                                                             version) -> None:
    ctx = _context(tmp_path, 300)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        request = _request(ctx, max_wait_ms=10_000)
        parked = asyncio.create_task(fetch.handle(ctx, request, version, 7))
        await asyncio.sleep(0.05)
        assert not parked.done()  # nothing to send: min_bytes 1 waits
        # the test and the handler; a wait() task per partition made it 300 more
        assert len(asyncio.all_tasks()) == 2
        assert len(ctx._fetch_waiters) == 300 and len(ctx._metadata_waiters) == 1
        log = ctx.logs.logs[(TOPIC, 299)]
        log.append(kbatch([b"late"]), leader_epoch=0)
        log.update_high_watermark(log.log_end_offset)
        woke = loop.time()
        ctx.notify_data(TOPIC, 299)
        answer = _bytes(await asyncio.wait_for(parked, 5))
        assert loop.time() - woke < 1
        assert ctx._fetch_waiters == {} and ctx._metadata_waiters == set()
        fresh = _bytes(await fetch.handle(ctx, request, version, 8))  # answered at once
        assert answer[:4] == fresh[:4] and answer[8:] == fresh[8:]  # all but the correlation id
        assert b"late" in answer

    try:
        asyncio.run(main())
    finally:
        _close(ctx)


def test_a_parked_fetch_answers_at_max_wait_and_unregisters(tmp_path) -> None:
    ctx = _context(tmp_path, 20)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        empty = _bytes(await fetch.handle(ctx, _request(ctx, max_wait_ms=150), 12, 1))
        assert 0.14 < loop.time() - started < 2
        assert ctx._fetch_waiters == {} and ctx._metadata_waiters == set()
        at_once = _bytes(await fetch.handle(ctx, _request(ctx, max_wait_ms=0), 12, 1))
        assert empty == at_once
        # an append to a partition nobody waits for wakes nobody and registers nothing
        ctx.notify_data(TOPIC, 3)
        assert ctx._fetch_waiters == {}

    try:
        asyncio.run(main())
    finally:
        _close(ctx)


def test_a_metadata_change_wakes_every_parked_fetch(tmp_path) -> None:
    ctx = _context(tmp_path, 10)

    async def main() -> None:
        parked = [asyncio.create_task(fetch.handle(ctx, _request(ctx, 10_000), 12, i))
                  for i in range(3)]
        await asyncio.sleep(0.05)
        assert len(ctx._metadata_waiters) == 3
        ctx.metadata.topics[TOPIC].partitions[4].leader_epoch = 1  # a new leader epoch
        ctx.wake_fetches()
        answers = await asyncio.wait_for(asyncio.gather(*parked), 5)
        assert len(answers) == 3
        assert ctx._fetch_waiters == {} and ctx._metadata_waiters == set()

    try:
        asyncio.run(main())
    finally:
        _close(ctx)


@pytest.mark.parametrize("committed", [False, True])
def test_reading_at_the_bound_answers_what_log_read_answers(tmp_path, committed) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    try:
        for i in range(5):
            log.append(kbatch([b"v%d" % i] * 3), leader_epoch=0)
        log.update_high_watermark(9)  # records 9..14 not yet replicated
        bound = log.last_stable_offset if committed else log.high_watermark
        for offset in range(0, log.log_end_offset + 1):
            p = FetchPartition(0, 0, offset, -1, -1, 1 << 20)
            code, slices, diverging = fetch._read_partition(log, p, 0, 1 << 20, bound, True)
            want = log.read(offset, 1 << 20, upper_bound=bound, min_one_batch=True).slices
            assert (code, diverging) == (0, None)
            assert [(s.position, s.length) for s in slices] == \
                [(s.position, s.length) for s in want], offset
    finally:
        log.close()
