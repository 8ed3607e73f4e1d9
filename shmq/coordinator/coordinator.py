"""The group coordinator: Kafka's classic group protocol and committed offsets, in the controller.

Theory of operation (``GroupMetadataManager`` / ``OffsetMetadataManager`` classic paths)
------------------------------------------------------------------------------------------
Everything runs on the controller's event loop; no state change awaits anything, so a request
sees the group as one consistent value.  Long polls are futures: a JoinGroup parks its future on
the member until the join phase completes, a follower's SyncGroup parks until the leader's
assignment arrives.  A client that disconnects cancels only its own wait (``asyncio.shield``):
the parked future stays on the member, as Kafka keeps a muted request whose connection is gone,
so the member still counts as joined (or syncing).  The join phase then completes as soon as
the live members rejoin, the answer to the dead connection goes nowhere, and the member, which
never syncs or heartbeats, expires by its session timeout.  Were the future cancelled with the
connection, the member would count as not rejoined while no session timer ran for it (the
timer is satisfied while a member waits in JoinGroup, and not rescheduled): the group would
wait for the rebalance timeout, ``max.poll.interval.ms``, 5 minutes by default.

Timers (``loop.call_later`` handles, cancelled when superseded):

* heartbeat, per member: session timeout after the last heartbeat/join/sync; a member waiting in
  JoinGroup or SyncGroup is kept alive, a *new* member only for ``NEW_MEMBER_JOIN_TIMEOUT_MS``.
  A pending member (the MEMBER_ID_REQUIRED round trip) expires after its session timeout.
* join, per group: the initial rebalance delay (``group.initial.rebalance.delay.ms``, extended
  while members keep arriving, capped by the rebalance timeout) when leaving Empty, else the
  rebalance timeout; members that did not rejoin by then are removed.
* pending sync, per group: members that got their JoinGroup response but send no SyncGroup within
  the rebalance timeout (a leader that never assigns) are removed and the group rebalances.
* retention, global: every ``offsets.retention.check.interval.ms`` expired offsets and empty groups
  without offsets are deleted (tombstones first).

Durability: committed offsets and group metadata are records in ``__consumer_offsets``
(``offsets_log.py``).  State changes apply in memory in log order at append time; a response
that reports a commit (OffsetCommit, DeleteGroups, OffsetDelete, the leader's SyncGroup) is sent
only after the fsync that covers its records.  At start the log is replayed: groups with members
come back Stable with fresh session timers (members that are gone expire and the group
rebalances), groups without members come back Empty.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shmq.coordinator import records as rec
from shmq.coordinator.group import Group, GroupState, Member, OffsetAndMetadata
from shmq.coordinator.offsets_log import OffsetsLog

log = logging.getLogger("shmq.coordinator")

NONE = 0
UNKNOWN_SERVER_ERROR = -1
UNKNOWN_TOPIC_OR_PARTITION = 3
OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82
GROUP_SUBSCRIBED_TO_TOPIC = 86
UNSTABLE_OFFSET_COMMIT = 88

NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000   # Kafka's classicGroupNewMemberJoinTimeoutMs


@dataclass(frozen=True)
class CoordinatorConfig:
    """The broker configs of the coordinator (Kafka names in ``shmq.broker.config``)."""

    initial_rebalance_delay_ms: int = 100        # group.initial.rebalance.delay.ms
    min_session_timeout_ms: int = 6000           # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000      # group.max.session.timeout.ms
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000   # offsets.retention.minutes
    retention_check_interval_ms: int = 600_000   # offsets.retention.check.interval.ms
    offset_metadata_max_bytes: int = 4096        # offset.metadata.max.bytes
    offsets_partitions: int = 50                 # offsets.topic.num.partitions
    offsets_segment_bytes: int = 16 << 20        # offsets.topic.segment.bytes


@dataclass
class JoinResult:
    error: int
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass
class GroupDescription:
    group_id: str
    error: int = NONE
    state: str = "Dead"
    protocol_type: str = ""
    protocol_data: str = ""
    members: list[MemberDescription] = field(default_factory=list)


@dataclass
class CommittedOffset:
    partition: int
    offset: int = -1
    leader_epoch: int = -1
    metadata: str = ""
    error: int = NONE


TopicPartitions = Sequence[tuple[str, Sequence[int]]]


def _now_ms() -> int:
    return int(time.time() * 1000)


class GroupCoordinator:
    """Classic groups of one broker.  ``topic_partitions(topic)`` says how many partitions a
    topic has (None if it does not exist), for the commit checks and offset cleanup."""

    def __init__(self, directory: Path, config: CoordinatorConfig,
                 topic_partitions: Callable[[str], int | None],
                 snapshot_bytes: int | None = None, *,
                 registered_partitions: int | None = None,
                 on_append: Callable[[int], None] | None = None) -> None:
        """``registered_partitions``: the partition count ``__consumer_offsets`` has in the cluster
        metadata, which fixes it; None while the topic is not registered (a new broker, or one
        upgraded from the single-partition layout): then records already on disk are placed into
        ``config.offsets_partitions`` partitions (``OffsetsLog.place``).  ``on_append(partition)``
        runs after every append (the controller registers the topic and wakes fetchers)."""
        self.config = config
        self.topic_partitions = topic_partitions
        self.groups: dict[str, Group] = {}
        self.log = OffsetsLog(directory, registered_partitions or config.offsets_partitions,
                              config.offsets_segment_bytes,
                              snapshot_bytes if snapshot_bytes is not None
                              else config.offsets_segment_bytes,
                              placed=registered_partitions is not None, on_append=on_append)
        self._pending_timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._snapshot_scheduled: set[int] = set()
        self._retention_timer: asyncio.TimerHandle | None = None
        # (group, topic, partition) with a transactional offset commit not yet ended: OffsetFetch
        # with require_stable answers UNSTABLE_OFFSET_COMMIT for them (the transaction coordinator
        # fills this in)
        self.pending_transactional_offsets: set[tuple[str, str, int]] = set()
        # TxnOffsetCommit's offsets, by producer id and group, until the transaction's marker
        # reaches the group's partition (commit: they become the committed offsets)
        self.txn_offsets: dict[int, dict[str, dict[tuple[str, int], OffsetAndMetadata]]] = {}
        self.loaded = False

    # -- life cycle ---------------------------------------------------------------------------

    def load(self) -> None:
        """Replay ``__consumer_offsets`` and start the timers (call on the event loop)."""
        started = time.monotonic()
        count = 0
        for p in self.log.partitions_on_disk():
            for batch, records in self.log.replay_batches(p):
                if batch.is_control:
                    self._replay_marker(p, batch)
                    continue
                txn = batch.producer_id if batch.is_transactional else -1
                for key, value in records:
                    if key is None:
                        continue
                    if txn >= 0:
                        self._replay_txn_offset(txn, key, value)
                    else:
                        self._replay(key, value)
                    count += 1
        for gid in [g.group_id for g in self.groups.values() if not g.persisted and not g.offsets]:
            del self.groups[gid]  # every record of the group was a tombstone
        for group in self.groups.values():
            if group.members:
                group.state = group.previous_state = GroupState.STABLE
                for m in group.members.values():
                    self._schedule_heartbeat(group, m)
        self._drop_offsets_of_missing_topics()
        self._schedule_retention()
        self.loaded = True
        log.info("group coordinator loaded %d groups from %d records in %.2f s",
                 len(self.groups), count, time.monotonic() - started)

    def _replay(self, key: bytes, value: bytes | None) -> None:
        try:
            k = rec.decode_key(key)
            if isinstance(k, rec.OffsetCommitKey):
                group = self.groups.get(k.group)
                if value is None:
                    if group is not None:
                        group.offsets.pop((k.topic, k.partition), None)
                    return
                v = rec.decode_offset_value(value)
                group = group or self.groups.setdefault(k.group, Group(k.group))
                group.offsets[(k.topic, k.partition)] = OffsetAndMetadata(
                    v.offset, v.leader_epoch, v.metadata, v.commit_timestamp)
            elif isinstance(k, rec.GroupMetadataKey):
                group = self.groups.get(k.group)
                if value is None:
                    if group is not None:
                        self._reset_group_metadata(group)
                    return
                g = rec.decode_group_value(value)
                group = group or self.groups.setdefault(k.group, Group(k.group))
                self._reset_group_metadata(group)
                group.persisted = True
                group.protocol_type = g.protocol_type or None
                group.generation = g.generation
                group.protocol_name = g.protocol
                group.state_timestamp = g.current_state_timestamp if \
                    g.current_state_timestamp >= 0 else _now_ms()
                for m in g.members:
                    member = Member(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                    m.rebalance_timeout, m.session_timeout, g.protocol_type,
                                    [(g.protocol or "", m.subscription)], m.assignment)
                    group.add(member)
                group.leader_id = g.leader if g.leader in group.members else group.leader_id
        except (ValueError, IndexError) as exc:  # CorruptRecordError is a ValueError
            log.error("skipping an unreadable __consumer_offsets record: %s", exc)

    def _replay_txn_offset(self, producer_id: int, key: bytes, value: bytes | None) -> None:
        try:
            k = rec.decode_key(key)
            if not isinstance(k, rec.OffsetCommitKey) or value is None:
                return
            v = rec.decode_offset_value(value)
        except (ValueError, IndexError) as exc:
            log.error("skipping an unreadable transactional offset record: %s", exc)
            return
        self._stage_txn_offset(producer_id, k.group, k.topic, k.partition, OffsetAndMetadata(
            v.offset, v.leader_epoch, v.metadata, v.commit_timestamp))

    def _replay_marker(self, partition: int, batch: Any) -> None:
        from shmq.storage.log import parse_marker

        marker = parse_marker(bytes(batch.buffer))
        if marker is not None:
            self._end_txn_offsets(batch.producer_id, partition, marker[0])

    def _stage_txn_offset(self, producer_id: int, group_id: str, topic: str, partition: int,
                          o: OffsetAndMetadata) -> None:
        self.txn_offsets.setdefault(producer_id, {}).setdefault(group_id, {})[
            (topic, partition)] = o
        self.pending_transactional_offsets.add((group_id, topic, partition))

    def _end_txn_offsets(self, producer_id: int, partition: int, commit: bool) -> None:
        """The marker of ``producer_id``'s transaction reached ``partition``: its staged
        offsets of the groups there become committed (COMMIT) or are dropped (ABORT)."""
        staged = self.txn_offsets.get(producer_id)
        if not staged:
            return
        for group_id in [g for g in staged if self.partition_for(g) == partition]:
            offsets = staged.pop(group_id)
            group = self.groups.get(group_id)
            if commit:
                if group is None:
                    group = self.groups[group_id] = Group(group_id)
                group.offsets.update(offsets)
            for topic, p in offsets:
                if not any((topic, p) in other.get(group_id, {})
                           for other in self.txn_offsets.values()):
                    self.pending_transactional_offsets.discard((group_id, topic, p))
        if not staged:
            del self.txn_offsets[producer_id]

    async def txn_commit_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                                 topics: Sequence[tuple[str, Sequence[tuple[Any, ...]]]]
                                 ) -> list[list[int]]:
        """TxnOffsetCommit: the offsets are written as the producer's transactional records
        into the group's partition and take effect with its COMMIT marker."""
        if not group_id:
            return [[INVALID_GROUP_ID] * len(parts) for _, parts in topics]
        now = _now_ms()
        out: list[list[int]] = []
        records: list[tuple[bytes, bytes | None]] = []
        staged: list[tuple[str, int, OffsetAndMetadata]] = []
        for topic, parts in topics:
            n = self.topic_partitions(topic)
            errors = []
            for partition, offset, epoch, metadata in parts:
                if n is None or not 0 <= partition < n:
                    errors.append(UNKNOWN_TOPIC_OR_PARTITION)
                elif metadata is not None and len(metadata) > self.config.offset_metadata_max_bytes:
                    errors.append(OFFSET_METADATA_TOO_LARGE)
                else:
                    o = OffsetAndMetadata(offset, epoch, metadata or "", now)
                    staged.append((topic, partition, o))
                    records.append(self._offset_record(group_id, topic, partition, o))
                    errors.append(NONE)
            out.append(errors)
        if not records:
            return out
        p = self.partition_for(group_id)
        try:
            end = self.log.append(p, records, producer_id=producer_id,
                                  producer_epoch=producer_epoch)
        except Exception as exc:  # noqa: BLE001 - an epoch error from the producer state
            code = getattr(exc, "code", COORDINATOR_NOT_AVAILABLE)
            return [[code if e == NONE else e for e in errs] for errs in out]
        for topic, partition, o in staged:
            self._stage_txn_offset(producer_id, group_id, topic, partition, o)
        error = await self._durable((p, end))
        if error:
            out = [[error if e == NONE else e for e in errs] for errs in out]
        return out

    def write_txn_marker(self, partition: int, producer_id: int, producer_epoch: int,
                         coordinator_epoch: int, commit: bool,
                         transaction_version: int = 0) -> tuple[int, int]:
        """The transaction coordinator's marker into ``__consumer_offsets-<partition>``."""
        end = self.log.append_marker(partition, producer_id, producer_epoch, coordinator_epoch,
                                     commit, transaction_version)
        self._end_txn_offsets(producer_id, partition, commit)
        return partition, end

    @staticmethod
    def _reset_group_metadata(group: Group) -> None:
        group.members.clear()
        group.static_members.clear()
        group.supported_protocols.clear()
        group.leader_id = None
        group.protocol_name = None
        group.persisted = False

    def close(self) -> None:
        """Cancel every timer and close the logs cleanly (flushed, clean-shutdown marker)."""
        if self._retention_timer is not None:
            self._retention_timer.cancel()
        for handle in self._pending_timers.values():
            handle.cancel()
        for group in self.groups.values():
            self._cancel_group_timers(group)
            for m in group.members.values():
                if m.heartbeat_timer is not None:
                    m.heartbeat_timer.cancel()
                m.complete_join(JoinResult(COORDINATOR_NOT_AVAILABLE, m.member_id))
                m.complete_sync(SyncResult(COORDINATOR_NOT_AVAILABLE))
        self.log.close()

    # -- persistence --------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return rec.partition_for(group_id, self.log.partitions)

    def _append(self, group_id: str, records: list[tuple[bytes, bytes | None]]) -> tuple[int, int]:
        p = self.partition_for(group_id)
        end = self.log.append(p, records)
        if p not in self._snapshot_scheduled and self.log.needs_snapshot(p):
            self._snapshot_scheduled.add(p)
            asyncio.get_running_loop().call_soon(self._snapshot, p)
        return p, end

    async def _durable(self, where: tuple[int, int] | None) -> int:
        """NONE once the records are fsynced, else an error code for the response."""
        if where is None:
            return NONE
        try:
            await self.log.durable(*where)
        except OSError as exc:
            log.error("cannot flush __consumer_offsets-%d: %s", where[0], exc)
            return COORDINATOR_NOT_AVAILABLE
        return NONE

    def _group_record(self, group: Group) -> tuple[bytes, bytes]:
        members = [rec.MemberMetadata(m.member_id, m.group_instance_id, m.client_id,
                                      m.client_host, m.rebalance_timeout_ms, m.session_timeout_ms,
                                      m.metadata(group.protocol_name), m.assignment)
                   for m in group.members.values()]
        value = rec.GroupMetadataValue(group.protocol_type or "", group.generation,
                                       group.protocol_name, group.leader_id,
                                       group.state_timestamp, members)
        return rec.group_metadata_key(group.group_id), rec.group_metadata_value(value)

    def _persist_group(self, group: Group) -> tuple[int, int]:
        group.persisted = True
        return self._append(group.group_id, [self._group_record(group)])

    @staticmethod
    def _offset_record(group_id: str, topic: str, partition: int,
                       o: OffsetAndMetadata) -> tuple[bytes, bytes]:
        return (rec.offset_commit_key(group_id, topic, partition),
                rec.offset_commit_value(rec.OffsetCommitValue(
                    o.offset, o.leader_epoch, o.metadata, o.commit_timestamp)))

    def _snapshot(self, partition: int) -> None:
        self._snapshot_scheduled.discard(partition)
        if self.log.closed:
            return
        if any(self.partition_for(g) == partition
               for staged in self.txn_offsets.values() for g in staged):
            # an open transaction's offsets are records of this partition that the snapshot
            # would drop: try again once its marker is written
            self._snapshot_scheduled.add(partition)
            asyncio.get_running_loop().call_later(1.0, self._snapshot, partition)
            return
        live: list[tuple[bytes, bytes | None]] = []
        for group in self.groups.values():
            if self.partition_for(group.group_id) != partition:
                continue
            if group.persisted:
                live.append(self._group_record(group))
            for (topic, p), o in group.offsets.items():
                live.append(self._offset_record(group.group_id, topic, p, o))
        try:
            self.log.snapshot(partition, live)
        except OSError as exc:
            log.error("snapshot of __consumer_offsets-%d failed: %s", partition, exc)

    # -- timers -------------------------------------------------------------------------------

    def _later(self, ms: int, fn: Callable[..., None], *args: Any) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(max(ms, 0) / 1000, fn, *args)

    def _schedule_heartbeat(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
        member.heartbeat_satisfied = False
        member.heartbeat_timer = self._later(
            member.session_timeout_ms if timeout_ms is None else timeout_ms,
            self._expire_heartbeat, group, member.member_id, member)

    def _expire_heartbeat(self, group: Group, member_id: str, member: Member) -> None:
        member.heartbeat_timer = None
        if group.members.get(member_id) is not member or self.groups.get(group.group_id) is not group:
            return
        if not member.has_satisfied_heartbeat():
            log.info("group %s: member %s session expired", group.group_id, member_id)
            self._remove_member_and_update_group(group, member)

    def _expire_pending(self, group: Group, member_id: str) -> None:
        self._pending_timers.pop((group.group_id, member_id), None)
        if member_id in group.pending_members:
            self._remove_pending_member(group, member_id)

    def _remove_pending_member(self, group: Group, member_id: str) -> None:
        group.pending_members.discard(member_id)
        handle = self._pending_timers.pop((group.group_id, member_id), None)
        if handle is not None:
            handle.cancel()
        if group.is_in(GroupState.PREPARING_REBALANCE) and group.has_all_members_joined():
            self._complete_join(group)

    def _cancel_group_timers(self, group: Group) -> None:
        for attr in ("join_timer", "sync_timer"):
            handle = getattr(group, attr)
            if handle is not None:
                handle.cancel()
                setattr(group, attr, None)

    def _schedule_retention(self) -> None:
        self._retention_timer = self._later(self.config.retention_check_interval_ms,
                                            self._retention_tick)

    def _retention_tick(self) -> None:
        try:
            self.expire_offsets()
        finally:
            self._schedule_retention()

    # -- rebalance machinery ------------------------------------------------------------------

    def _remove_member_and_update_group(self, group: Group, member: Member) -> None:
        member.complete_join(JoinResult(UNKNOWN_MEMBER_ID, ""))
        member.complete_sync(SyncResult(UNKNOWN_MEMBER_ID))
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
            member.heartbeat_timer = None
        group.remove(member.member_id)
        if group.is_in(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        elif group.is_in(GroupState.PREPARING_REBALANCE) and group.has_all_members_joined():
            self._complete_join(group)

    def _prepare_rebalance(self, group: Group) -> None:
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            # members waiting in SyncGroup must rejoin; the assignment being built is void
            for m in group.members.values():
                m.assignment = b""
                if m.awaiting_sync:
                    m.complete_sync(SyncResult(REBALANCE_IN_PROGRESS))
                    self._schedule_heartbeat(group, m)
        self._cancel_group_timers(group)
        initial = group.is_in(GroupState.EMPTY)
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            group.join_timer = self._later(delay, self._initial_join_expired, group, delay,
                                           remaining)
        else:
            group.join_timer = self._later(group.rebalance_timeout_ms(), self._complete_join, group)
        group.transition(GroupState.PREPARING_REBALANCE)
        log.debug("group %s preparing rebalance (generation %d)", group.group_id, group.generation)
        if not initial:
            self._maybe_complete_join_phase(group)

    def _initial_join_expired(self, group: Group, delay: int, remaining: int) -> None:
        group.join_timer = None
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
            group.join_timer = self._later(new_delay, self._initial_join_expired, group,
                                           new_delay, max(remaining - delay, 0))
        else:
            self._complete_join(group)

    def _maybe_prepare_rebalance_or_complete_join(self, group: Group) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join_phase(group)

    def _maybe_complete_join_phase(self, group: Group) -> None:
        if (group.is_in(GroupState.PREPARING_REBALANCE) and group.has_all_members_joined()
                and group.previous_state != GroupState.EMPTY):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        if not group.is_in(GroupState.PREPARING_REBALANCE) or self.groups.get(group.group_id) is not group:
            return
        for m in list(group.members.values()):  # dynamic members that did not rejoin are out
            if not m.awaiting_join and m.group_instance_id is None:
                if m.heartbeat_timer is not None:
                    m.heartbeat_timer.cancel()
                    m.heartbeat_timer = None
                m.complete_sync(SyncResult(UNKNOWN_MEMBER_ID))
                group.remove(m.member_id)
        if not group.maybe_elect_new_joined_leader() and group.members:
            # nobody rejoined: wait for the session timeouts to remove the silent members
            group.join_timer = self._later(group.rebalance_timeout_ms(), self._complete_join, group)
            return
        group.init_next_generation()
        log.info("group %s generation %d (%s) with %d members", group.group_id, group.generation,
                 group.protocol_name, len(group.members))
        if group.is_in(GroupState.EMPTY):
            self._persist_group(group)
            return
        everyone = [(m.member_id, m.group_instance_id, m.metadata(group.protocol_name))
                    for m in group.members.values()]
        for m in group.members.values():
            m.complete_join(JoinResult(
                NONE, m.member_id, group.generation, group.protocol_type, group.protocol_name,
                group.leader_id or "", everyone if group.is_leader(m.member_id) else []))
            self._schedule_heartbeat(group, m)
            m.is_new = False
            group.pending_sync.add(m.member_id)
        group.sync_timer = self._later(group.rebalance_timeout_ms(), self._expire_pending_sync,
                                       group, group.generation)

    def _expire_pending_sync(self, group: Group, generation: int) -> None:
        group.sync_timer = None
        if generation != group.generation or not group.is_in(
                GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        if group.pending_sync:
            log.info("group %s: members %s sent no SyncGroup within the rebalance timeout",
                     group.group_id, sorted(group.pending_sync))
            for member_id in list(group.pending_sync):
                m = group.members.get(member_id)
                if m is not None:
                    if m.heartbeat_timer is not None:
                        m.heartbeat_timer.cancel()
                        m.heartbeat_timer = None
                    m.complete_sync(SyncResult(UNKNOWN_MEMBER_ID))
                group.remove(member_id)
            self._prepare_rebalance(group)

    def _validate_member(self, group: Group, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            existing = group.static_member_id(instance_id)
            if existing is None:
                return UNKNOWN_MEMBER_ID
            if existing != member_id:
                return FENCED_INSTANCE_ID
            return NONE
        return NONE if group.has_member(member_id) else UNKNOWN_MEMBER_ID

    # -- JoinGroup ----------------------------------------------------------------------------

    async def join_group(self, group_id: str, member_id: str, instance_id: str | None,
                         client_id: str, client_host: str, session_timeout_ms: int,
                         rebalance_timeout_ms: int, protocol_type: str,
                         protocols: list[tuple[str, bytes]], version: int) -> JoinResult:
        if not group_id:
            return JoinResult(INVALID_GROUP_ID, member_id)
        if not (self.config.min_session_timeout_ms <= session_timeout_ms
                <= self.config.max_session_timeout_ms):
            return JoinResult(INVALID_SESSION_TIMEOUT, member_id)
        if not protocol_type or not protocols:
            return JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id)
        if rebalance_timeout_ms < 0:  # v0 has none: the session timeout serves
            rebalance_timeout_ms = session_timeout_ms
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return JoinResult(UNKNOWN_MEMBER_ID, member_id)
            group = self.groups[group_id] = Group(group_id)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        args = (group, member_id, instance_id, client_id, client_host, session_timeout_ms,
                rebalance_timeout_ms, protocol_type, protocols, version, fut)
        if not member_id:
            self._join_new_member(*args)
        else:
            self._join_existing_member(*args)
        return await asyncio.shield(fut)  # type: ignore[no-any-return]  # see "Theory"

    def _join_new_member(self, group: Group, member_id: str, instance_id: str | None,
                         client_id: str, client_host: str, session_ms: int, rebalance_ms: int,
                         protocol_type: str, protocols: list[tuple[str, bytes]], version: int,
                         fut: asyncio.Future) -> None:
        if group.is_in(GroupState.DEAD):
            fut.set_result(JoinResult(COORDINATOR_NOT_AVAILABLE, ""))
            return
        if not group.supports_protocols(protocol_type, protocols):
            fut.set_result(JoinResult(INCONSISTENT_GROUP_PROTOCOL, ""))
            return
        new_id = f"{instance_id if instance_id is not None else client_id}-{uuid.uuid4()}"
        if instance_id is not None:
            existing = group.static_member_id(instance_id)
            if existing is not None:
                self._update_static_member(group, existing, new_id, instance_id, session_ms,
                                           rebalance_ms, protocols, version, fut)
                return
        elif version >= 4:  # KIP-394: the member must come back with the id we give it
            group.pending_members.add(new_id)
            self._pending_timers[(group.group_id, new_id)] = self._later(
                session_ms, self._expire_pending, group, new_id)
            fut.set_result(JoinResult(MEMBER_ID_REQUIRED, new_id))
            return
        self._add_member_then_rebalance(group, new_id, instance_id, client_id, client_host,
                                        session_ms, rebalance_ms, protocol_type, protocols, fut)

    def _join_existing_member(self, group: Group, member_id: str, instance_id: str | None,
                              client_id: str, client_host: str, session_ms: int,
                              rebalance_ms: int, protocol_type: str,
                              protocols: list[tuple[str, bytes]], version: int,
                              fut: asyncio.Future) -> None:
        if group.is_in(GroupState.DEAD):
            fut.set_result(JoinResult(COORDINATOR_NOT_AVAILABLE, member_id))
            return
        if not group.supports_protocols(protocol_type, protocols):
            fut.set_result(JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id))
            return
        if member_id in group.pending_members:
            handle = self._pending_timers.pop((group.group_id, member_id), None)
            if handle is not None:
                handle.cancel()
            self._add_member_then_rebalance(group, member_id, instance_id, client_id, client_host,
                                            session_ms, rebalance_ms, protocol_type, protocols,
                                            fut)
            return
        error = self._validate_member(group, member_id, instance_id)
        if error:
            fut.set_result(JoinResult(error, member_id))
            return
        member = group.members[member_id]
        current = JoinResult(NONE, member_id, group.generation, group.protocol_type,
                             group.protocol_name, group.leader_id or "")
        if group.is_in(GroupState.PREPARING_REBALANCE):
            group.update_member(member, protocols, rebalance_ms, session_ms, fut)
            self._maybe_prepare_rebalance_or_complete_join(group)
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            if member.protocols == protocols:  # the JoinGroup response was lost: send it again
                if group.is_leader(member_id):
                    current.members = [(m.member_id, m.group_instance_id,
                                        m.metadata(group.protocol_name))
                                       for m in group.members.values()]
                fut.set_result(current)
            else:
                group.update_member(member, protocols, rebalance_ms, session_ms, fut)
                self._maybe_prepare_rebalance_or_complete_join(group)
        elif group.is_in(GroupState.STABLE):
            if group.is_leader(member_id) or member.protocols != protocols:
                # the leader rejoining forces a rebalance (it may have seen metadata change)
                group.update_member(member, protocols, rebalance_ms, session_ms, fut)
                self._maybe_prepare_rebalance_or_complete_join(group)
            else:
                fut.set_result(current)
        else:
            fut.set_result(JoinResult(UNKNOWN_MEMBER_ID, member_id))

    def _add_member_then_rebalance(self, group: Group, member_id: str, instance_id: str | None,
                                   client_id: str, client_host: str, session_ms: int,
                                   rebalance_ms: int, protocol_type: str,
                                   protocols: list[tuple[str, bytes]],
                                   fut: asyncio.Future) -> None:
        member = Member(member_id, instance_id, client_id, client_host, rebalance_ms, session_ms,
                        protocol_type, protocols, is_new=True, join_future=fut)
        if group.is_in(GroupState.PREPARING_REBALANCE) and group.previous_state == GroupState.EMPTY:
            group.new_member_added = True
        group.add(member)
        self._schedule_heartbeat(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance_or_complete_join(group)

    def _update_static_member(self, group: Group, old_id: str, new_id: str, instance_id: str,
                              session_ms: int, rebalance_ms: int,
                              protocols: list[tuple[str, bytes]], version: int,
                              fut: asyncio.Future) -> None:
        """KIP-345: a static member came back with an unknown member id.  It replaces the old
        id (which is fenced); a Stable group keeps its generation and assignment if the selected
        protocol does not change."""
        current_leader = group.leader_id
        old = group.members[old_id]
        old.complete_join(JoinResult(FENCED_INSTANCE_ID, old_id))
        old.complete_sync(SyncResult(FENCED_INSTANCE_ID))
        member = group.replace_static_member(instance_id, old_id, new_id)
        self._schedule_heartbeat(group, member)
        group.update_member(member, protocols, rebalance_ms, session_ms, fut)
        if group.is_in(GroupState.STABLE):
            if group.protocol_name == group.select_protocol():
                self._persist_group(group)
                if version >= 9:
                    leader = group.is_leader(new_id)
                    members = [(m.member_id, m.group_instance_id, m.metadata(group.protocol_name))
                               for m in group.members.values()] if leader else []
                    result = JoinResult(NONE, new_id, group.generation, group.protocol_type,
                                        group.protocol_name, group.leader_id or "", members,
                                        skip_assignment=leader)
                else:  # an old leader is told someone else leads, so it keeps the assignment
                    result = JoinResult(NONE, new_id, group.generation, group.protocol_type,
                                        group.protocol_name, current_leader or "")
                member.complete_join(result)
            else:
                self._maybe_prepare_rebalance_or_complete_join(group)
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join_phase(group)

    # -- SyncGroup ----------------------------------------------------------------------------

    async def sync_group(self, group_id: str, generation: int, member_id: str,
                         instance_id: str | None, protocol_type: str | None,
                         protocol_name: str | None,
                         assignments: dict[str, bytes]) -> SyncResult:
        group = self.groups.get(group_id)
        if group is None:
            return SyncResult(UNKNOWN_MEMBER_ID)
        if group.is_in(GroupState.DEAD):
            return SyncResult(COORDINATOR_NOT_AVAILABLE)
        error = self._validate_member(group, member_id, instance_id)
        if error:
            return SyncResult(error)
        if generation != group.generation:
            return SyncResult(ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or \
                (protocol_name is not None and protocol_name != group.protocol_name):
            return SyncResult(INCONSISTENT_GROUP_PROTOCOL)
        member = group.members[member_id]
        if group.is_in(GroupState.EMPTY):
            return SyncResult(UNKNOWN_MEMBER_ID)
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return SyncResult(REBALANCE_IN_PROGRESS)
        if group.is_in(GroupState.STABLE):
            self._received_sync(group, member_id)
            self._schedule_heartbeat(group, member)
            return SyncResult(NONE, member.assignment, group.protocol_type, group.protocol_name)
        # CompletingRebalance: followers wait for the leader's assignment
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        member.sync_future = fut
        self._received_sync(group, member_id)
        where = None
        if group.is_leader(member_id):
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.transition(GroupState.STABLE)
            where = self._persist_group(group)
            for m in group.members.values():
                if m.awaiting_sync:
                    m.complete_sync(SyncResult(NONE, m.assignment, group.protocol_type,
                                               group.protocol_name))
                    self._schedule_heartbeat(group, m)
        result: SyncResult = await asyncio.shield(fut)  # a disconnect leaves it parked
        if where is not None and result.error == NONE:
            await self._durable(where)
        return result

    def _received_sync(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync and group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None

    # -- Heartbeat / LeaveGroup ---------------------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  instance_id: str | None) -> int:
        group = self.groups.get(group_id)
        if group is None:
            return UNKNOWN_MEMBER_ID
        if group.is_in(GroupState.DEAD):
            return COORDINATOR_NOT_AVAILABLE
        error = self._validate_member(group, member_id, instance_id)
        if error:
            return error
        if generation != group.generation:
            return ILLEGAL_GENERATION
        if group.is_in(GroupState.EMPTY):
            return UNKNOWN_MEMBER_ID
        self._schedule_heartbeat(group, group.members[member_id])
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return REBALANCE_IN_PROGRESS
        return NONE

    def leave_group(self, group_id: str, members: Sequence[tuple[str, str | None]]
                    ) -> tuple[int, list[int]]:
        """(group error, one error per leaving member)."""
        group = self.groups.get(group_id)
        if group is None:
            return UNKNOWN_MEMBER_ID, [UNKNOWN_MEMBER_ID] * len(members)
        if group.is_in(GroupState.DEAD):
            return COORDINATOR_NOT_AVAILABLE, [COORDINATOR_NOT_AVAILABLE] * len(members)
        errors = []
        for member_id, instance_id in members:
            if instance_id is not None:
                existing = group.static_member_id(instance_id)
                if existing is None:
                    errors.append(UNKNOWN_MEMBER_ID)
                elif member_id and member_id != existing:
                    errors.append(FENCED_INSTANCE_ID)
                else:
                    errors.append(NONE)
                    log.info("group %s: static member %s (%s) left", group_id, existing, instance_id)
                    self._remove_member_and_update_group(group, group.members[existing])
            elif member_id in group.pending_members:
                errors.append(NONE)
                self._remove_pending_member(group, member_id)
            elif member_id in group.members:
                errors.append(NONE)
                log.info("group %s: member %s left", group_id, member_id)
                self._remove_member_and_update_group(group, group.members[member_id])
            else:
                errors.append(UNKNOWN_MEMBER_ID)
        return NONE, errors

    # -- offsets ------------------------------------------------------------------------------

    def _validate_commit(self, group: Group | None, group_id: str, generation: int,
                         member_id: str, instance_id: str | None, version: int) -> tuple[int, Group | None]:
        if group is None:
            if generation < 0:  # a "simple" group: manual assignment, admin tools, kcat
                group = self.groups[group_id] = Group(group_id)
                return NONE, group
            return (GROUP_ID_NOT_FOUND if version >= 9 else ILLEGAL_GENERATION), None
        if group.is_in(GroupState.DEAD):
            return COORDINATOR_NOT_AVAILABLE, None
        if generation < 0 and group.is_in(GroupState.EMPTY):
            return NONE, group
        if generation >= 0 or member_id or instance_id is not None:
            error = self._validate_member(group, member_id, instance_id)
            if error:
                return error, None
            if generation != group.generation:
                return ILLEGAL_GENERATION, None
        elif not group.is_in(GroupState.EMPTY):
            return UNKNOWN_MEMBER_ID, None
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            return REBALANCE_IN_PROGRESS, None
        return NONE, group

    async def commit_offsets(self, group_id: str, generation: int, member_id: str,
                             instance_id: str | None,
                             topics: Sequence[tuple[str, Sequence[tuple[Any, ...]]]],
                             version: int) -> list[list[int]]:
        """One error per (topic, partition) of the request, in request order.  A partition is
        ``(partition, offset, leader epoch, metadata[, commit timestamp])``; the timestamp
        (OffsetCommit v1) replaces the broker's time unless it is -1, as in Kafka 3.9."""
        if not group_id:
            return [[INVALID_GROUP_ID] * len(parts) for _, parts in topics]
        error, group = self._validate_commit(self.groups.get(group_id), group_id, generation,
                                             member_id, instance_id, version)
        if error or group is None:
            return [[error] * len(parts) for _, parts in topics]
        now = _now_ms()
        out: list[list[int]] = []
        records: list[tuple[bytes, bytes | None]] = []
        committed: list[tuple[str, int, OffsetAndMetadata]] = []
        for topic, parts in topics:
            n = self.topic_partitions(topic)
            errors = []
            for partition, offset, epoch, metadata, *timestamp in parts:
                if n is None or not 0 <= partition < n:
                    errors.append(UNKNOWN_TOPIC_OR_PARTITION)
                elif metadata is not None and len(metadata) > self.config.offset_metadata_max_bytes:
                    errors.append(OFFSET_METADATA_TOO_LARGE)
                else:
                    committed_at = timestamp[0] if timestamp and timestamp[0] != -1 else now
                    o = OffsetAndMetadata(offset, epoch, metadata or "", committed_at)
                    committed.append((topic, partition, o))
                    records.append(self._offset_record(group_id, topic, partition, o))
                    errors.append(NONE)
            out.append(errors)
        if member_id in group.members and group.is_in(GroupState.STABLE):
            self._schedule_heartbeat(group, group.members[member_id])  # a commit is a sign of life
        if not records:
            return out
        where = self._append(group_id, records)
        for topic, partition, o in committed:
            group.offsets[(topic, partition)] = o
        error = await self._durable(where)
        if error:
            out = [[error if e == NONE else e for e in errs] for errs in out]
        return out

    def fetch_offsets(self, group_id: str, topics: TopicPartitions | None,
                      require_stable: bool) -> tuple[int, list[tuple[str, list[CommittedOffset]]]]:
        """(group error, committed offsets by topic); topics None = every committed offset."""
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None else {}

        def one(topic: str, partition: int) -> CommittedOffset:
            if require_stable and (group_id, topic, partition) in self.pending_transactional_offsets:
                return CommittedOffset(partition, error=UNSTABLE_OFFSET_COMMIT)
            o = offsets.get((topic, partition))
            if o is None:
                return CommittedOffset(partition)
            return CommittedOffset(partition, o.offset, o.leader_epoch, o.metadata)

        if topics is None:
            by_topic: dict[str, list[int]] = {}
            for (topic, partition) in sorted(offsets):
                by_topic.setdefault(topic, []).append(partition)
            topics = list(by_topic.items())
        return NONE, [(topic, [one(topic, p) for p in parts]) for topic, parts in topics]

    # -- admin --------------------------------------------------------------------------------

    def describe_group(self, group_id: str) -> GroupDescription:
        group = self.groups.get(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            return GroupDescription(group_id)
        stable = group.is_in(GroupState.STABLE)
        members = [MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                     m.metadata(group.protocol_name) if stable else b"",
                                     m.assignment if stable else b"")
                   for m in group.members.values()]
        return GroupDescription(group_id, NONE, group.state.value, group.protocol_type or "",
                                (group.protocol_name or "") if stable else "", members)

    def list_groups(self, states: Sequence[str] | None = None,
                    types: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every live group passing the filters."""
        if types and "classic" not in {t.lower() for t in types}:
            return []
        wanted = {s.lower() for s in states} if states else None
        return [(g.group_id, g.protocol_type or "", g.state.value)
                for g in self.groups.values()
                if not g.is_in(GroupState.DEAD)
                and (wanted is None or g.state.value.lower() in wanted)]

    async def delete_groups(self, group_ids: Sequence[str]) -> list[int]:
        errors = []
        wheres = []
        for gid in group_ids:
            group = self.groups.get(gid)
            if group is None or group.is_in(GroupState.DEAD):
                errors.append(GROUP_ID_NOT_FOUND)
            elif not group.is_in(GroupState.EMPTY):
                errors.append(NON_EMPTY_GROUP)
            else:
                wheres.append(self._delete_group(group))
                errors.append(NONE)
        for where in wheres:
            if await self._durable(where):
                errors = [COORDINATOR_NOT_AVAILABLE if e == NONE else e for e in errors]
        return errors

    def _delete_group(self, group: Group) -> tuple[int, int] | None:
        records: list[tuple[bytes, bytes | None]] = [
            (rec.offset_commit_key(group.group_id, t, p), None) for (t, p) in group.offsets]
        if group.persisted:
            records.append((rec.group_metadata_key(group.group_id), None))
        self._cancel_group_timers(group)
        for m in group.members.values():
            if m.heartbeat_timer is not None:
                m.heartbeat_timer.cancel()
        group.offsets.clear()
        group.transition(GroupState.DEAD)
        del self.groups[group.group_id]
        log.info("group %s deleted", group.group_id)
        return self._append(group.group_id, records) if records else None

    async def delete_offsets(self, group_id: str, topics: TopicPartitions
                             ) -> tuple[int, list[tuple[str, list[tuple[int, int]]]]]:
        """OffsetDelete: (group error, per-partition errors)."""
        group = self.groups.get(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            return GROUP_ID_NOT_FOUND, []
        subscribed: set[str] | None = set()
        if not group.is_in(GroupState.EMPTY):
            subscribed = group.subscribed_topics()
            if subscribed is None:
                return NON_EMPTY_GROUP, []
        out = []
        records: list[tuple[bytes, bytes | None]] = []
        for topic, parts in topics:
            errs = []
            for p in parts:
                if self.topic_partitions(topic) is None:
                    errs.append((p, UNKNOWN_TOPIC_OR_PARTITION))
                elif topic in subscribed:  # type: ignore[operator]
                    errs.append((p, GROUP_SUBSCRIBED_TO_TOPIC))
                else:
                    if group.offsets.pop((topic, p), None) is not None:
                        records.append((rec.offset_commit_key(group_id, topic, p), None))
                    errs.append((p, NONE))
            out.append((topic, errs))
        if records:
            error = await self._durable(self._append(group_id, records))
            if error:
                return error, []
        return NONE, out

    # -- cleanup ------------------------------------------------------------------------------

    def on_topics_deleted(self, topics: Sequence[str]) -> None:
        """Offsets of deleted topics go (Kafka ``onPartitionsDeleted``)."""
        doomed = set(topics)
        for group in list(self.groups.values()):
            gone = [tp for tp in group.offsets if tp[0] in doomed]
            self._drop_offsets(group, gone)

    def _drop_offsets_of_missing_topics(self) -> None:
        for group in list(self.groups.values()):
            gone = [(t, p) for (t, p) in group.offsets
                    if (n := self.topic_partitions(t)) is None or p >= n]
            self._drop_offsets(group, gone)

    def _drop_offsets(self, group: Group, gone: list[tuple[str, int]]) -> None:
        if not gone:
            return
        for tp in gone:
            group.offsets.pop(tp, None)
        self._append(group.group_id,
                     [(rec.offset_commit_key(group.group_id, t, p), None) for t, p in gone])

    def expire_offsets(self, now_ms: int | None = None) -> int:
        """Kafka's ``cleanupGroupMetadata``: offsets past ``offsets.retention.minutes`` go, then
        Empty groups that have no offsets left.  Returns how many offsets expired."""
        now = _now_ms() if now_ms is None else now_ms
        retention = self.config.offsets_retention_ms
        expired = 0
        for group in list(self.groups.values()):
            if group.protocol_type is None and not group.members:  # simple group
                gone = [tp for tp, o in group.offsets.items()
                        if o.commit_timestamp + retention <= now]
            elif group.is_in(GroupState.EMPTY):
                gone = [tp for tp, o in group.offsets.items()
                        if max(group.state_timestamp, 0) + retention <= now]
            elif group.is_in(GroupState.STABLE) and (subs := group.subscribed_topics()) is not None:
                gone = [tp for tp, o in group.offsets.items()
                        if tp[0] not in subs and o.commit_timestamp + retention <= now]
            else:
                gone = []
            self._drop_offsets(group, gone)
            expired += len(gone)
            if group.is_in(GroupState.EMPTY) and not group.offsets and not group.members \
                    and not group.pending_members:
                self._delete_group(group)
        return expired
