"""One classic consumer group: members, generation, selected protocol, committed offsets.

A plain data model with Kafka's rules (``ClassicGroup.java``, ``ClassicGroupMember.java``); the
coordinator drives the state machine and owns the timers.  States and the transitions Kafka
allows::

    Empty ──────────────► PreparingRebalance ◄──────────────┐
      ▲                        │      ▲                     │
      │ (join completes,       │ join │ member joins/leaves │
      │  no members)           ▼ done │ or times out        │
      └──────────────── CompletingRebalance ──leader syncs──► Stable
    any state ──► Dead (group deleted, or expired with no offsets left)
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS = {
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE,
                                     GroupState.EMPTY},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.DEAD: set(GroupState),
}


@dataclass
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    is_new: bool = False
    heartbeat_satisfied: bool = False
    join_future: asyncio.Future | None = None
    sync_future: asyncio.Future | None = None
    heartbeat_timer: asyncio.TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None and not self.sync_future.done()

    def has_satisfied_heartbeat(self) -> bool:
        if self.is_new:  # new members can expire while their JoinGroup waits
            return self.heartbeat_satisfied
        if self.awaiting_join or self.awaiting_sync:
            return True
        return self.heartbeat_satisfied

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def complete_join(self, result: Any) -> None:
        fut, self.join_future = self.join_future, None
        if fut is not None and not fut.done():
            fut.set_result(result)

    def complete_sync(self, result: Any) -> None:
        fut, self.sync_future = self.sync_future, None
        if fut is not None and not fut.done():
            fut.set_result(result)


@dataclass(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    previous_state: GroupState = GroupState.EMPTY
    state_timestamp: int = field(default_factory=lambda: int(time.time() * 1000))
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending_members: set[str] = field(default_factory=set)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_sync: set[str] = field(default_factory=set)
    supported_protocols: Counter = field(default_factory=Counter)
    new_member_added: bool = False
    offsets: dict[tuple[str, int], OffsetAndMetadata] = field(default_factory=dict)
    join_timer: asyncio.TimerHandle | None = None
    sync_timer: asyncio.TimerHandle | None = None
    persisted: bool = False          # a GroupMetadata record is in the log (tombstone on delete)

    # -- state ------------------------------------------------------------------------------

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition(self, target: GroupState) -> None:
        if self.state not in _VALID_PREVIOUS[target]:
            raise AssertionError(f"group {self.group_id}: {self.state.value} -> {target.value}")
        self.previous_state, self.state = self.state, target
        self.state_timestamp = int(time.time() * 1000)

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    # -- members ----------------------------------------------------------------------------

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names())
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        self.pending_members.discard(member_id)
        self.pending_sync.discard(member_id)
        if member is None:
            return None
        self.supported_protocols.subtract(member.protocol_names())
        self.supported_protocols += Counter()  # drop zero counts
        if member.group_instance_id is not None and \
                self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def update_member(self, member: Member, protocols: list[tuple[str, bytes]],
                      rebalance_timeout_ms: int, session_timeout_ms: int,
                      future: asyncio.Future | None) -> None:
        self.supported_protocols.subtract(member.protocol_names())
        self.supported_protocols += Counter()
        member.protocols = protocols
        self.supported_protocols.update(member.protocol_names())
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if future is not None:
            member.join_future = future

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """A static member rejoined with a new member id: the old id is fenced."""
        old = self.members.pop(old_id)
        old.complete_join(("fenced", old_id))
        old.complete_sync(("fenced", old_id))
        old.member_id = new_id
        self.members[new_id] = old
        self.static_members[instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return old

    def static_member_id(self, instance_id: str | None) -> str | None:
        return None if instance_id is None else self.static_members.get(instance_id)

    def awaiting_join_count(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.awaiting_join_count() and not self.pending_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def maybe_elect_new_joined_leader(self) -> bool:
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for m in self.members.values():
            if m.awaiting_join:
                self.leader_id = m.member_id
                return True
        return False

    # -- protocols --------------------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        n = len(self.members)
        return protocol_type == self.protocol_type and any(
            self.supported_protocols.get(name, 0) == n for name, _ in protocols)

    def select_protocol(self) -> str:
        """Kafka's vote: every member votes for its most preferred protocol all members
        support; the most votes wins (ties: the first member's preference order)."""
        n = len(self.members)
        candidates = [p for p, c in self.supported_protocols.items() if c == n]
        if not candidates:
            raise AssertionError(f"group {self.group_id}: no protocol all members support")
        votes: Counter = Counter()
        for m in self.members.values():
            votes[next(name for name in m.protocol_names() if name in candidates)] += 1
        first = next(iter(self.members.values())).protocol_names()
        return max(candidates, key=lambda p: (votes[p], -first.index(p) if p in first else -999))

    def init_next_generation(self) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition(GroupState.COMPLETING_REBALANCE)
        else:
            self.protocol_name = None
            self.transition(GroupState.EMPTY)
        self.pending_sync.clear()

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol), None if unknown."""
        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            parsed = parse_subscription_topics(m.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics.update(parsed)
        return topics


def parse_subscription_topics(data: bytes) -> list[str] | None:
    """The topics of a ConsumerProtocolSubscription (int16 version, then [string] topics)."""
    import struct

    try:
        pos = 2
        (count,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if count < 0 or count > len(data):
            return None
        topics = []
        for _ in range(count):
            (n,) = struct.unpack_from(">h", data, pos)
            pos += 2
            if n < 0 or pos + n > len(data):
                return None
            topics.append(data[pos : pos + n].decode())
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def parse_assignment(data: bytes) -> list[tuple[str, list[int]]] | None:
    """The partitions of a ConsumerProtocolAssignment (int16 version, then [topic string,
    [int32 partition]]), or None when ``data`` is not one (another protocol type's bytes)."""
    import struct

    try:
        pos = 2
        (count,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if count < 0 or count > len(data):
            return None
        out = []
        for _ in range(count):
            (n,) = struct.unpack_from(">h", data, pos)
            pos += 2
            if n < 0 or pos + n > len(data):
                return None
            topic = data[pos : pos + n].decode()
            pos += n
            (k,) = struct.unpack_from(">i", data, pos)
            pos += 4
            if k < 0 or pos + 4 * k > len(data):
                return None
            out.append((topic, list(struct.unpack_from(f">{k}i", data, pos))))
            pos += 4 * k
        return out
    except (struct.error, UnicodeDecodeError):
        return None
