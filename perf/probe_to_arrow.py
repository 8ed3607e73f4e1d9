"""The fixed cost of one small read into Arrow: ``ReadResult.to_arrow``'s path
(``batches_to_spark_arrow`` into a ``BufferPool``, with its constant columns).

    python perf/probe_to_arrow.py [--calls 10000]

Prints the CPU (``time.thread_time_ns``) per call, after 200 warm-up calls, for reads of 300
records in one batch, 10 records in one batch, 300 records in 4 batches, and 10 records with
headers; 100 B values, keys of 2-4 bytes.  A/B: run it alternately in two trees (or with
``PYTHONPATH`` set to each).
"""

from __future__ import annotations

import argparse
import time

from shmq.ipc.buffers import BufferPool
from shmq.ipc.reader import batches_to_spark_arrow
from shmq.protocol import records as rec


def log(records: int, per_batch: int = 0) -> memoryview:
    per_batch = per_batch or records
    out, off = bytearray(), 0
    while off < records:
        k = min(per_batch, records - off)
        out += rec.encode_batch([(b"k%d" % i, b"v" * 100, 1_700_000_000_000 + i)
                                 for i in range(k)], base_offset=off)
        off += k
    return memoryview(bytes(out))


def per_call(buf: memoryview, n: int, calls: int, headers: bool = False) -> float:
    pool = BufferPool()

    def read() -> object:
        return batches_to_spark_arrow(buf, "topic", 3, 0, n, alloc=pool.take,
                                      constants=pool.constants, include_headers=headers)
    for _ in range(200):
        read()
    t = time.thread_time_ns()
    for _ in range(calls):
        read()
    return (time.thread_time_ns() - t) / calls / 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=10_000)
    calls = p.parse_args().calls
    rows = {
        "300 records, 1 batch": per_call(log(300), 300, calls),
        "10 records, 1 batch": per_call(log(10), 10, calls),
        "300 records, 4 batches": per_call(log(300, 75), 300, calls),
        "10 records, headers": per_call(log(10), 10, calls, True),
    }
    for name, us in rows.items():
        print(f"{name:28s} {us:7.2f} us a call")


if __name__ == "__main__":
    main()
