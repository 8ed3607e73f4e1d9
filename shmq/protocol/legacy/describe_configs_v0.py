"""DescribeConfigs v0 (Kafka 3.9 ``DescribeConfigsRequest.json`` / ``DescribeConfigsResponse.json``).

No ``include_synonyms``; each config says ``is_default`` where v1+ give its source and synonyms.
"""

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i32Timedelta

from shmq.protocol.legacy._schema import request, request_nested, response, response_nested

API_KEY, VERSION = 32, 0


@request_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResource:
    resource_type: i8 = field(metadata={"kafka_type": "int8"})
    resource_name: str = field(metadata={"kafka_type": "string"})
    configuration_keys: tuple[str, ...] | None = field(metadata={"kafka_type": "string"},
                                                       default=())


@request(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsRequest:
    resources: tuple[DescribeConfigsResource, ...]


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResourceResult:
    name: str = field(metadata={"kafka_type": "string"})
    value: str | None = field(metadata={"kafka_type": "string"})
    read_only: bool = field(metadata={"kafka_type": "bool"})
    is_default: bool = field(metadata={"kafka_type": "bool"})
    is_sensitive: bool = field(metadata={"kafka_type": "bool"})


@response_nested(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResult:
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    error_message: str | None = field(metadata={"kafka_type": "string"})
    resource_type: i8 = field(metadata={"kafka_type": "int8"})
    resource_name: str = field(metadata={"kafka_type": "string"})
    configs: tuple[DescribeConfigsResourceResult, ...]


@response(API_KEY, VERSION)
@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResponse:
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    results: tuple[DescribeConfigsResult, ...]


REQUEST, RESPONSE = DescribeConfigsRequest, DescribeConfigsResponse
