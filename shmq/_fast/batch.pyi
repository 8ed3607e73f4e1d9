from collections.abc import Sequence
from typing import Any

from typing_extensions import Buffer

HEADER_SIZE: int
SCAN_END: int
SCAN_PARTIAL: int
SCAN_CORRUPT: int
SCAN_FULL: int
SCAN_COLUMNS: int
NO_LOG_APPEND_TIME: int

def validate_batch(
    buf: Buffer, pos: int = 0, end: int = -1, verify_crc: bool = True, strict: bool = True
) -> int: ...
def write_stamped(
    fd: int, at: int, buf: Buffer, pos: int, size: int, base_offset: int, leader_epoch: int
) -> int: ...
def batch_header(buf: Buffer, pos: int = 0) -> tuple[int, ...]: ...
def stamp_batch(buf: Buffer, pos: int, base_offset: int, leader_epoch: int) -> None: ...
def scan_batches(
    buf: Buffer, start: int, end: int, out: Any, verify_crc: bool = True, strict: bool = False
) -> tuple[int, int, int, str | None]: ...
def check_timestamps(
    body: Buffer,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int,
    create_time: bool,
    now: int,
    before_max_ms: int,
    after_max_ms: int,
) -> tuple[int, list[tuple[int, int, int, int, int, int]] | None]: ...
TIMESTAMPS_UNCHECKED: int

def check_batch(
    buf: Buffer,
    pos: int,
    limit: int,
    validate: bool,
    create_time: bool,
    now: int,
    before_max_ms: int,
    after_max_ms: int,
) -> tuple[int, int, int, int, int, int, int, int, list[tuple[int, int, int, int, int, int]] | None]: ...
def decode_records(
    body: Buffer,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int = ...,
    record_type: type | None = None,
) -> list[Any]: ...
def decode_sections(
    bodies: list[Any], meta: Any, record_type: type | None = None
) -> list[Any]: ...
def encode_records(records: Sequence[tuple[Any, Any, int, Any]], base_timestamp: int) -> bytes: ...
def build_batch(
    records: Buffer,
    records_count: int,
    last_offset_delta: int,
    attributes: int,
    base_offset: int,
    leader_epoch: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> bytearray: ...
def fill_columns(
    bodies: list[Any],
    meta: Any,
    offsets: Any,
    timestamps: Any,
    key_offsets: Any,
    key_data: Any,
    key_valid: Any,
    value_offsets: Any,
    value_data: Any,
    value_valid: Any,
    min_offset: int = ...,
    max_offset: int = ...,
    timestamp_scale: int = 1,
) -> tuple[int, int, int, int, int]: ...
def fill_headers(
    bodies: list[Any],
    meta: Any,
    list_offsets: Any,
    list_valid: Any,
    key_offsets: Any,
    key_data: Any,
    value_offsets: Any,
    value_data: Any,
    value_valid: Any,
    min_offset: int = ...,
    max_offset: int = ...,
) -> tuple[int, int, int, int, int, int, int]: ...
def murmur2_partitions(
    offsets: Any, data: Any, valid: Any, partitions: int, out: Any
) -> None: ...
def encode_arrow_batch_into(
    out: Any,
    pos: int,
    limit: int,
    rows: Any,
    key_offsets: Any,
    key_data: Any,
    key_valid: Any,
    value_offsets: Any,
    value_data: Any,
    value_valid: Any,
    timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> int: ...
def import_spark_batch(
    importer: Any,
    schema: Any,
    n: int,
    block: Any,
    at_koff: int,
    at_kdata: int,
    at_kvalid: int,
    r4: int,
    data: int,
    bits: int,
    r8: int,
    knulls: int,
    vnulls: int,
    topic_ends: Any,
    topic_data: Any,
    partitions: Any,
    types: Any,
) -> Any: ...
