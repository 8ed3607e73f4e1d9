"""Where the keyed confluent-kafka consume at 10,000 partitions loses its time (issue 17).

    python perf/trace_offset_wait.py [--partitions 10000] [--records 200000] [--repeat 3]
        [--from beginning|zero] [--keep-log DIR]

A shmq broker (``bench_scale.start``, 2 workers, loopback), a topic of ``--partitions``
partitions, ``--records`` records of 100 bytes with distinct keys (every partition ~20 records),
then the consume of ``bench_scale --only partitions`` (``suite_load.consume``: ``assign`` every
partition at ``OFFSET_BEGINNING``, fetch.queue.backoff.ms=10) with librdkafka's
``debug=topic,protocol`` written to a file.  Per pass it prints msg/s, broker CPU s/M, and from
the trace, for each partition, the time from librdkafka's "querying for logical offset" (the
ListOffsets request made and queued) to its "Offset reply" (the partition can be fetched): the
slowest, and how many waited over 1 s; and for the ListOffsets requests of the slowest
partitions, when librdkafka wrote them to the socket ("Sent ListOffsetsRequest") and the RTT it
measured from that write to the broker's answer.

``--from zero`` assigns offset 0 instead (no ListOffsets at all): the control.

Finding (2026-11-25, i17l): the slow passes are a few dozen partitions whose ListOffsets request
librdkafka queued at the start and wrote to the socket only 10-15 s later, while it sent
Fetches on the same connection every 0.1-0.5 s; the broker answered them in 5-80 ms of the write.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_scale as bs  # noqa: E402
from suite import delete_topic, settle  # noqa: E402
from suite_load import CONSUMER_CONF, keys  # noqa: E402

LINE = re.compile(r"^%\d\|(\d+\.\d+)\|(\w+)\|[^|]*\| \[thrd:([^\]]*)\]: (.*)$")
QUERY = re.compile(r"Partition (\S+) \[(\d+)\]: querying for logical offset")
REPLY = re.compile(r"Offset reply for topic (\S+) \[(\d+)\]")
SENT = re.compile(r"(\S+): Sent ListOffsetsRequest .*CorrId (\d+)\)")
RECV = re.compile(r"(\S+): Received ListOffsetsResponse .*CorrId (\d+), rtt ([\d.]+)ms")


def produce(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1048576,
                  "acks": 1})
    value = b"x" * 100
    for k in keys(records):
        while True:
            try:
                p.produce(topic, value, k)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(120):
        raise RuntimeError("produce: records left unacknowledged")


def consume(bootstrap: str, topic: str, parts: int, records: int, start_zero: bool,
            log: Path) -> float:
    """Seconds to read ``records``; librdkafka's debug lines go to ``log`` (its stderr)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    saved = os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "trace", **CONSUMER_CONF,
                         "debug": "topic,protocol"})
        cons.list_topics(topic, timeout=10)
        t0 = time.monotonic()
        start = 0 if start_zero else OFFSET_BEGINNING
        cons.assign([TopicPartition(topic, p, start) for p in range(parts)])
        got = 0
        while got < records and time.monotonic() < t0 + 120:
            got += sum(m.error() is None for m in cons.consume(min(10000, records - got), 0.5))
        seconds = time.monotonic() - t0
        cons.close()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    if got != records:
        raise RuntimeError(f"consume: {got} of {records}")
    return seconds


def analyse(log: Path) -> str:
    queried: dict[tuple[str, int], float] = {}
    waits: list[tuple[float, float, str, int]] = []  # (wait, queried at, topic, partition)
    sent: dict[tuple[str, int], float] = {}
    rtt: dict[tuple[str, int], float] = {}
    first = None
    with open(log, errors="replace") as f:
        for raw in f:
            m = LINE.match(raw)
            if not m:
                continue
            ts, text = float(m.group(1)), m.group(4)
            if (q := QUERY.search(text)) is not None:
                queried[(q.group(1), int(q.group(2)))] = ts
                first = ts if first is None else first
            elif (r := REPLY.search(text)) is not None:
                key = (r.group(1), int(r.group(2)))
                if key in queried:
                    at = queried.pop(key)
                    waits.append((ts - at, at, *key))
            elif (s := SENT.search(text)) is not None:
                sent[(s.group(1), int(s.group(2)))] = ts
            elif (v := RECV.search(text)) is not None:
                rtt[(v.group(1), int(v.group(2)))] = float(v.group(3))
    if not waits or first is None:
        return "no offset queries in the trace"
    waits.sort(reverse=True)
    late = [w for w in waits if w[0] > 1.0]
    # the requests written last: the late partitions' ListOffsets (librdkafka names no
    # partition in its protocol lines, so they are matched by count, latest writes first)
    last_sent = sorted(sent.items(), key=lambda kv: kv[1])[-len(late):] if late else []
    lines = [f"offset queries {len(waits) + len(queried):,}; query -> reply slowest "
             f"{waits[0][0]:.2f} s, median {waits[len(waits) // 2][0] * 1000:.0f} ms, "
             f"over 1 s: {len(late)}"]
    if last_sent:
        written = [t - first for _, t in last_sent]
        rtts = [rtt.get(k, -1.0) for k, _ in last_sent]
        lines.append(f"  their ListOffsets written to the socket {min(written):.2f}-"
                     f"{max(written):.2f} s after the first query; broker RTT from the write "
                     f"{min(rtts):.0f}-{max(rtts):.0f} ms")
    if queried:
        lines.append(f"  {len(queried)} queries never answered in the trace")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=10000)
    ap.add_argument("--records", type=int, default=200000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--from", dest="start", choices=("beginning", "zero"), default="beginning")
    ap.add_argument("--keep-log", type=Path, default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shmq-trace-"))
    b = None
    try:
        b, _ = bs.start(work, work / "data", 2)
        for rep in range(a.repeat):
            topic = f"trace-{rep}"
            bs.create_big_topic(b.bootstrap, topic, a.partitions, 120)
            settle(b, 120)
            produce(b.bootstrap, topic, a.records)
            log = (a.keep_log or work) / f"rdkafka-{rep}.log"
            cpu0 = b.cpu()
            seconds = consume(b.bootstrap, topic, a.partitions, a.records, a.start == "zero",
                              log)
            cpu = b.cpu() - cpu0
            print(f"pass {rep}: {a.records / seconds:,.0f} msg/s in {seconds:.2f} s, broker CPU "
                  f"{cpu / (a.records / 1e6):.2f} s/M\n  {analyse(log)}", flush=True)
            if a.keep_log is None:
                log.unlink()
            delete_topic(b.bootstrap, topic)
    finally:
        if b is not None:
            b.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
