"""CreateTopics v0 (Kafka 3.9 ``CreateTopicsRequest.json`` / ``CreateTopicsResponse.json``).

No ``validate_only`` (added in v1); the response has a name and an error code per topic.
"""

import datetime
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i16, i32, i32Timedelta

from shmq.protocol.legacy._schema import request, request_nested, response, response_nested

API_KEY, VERSION = 19, 0


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class CreatableReplicaAssignment:
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    broker_ids: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"}, default=())


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class CreatableTopicConfig:
    name: str = field(metadata={"kafka_type": "string"})
    value: str | None = field(metadata={"kafka_type": "string"})


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class CreatableTopic:
    name: TopicName = field(metadata={"kafka_type": "string"})
    num_partitions: i32 = field(metadata={"kafka_type": "int32"})
    replication_factor: i16 = field(metadata={"kafka_type": "int16"})
    assignments: tuple[CreatableReplicaAssignment, ...]
    configs: tuple[CreatableTopicConfig, ...]


@request(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopicsRequest:
    topics: tuple[CreatableTopic, ...]
    timeout: i32Timedelta = field(
        metadata={"kafka_type": "timedelta_i32"},
        default=i32Timedelta.parse(datetime.timedelta(milliseconds=60000)))


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class CreatableTopicResult:
    name: TopicName = field(metadata={"kafka_type": "string"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})


@response(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopicsResponse:
    topics: tuple[CreatableTopicResult, ...]


REQUEST, RESPONSE = CreateTopicsRequest, CreateTopicsResponse
