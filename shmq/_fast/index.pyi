from typing_extensions import Buffer

def largest_lower_bound(
    buf: Buffer, entries: int, entry_size: int, key_offset: int, key_width: int, target: int
) -> int: ...
def smallest_upper_bound(
    buf: Buffer, entries: int, entry_size: int, key_offset: int, key_width: int, target: int
) -> int: ...
