"""DeleteTopics v0 (Kafka 3.9 ``DeleteTopicsRequest.json`` / ``DeleteTopicsResponse.json``).

The request of v1 (topic names and a timeout); the response without the throttle time (v1).
"""

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32Timedelta

from shmq.protocol.legacy._schema import request, response, response_nested

API_KEY, VERSION = 20, 0


@request(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicsRequest:
    topic_names: tuple[TopicName, ...] = field(metadata={"kafka_type": "string"}, default=())
    timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class DeletableTopicResult:
    name: TopicName = field(metadata={"kafka_type": "string"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})


@response(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicsResponse:
    responses: tuple[DeletableTopicResult, ...]


REQUEST, RESPONSE = DeleteTopicsRequest, DeleteTopicsResponse
