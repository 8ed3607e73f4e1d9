"""OffsetForLeaderEpoch v1 (Kafka 3.9 ``OffsetForLeaderEpochRequest.json`` / ``...Response.json``).

The request of v0; the answer adds the leader epoch whose end offset it gives.
"""

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64

from shmq.protocol.legacy._schema import request, request_nested, response, response_nested

API_KEY, VERSION = 23, 1


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetForLeaderPartition:
    partition: i32 = field(metadata={"kafka_type": "int32"})
    leader_epoch: i32 = field(metadata={"kafka_type": "int32"})


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetForLeaderTopic:
    topic: TopicName = field(metadata={"kafka_type": "string"})
    partitions: tuple[OffsetForLeaderPartition, ...]


@request(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetForLeaderEpochRequest:
    topics: tuple[OffsetForLeaderTopic, ...]


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class EpochEndOffset:
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    partition: i32 = field(metadata={"kafka_type": "int32"})
    leader_epoch: i32 = field(metadata={"kafka_type": "int32"}, default=i32(-1))
    end_offset: i64 = field(metadata={"kafka_type": "int64"}, default=i64(-1))


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetForLeaderTopicResult:
    topic: TopicName = field(metadata={"kafka_type": "string"})
    partitions: tuple[EpochEndOffset, ...]


@response(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetForLeaderEpochResponse:
    topics: tuple[OffsetForLeaderTopicResult, ...]


REQUEST, RESPONSE = OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse
