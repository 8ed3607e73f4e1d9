"""A partition worker's CPU for one ``produce_partition`` (validate, idempotence, append,
high watermark, state-table publish, metrics), in process: no ring, no event loop.

    .venv/bin/python perf/probe_append.py [--calls 50000] [--records 1] [--size 100]
                                          [--no-idempotence] [--log-append-time]

Builds what a worker holds for one partition (a ``PartitionLog`` in a temporary directory, a
state table and a metrics table in /dev/shm), encodes ``--calls`` batches as a client does
(sequence numbers in order, timestamps now), then times each ``produce_partition`` with
``time.thread_time`` and prints the CPU per call (the median of 5 slices, and the whole run's
mean).  Everything it creates is removed at the end.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from shmq import _fast
from shmq.broker.config import BrokerConfig
from shmq.broker.context import BrokerContext
from shmq.broker.handlers.produce import produce_partition
from shmq.broker.metadata import ClusterMetadata, PartitionInfo, TopicInfo
from shmq.ipc.metrics_table import MetricsTable
from shmq.ipc.state_table import StateTable
from shmq.storage.log import LogConfig, PartitionLog

TOPIC = "t"


class _Logs:
    def __init__(self, logs: dict[tuple[str, int], PartitionLog]) -> None:
        self.logs = logs

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))


def _batches(calls: int, records: int, size: int, pid: int) -> list[bytes]:
    values = [b"x" * size] * records
    now = int(time.time() * 1000)
    n = -_fast.ring.encode_batch_into(bytearray(0), 0, 0, values, now, 1000, 0, 0)
    out = []
    for i in range(calls):
        buf = bytearray(n)
        _fast.ring.encode_values_into(buf, 0, n, values, now, pid, 0, i * records)
        out.append(bytes(buf))
    return out


def run(calls: int, records: int, size: int, idempotent: bool, log_append_time: bool) -> list[float]:
    tmp = Path(tempfile.mkdtemp(prefix="probe-append-"))
    table, metrics = StateTable.create(4), MetricsTable.create(2, 4)
    plog = None
    try:
        info = TopicInfo(TOPIC, "00000000-0000-0000-0000-000000000001",
                         [PartitionInfo(0, 1, [1], [1], slot=0)])
        config = LogConfig(message_timestamp_type="LogAppendTime") if log_append_time \
            else LogConfig()
        plog = PartitionLog.open(tmp / f"{TOPIC}-0", config)
        ctx = BrokerContext(node_id=1, config=BrokerConfig(data_dir=tmp),
                            metadata=ClusterMetadata(cluster_id="x", topics={TOPIC: info}),
                            controller=None, logs=_Logs({(TOPIC, 0): plog}))  # type: ignore[arg-type]
        ctx.state_table, ctx.metrics = table, metrics.writer(1)
        PartitionLog.defer_flushes = True  # as in a worker
        batches = [memoryview(b) for b in _batches(calls, records, size,
                                                   1000 if idempotent else -1)]
        gc.freeze()
        slices: list[float] = []
        per = max(1, calls // 5)
        thread_time = time.thread_time
        for start in range(0, calls - per + 1, per):
            cpu = 0.0
            for b in batches[start : start + per]:
                t0 = thread_time()
                result, _ = produce_partition(ctx, TOPIC, 0, b, 1)
                cpu += thread_time() - t0
                if result.error_code:
                    raise AssertionError(result)
            slices.append(cpu / per)
        assert plog.log_end_offset == calls * records
        return slices
    finally:
        if plog is not None:
            plog.close()
        table.close()
        table.unlink()
        metrics.close()
        metrics.unlink()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=50_000)
    p.add_argument("--records", type=int, default=1)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--no-idempotence", action="store_true")
    p.add_argument("--log-append-time", action="store_true")
    args = p.parse_args()
    slices: Any = run(args.calls, args.records, args.size, not args.no_idempotence,
                      args.log_append_time)
    print(f"produce_partition CPU per call: {statistics.median(slices) * 1e6:.2f} us median of "
          f"{len(slices)} slices ({min(slices) * 1e6:.2f}-{max(slices) * 1e6:.2f}; "
          f"{args.calls:,} calls of {args.records} x {args.size} B)")


if __name__ == "__main__":
    main()
