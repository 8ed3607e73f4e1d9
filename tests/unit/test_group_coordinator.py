"""The group coordinator without sockets: Kafka's classic-protocol rules, error codes, timers,
durability in ``__consumer_offsets`` (reload, snapshot), and every version of every group API
encoded through the handlers."""

from __future__ import annotations

import asyncio
import datetime
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shmq.coordinator import records as rec
from shmq.coordinator.coordinator import CoordinatorConfig, GroupCoordinator, JoinResult
from shmq.coordinator.group import GroupState

TOPICS = {"t": 4, "u": 2}
SUB = struct.pack(">hih", 0, 1, 1) + b"t" + struct.pack(">i", -1)  # ConsumerProtocolSubscription
PROTOCOLS = [("range", SUB), ("roundrobin", SUB)]


def make(tmp_path: Path, registered: int | None = -1, **cfg: Any) -> GroupCoordinator:
    """A loaded coordinator; ``__consumer_offsets`` has one partition unless the test says
    otherwise, registered (placed) with the configured count unless ``registered`` says."""
    snapshot_bytes = cfg.pop("snapshot_bytes", None)
    config = CoordinatorConfig(**{"initial_rebalance_delay_ms": 0, "min_session_timeout_ms": 10,
                                  "offsets_partitions": 1, **cfg})
    c = GroupCoordinator(tmp_path / "controller", config, TOPICS.get,
                         snapshot_bytes=snapshot_bytes,
                         registered_partitions=config.offsets_partitions if registered == -1
                         else registered)
    c.load()
    return c


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())


async def join(c: GroupCoordinator, group: str = "g", member: str = "", *, instance: str | None = None,
               session: int = 10_000, rebalance: int = 10_000, version: int = 5,
               protocols: list = PROTOCOLS, ptype: str = "consumer") -> JoinResult:
    return await c.join_group(group, member, instance, "client", "/127.0.0.1", session, rebalance,
                              ptype, protocols, version)


async def join_dynamic(c: GroupCoordinator, group: str = "g", **kw: Any) -> JoinResult:
    first = await join(c, group, **kw)
    assert first.error == 79 and first.member_id.startswith("client-")  # MEMBER_ID_REQUIRED
    return await join(c, group, first.member_id, **kw)


# -- records ------------------------------------------------------------------------------------


def test_record_layouts_round_trip() -> None:
    key = rec.offset_commit_key("grp", "topic", 7)
    assert key == struct.pack(">h", 1) + b"\x00\x03grp\x00\x05topic" + struct.pack(">i", 7)
    assert rec.decode_key(key) == rec.OffsetCommitKey("grp", "topic", 7)
    assert rec.decode_key(rec.group_metadata_key("grp")) == rec.GroupMetadataKey("grp")
    assert rec.decode_key(struct.pack(">h", 3) + b"\x00\x01x") is None  # KIP-848 records
    v = rec.OffsetCommitValue(42, 3, "meta", 1700000000000)
    raw = rec.offset_commit_value(v)
    assert raw[:2] == b"\x00\x03" and rec.decode_offset_value(raw) == v
    # v1 (with expireTimestamp), as Kafka 2.0 wrote it
    v1 = struct.pack(">hq", 1, 5) + b"\x00\x00" + struct.pack(">qq", 11, 99)
    assert rec.decode_offset_value(v1) == rec.OffsetCommitValue(5, -1, "", 11, 99)
    member = rec.MemberMetadata("m-1", "inst", "cid", "/h", 300, 45, b"sub", b"asg")
    g = rec.GroupMetadataValue("consumer", 3, "range", "m-1", 123, [member])
    assert rec.decode_group_value(rec.group_metadata_value(g)) == g


def test_partition_for_is_kafkas() -> None:
    assert rec.java_string_hash("hello") == 99162322
    assert rec.java_string_hash("polygenelubricants") == -(1 << 31)  # abs() would overflow
    assert rec.partition_for("polygenelubricants", 50) == 0
    assert rec.partition_for("hello", 50) == 99162322 % 50


# -- the join / sync / heartbeat cycle ---------------------------------------------------------


def test_two_members_join_sync_and_a_third_triggers_a_rebalance(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path)
        a = await join_dynamic(c)
        assert (a.error, a.generation, a.leader, a.protocol_name) == (0, 1, a.member_id, "range")
        assert [m[0] for m in a.members] == [a.member_id]
        s = await c.sync_group("g", 1, a.member_id, None, "consumer", "range", {a.member_id: b"A"})
        assert (s.error, s.assignment) == (0, b"A")
        assert c.heartbeat("g", 1, a.member_id, None) == 0
        # b joins: a learns about the rebalance from its heartbeat and rejoins
        b_task = asyncio.ensure_future(join_dynamic(c))
        await asyncio.sleep(0.01)
        assert c.heartbeat("g", 1, a.member_id, None) == 27  # REBALANCE_IN_PROGRESS
        a2 = await join(c, "g", a.member_id)
        b = await b_task
        assert a2.generation == b.generation == 2 and a2.leader == a.member_id
        assert len(a2.members) == 2 and b.members == []  # only the leader gets the members
        follower = asyncio.ensure_future(c.sync_group("g", 2, b.member_id, None, None, None, {}))
        await asyncio.sleep(0.01)
        assert not follower.done()  # followers wait for the leader's assignment
        assert c.heartbeat("g", 2, b.member_id, None) == 0  # CompletingRebalance: NONE
        leader = await c.sync_group("g", 2, a.member_id, None, None, None,
                                    {a.member_id: b"A2", b.member_id: b"B2"})
        assert leader.assignment == b"A2" and (await follower).assignment == b"B2"
        assert c.groups["g"].state is GroupState.STABLE
        d = c.describe_group("g")
        assert d.state == "Stable" and d.protocol_data == "range" and len(d.members) == 2
        assert c.list_groups() == [("g", "consumer", "Stable")]
        assert c.list_groups(states=["empty"]) == [] and c.list_groups(types=["consumer"]) == []
        # b leaves: a must rejoin
        assert c.leave_group("g", [(b.member_id, None), ("nobody", None)]) == (0, [0, 25])
        assert c.heartbeat("g", 2, a.member_id, None) == 27
        c.close()

    run(main)


def test_join_errors(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path, min_session_timeout_ms=6000, max_session_timeout_ms=60000)
        assert (await join(c, session=5999)).error == 26  # INVALID_SESSION_TIMEOUT
        assert (await join(c, session=60001)).error == 26
        assert (await join(c, protocols=[])).error == 23  # INCONSISTENT_GROUP_PROTOCOL
        assert (await join(c, "")).error == 24  # INVALID_GROUP_ID
        assert (await join(c, "g", "ghost")).error == 25  # unknown group, member id given
        a = await join_dynamic(c)
        assert (await join(c, ptype="connect")).error == 23  # another protocol type
        assert (await join(c, protocols=[("sticky", b"")])).error == 23  # no common protocol
        assert (await join(c, "g", "ghost")).error == 25
        # v0-v3 have no MEMBER_ID_REQUIRED round trip: the member is in at once
        c2 = make(tmp_path / "b")
        r = await join(c2, "h", version=3)
        assert r.error == 0 and r.generation == 1
        c.close(), c2.close()
        assert a.error == 0

    run(main)


def test_heartbeat_and_sync_errors(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path)
        assert c.heartbeat("nogroup", 1, "m", None) == 25
        a = await join_dynamic(c)
        assert c.heartbeat("g", 9, a.member_id, None) == 22  # ILLEGAL_GENERATION
        assert c.heartbeat("g", 1, "other", None) == 25
        assert (await c.sync_group("g", 9, a.member_id, None, None, None, {})).error == 22
        assert (await c.sync_group("g", 1, "x", None, None, None, {})).error == 25
        assert (await c.sync_group("g", 1, a.member_id, None, "consumer", "roundrobin", {})).error == 23
        c.close()

    run(main)


def test_session_expiry_removes_a_silent_member(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path)
        a = await join_dynamic(c, session=200)
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        for _ in range(5):  # heartbeats keep it
            await asyncio.sleep(0.1)
            assert c.heartbeat("g", 1, a.member_id, None) == 0
        await asyncio.sleep(0.4)
        assert "g" in c.groups and not c.groups["g"].members
        await asyncio.sleep(0.05)
        assert c.groups["g"].state is GroupState.EMPTY and c.groups["g"].generation == 2
        c.close()

    run(main)


def test_leader_that_never_syncs_is_removed_after_the_rebalance_timeout(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path)
        a = await join_dynamic(c, rebalance=300)
        b_task = asyncio.ensure_future(join_dynamic(c, rebalance=300))
        await asyncio.sleep(0.01)
        assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
        # a never rejoins nor syncs: after 300 ms the join completes without it
        b = await asyncio.wait_for(b_task, 5)
        assert b.error == 0 and b.leader == b.member_id and a.member_id not in c.groups["g"].members
        # b, now leader, never syncs either: the group rebalances and ends Empty
        await asyncio.sleep(0.5)
        assert c.groups["g"].state in (GroupState.EMPTY, GroupState.PREPARING_REBALANCE)
        assert not c.groups["g"].members
        c.close()

    run(main)


async def _stable_pair(c: GroupCoordinator, session: int, rebalance: int) -> tuple[str, str]:
    """Two members a (leader) and b, synced in generation 2."""
    a = await join_dynamic(c, session=session, rebalance=rebalance)
    await c.sync_group("g", 1, a.member_id, None, None, None, {a.member_id: b"A"})
    b_task = asyncio.ensure_future(join_dynamic(c, session=session, rebalance=rebalance))
    await asyncio.sleep(0.01)
    a2 = await join(c, "g", a.member_id, session=session, rebalance=rebalance)
    b = await b_task
    assert a2.generation == b.generation == 2
    follower = asyncio.ensure_future(c.sync_group("g", 2, b.member_id, None, None, None, {}))
    await asyncio.sleep(0)
    await c.sync_group("g", 2, a.member_id, None, None, None,
                       {a.member_id: b"A", b.member_id: b"B"})
    await follower
    assert c.groups["g"].state is GroupState.STABLE
    return a.member_id, b.member_id


def _disconnect(task: asyncio.Task) -> None:
    """What a dropped connection does to a parked request: its serving task is cancelled."""
    task.cancel()


def test_new_member_that_disconnects_mid_join_still_counts_as_joined(tmp_path: Path) -> None:
    """Kafka keeps a parked JoinGroup whose connection dropped (the response goes nowhere): the
    member still counts as joined, the join phase completes as soon as the others rejoin, and
    the member, never syncing, expires by its session timeout.  The group must not wait for the
    rebalance timeout (issue 21 item 1: 39 s with a 40 s max.poll.interval.ms)."""
    async def main() -> None:
        c = make(tmp_path)
        session, rebalance = 300, 20_000
        a, b = await _stable_pair(c, session, rebalance)
        crash = asyncio.ensure_future(join_dynamic(c, session=session, rebalance=rebalance))
        await asyncio.sleep(0.01)
        group = c.groups["g"]
        assert group.state is GroupState.PREPARING_REBALANCE and len(group.members) == 3
        _disconnect(crash)
        await asyncio.sleep(0.01)
        # a and b rejoin: the join completes at once, the crashed member included
        started = asyncio.get_running_loop().time()
        b_join = asyncio.ensure_future(join(c, "g", b, session=session, rebalance=rebalance))
        a3 = await asyncio.wait_for(join(c, "g", a, session=session, rebalance=rebalance), 2)
        b3 = await b_join
        assert asyncio.get_running_loop().time() - started < 1
        assert a3.error == b3.error == 0 and a3.generation == 3 and len(a3.members) == 3
        ghost = next(m for m, _, _ in a3.members if m not in (a, b))
        follower = asyncio.ensure_future(c.sync_group("g", 3, b, None, None, None, {}))
        await asyncio.sleep(0)
        await c.sync_group("g", 3, a, None, None, None, {a: b"A", b: b"B", ghost: b"G"})
        await follower
        # the ghost never syncs nor heartbeats: gone after its session timeout, then a rebalance
        for _ in range(6):
            await asyncio.sleep(0.1)
            c.heartbeat("g", group.generation, a, None)
            c.heartbeat("g", group.generation, b, None)
        assert ghost not in group.members
        assert c.heartbeat("g", 3, a, None) == 27
        b_join = asyncio.ensure_future(join(c, "g", b, session=session, rebalance=rebalance))
        a4 = await asyncio.wait_for(join(c, "g", a, session=session, rebalance=rebalance), 2)
        await b_join
        assert a4.generation == 4 and sorted(m for m, _, _ in a4.members) == sorted([a, b])
        c.close()

    run(main)


def test_existing_member_that_disconnects_mid_join_still_counts_as_joined(tmp_path: Path) -> None:
    """The same for a member of the group: its JoinGroup waits longer than its session timeout
    (another member is slow to rejoin), then its connection drops.  Kafka completes the join
    when the slow member rejoins and expires the dropped one a session timeout later."""
    async def main() -> None:
        c = make(tmp_path)
        session, rebalance = 300, 20_000
        a, b = await _stable_pair(c, session, rebalance)
        group = c.groups["g"]
        # a third member joins; b rejoins at once, a (slow) only later
        newcomer = asyncio.ensure_future(join_dynamic(c, session=session, rebalance=rebalance))
        await asyncio.sleep(0.01)
        assert group.state is GroupState.PREPARING_REBALANCE
        crash = asyncio.ensure_future(join(c, "g", b, session=session, rebalance=rebalance))
        for _ in range(5):  # longer than b's session timeout, while b waits in JoinGroup
            await asyncio.sleep(0.1)
            assert c.heartbeat("g", 2, a, None) == 27  # a is alive, just slow to rejoin
        assert b in group.members
        _disconnect(crash)
        await asyncio.sleep(0.01)
        started = asyncio.get_running_loop().time()
        a3 = await asyncio.wait_for(join(c, "g", a, session=session, rebalance=rebalance), 2)
        n = await newcomer
        assert asyncio.get_running_loop().time() - started < 1
        assert a3.generation == n.generation == 3 and len(a3.members) == 3
        follower = asyncio.ensure_future(c.sync_group("g", 3, n.member_id, None, None, None, {}))
        await asyncio.sleep(0)
        await c.sync_group("g", 3, a, None, None, None, {})
        await follower
        for _ in range(6):
            await asyncio.sleep(0.1)
            c.heartbeat("g", group.generation, a, None)
            c.heartbeat("g", group.generation, n.member_id, None)
        assert b not in group.members and group.state is GroupState.PREPARING_REBALANCE
        c.close()

    run(main)


def test_leader_that_disconnects_mid_join_stays_leader_until_its_session_expires(
        tmp_path: Path) -> None:
    """The leader's JoinGroup is parked when its connection drops: it stays leader of the new
    generation (Kafka keeps a leader that is awaiting join), never assigns, and its session
    timeout (not the rebalance timeout) frees the follower waiting in SyncGroup."""
    async def main() -> None:
        c = make(tmp_path)
        session, rebalance = 300, 20_000
        a, b = await _stable_pair(c, session, rebalance)
        crash = asyncio.ensure_future(join(c, "g", a, session=session, rebalance=rebalance))
        await asyncio.sleep(0.01)
        _disconnect(crash)  # the leader's rejoin (it forces a rebalance) is parked, then gone
        await asyncio.sleep(0.01)
        b3 = await asyncio.wait_for(join(c, "g", b, session=session, rebalance=rebalance), 2)
        assert b3.generation == 3 and b3.leader == a
        started = asyncio.get_running_loop().time()
        follower = await asyncio.wait_for(c.sync_group("g", 3, b, None, None, None, {}), 2)
        assert follower.error == 27  # REBALANCE_IN_PROGRESS once a's session expired
        assert asyncio.get_running_loop().time() - started < 1
        b4 = await asyncio.wait_for(join(c, "g", b, session=session, rebalance=rebalance), 2)
        assert b4.generation == 4 and b4.leader == b and [m for m, _, _ in b4.members] == [b]
        c.close()

    run(main)


def test_follower_that_disconnects_while_waiting_in_sync_expires_after_the_assignment(
        tmp_path: Path) -> None:
    """A SyncGroup parked for the leader's assignment also outlives its connection (Kafka): the
    member counts as syncing until the assignment is propagated, then its session timer runs."""
    async def main() -> None:
        c = make(tmp_path)
        session = 300
        a = await join_dynamic(c, session=session)
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        b_task = asyncio.ensure_future(join_dynamic(c, session=session))
        await asyncio.sleep(0.01)
        await join(c, "g", a.member_id, session=session)
        b = await b_task
        crash = asyncio.ensure_future(c.sync_group("g", 2, b.member_id, None, None, None, {}))
        await asyncio.sleep(0.01)
        _disconnect(crash)
        for _ in range(4):  # past b's session timeout: still waiting for the leader
            await asyncio.sleep(0.1)
            assert c.heartbeat("g", 2, a.member_id, None) == 0
        group = c.groups["g"]
        assert b.member_id in group.members and group.state is GroupState.COMPLETING_REBALANCE
        await c.sync_group("g", 2, a.member_id, None, None, None, {})
        assert group.state is GroupState.STABLE
        for _ in range(5):
            await asyncio.sleep(0.1)
            c.heartbeat("g", 2, a.member_id, None)
        assert b.member_id not in group.members
        c.close()

    run(main)


def test_static_member_rejoins_without_rebalance_and_fences_the_old_id(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path)
        a = await join(c, instance="i-a")
        assert a.error == 0 and a.member_id.startswith("i-a-")
        await c.sync_group("g", 1, a.member_id, "i-a", None, None, {a.member_id: b"ASSIGN"})
        again = await join(c, instance="i-a")  # restarted: no member id, same instance id
        assert again.error == 0 and again.generation == 1 and again.member_id != a.member_id
        assert again.leader == a.member_id  # v5: told someone else leads, so it does not assign
        s = await c.sync_group("g", 1, again.member_id, "i-a", None, None, {})
        assert (s.error, s.assignment) == (0, b"ASSIGN")
        assert c.heartbeat("g", 1, a.member_id, "i-a") == 82  # FENCED_INSTANCE_ID
        assert c.groups["g"].state is GroupState.STABLE and c.groups["g"].generation == 1
        v9 = await join(c, instance="i-a", version=9)
        assert v9.skip_assignment and v9.leader == v9.member_id and v9.generation == 1
        assert c.leave_group("g", [("", "i-a")]) == (0, [0])  # admin removal by instance id
        c.close()

    run(main)


# -- offsets ------------------------------------------------------------------------------------


def test_commit_validation(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path, offset_metadata_max_bytes=10)
        # unknown group with a generation: v8- ILLEGAL_GENERATION, v9 GROUP_ID_NOT_FOUND
        assert await c.commit_offsets("g", 1, "m", None, [("t", [(0, 1, -1, "")])], 8) == [[22]]
        assert await c.commit_offsets("g", 1, "m", None, [("t", [(0, 1, -1, "")])], 9) == [[69]]
        a = await join_dynamic(c)
        parts = [("t", [(0, 5, 1, "ok"), (9, 1, -1, ""), (1, 1, -1, "x" * 11)]),
                 ("nope", [(0, 1, -1, "")])]
        assert await c.commit_offsets("g", 1, a.member_id, None, parts, 8) == [[27, 27, 27], [27]]
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        assert await c.commit_offsets("g", 1, a.member_id, None, parts, 8) == [[0, 3, 12], [3]]
        assert await c.commit_offsets("g", 0, a.member_id, None, parts[:1], 8) == [[22] * 3]
        assert await c.commit_offsets("g", 1, "who", None, parts[:1], 8) == [[25] * 3]
        assert await c.commit_offsets("g", -1, "", None, parts[:1], 8) == [[25] * 3]
        got = c.fetch_offsets("g", [("t", [0, 1])], False)[1][0][1]
        assert [(o.offset, o.leader_epoch, o.metadata) for o in got] == [(5, 1, "ok"),
                                                                         (-1, -1, "")]
        got = c.fetch_offsets("g", None, False)[1]
        assert [(t, [(o.partition, o.offset, o.metadata) for o in os]) for t, os in got] == [
            ("t", [(0, 5, "ok")])]
        missing = c.fetch_offsets("g", [("t", [3])], False)[1][0][1][0]
        assert (missing.offset, missing.metadata, missing.error) == (-1, "", 0)
        # a simple group (generation -1) commits while Empty
        assert await c.commit_offsets("s", -1, "", None, [("u", [(1, 9, -1, None)])], 2) == [[0]]
        c.pending_transactional_offsets.add(("s", "u", 1))
        assert c.fetch_offsets("s", [("u", [1])], True)[1][0][1][0].error == 88
        assert c.fetch_offsets("s", [("u", [1])], False)[1][0][1][0].offset == 9
        c.close()

    run(main)


def test_offsets_and_groups_survive_a_reload(tmp_path: Path) -> None:
    async def first() -> str:
        c = make(tmp_path)
        a = await join_dynamic(c)
        await c.sync_group("g", 1, a.member_id, None, None, None, {a.member_id: b"A"})
        assert await c.commit_offsets("g", 1, a.member_id, None,
                                      [("t", [(0, 10, 2, "m0"), (1, 11, -1, "")])], 8) == [[0, 0]]
        assert await c.commit_offsets("s", -1, "", None, [("u", [(0, 3, -1, "")])], 8) == [[0]]
        assert await c.commit_offsets("s", -1, "", None, [("u", [(0, 4, -1, "")])], 8) == [[0]]
        c.log.logs[0].crash_close()  # SIGKILL: no flush, no trim, no clean-shutdown marker
        return a.member_id

    member = run(first)

    async def second() -> None:
        c = make(tmp_path)
        g = c.groups["g"]
        assert g.state is GroupState.STABLE and g.generation == 1 and member in g.members
        assert g.members[member].assignment == b"A"
        assert c.heartbeat("g", 1, member, None) == 0  # no rejoin needed after a restart
        got = c.fetch_offsets("g", [("t", [0, 1])], False)[1][0][1]
        assert [(o.offset, o.leader_epoch, o.metadata) for o in got] == [(10, 2, "m0"),
                                                                         (11, -1, "")]
        assert c.fetch_offsets("s", [("u", [0])], False)[1][0][1][0].offset == 4
        assert await c.delete_groups(["s", "g", "none"]) == [0, 68, 69]
        c.close()

    run(second)

    async def third() -> None:
        c = make(tmp_path)
        assert "s" not in c.groups and c.groups["g"].offsets
        c.close()

    run(third)


def test_snapshot_keeps_the_log_small_and_the_state_exact(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path, offsets_segment_bytes=4096, snapshot_bytes=8192)
        for i in range(400):
            await c.commit_offsets("s", -1, "", None, [("t", [(i % 4, i, -1, "x" * 20)])], 8)
            if i % 50 == 0:
                await asyncio.sleep(0)  # let the scheduled snapshot run
        await asyncio.sleep(0)
        assert c.log.logs[0].size_in_bytes < 5 * 8192
        assert c.log.logs[0].log_start_offset > 0
        c.close()
        c2 = make(tmp_path)
        got = c2.fetch_offsets("s", [("t", [0, 1, 2, 3])], False)[1][0][1]
        assert [o.offset for o in got] == [396, 397, 398, 399]
        c2.close()

    run(main)


def test_offset_delete_expiry_and_deleted_topics(tmp_path: Path) -> None:
    async def main() -> None:
        c = make(tmp_path, offsets_retention_ms=1000)
        a = await join_dynamic(c)
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        await c.commit_offsets("g", 1, a.member_id, None, [("t", [(0, 1, -1, "")]),
                                                          ("u", [(0, 2, -1, "")])], 8)
        err, parts = await c.delete_offsets("g", [("t", [0]), ("u", [0]), ("zz", [0])])
        assert err == 0 and parts == [("t", [(0, 86)]), ("u", [(0, 0)]), ("zz", [(0, 3)])]
        assert await c.delete_offsets("nope", [("t", [0])]) == (69, [])
        c.on_topics_deleted(["t"])
        assert c.groups["g"].offsets == {}
        await c.commit_offsets("s", -1, "", None, [("u", [(1, 5, -1, "")])], 8)
        now = c.groups["s"].offsets[("u", 1)].commit_timestamp
        assert c.expire_offsets(now + 999) == 0
        assert c.expire_offsets(now + 1000) == 1 and "s" not in c.groups  # empty group goes
        c.close()
        c2 = make(tmp_path)
        assert "s" not in c2.groups and not c2.groups["g"].offsets
        c2.close()

    run(main)


# -- every version of every group API, through the handlers and the encoder ---------------------


def _ns(**kw: Any) -> SimpleNamespace:
    return SimpleNamespace(**kw)


REQUESTS: dict[int, Callable[[int, str], SimpleNamespace]] = {
    11: lambda v, m: _ns(group_id="hg", session_timeout=datetime.timedelta(seconds=10),
                         rebalance_timeout=datetime.timedelta(seconds=10), member_id=m,
                         group_instance_id=None, protocol_type="consumer",
                         protocols=[_ns(name="range", metadata=SUB)], reason=None),
    14: lambda v, m: _ns(group_id="hg", generation_id=1, member_id=m, group_instance_id=None,
                         protocol_type=None, protocol_name=None, assignments=[]),
    12: lambda v, m: _ns(group_id="hg", generation_id=1, member_id=m, group_instance_id=None),
    13: lambda v, m: _ns(group_id="hg", member_id=m, members=[_ns(member_id=m,
                                                                  group_instance_id=None)]),
    8: lambda v, m: _ns(group_id="hg", generation_id_or_member_epoch=-1, member_id="",
                        group_instance_id=None, topics=[_ns(name="t", partitions=[_ns(
                            partition_index=0, committed_offset=3, committed_leader_epoch=-1,
                            committed_metadata="md")])]),
    9: lambda v, m: _ns(group_id="hg", topics=None if v >= 2 else [_ns(
        name="t", partition_indexes=[0])], require_stable=True,
        groups=[_ns(group_id="hg", topics=[_ns(name="t", partition_indexes=[0])])]),
    15: lambda v, m: _ns(groups=["hg", "unknown"], include_authorized_operations=False),
    16: lambda v, m: _ns(states_filter=[], types_filter=[]),
    42: lambda v, m: _ns(groups_names=["unknown"]),
    47: lambda v, m: _ns(group_id="hg", topics=[_ns(name="t", partitions=[_ns(partition_index=0)])]),
}


@pytest.mark.parametrize("with_coordinator", [True, False])
def test_every_version_encodes(tmp_path: Path, with_coordinator: bool) -> None:
    from shmq.broker.config import BrokerConfig
    from shmq.broker.context import BrokerContext
    from shmq.broker.handlers import HANDLERS
    from shmq.broker.metadata import ClusterMetadata
    from shmq.protocol import api_versions, codec

    async def main() -> None:
        ctx = BrokerContext(node_id=0, config=BrokerConfig(data_dir=tmp_path), controller=None,
                            metadata=ClusterMetadata(cluster_id="x"))  # type: ignore[arg-type]
        if with_coordinator:
            ctx.coordinator = make(tmp_path)
        member = ""
        for key in (11, 14, 12, 8, 9, 15, 16, 47, 13, 42):
            lo, hi = api_versions.SUPPORTED[key]
            for v in range(lo, hi + 1):
                header = codec.RequestHeader(key, v, 5, "client")
                response = await HANDLERS[key](ctx, header, REQUESTS[key](v, member))
                wire = codec.encode_response(key, v, 5, response)
                assert wire[4:8] == struct.pack(">i", 5)
                if not with_coordinator and key in (11, 14, 12, 13, 47):
                    assert response.error_code == 16, (key, v)  # a worker: NOT_COORDINATOR
                if not with_coordinator and key == 16:  # a worker lists no group, no error
                    assert (response.error_code, response.groups) == (0, ()), v
                if key == 11 and with_coordinator and response.error_code == 79:
                    assert v >= 4 and not member  # MEMBER_ID_REQUIRED, then join with the id
                    response = await HANDLERS[key](
                        ctx, header, REQUESTS[key](v, response.member_id))
                    codec.encode_response(key, v, 5, response)
                if key == 11 and with_coordinator:
                    assert response.error_code == 0, (v, response)
                    member = response.member_id
        if with_coordinator:
            ctx.coordinator.close()

    run(main)


def test_group_apis_are_advertised() -> None:
    from shmq.protocol.api_versions import SUPPORTED

    assert {k: SUPPORTED[k] for k in (10, 11, 14, 12, 13, 8, 9, 15, 16, 42, 47)} == {
        10: (0, 6), 11: (0, 9), 14: (0, 5), 12: (0, 4), 13: (0, 5), 8: (0, 9), 9: (0, 9),
        15: (0, 6), 16: (0, 5), 42: (0, 2), 47: (0, 0)}


def test_concurrent_commits_share_flushes_and_all_return(tmp_path: Path) -> None:
    """Commits that arrive while a flush runs wait for the next one (a regression: the waiter
    re-awaited the finished flush, which does not yield, and spun the event loop forever)."""

    async def main() -> None:
        c = make(tmp_path)
        results = await asyncio.wait_for(asyncio.gather(*(
            c.commit_offsets(f"g{i % 7}", -1, "", None, [("t", [(i % 4, i, -1, "")])], 8)
            for i in range(300))), 30)
        assert all(r == [[0]] for r in results)
        # what a commit waits for: the durable offset (the recovery point follows at checkpoints)
        assert c.log.logs[0].durable_offset == c.log.logs[0].log_end_offset
        # the finished flush is still recorded when a new commit waits (its completion callbacks
        # have not run yet): the waiter must start another flush, not spin on the old one
        end = c.log.append(0, [(rec.group_metadata_key("x"), None)])
        done = asyncio.get_running_loop().create_future()
        done.set_result(False)
        c.log._flushing[0] = done
        await c.log.durable(0, end)
        assert c.log.logs[0].durable_offset == end
        c.close()

    run(main)


def test_several_offsets_partitions_and_a_changed_count(tmp_path: Path) -> None:
    """Groups spread over partitions by Kafka's hash; the registered count wins over the config
    (an unregistered layout is placed anew: test_offsets_topic.py)."""

    async def main() -> None:
        c = make(tmp_path, offsets_partitions=3)
        for i in range(12):
            assert await c.commit_offsets(f"grp-{i}", -1, "", None,
                                          [("t", [(0, i, -1, "")])], 8) == [[0]]
        used = {c.partition_for(f"grp-{i}") for i in range(12)}
        assert len(used) > 1 and all(c.log.logs[p].log_end_offset > 0 for p in used)
        c.close()
        again = make(tmp_path, registered=3, offsets_partitions=50)
        assert again.log.partitions == 3
        assert [again.fetch_offsets(f"grp-{i}", [("t", [0])], False)[1][0][1][0].offset
                for i in range(12)] == list(range(12))
        again.close()

    run(main)
