"""The storage op-fuzzer's deterministic batch model, and a writer process to SIGKILL.

Model: batch ``i`` of a fuzz run has fixed content derived from ``(seed, i)`` only (record
count, keys, values, headers, timestamps, compression codec), so any process can rebuild the
exact batches another one appended.  A log that is correct holds batches ``j..k-1`` of the
model at offsets ``base_offset(j)..base_offset(k)-1`` and nothing else.

LogAppendTime topics: ``append`` is given ``now_ms = append_time(first batch of the call)``, so
every record of batch ``i`` must read back with the timestamp of the call that wrote it.

Run as a script (``python _writer.py '<json args>'``) it is the victim of the SIGKILL test: it
opens the log (which the test closed cleanly), appends batches from ``start_batch`` on until
it is killed (or reaches a batch or time limit), and reports on stdout, flushing after every
line:

    R <leo> <rp> <epoch>       opened (LEO, recovery point, the log's leader epoch)
    W <first> <last> <bytes>   about to append batches first..last in one call
    A <last>                   that append returned (acknowledged)
    F <recovery point>         a flush (a checkpoint) returned
    K <durable> <rp>           an acknowledgement's flush returned (durable offset, recovery point)
    O                          rolled
    D                          stopped by itself (batch or time limit; the test kills it before)

Everything acknowledged is in the page cache and must survive the SIGKILL.
"""

from __future__ import annotations

import bisect
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from shmq.protocol.records import encode_batch

T0 = 1_600_000_000_000          # CreateTime timestamps start here (2020-09)
LAT0 = 1_700_000_000_000        # LogAppendTime "now" values start here (2023-11, in the past)

Record = tuple[bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]


def append_time(first_batch: int) -> int:
    """``now_ms`` passed to an append call whose first batch is ``first_batch``."""
    return LAT0 + 10 * first_batch


class BatchModel:
    """Batches ``0, 1, 2, ...`` of one fuzz run: content, encoding and offsets."""

    def __init__(self, seed: int, big_rate: float = 0.0) -> None:
        self.seed = seed
        self.big_rate = big_rate
        self._cache: dict[int, tuple[int, list[Record], bytes]] = {}
        self._bases = [0]           # _bases[i] = base offset of batch i

    def _payload(self, rng: random.Random) -> bytes:
        r = rng.random()
        if r < self.big_rate:
            return rng.randbytes(rng.randint(20_000, 90_000))           # a big, incompressible one
        if r < 0.5:
            return rng.randbytes(rng.randint(0, 120))
        word = rng.choice([b"shmq", b"kafka", b"segment", b"\x00\x01"])
        return (word * rng.randint(0, 200))[: rng.randint(0, 900)]      # compressible

    def spec(self, i: int) -> tuple[int, list[Record], bytes]:
        """(codec, records, encoded batch bytes) of batch ``i``."""
        got = self._cache.get(i)
        if got is not None:
            return got
        rng = random.Random(f"shmq-opfuzz:{self.seed}:{i}")
        n = 1 if rng.random() < 0.25 else rng.randint(1, 20)
        codec = rng.choice([0, 0, 1, 2, 3, 4])
        base_ts = T0 + i * 1000 + rng.randint(-1500, 500)   # batches overlap in time sometimes
        records: list[Record] = []
        for _ in range(n):
            ts = base_ts + rng.randint(-30, 60)
            key = None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 16))
            value = None if rng.random() < 0.1 else self._payload(rng)
            headers = tuple(
                (f"h{j}", None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 8)))
                for j in range(rng.choice([0, 0, 0, 1, 2, 3]))
            )
            records.append((key, value, ts, headers))
        data = bytes(encode_batch(records, compression_type=codec))
        got = (codec, records, data)
        self._cache[i] = got
        return got

    def count(self, i: int) -> int:
        return len(self.spec(i)[1])

    def base_offset(self, i: int) -> int:
        while len(self._bases) <= i:
            j = len(self._bases) - 1
            self._bases.append(self._bases[j] + self.count(j))
        return self._bases[i]

    def index_at(self, offset: int) -> int:
        """Index of the batch whose base offset is ``offset`` (ValueError if none)."""
        while self._bases[-1] < offset:
            self.base_offset(len(self._bases))
        i = bisect.bisect_left(self._bases, offset)
        if self._bases[i] != offset:
            raise ValueError(f"offset {offset} is not a batch boundary of the model")
        return i

    def index_containing(self, offset: int) -> int:
        """Index of the batch that holds ``offset``."""
        while self._bases[-1] <= offset:
            self.base_offset(len(self._bases))
        return bisect.bisect_right(self._bases, offset) - 1

    def encoded(self, i: int) -> bytes:
        return self.spec(i)[2]

    def expected_records(self, i: int, lat: int | None) -> list[tuple[Any, ...]]:
        """(offset, timestamp, key, value, headers) of batch ``i`` as it must read back."""
        base = self.base_offset(i)
        return [(base + n, lat if lat is not None else ts, key, value, tuple(headers))
                for n, (key, value, ts, headers) in enumerate(self.spec(i)[1])]

    def max_timestamp(self, i: int, lat: int | None) -> int:
        """The batch's maxTimestamp header field as stored."""
        return lat if lat is not None else max(r[2] for r in self.spec(i)[1])


def _say(*parts: Any) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    from shmq.storage.log import PartitionLog
    from shmq.storage.log_config import LogConfig

    args = json.loads(argv[1])
    model = BatchModel(args["seed"], args.get("big_rate", 0.0))
    config = LogConfig(**args["config"])
    rng = random.Random(args["writer_seed"])
    log = PartitionLog.open(Path(args["dir"]), config, clean_shutdown=True,
                            log_start_offset=args["log_start"])
    i = args["start_batch"]
    if log.log_end_offset != model.base_offset(i):
        _say("E", log.log_end_offset, model.base_offset(i))
        return 2
    _say("R", log.log_end_offset, log.recovery_point, log.leader_epoch)
    stop = i + args.get("max_batches", 20_000)
    deadline = time.monotonic() + args.get("max_seconds", 60)   # never outlive a lost parent
    while i < stop and time.monotonic() < deadline:
        r = rng.random()
        if r < 0.04:
            log.roll()
            _say("O")
        elif r < 0.10:
            log.flush()
            _say("F", log.recovery_point)
        elif r < 0.40:
            log.flush(checkpoint=False)
            _say("K", log.durable_offset, log.recovery_point)
        size = rng.random()
        if size < 0.8:
            n = rng.choice([1, 1, 1, 2, 3, 5])
        elif size < 0.93:
            n = rng.randint(8, 40)
        else:
            n = rng.randint(60, 160)    # megabytes in one pwritev: a SIGKILL can tear it
        data = b"".join(model.encoded(j) for j in range(i, i + n))
        _say("W", i, i + n - 1, len(data))
        log.append(data, now_ms=append_time(i), leader_epoch=args.get("epoch"))
        _say("A", i + n - 1)
        i += n
    _say("D")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
