"""``__consumer_offsets`` as a topic: the partition count, Kafka's placement of groups, and the
placement of a log written before the topic was registered (the single-partition layout of
earlier shmq versions), including a crash in the middle of it."""

from __future__ import annotations

import asyncio
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from shmq.coordinator import records as rec
from shmq.coordinator.coordinator import CoordinatorConfig, GroupCoordinator
from shmq.coordinator.offsets_log import TOPIC, OffsetsLog
from shmq.storage.log import PartitionLog

TOPICS = {"t": 4, "u": 2}
SUB = struct.pack(">hih", 0, 1, 1) + b"t" + struct.pack(">i", -1)  # ConsumerProtocolSubscription


def make(tmp_path: Path, partitions: int, registered: int | None) -> GroupCoordinator:
    config = CoordinatorConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=10,
                               offsets_partitions=partitions)
    c = GroupCoordinator(tmp_path / "controller", config, TOPICS.get,
                         registered_partitions=registered)
    c.load()
    return c


def state(c: GroupCoordinator) -> dict[str, Any]:
    """Everything a reload must keep: offsets with metadata, and the persisted group records."""
    return {g.group_id: (sorted((tp, (o.offset, o.leader_epoch, o.metadata, o.commit_timestamp))
                                for tp, o in g.offsets.items()),
                         g.generation, g.protocol_type, g.protocol_name, g.leader_id,
                         sorted(g.members))
            for g in c.groups.values()}


def keys_by_partition(directory: Path) -> dict[int, set[str]]:
    """The group of every record in each partition log on disk (read with a fresh OffsetsLog)."""
    olog = OffsetsLog(directory, 1000, 1 << 20, 1 << 20)
    try:
        return {p: {rec.group_of(k) for k, _ in olog.replay(p)} for p in sorted(olog.logs)}
    finally:
        olog.close()


async def legacy_layout(tmp_path: Path) -> dict[str, Any]:
    """What a broker before the topic was listed left: one partition, every kind of record
    (a group with members and a generation, simple groups, overwritten offsets, an offset
    deleted, a group deleted), closed cleanly."""
    c = make(tmp_path, 1, 1)
    first = await c.join_group("live", "", None, "client", "/127.0.0.1", 10_000, 10_000,
                               "consumer", [("range", SUB)], 5)
    joined = await c.join_group("live", first.member_id, None, "client", "/127.0.0.1", 10_000,
                                10_000, "consumer", [("range", SUB)], 5)
    await c.sync_group("live", joined.generation, joined.member_id, None, None, None,
                       {joined.member_id: b"assignment"})
    assert await c.commit_offsets("live", joined.generation, joined.member_id, None,
                                  [("t", [(0, 600, 3, "m"), (1, 1000, -1, "")])], 8) == [[0, 0]]
    for i in range(40):
        assert await c.commit_offsets(f"simple-{i}", -1, "", None,
                                      [("t", [(i % 4, i, -1, f"md{i}")]), ("u", [(1, 7, -1, "")])],
                                      8) == [[0], [0]]
    assert await c.commit_offsets("simple-3", -1, "", None, [("t", [(3, 333, -1, "")])], 8) == [[0]]
    assert await c.delete_offsets("simple-4", [("u", [1])]) == (0, [("u", [(1, 0)])])
    assert await c.delete_groups(["simple-5"]) == [0]
    before = state(c)
    c.close()
    assert sorted(p.name for p in (tmp_path / "controller").glob(f"{TOPIC}-*")) == [f"{TOPIC}-0"]
    return before


def test_an_unregistered_single_partition_layout_is_placed_losing_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        before = await legacy_layout(tmp_path)
        c = make(tmp_path, 50, None)  # upgraded: the topic is not registered yet
        assert c.log.partitions == 50
        assert state(c) == before
        assert "simple-5" not in before and ("u", 1) not in dict(before["simple-4"][0])
        assert len(before) == 40  # live + 39 simple groups
        # a commit after the upgrade goes to the group's partition among 50
        assert await c.commit_offsets("simple-7", -1, "", None, [("t", [(3, 77, -1, "")])],
                                      8) == [[0]]
        after = state(c)
        c.close()
        # every record now lives in its group's partition, and only there
        for p, groups in keys_by_partition(tmp_path / "controller").items():
            assert all(rec.partition_for(g, 50) == p for g in groups), (p, groups)
        again = make(tmp_path, 50, 50)  # registered: nothing is placed again
        assert state(again) == after
        again.close()

    asyncio.run(main())


@pytest.mark.parametrize("crash_at", ["flush-1", "flush-5", "delete-1", "delete-all"])
def test_a_crash_while_placing_loses_nothing(tmp_path: Path, crash_at: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL in the middle of the placement (after some copies are fsynced, or after some old
    records were dropped): the next start places again and has every offset."""

    async def main() -> None:
        before = await legacy_layout(tmp_path)
        olog = OffsetsLog(tmp_path / "controller", 50, 1 << 20, 1 << 20)  # placed: as opened
        kind, _, when = crash_at.partition("-")
        calls = [0]
        method = "flush" if kind == "flush" else "delete_records_before"
        original = getattr(PartitionLog, method)

        def crashing(self: PartitionLog, *args: Any, **kw: Any) -> Any:
            result = original(self, *args, **kw)
            calls[0] += 1
            if when != "all" and calls[0] == int(when):
                raise KeyboardInterrupt("crash")
            return result

        monkeypatch.setattr(PartitionLog, method, crashing)
        if when == "all":
            olog.place()
        else:
            with pytest.raises(KeyboardInterrupt):
                olog.place()
        monkeypatch.undo()
        for plog in olog.manager.logs.values():
            plog.crash_close()  # no flush, no trim, no clean-shutdown marker
        c = make(tmp_path, 50, None)  # still unregistered: placed again
        assert state(c) == before
        c.close()
        for p, groups in keys_by_partition(tmp_path / "controller").items():
            assert all(rec.partition_for(g, 50) == p for g in groups), (p, groups)

    asyncio.run(main())


def test_a_registered_count_is_fixed_and_partitions_are_created_when_used(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path, 50, 50)
        assert c.log.logs == {}  # nothing created before it is written or read
        assert await c.commit_offsets("g", -1, "", None, [("t", [(0, 1, -1, "")])], 8) == [[0]]
        p = rec.partition_for("g", 50)
        assert sorted(c.log.logs) == [p]
        # the batch carries the leader epoch Metadata gives the partition (0), as in Kafka
        segment = next((tmp_path / "controller" / f"{TOPIC}-{p}").glob("*.log")).read_bytes()
        assert struct.unpack_from(">qii", segment, 0)[2] == 0  # partitionLeaderEpoch
        assert c.log.log(p).end_offset_for_epoch(0, 0) == (0, c.log.log(p).log_end_offset)
        assert c.log.log(49).log_end_offset == 0 and sorted(c.log.logs) == sorted({p, 49})
        with pytest.raises(IndexError):
            c.log.log(50)
        c.close()
        again = make(tmp_path, 7, 50)  # offsets.topic.num.partitions changed: ignored
        assert again.log.partitions == 50 and again.fetch_offsets(
            "g", [("t", [0])], False)[1][0][1][0].offset == 1
        again.close()

    asyncio.run(main())


def test_prepare_creates_every_partition_while_groups_commit(tmp_path: Path) -> None:
    """Kafka creates every partition with the topic; ``prepare`` does it in a thread while the
    event loop creates the ones it needs first, each once, each with epoch 0 checkpointed."""

    async def main() -> None:
        c = make(tmp_path, 50, 50)
        preparer = threading.Thread(target=c.log.prepare)
        preparer.start()
        for i in range(40):
            assert await c.commit_offsets(f"g{i}", -1, "", None, [("t", [(0, i, -1, "")])],
                                          8) == [[0]]
        preparer.join(60)
        assert sorted(c.log.logs) == list(range(50))
        assert c.log.prepare() == 0  # nothing left to create
        for p in range(50):
            text = (tmp_path / "controller" / f"{TOPIC}-{p}" / "leader-epoch-checkpoint").read_text()
            assert text.split("\n")[2] == "0 0", (p, text)
        before = state(c)
        c.close()
        again = make(tmp_path, 50, 50)
        assert state(again) == before and len(before) == 40
        again.close()

    asyncio.run(main())


def test_close_stops_prepare(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path, 50, 50)
        done: list[int] = []
        preparer = threading.Thread(target=lambda: done.append(c.log.prepare()))
        preparer.start()
        c.close()  # waits for a creation under way, then prepare stops
        preparer.join(60)
        created = len(list((tmp_path / "controller").glob(f"{TOPIC}-*")))
        assert done == [created]
        again = make(tmp_path, 50, 50)  # whatever was created opens cleanly
        assert again.log.prepare() == 50 - created
        again.close()

    asyncio.run(main())


def test_kafka_placement_of_groups() -> None:
    """``Utils.abs(groupId.hashCode()) % 50``: the hashes printed by Java 17's jshell."""
    assert rec.java_string_hash("console-consumer-1") == 35782224
    assert rec.java_string_hash("my-group") == -1906497762
    assert rec.java_string_hash("grüße-€") == 426799350
    assert rec.java_string_hash("") == 0
    assert rec.java_string_hash("polygenelubricants") == -2147483648  # Integer.MIN_VALUE
    assert rec.partition_for("polygenelubricants", 50) == 0           # Utils.abs(MIN) = 0
    assert rec.partition_for("my-group", 50) == 1906497762 % 50 == 12
    assert rec.group_of(rec.offset_commit_key("g1", "t", 0)) == "g1"
    assert rec.group_of(rec.group_metadata_key("g2")) == "g2"


def test_recovery_point_catches_up_after_the_commits_stop(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit's flush moves the durable offset only; once the commits stop, the recovery point
    (what an unclean start of the controller validates from) catches up a checkpoint interval
    later, as a worker's timer does for its logs."""
    from shmq.coordinator import offsets_log

    monkeypatch.setattr(offsets_log, "CHECKPOINT_INTERVAL_MS", 200)
    monkeypatch.setattr("shmq.storage.log.CHECKPOINT_INTERVAL_MS", 200)

    async def run() -> tuple[int, int, int]:
        olog = OffsetsLog(tmp_path / "controller", 1, 1 << 20, 1 << 20)
        try:
            plog = olog.log(0)
            await olog.durable(0, olog.append(0, [(b"k", b"v")]))
            end = olog.append(0, [(b"k", b"w")])  # just after: no checkpoint due
            await olog.durable(0, end)
            behind = plog.recovery_point
            await asyncio.sleep(0.6)
            return behind, plog.recovery_point, end
        finally:
            olog.close()

    behind, caught_up, end = asyncio.run(run())
    assert behind < end, "the commit's flush was a checkpoint: nothing to catch up"
    assert caught_up == end
