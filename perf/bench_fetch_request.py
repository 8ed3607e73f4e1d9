"""Fetch request decode: kio (``codec.decode_request``, the old path) vs the hand-written parser
(compiled ``wire.parse_fetch_request`` and its twin), in microseconds per request.

Requests are encoded by kafka-python 3.x as real consumers send them: v11 (librdkafka/aiokafka
shape) and v12 (kafka-python/Java), 1 topic with 1 or 6 partitions.  Timing: ``timeit``, best of
``--repeat`` runs of ``--number`` calls; not a test.  Usage: ``python perf/bench_fetch_request.py``.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import timeit
import warnings

from shmq import _fast
from shmq.protocol import codec
from shmq.protocol.fetch_request import parse_fetch_request_py
from shmq.protocol.request_header import request_header_size_py

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import FetchRequest as F


def request(version: int, partitions: int) -> memoryview:
    fields = dict(partition=0, fetch_offset=123456, log_start_offset=-1, partition_max_bytes=1 << 20)
    if version >= 9:
        fields["current_leader_epoch"] = 0
    if version >= 12:
        fields["last_fetched_epoch"] = -1
    req = F[version](
        replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=52428800, isolation_level=1,
        session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
        topics=[F.FetchTopic(topic="bench-topic", partitions=[
            F.FetchTopic.FetchPartition(**{**fields, "partition": i}) for i in range(partitions)])])
    req.with_header(correlation_id=7, client_id="rdkafka")
    return memoryview(bytes(req.encode(header=True, framed=True))[4:]).toreadonly()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}, {platform.processor() or platform.machine()}, "
          f"compiled={_fast.HAVE_FAST}, best of {args.repeat} x {args.number}")
    parsers = {"kio": lambda f, v: codec.decode_request(f),
               "twin": lambda f, v: parse_fetch_request_py(
                   f, request_header_size_py(f, v >= 12), v)}
    if _fast.HAVE_FAST:
        from shmq._fast import wire
        parsers["cython"] = lambda f, v: wire.parse_fetch_request(
            f, wire.request_header_size(f, v >= 12), v)
    print(f"{'request':<18}" + "".join(f"{name:>10}" for name in parsers) + "   kio/cython")
    for version, parts in ((11, 1), (11, 6), (12, 1), (12, 6)):
        frame = request(version, parts)
        row = {}
        for name, parse in parsers.items():
            t = min(timeit.repeat("parse(frame, version)", number=args.number,
                                  repeat=args.repeat,
                                  globals={"parse": parse, "frame": frame, "version": version}))
            row[name] = t / args.number * 1e6
        ratio = f"{row['kio'] / row['cython']:10.1f}x" if "cython" in row else ""
        print(f"Fetch v{version} {parts} part".ljust(18)
              + "".join(f"{us:10.2f}" for us in row.values()) + ratio)
    print("(us per request, header size included for the hand-written parsers)")


if __name__ == "__main__":
    main()
