"""OffsetFetch v0 (Kafka 3.9 ``OffsetFetchRequest.json`` / ``OffsetFetchResponse.json``).

The layout of v1: a group and its topics' partitions in, per partition an offset, metadata and
error out (no group-level error before v2).  Kafka read v0's offsets from ZooKeeper and v1's from
``__consumer_offsets``; shmq has one store, the coordinator's, for both.
"""

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64

from shmq.protocol.legacy._schema import request, request_nested, response, response_nested

API_KEY, VERSION = 9, 0


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchRequestTopic:
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_indexes: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())


@request(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchRequest:
    group_id: GroupId = field(metadata={"kafka_type": "string"})
    topics: tuple[OffsetFetchRequestTopic, ...]


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchResponsePartition:
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    committed_offset: i64 = field(metadata={"kafka_type": "int64"})
    metadata: str | None = field(metadata={"kafka_type": "string"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchResponseTopic:
    name: TopicName = field(metadata={"kafka_type": "string"})
    partitions: tuple[OffsetFetchResponsePartition, ...]


@response(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchResponse:
    topics: tuple[OffsetFetchResponseTopic, ...]


REQUEST, RESPONSE = OffsetFetchRequest, OffsetFetchResponse
