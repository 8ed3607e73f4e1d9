"""The records of ``__consumer_offsets``: Kafka's key and value layouts, byte for byte.

Every record's key and value start with an int16 version that says which schema follows
(``group-coordinator/src/main/resources/common/message/*.json``; Kafka's ``CoordinatorRecordSerde``)::

    key version 0 or 1   OffsetCommitKey      group string | topic string | partition int32
    key version 2        GroupMetadataKey     group string
    (3 and above are KIP-848 / share / streams group records: skipped on load)

    OffsetCommitValue v3   offset int64 | leaderEpoch int32 | metadata string | commitTimestamp int64
      (v0: offset, metadata, commitTimestamp; v1 adds expireTimestamp int64 after it;
       v2 = v0; v4 = v3 flexible: compact strings and a tagged-field section)
    GroupMetadataValue v3  protocolType string | generation int32 | protocol string? | leader string?
                           | currentStateTimestamp int64 | members [MemberMetadata]
      MemberMetadata v3    memberId string | groupInstanceId string? | clientId string
                           | clientHost string | rebalanceTimeout int32 | sessionTimeout int32
                           | subscription bytes | assignment bytes
      (v0: no currentStateTimestamp, rebalanceTimeout, groupInstanceId; v1 adds rebalanceTimeout;
       v2 adds currentStateTimestamp; v3 adds groupInstanceId; v4 = v3 flexible)

A null value is a tombstone: the offset, or the whole group, is gone.  shmq writes the versions
Kafka 4.0 writes (OffsetCommitValue v3, GroupMetadataValue v3) and reads every version above, so a
log copied from Kafka loads and Kafka's ``kafka-dump-log --offsets-decoder`` reads ours.  Kafka
4.3 writes OffsetCommitValue v4 (flexible, the topic id as a tagged field); shmq keeps v3 because
the lag monitors that read this topic (Burrow: sarama's decoder knows versions 0, 1 and 3) fail on
v4, while every Kafka tool and client reads v3 (tests/integration/kafka_differences.py, row 11).
Strings are ``int16 length + UTF-8`` (-1 = null), bytes ``int32 length``, arrays ``int32 count``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from shmq.errors import CorruptRecordError

OFFSET_COMMIT_KEY_VERSION = 1       # Kafka 4.0 (apiKey 1); 0 is the legacy layout, same fields
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3

_H = struct.Struct(">h")
_I = struct.Struct(">i")
_Q = struct.Struct(">q")


@dataclass(frozen=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1


@dataclass(frozen=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: list[MemberMetadata] = field(default_factory=list)


# -- writing ----------------------------------------------------------------------------------

def _str(s: str | None) -> bytes:
    if s is None:
        return _H.pack(-1)
    b = s.encode()
    return _H.pack(len(b)) + b


def _bytes(b: bytes) -> bytes:
    return _I.pack(len(b)) + b


def offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    return _H.pack(OFFSET_COMMIT_KEY_VERSION) + _str(group) + _str(topic) + _I.pack(partition)


def group_metadata_key(group: str) -> bytes:
    return _H.pack(GROUP_METADATA_KEY_VERSION) + _str(group)


def offset_commit_value(v: OffsetCommitValue) -> bytes:
    return (_H.pack(OFFSET_COMMIT_VALUE_VERSION) + _Q.pack(v.offset) + _I.pack(v.leader_epoch)
            + _str(v.metadata) + _Q.pack(v.commit_timestamp))


def group_metadata_value(v: GroupMetadataValue) -> bytes:
    out = [_H.pack(GROUP_METADATA_VALUE_VERSION), _str(v.protocol_type), _I.pack(v.generation),
           _str(v.protocol), _str(v.leader), _Q.pack(v.current_state_timestamp),
           _I.pack(len(v.members))]
    for m in v.members:
        out += [_str(m.member_id), _str(m.group_instance_id), _str(m.client_id),
                _str(m.client_host), _I.pack(m.rebalance_timeout), _I.pack(m.session_timeout),
                _bytes(m.subscription), _bytes(m.assignment)]
    return b"".join(out)


# -- reading ----------------------------------------------------------------------------------

class _Reader:
    """Legacy (non-flexible) and compact (flexible, v4) primitives over one key or value."""

    def __init__(self, buf: bytes, flexible: bool = False) -> None:
        self.buf, self.pos, self.flexible = buf, 0, flexible

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise CorruptRecordError("__consumer_offsets record is truncated")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return int(_H.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_I.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_Q.unpack(self._take(8))[0])

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptRecordError("bad varint in a __consumer_offsets record")

    def string(self) -> str | None:
        n = self.uvarint() - 1 if self.flexible else self.int16()
        if n == -1:
            return None
        try:
            return self._take(n).decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"bad UTF-8 in a __consumer_offsets record: {exc}") from None

    def bytes_(self) -> bytes:
        n = self.uvarint() - 1 if self.flexible else self.int32()
        return b"" if n < 0 else self._take(n)

    def count(self) -> int:
        n = self.uvarint() - 1 if self.flexible else self.int32()
        if n > len(self.buf) - self.pos:
            raise CorruptRecordError("array count beyond the record")
        return max(n, 0)

    def tags(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()
                self._take(self.uvarint())


def decode_key(key: bytes) -> OffsetCommitKey | GroupMetadataKey | None:
    """The key of a ``__consumer_offsets`` record; None for record kinds classic groups ignore."""
    r = _Reader(key)
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string() or "", r.string() or "", r.int32())
    if version == 2:
        return GroupMetadataKey(r.string() or "")
    return None


def group_of(key: bytes) -> str:
    """The group id of any coordinator record key: every key schema starts with it (the classic
    keys above and KIP-848's group keys alike)."""
    r = _Reader(key)
    r.int16()
    group = r.string()
    if group is None:
        raise CorruptRecordError("__consumer_offsets key without a group id")
    return group


def decode_offset_value(value: bytes) -> OffsetCommitValue:
    version = _H.unpack_from(value, 0)[0] if len(value) >= 2 else -1
    if not 0 <= version <= 4:
        raise CorruptRecordError(f"unknown OffsetCommitValue version {version}")
    r = _Reader(value, flexible=version >= 4)
    r.int16()
    offset = r.int64()
    epoch = r.int32() if version >= 3 else -1
    metadata = r.string() or ""
    ts = r.int64()
    expire = r.int64() if version == 1 else -1
    r.tags()
    return OffsetCommitValue(offset, epoch, metadata, ts, expire)


def decode_group_value(value: bytes) -> GroupMetadataValue:
    version = _H.unpack_from(value, 0)[0] if len(value) >= 2 else -1
    if not 0 <= version <= 4:
        raise CorruptRecordError(f"unknown GroupMetadataValue version {version}")
    r = _Reader(value, flexible=version >= 4)
    r.int16()
    protocol_type = r.string() or ""
    generation = r.int32()
    protocol = r.string()
    leader = r.string()
    ts = r.int64() if version >= 2 else -1
    members = []
    for _ in range(r.count()):
        member_id = r.string() or ""
        instance = r.string() if version >= 3 else None
        client_id = r.string() or ""
        client_host = r.string() or ""
        rebalance = r.int32() if version >= 1 else -1
        session = r.int32()
        subscription = r.bytes_()
        assignment = r.bytes_()
        r.tags()
        if rebalance < 0:
            rebalance = session
        members.append(MemberMetadata(member_id, instance, client_id, client_host, rebalance,
                                      session, subscription, assignment))
    r.tags()
    return GroupMetadataValue(protocol_type, generation, protocol, leader, ts, members)


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(groupId.hashCode()) % partitions`` (abs(MIN_VALUE) is 0 there)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions
