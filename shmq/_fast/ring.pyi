from typing import Any

from typing_extensions import Buffer

def load_u64(buf: Buffer, off: int) -> int: ...
def store_u64(buf: Buffer, off: int, value: int) -> None: ...
def load_u32(buf: Buffer, off: int) -> int: ...
def exchange_u32(buf: Buffer, off: int, value: int) -> int: ...
def full_fence() -> None: ...
def publish_u64(buf: Buffer, off: int, value: int, flag: int) -> bool: ...
def encode_batch_into(
    out: Buffer,
    pos: int,
    limit: int,
    records: list[Any],
    timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> int: ...

def encode_values_into(
    out: Buffer,
    pos: int,
    size: int,
    records: list[Any],
    timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> int: ...


def encode_columns_into(
    out: Buffer,
    pos: int,
    limit: int,
    keys: list[bytes | None],
    values: list[bytes | None],
    stamps: list[int],
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> int: ...
