"""OffsetCommit v1 (Kafka 3.9 ``OffsetCommitRequest.json`` / ``OffsetCommitResponse.json``).

Adds the generation and member id, and a commit timestamp per partition (-1: the broker's time;
Kafka 3.9 keeps any other value as the offset's commit timestamp, which retention counts from).
"""

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64

from shmq.protocol.legacy._schema import request, request_nested, response, response_nested

API_KEY, VERSION = 8, 1


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequestPartition:
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    committed_offset: i64 = field(metadata={"kafka_type": "int64"})
    commit_timestamp: i64 = field(metadata={"kafka_type": "int64"}, default=i64(-1))
    committed_metadata: str | None = field(metadata={"kafka_type": "string"})


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequestTopic:
    name: TopicName = field(metadata={"kafka_type": "string"})
    partitions: tuple[OffsetCommitRequestPartition, ...]


@request(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequest:
    group_id: GroupId = field(metadata={"kafka_type": "string"})
    generation_id_or_member_epoch: i32 = field(metadata={"kafka_type": "int32"},
                                               default=i32(-1))
    member_id: str = field(metadata={"kafka_type": "string"})
    topics: tuple[OffsetCommitRequestTopic, ...]


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitResponsePartition:
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitResponseTopic:
    name: TopicName = field(metadata={"kafka_type": "string"})
    partitions: tuple[OffsetCommitResponsePartition, ...]


@response(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitResponse:
    topics: tuple[OffsetCommitResponseTopic, ...]


REQUEST, RESPONSE = OffsetCommitRequest, OffsetCommitResponse
