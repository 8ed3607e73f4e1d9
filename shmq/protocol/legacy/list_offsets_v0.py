"""ListOffsets v0 (Kafka 3.9 ``ListOffsetsRequest.json`` / ``ListOffsetsResponse.json``).

Request: replica id, then per partition a timestamp and ``max_num_offsets``; response: per
partition a list of offsets (``old_style_offsets``), segment base offsets in descending order.
"""

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i32, i64

from shmq.protocol.legacy._schema import request, request_nested, response, response_nested

API_KEY, VERSION = 2, 0


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsPartition:
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    timestamp: i64 = field(metadata={"kafka_type": "int64"})
    max_num_offsets: i32 = field(metadata={"kafka_type": "int32"}, default=i32(1))


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsTopic:
    name: TopicName = field(metadata={"kafka_type": "string"})
    partitions: tuple[ListOffsetsPartition, ...]


@request(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsRequest:
    replica_id: BrokerId = field(metadata={"kafka_type": "int32"})
    topics: tuple[ListOffsetsTopic, ...]


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsPartitionResponse:
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    old_style_offsets: tuple[i64, ...] = field(metadata={"kafka_type": "int64"}, default=())


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsTopicResponse:
    name: TopicName = field(metadata={"kafka_type": "string"})
    partitions: tuple[ListOffsetsPartitionResponse, ...]


@response(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsResponse:
    topics: tuple[ListOffsetsTopicResponse, ...]


REQUEST, RESPONSE = ListOffsetsRequest, ListOffsetsResponse
