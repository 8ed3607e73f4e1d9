from typing_extensions import Buffer

SLOT_SIZE: int
DEFAULT_MAX_SPINS: int

def write_slot(
    buf: Buffer,
    slot_offset: int,
    leader: int,
    epoch: int,
    log_start: int,
    hw: int,
    lso: int,
    leo: int,
    segments_gen: int,
    flags: int,
) -> None: ...
def read_slot(
    buf: Buffer, slot_offset: int, max_spins: int = ...
) -> tuple[int, int, int, int, int, int, int, int] | None: ...
def slot_seq(buf: Buffer, slot_offset: int) -> int: ...
def wait_slot(buf: Buffer, slot_offset: int, seen: int, timeout: float, spin: float = ...) -> bool: ...
def wait_bound(
    buf: Buffer,
    slot_offset: int,
    offset: int,
    committed: bool,
    timeout: float,
    spin: float = ...,
    slice_us: float = ...,
    max_spins: int = ...,
) -> tuple[tuple[int, int, int, int, int, int, int, int] | None, float]: ...
