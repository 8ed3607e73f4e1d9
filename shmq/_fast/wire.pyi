from collections.abc import Sequence
from typing import Any

from shmq._fast._wire_types import FetchRequest, ProduceRequest

def request_header_size(frame: memoryview, flexible: bool) -> int: ...
def parse_produce_request(frame: memoryview, header_size: int, version: int) -> ProduceRequest: ...
def parse_fetch_request(frame: memoryview, header_size: int, version: int) -> FetchRequest: ...
def encode_produce_response(
    version: int,
    correlation_id: int,
    throttle_ms: int,
    results: Sequence[tuple[str, Sequence[Sequence[Any]]]],
) -> bytes: ...
def encode_fetch_response(
    version: int,
    correlation_id: int,
    topics: Sequence[tuple[str, Sequence[Sequence[Any]]]],
    throttle_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
) -> list[Any]: ...

POOL_MAX: int
POOL_BYTES: int

def pooled_buffers() -> int: ...

class ReceiveBuffer:
    size: int
    exports: int
    def __init__(self, size: int) -> None: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
