"""ListOffsets (2): latest (-1), earliest (-2), max timestamp (-3, v7+), earliest local (-4,
v8+) or the first offset whose timestamp is at or after a given one.

"Latest" is the high watermark for read_uncommitted and the last stable offset for
read_committed: a consumer never positions itself past what it may read.  The leader epoch
answered (v4+) is Kafka's (``ReplicaManager.fetchOffset``): the partition's current epoch for
"latest", the epoch covering the log start for "earliest", the found batch's epoch for a
timestamp or max-timestamp lookup, and -1 with an error or when nothing is found (an offset at
or past the high watermark counts as nothing).  Max timestamp before v7 and earliest local
before v8 are UNSUPPORTED_VERSION (``isListOffsetsTimestampUnsupported``).

v1..v8 arrive through ``handle_wire`` (the router parses them by hand: librdkafka sends one
request per partition when a consumer starts, and kio's decode and encode were ~0.4 ms of each);
v0 and kio-decoded requests through ``handle``.  Both answer through ``answer``.

v0 (Kafka 3.9's ``handleListOffsetRequestV0``) answers a list of up to ``max_num_offsets``
segment base offsets instead (``PartitionLog.legacy_offsets_before``); a consumer (replica id -1)
gets the high watermark in place of any offset above it.  Timestamps below -2 are
UNSUPPORTED_VERSION there.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers._build import build, response_module
from shmq.broker.handlers._epochs import check_leader_epoch
from shmq.protocol.list_offsets import encode_list_offsets_response, parse_list_offsets_request
from shmq.storage.log import EARLIEST_TIMESTAMP, MAX_TIMESTAMP, PartitionLog

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, 3, 6
UNKNOWN_SERVER_ERROR, UNSUPPORTED_VERSION = -1, 35
CONSUMER_REPLICA_ID = -1


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    """The kio path: v0, and any version when called with a kio request."""
    version = header.api_version
    cls, m = response_module(2, version)
    asked = [(t.name, [(p.partition_index, getattr(p, "current_leader_epoch", -1), p.timestamp,
                        getattr(p, "max_num_offsets", 1)) for p in t.partitions])
             for t in request.topics]
    answered = answer(ctx, version, request.replica_id,
                      getattr(request, "isolation_level", 0) == 1, asked)
    return build(cls, topics=tuple(
        build(m.ListOffsetsTopicResponse, name=name, partitions=tuple(
            build(m.ListOffsetsPartitionResponse, partition_index=index, error_code=code,
                  timestamp=ts, offset=offset, leader_epoch=epoch,
                  old_style_offsets=tuple(old_style))
            for index, code, ts, offset, epoch, old_style in parts))
        for name, parts in answered))


async def handle_wire(ctx: BrokerContext, frame: memoryview, header_size: int, version: int,
                      correlation_id: int) -> bytes:
    """v1..v8 parsed and answered by hand (``protocol.list_offsets``): the same answers as the
    kio path, byte for byte."""
    request = parse_list_offsets_request(frame, header_size, version)
    answered = answer(ctx, version, request.replica_id, request.isolation_level == 1,
                      [(name, [(*p, 1) for p in parts]) for name, parts in request.topics])
    return encode_list_offsets_response(version, correlation_id, [
        (name, [row[:5] for row in parts]) for name, parts in answered])


def answer(ctx: BrokerContext, version: int, replica_id: int, committed: bool,
           topics: list[tuple[str, list[tuple[int, int, int, int]]]]) -> list[tuple[str, list]]:
    """``[(name, [(partition_index, error_code, timestamp, offset, leader_epoch,
    old_style_offsets)])]`` for ``[(name, [(partition_index, current_leader_epoch, timestamp,
    max_num_offsets)])]``."""
    out = []
    for name, partitions in topics:
        parts = []
        for index, current_epoch, timestamp, max_num_offsets in partitions:
            code, offset, ts, epoch = NONE, -1, -1, -1
            old_style: list[int] = []
            info = ctx.metadata.topics.get(name)
            log = ctx.log_for(name, index)
            if version >= 1 and ((timestamp == MAX_TIMESTAMP and version < 7)
                                 or (timestamp == -4 and version < 8)):
                code = UNSUPPORTED_VERSION
            elif info is None or not 0 <= index < len(info.partitions):
                code = UNKNOWN_TOPIC_OR_PARTITION
            elif log is None:
                code = NOT_LEADER
            elif version == 0:
                code, old_style = _legacy_offsets(log, timestamp, max_num_offsets,
                                                  replica_id == CONSUMER_REPLICA_ID)
            else:
                leader_epoch = info.partitions[index].leader_epoch
                code = check_leader_epoch(current_epoch, leader_epoch)
                if code == NONE:  # errors carry no offset, timestamp or epoch
                    offset, ts, epoch = _lookup(log, timestamp, leader_epoch, committed)
            parts.append((index, code, ts, offset, epoch, old_style))
        out.append((name, parts))
    return out


def _lookup(log: PartitionLog, timestamp: int, leader_epoch: int,
            committed: bool = False) -> tuple[int, int, int]:
    """(offset, timestamp, leader epoch) answered for one partition (``ReplicaManager``);
    read_committed's latest offset is the last stable offset."""
    if timestamp == -1:
        return (log.last_stable_offset if committed else log.high_watermark), -1, leader_epoch
    if timestamp in (-2, -4):
        found = log.fetch_offset_by_timestamp(EARLIEST_TIMESTAMP)
        assert found is not None
        return found.offset, -1, found.leader_epoch
    found = log.fetch_offset_by_timestamp(timestamp)
    if found is None or found.offset >= log.high_watermark:
        return -1, -1, -1  # nothing (readable) found
    return found.offset, found.timestamp, found.leader_epoch


def _legacy_offsets(log: PartitionLog, timestamp: int, max_num_offsets: int,
                    from_consumer: bool) -> tuple[int, list[int]]:
    if timestamp < -2:
        return UNSUPPORTED_VERSION, []
    if max_num_offsets < 0:
        return UNKNOWN_SERVER_ERROR, []  # Kafka 3.9 fails the same way (a negative array size)
    offsets = log.legacy_offsets_before(timestamp, max_num_offsets)
    hw = log.high_watermark
    if from_consumer and any(o > hw for o in offsets):  # Partition.legacyFetchOffsetsForTimestamp
        offsets = [hw] + [o for o in offsets if o <= hw]
    return NONE, offsets
