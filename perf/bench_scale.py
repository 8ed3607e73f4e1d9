"""How shmq's cost grows: partitions, start and recovery, connections, record size, log size.

    python perf/bench_scale.py [--only partitions,start,segments,recovery,connections,large,
        sustained] [--recovery-segments 100000]
        [--repeat 3] [--partitions 1,6,64,1000,10000] [--records 200000] [--size 100]
        [--clients kcat,ck] [--keys null,keyed] [--no-kafka] [--kafka-heap 1g]
        [--start-partitions 10000] [--segments 1000]
        [--segment-bytes 65536] [--idle 1000] [--busy 10] [--busy-records 20000]
        [--large 1M:100,10M:10] [--sustained-bytes 2G] [--workers 2] [--plot FILE]
        [--json FILE] [--dir /tmp] [--phase-timeout 120]

Every part starts its own shmq broker (``python -m shmq broker --workers N``, data dir in a
fresh temporary directory under ``--dir``, loopback only) and stops it by PID afterwards.  Broker
CPU is the CPU time of the broker's process tree (controller and workers) over a phase
(``bench_broker.cpu_seconds``: each process's CPU-time clock, in nanoseconds); memory
is the sum over that tree of RSS and of USS (pages only that process maps: RSS counts the
controller's pages its forked workers share, USS does not), from psutil.

Parts (``--only``):

* ``partitions``: for each count in ``--partitions``, a fresh topic (created, then the broker
  left to finish creating its logs: that time is printed apart); ``--records`` records of
  ``--size`` bytes produced by one client (kcat ``-P -l``, or confluent-kafka through
  ``suite_load.py``, the suite's settings: linger.ms=5, batch.size=1 MiB, acks=1), then read back
  from the beginning by the same client (fetch.queue.backoff.ms=10, as in the suite).  msg/s,
  broker CPU seconds per million records and the client's CPU over the phase's wall time (``CB
  k/n``: k of the n samples were client-bound, the client's CPU at or above the wall time, as
  ``suite.py`` marks them); the ratio column divides by the 6-partition row of the same broker,
  client, phase and keys (the issue's target: 1,000 partitions >= 0.7x of 6).  Medians of
  ``--repeat`` passes with the spread (min-max).
  ``--keys`` (default ``null,keyed``): ``null`` rows produce records without keys (the clients'
  default: librdkafka's sticky partitioner fills one partition's batch after another, so 200,000
  records reach only ~15-20 of 1,000 partitions); ``keyed`` rows give every record a distinct
  key (kcat ``-K:`` on ``key:value`` lines, confluent-kafka ``produce(key=...)``, the keys of
  ``suite_load.keys``), which librdkafka's default partitioner (CRC-32 of the key) spreads over
  every partition: what a real 1,000-partition topic holds.  Its consume row reads that topic.
  "with data" is how many partitions held a record after the produce (one ListOffsets through
  the AdminClient, between the two phases' clocks).
  Apache Kafka 4.3.1 (``tools/apache_kafka.py``, as ``suite.py`` starts it: KRaft single node,
  ``--kafka-heap`` 1g, Kafka's JVM settings) runs beside shmq in the same pass, both brokers up
  and the order shuffled per cell; ``--no-kafka`` leaves it out.  Kafka costs its start (about
  10-20 s) and one more cell per shmq cell: with it, ``--partitions 6,1000 --repeat 3`` and both
  ``--keys`` took 6-9 min on this shared 2-core box (Kafka waits 5-20 s for each
  1,000-partition topic's logs before its phases: ``kafka_logs_created``).
  Beside them, for shmq only, from the broker's own metrics table (``Counters``): the Produce,
  Fetch and ListOffsets requests it answered in the phase (the shape the client gave the load:
  one ListOffsets per partition at a consumer's start, one Produce per partition batch), and
  the Fetch long polls that waited over 250 ms, each a Fetch that named only partitions with
  nothing to read and was parked for most of ``fetch.wait.max.ms`` (500 ms), as Kafka parks
  it: what makes a 1,000-partition consume row swing between 0.2 s and 1 s.
* ``start``: a topic of ``--start-partitions`` partitions (one record in each), the broker
  stopped cleanly and started again: seconds from exec to its ready line, to every partition
  having a leader in Metadata, and to the first acknowledgement (acks=all) of a record produced
  to the last partition; RSS and USS of the whole tree once ready.  Anchor: the same broker
  with no topic.  Target (issue 17): <= 3 s and <= 2 GiB.
  Then the mapped files and open descriptors under the data dir, summed over the broker's
  processes (``/proc/<pid>/maps`` and ``/proc/<pid>/fd``: what a start holds open), and the
  start after SIGKILL of every process (recovery from each log's recovery point).  Both
  restarts ``--repeat`` times (clean restart, SIGKILL, restart, clean stop): medians with the
  spread, and the load average at each round's start.
  Creating the topic is timed apart (CreateTopics plus CreatePartitions until every partition
  has a leader, then until the workers are idle).
* ``recovery``: one partition of ``--recovery-segments`` segments (default 100,000, one
  100-byte record each: the bench writes them straight into the stopped broker's partition
  directory in Kafka's format, with a recovery point at the log end and no clean-shutdown
  marker, as a SIGKILL would leave them; building them through the broker would take its
  rolls' time), then: the start that recovers them, a record produced (acks=all) and every
  process SIGKILLed, the start after that kill, and a clean restart.  Seconds to the ready line
  and to the first fetch of the last record, and the bytes the workers validated at start
  (from their ready lines).  Recovery validates only what follows the recovery point: the rows
  grow with the number of segment files (listing and stat-ing them), not with their bytes.
* ``segments``: one partition of ``--segments`` segments (``internal.segment.bytes``
  ``--segment-bytes``, Kafka's testing override of the 1 MiB minimum, so 1,000 segments take
  64 MiB), then (a) a clean restart: start time and RSS, and (b) SIGKILL of every broker process
  and a restart: seconds to the ready line and to the first fetch of the last record (the
  recovery after the kill: only the segments after the recovery point are validated).
* ``connections``: ``--idle`` TCP connections that each made one ApiVersions request and then
  stay idle (spread over the controller and the workers, as clients connect to every node);
  memory per connection = (tree RSS/USS with them - without) / idle; then ``--busy`` kcat
  producers of ``--busy-records`` 100 B records each into a 10-partition topic while the idle
  ones stay open, against the same with no idle connections (the anchor, same run).
* ``large``: records of 1 MiB and 10 MiB (``--large SIZE:COUNT,...``) with the topic's
  ``max.message.bytes`` raised to 16 MiB and kcat's ``message.max.bytes`` /
  ``fetch.message.max.bytes`` / ``receive.message.max.bytes`` raised to match: produce and consume
  MB/s.
* ``sustained``: ``--sustained-bytes`` (default 2 GiB; the issue's full run is 50G, more than
  the page cache holds, and needs that much free disk) of 10 KiB records produced by confluent-kafka
  in two halves: the first alone, then the second while a consumer catches up on the first from
  the beginning (from disk when the log outgrew the page cache).  MB/s of each.

Every load is bounded by its record count and ``--phase-timeout``.  Output: the environment, one
line per sample as it runs, a table per part, a JSON file of every sample and a PNG plot
(``--plot``, default ``perf/results/scale-<UTC>.png``; needs matplotlib, in the ``perf`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import _common as c
from bench_broker import apache_kafka
from suite import (
    KCAT_CONSUME_X,
    KCAT_X,
    Broker,
    Counters,
    PhaseError,
    _session_members,
    _table,
    admin,
    children_cpu,
    client_bound,
    create_topic,
    delete_topic,
    kafka_logs_created,
    kcat_env,
    requests,
    run_kcats,
    run_loads,
    settle,
    start_kafka,
    write_lines,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
GiB = 1 << 30


# -- the broker ---------------------------------------------------------------------------------


def start(work: Path, data: Path, workers: int, overrides: list[str] = (),
          timeout: float = 120) -> tuple[Broker, float]:
    """A shmq broker on ``data``: (the broker, seconds from exec to its ready line)."""
    argv = [sys.executable, "-m", "shmq", "broker", "--listeners", "127.0.0.1:0", "--workers",
            str(workers), "--data-dir", str(data), "--http-listener", "none"]
    for o in overrides:
        argv += ["--override", o]
    t0 = time.monotonic()
    logs = len(list(work.glob("shmq-*.log")))  # a log each: wait_for reads the first ready line
    b = Broker("shmq", argv, work / f"shmq-{logs}.log")
    try:
        b.bootstrap = b.wait_for("shmq broker ready: bootstrap ", timeout).split()[0]
    except BaseException:
        b.stop()
        raise
    return b, time.monotonic() - t0


def create_big_topic(bootstrap: str, topic: str, partitions: int, timeout: float) -> None:
    """A topic of any size: Kafka refuses more than 10,000 records in one controller operation
    (POLICY_VIOLATION "excessively large batch operation": a topic record plus 10,000
    partition records is one too many), so it is created with up to 5,000 partitions and grown
    with CreatePartitions in steps of 5,000, as a Kafka user would."""
    from confluent_kafka.admin import NewPartitions

    step = 5000
    create_topic(bootstrap, topic, min(partitions, step), timeout=timeout)
    have = min(partitions, step)
    while have < partitions:
        have = min(partitions, have + step)
        for fut in admin(bootstrap).create_partitions([NewPartitions(topic, have)],
                                                      operation_timeout=timeout).values():
            fut.result(timeout=timeout)
    leaders_ready(bootstrap, topic, partitions, timeout)


def stop_clean(b: Broker, timeout: float) -> float:
    """SIGTERM and wait up to ``timeout`` for the clean stop (the suite's ``Broker.stop``
    SIGKILLs after 15 s, and a worker with 5,000 written logs takes longer to flush and close
    them: its next start would be an unclean one); seconds it took.  Raises when it did not stop."""
    t0 = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    try:
        b.proc.wait(timeout=timeout)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
        b.stop()
        raise PhaseError(f"no clean stop within {timeout} s") from None
    seconds = time.monotonic() - t0
    b.stop()  # reaps anything left, closes the log
    return seconds


def kill_all(b: Broker) -> None:
    """SIGKILL every process of the broker's session at once (a power-cut of the broker)."""
    for pid in _session_members(b.proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    b.proc.wait(timeout=10)
    b._logf.close()


def memory(b: Broker) -> dict[str, float]:
    """RSS and USS summed over the broker's process tree, bytes."""
    import psutil

    rss = uss = 0
    root = psutil.Process(b.proc.pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        uss += info.uss
    return {"rss": rss, "uss": uss}


def file_usage(b: Broker, data: Path) -> dict[str, int]:
    """Mappings of files and open descriptors under ``data``, summed over the broker's
    processes (``/proc/<pid>/maps``, ``/proc/<pid>/fd``)."""
    import psutil

    root = str(data.resolve())
    maps = fds = 0
    proc = psutil.Process(b.proc.pid)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            with open(f"/proc/{p.pid}/maps") as f:
                maps += sum(1 for line in f if root in line)
            for fd in os.listdir(f"/proc/{p.pid}/fd"):
                try:
                    if os.readlink(f"/proc/{p.pid}/fd/{fd}").startswith(root):
                        fds += 1
                except OSError:
                    continue
        except OSError:
            continue
    return {"maps": maps, "fds": fds}


def leaders_ready(bootstrap: str, topic: str, partitions: int, timeout: float) -> float:
    """Seconds until Metadata shows a leader for every partition of ``topic``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            t = admin(bootstrap).list_topics(topic, timeout=10).topics.get(topic)
        except Exception:  # noqa: BLE001 - a broker still starting
            t = None
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()):
            return time.monotonic() - t0
        time.sleep(0.05)
    raise PhaseError(f"{topic}: no leader for every partition after {timeout} s")


def first_ack(bootstrap: str, topic: str, partition: int, timeout: float) -> float:
    """Seconds to produce one record to ``partition`` and have it acknowledged (acks=all)."""
    from confluent_kafka import Producer

    t0 = time.monotonic()
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    done: list[Any] = []
    p.produce(topic, b"x", partition=partition, on_delivery=lambda e, m: done.append(e))
    p.flush(timeout)
    if done != [None]:
        raise PhaseError(f"first ack: {done or 'no answer'}")
    return time.monotonic() - t0


def first_fetch(bootstrap: str, topic: str, partition: int, offset: int, timeout: float) -> float:
    """Seconds for a new consumer to receive the record at ``offset``."""
    from confluent_kafka import Consumer, TopicPartition

    t0 = time.monotonic()
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "scale", "enable.auto.commit":
                     False})
    try:
        cons.assign([TopicPartition(topic, partition, offset)])
        while time.monotonic() - t0 < timeout:
            m = cons.poll(0.5)
            if m is not None and m.error() is None:
                return time.monotonic() - t0
        raise PhaseError(f"first fetch of offset {offset}: nothing after {timeout} s")
    finally:
        cons.close()


def spread(values: list[float]) -> str:
    return f"{min(values):,.3g}-{max(values):,.3g}" if len(values) > 1 else "-"


class Row(NamedTuple):
    """One row of the ``partitions`` table: its samples are the passes of that cell."""
    broker: str  # shmq | kafka
    client: str  # ck | kcat
    phase: str  # produce | consume
    keys: str  # null (the sticky partitioner) | keyed (distinct keys: every partition)
    partitions: int


def row_label(row: Row) -> str:
    return (f"{row.phase} {'confluent-kafka' if row.client == 'ck' else 'kcat'}"
            + (" keyed" if row.keys == "keyed" else ""))


def partition_rows(rows: dict[Row, list[dict[str, float]]]) -> tuple[list[list[str]],
                                                                      list[dict[str, Any]]]:
    """The ``partitions`` table (and its JSON): medians of each row's samples with the spread,
    and the ratio to the 6-partition row of the same broker, client, phase and keys."""
    table = []
    out = []
    order = {"shmq": 0, "kafka": 1}
    for row in sorted(rows, key=lambda r: (r.client, r.keys != "null", r.phase,
                                           r.partitions, order.get(r.broker, 2), r.broker)):
        samples = rows[row]
        rate = statistics.median(s["msg_s"] for s in samples)
        cpu = statistics.median(s["cpu_s_per_M"] for s in samples)
        six = rows.get(row._replace(partitions=6))
        ratio = rate / statistics.median(s["msg_s"] for s in six) if six else None
        bound = sum(client_bound(s) for s in samples)
        share = statistics.median(s["client_cpu_s"] / s["seconds"] for s in samples)
        with_data = statistics.median(s.get("with_data", 0) for s in samples)
        out.append({**row._asdict(), "msg_s": rate, "cpu_s_per_M": cpu, "vs_6": ratio,
                    "client_cpu_per_wall": share, "with_data": with_data, "samples": samples})
        counted = [s for s in samples if "long_polls" in s]
        med = ({k: statistics.median(s[k] for s in counted)
                for k in ("Produce", "Fetch", "ListOffsets", "long_polls")}
               if counted else None)
        table.append([row.broker, row_label(row), f"{row.partitions:,}", f"{rate:,.0f}",
                      spread([s["msg_s"] for s in samples]), f"{cpu:.2f}",
                      spread([s["cpu_s_per_M"] for s in samples]),
                      f"{share:.2f}" + (f" CB {bound}/{len(samples)}" if bound else ""),
                      f"{ratio:.2f}x" if ratio is not None else "-",
                      f"{with_data:,.0f}" if with_data else "-",
                      requests(med) if med else "-",
                      (f"{med['long_polls']:.0f} ("
                       f"{spread([s['long_polls'] for s in counted])})") if med else "-"])
    return table, out


def write_keyed_lines(path: Path, n: int, size: int) -> None:
    """n ``key:value`` lines for kcat ``-P -K:``: the keys of ``suite_load.keys`` (distinct, so
    they spread over every partition), each value ``size`` bytes as ``write_lines`` makes them."""
    filler = (b"abcdefghijklmnopqrstuvwxyz" * (size // 26 + 1))[:max(0, size - 10)]
    with open(path, "wb") as f:
        for first in range(0, n, 5000):
            f.write(b"".join(b"%010d:%010d%s\n" % (i, i, filler)
                             for i in range(first, min(n, first + 5000))))


def partitions_with_data(bootstrap: str, topic: str, partitions: int, timeout: float) -> int:
    """How many of the topic's partitions hold a record (their latest offset > 0): one
    ListOffsets per broker through the AdminClient."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    futures = admin(bootstrap).list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},
        request_timeout=timeout)
    return sum(f.result(timeout=timeout).offset > 0 for f in futures.values())


# -- parts --------------------------------------------------------------------------------------



def _kcat_cpu(cpu: float, seconds: float) -> str:
    """kcat's CPU / the phase's wall time, ``CB`` when it reaches the wall time (the row is bound
    by the client: it still counts, as in the suite)."""
    return f"{cpu / seconds:.2f}" + (" CB" if client_bound({"client_cpu_s": cpu,
                                                           "seconds": seconds}) else "")

class Scale:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.env_kcat = kcat_env(work)
        self.results: dict[str, Any] = {}
        self.serial = 0

    def fresh(self, name: str) -> Path:
        self.serial += 1
        path = self.work / f"{name}-{self.serial}"
        path.mkdir()
        return path

    # - partitions -

    def partitions(self) -> str:
        a = self.args
        rows: dict[Row, list[dict[str, float]]] = {}
        errors: list[str] = []
        created: dict[tuple[str, int], list[float]] = {}  # seconds to create the topic, go idle
        data = self.fresh("partitions")
        lines = {"null": self.work / "lines.txt", "keyed": self.work / "lines-keyed.txt"}
        write_lines(lines["null"], a.records, a.size)
        write_keyed_lines(lines["keyed"], a.records, a.size)
        brokers: dict[str, Broker] = {}
        counters: Counters | None = None
        rng = random.Random(0)
        try:
            brokers["shmq"], _ = start(self.work, data, a.workers)
            counters = Counters(data)
            if a.kafka:
                brokers["kafka"] = start_kafka(self.work, a.kafka_heap)
            for rep in range(a.repeat):
                for parts in a.partitions:
                    for client in a.clients:
                        for keys in a.keys:
                            order = list(brokers)
                            rng.shuffle(order)  # as suite.py: no broker always goes first
                            for name in order:
                                self.partitions_cell(
                                    brokers[name], counters if name == "shmq" else None,
                                    Row(name, client, "produce", keys, parts), rep, lines[keys],
                                    rows, created, errors)
        finally:
            if counters is not None:
                counters.close()
            for b in brokers.values():
                b.stop()
            shutil.rmtree(data, ignore_errors=True)
        table, out = partition_rows(rows)
        self.results["partitions"] = out
        self.results["create_s"] = {f"{k[0]} {k[1]}": v for k, v in created.items()}
        notes = "".join(f"\n  {name}: topic of {k:,} partitions created and the broker idle again"
                        f" in {statistics.median(v):.2f} s (median; {spread(v)})"
                        for (name, k), v in sorted(created.items()))
        return _table(["broker", "phase client keys", "partitions", "msg/s", "spread",
                       "broker CPU s/M", "spread", "client CPU/wall", "vs 6 part",
                       "with data", "requests P / F / LO", "long polls > 250 ms"],
                      table) + notes + "".join(f"\n  ERROR {e}" for e in errors)

    def partitions_cell(self, b: Broker, counters: Counters | None, row: Row, rep: int,
                        lines: Path, rows: dict[Row, list[dict[str, float]]],
                        created: dict[tuple[str, int], list[float]], errors: list[str]) -> None:
        """One topic on one broker: create it, produce, count its partitions holding data (after
        the produce phase, outside both phases' clocks), consume; samples into ``rows``."""
        a = self.args
        parts = row.partitions
        topic = f"scale-{row.client}-{row.keys}-{parts}-{rep}"
        label = f"{row.broker:<5} {row.client:<4} {row.keys:<5}"
        with_data = 0
        try:
            t0 = time.monotonic()
            create_big_topic(b.bootstrap, topic, parts, a.phase_timeout)
            if row.broker == "kafka":
                kafka_logs_created(self.work / "kafka" / "data", topic, parts, a.phase_timeout)
            settle(b, a.phase_timeout)
            created.setdefault((row.broker, parts), []).append(time.monotonic() - t0)
            for phase in ("produce", "consume"):
                before = counters.read() if counters else None
                cpu0 = b.cpu()
                seconds, client_cpu = self.load(b, row.client, phase, topic, parts, lines,
                                                row.keys == "keyed")
                cpu = b.cpu() - cpu0
                counted: dict[str, float] = {}
                if counters is not None and before is not None:
                    time.sleep(0.05)  # a long poll ended by the client's exit
                    counted = Counters.since(before, counters.read())
                if phase == "produce":
                    with_data = partitions_with_data(b.bootstrap, topic, parts, a.phase_timeout)
                sample = {"seconds": seconds, "msg_s": a.records / seconds,
                          "cpu_s_per_M": cpu / (a.records / 1e6), "client_cpu_s": client_cpu,
                          "with_data": with_data, **counted}
                rows.setdefault(row._replace(phase=phase), []).append(sample)
                print(f"    {label} {phase:<7} {parts:>6} part  {sample['msg_s']:>10,.0f} msg/s"
                      f"  broker CPU {sample['cpu_s_per_M']:.2f} s/M  client CPU "
                      f"{client_cpu:.2f} s / {seconds:.2f} s"
                      + (" (client-bound)" if client_bound(sample) else "")
                      + f"  {with_data:,} partitions with data"
                      + (f"  {requests(sample)}  long polls > 250 ms: "
                         f"{sample['long_polls']:.0f}" if counted else ""), flush=True)
        except Exception as e:  # noqa: BLE001 - one failed cell, not the run
            print(f"    {label} {parts:>6} part  ERROR {str(e)[:200]}", flush=True)
            errors.append(f"{row.broker} {row.client} {row.keys} {parts} part: {str(e)[:200]}")
        finally:
            delete_topic(b.bootstrap, topic)

    def load(self, b: Broker, client: str, phase: str, topic: str, parts: int,
             lines: Path, keyed: bool = False) -> tuple[float, float]:
        """(wall seconds, client CPU seconds) of one phase; ``keyed``: the produce sends distinct
        keys (``lines`` then holds ``key:value`` lines, kcat ``-K:``)."""
        a = self.args
        n = a.records
        if client == "ck":
            argv = (["produce", b.bootstrap, topic, str(n), str(a.size)] if phase == "produce"
                    else ["consume", b.bootstrap, topic, str(parts), str(n)])
            argv.append(str(a.phase_timeout))
            if keyed and phase == "produce":
                argv.append("keyed")
            (r,) = run_loads([argv], a.phase_timeout + 30)
            if r["count"] != n:
                raise PhaseError(f"{phase}: {r['count']} of {n} records")
            return r["t1"] - r["t0"], r["cpu"]
        cpu0 = children_cpu()
        if phase == "produce":
            argv = ["kcat", "-P", "-b", b.bootstrap, "-t", topic, "-l", str(lines), *KCAT_X,
                    *(["-K:"] if keyed else [])]
            return (run_kcats([argv], [None], self.env_kcat, a.phase_timeout)[0],
                    children_cpu() - cpu0)
        argv = ["kcat", "-C", "-b", b.bootstrap, "-t", topic, "-e", "-o", "beginning", "-q",
                "-c", str(n), *KCAT_CONSUME_X]
        seconds, got = run_kcats([argv], [None], self.env_kcat, a.phase_timeout,
                                 count_stdout=True)
        if got != n * (a.size + 1):  # kcat prints each value and a newline, not the key
            raise PhaseError(f"kcat -C printed {got} bytes, expected {n * (a.size + 1)}")
        return seconds, children_cpu() - cpu0

    # - start with many partitions -

    def start(self) -> str:
        a = self.args
        parts = a.start_partitions
        data = self.fresh("start")
        out: dict[str, Any] = {"partitions": parts, "repeat": a.repeat}
        b, empty_s = start(self.work, data, a.workers)
        empty_mem = memory(b)
        empty_files = file_usage(b, data)
        try:
            t0 = time.monotonic()
            create_big_topic(b.bootstrap, "many", parts, a.phase_timeout)
            out["create_s"] = time.monotonic() - t0
            out["create_idle_s"] = out["create_s"] + settle(b, a.phase_timeout)
            lines = self.work / "one-each.txt"
            lines.write_bytes(b"".join(b"%d:x\n" % i for i in range(parts)))
            # one record in each partition: keyed "i:x" lines spread by murmur2, so not every
            # partition; an explicit partition each is kcat -p, one process per partition (too
            # many); the first ack of the last partition below checks the log works
            run_kcats([["kcat", "-P", "-b", b.bootstrap, "-t", "many", "-K", ":", "-l",
                        str(lines), *KCAT_X]], [None], self.env_kcat, a.phase_timeout)
        finally:
            out["stop_s"] = stop_clean(b, a.phase_timeout * 5)
        runs: dict[str, list[dict[str, float]]] = {"clean": [], "killed": []}
        load: list[float] = []

        def measured(b: Broker, ready_s: float) -> dict[str, float]:
            files = file_usage(b, data)
            leaders_s = leaders_ready(b.bootstrap, "many", parts, a.phase_timeout)
            mem = memory(b)
            ack_s = first_ack(b.bootstrap, "many", parts - 1, a.phase_timeout)
            return {"start_s": ready_s, "leaders_s": leaders_s, "first_ack_s": ack_s,
                    "rss": mem["rss"], "uss": mem["uss"], **files}

        try:
            for _ in range(a.repeat):  # a clean restart, then SIGKILL and a restart after it
                load.append(os.getloadavg()[0])
                b, ready_s = start(self.work, data, a.workers)
                try:
                    runs["clean"].append(measured(b, ready_s))
                finally:
                    kill_all(b)  # then a start that finds every log as the kill left it
                b, ready_s = start(self.work, data, a.workers)
                try:
                    runs["killed"].append(measured(b, ready_s))
                finally:
                    stop_clean(b, a.phase_timeout * 5)  # the next round starts clean
        finally:
            shutil.rmtree(data, ignore_errors=True)

        def med(kind: str, key: str) -> float:
            return statistics.median(r[key] for r in runs[kind])

        for kind, prefix in (("clean", ""), ("killed", "killed_")):
            for key in ("start_s", "leaders_s", "first_ack_s", "rss", "uss", "maps", "fds"):
                out[prefix + key] = med(kind, key)
            out[prefix + "runs"] = runs[kind]
        out |= {"empty_start_s": empty_s, "empty_rss": empty_mem["rss"],
                "empty_uss": empty_mem["uss"], "load": load}
        self.results["start"] = out

        def cell(kind: str, key: str) -> str:
            values = [r[key] for r in runs[kind]]
            return f"{statistics.median(values):.2f} ({spread(values)})"

        table = [["no topic (anchor)", f"{empty_s:.2f}", "-", "-", "-",
                  f"{empty_mem['rss'] / 2**20:,.0f}", f"{empty_mem['uss'] / 2**20:,.0f}",
                  f"{empty_files['maps']} / {empty_files['fds']}"]]
        for kind, label in (("clean", "clean restart"), ("killed", "after SIGKILL")):
            total = [r["start_s"] + r["leaders_s"] + r["first_ack_s"] for r in runs[kind]]
            table.append([f"{parts:,} partitions, {label}", cell(kind, "start_s"),
                          cell(kind, "leaders_s"), cell(kind, "first_ack_s"),
                          f"{statistics.median(total):.2f} ({spread(total)})",
                          f"{med(kind, 'rss') / 2**20:,.0f}", f"{med(kind, 'uss') / 2**20:,.0f}",
                          f"{med(kind, 'maps'):.0f} / {med(kind, 'fds'):.0f}"])
        created = _table(["create the topic, stop the broker", "s"], [
            [f"{parts:,} partitions: every leader in Metadata", f"{out['create_s']:.2f}"],
            ["  and the workers idle again", f"{out['create_idle_s']:.2f}"],
            ["clean stop (a record in most partitions)", f"{out['stop_s']:.2f}"]])
        return (_table(["broker holding", "exec -> ready s", "+ leaders s", "+ first ack s",
                        "ready to ack s", "RSS MiB", "USS MiB", "maps / fds"], table)
                + f"\nmedians of {a.repeat} restarts each (spread min-max); load average "
                  f"{min(load):.1f}-{max(load):.1f} at their starts\n" + created)

    # - many segments: start and recovery -

    def segments(self) -> str:
        a = self.args
        data = self.fresh("segments")
        record = 1000
        per_segment = max(1, a.segment_bytes // (record + 80))
        n = a.segments * per_segment + per_segment // 2
        lines = self.work / "segments.txt"
        write_lines(lines, n, record)
        out: dict[str, Any] = {"segments": a.segments, "segment_bytes": a.segment_bytes,
                               "records": n}
        b, empty_s = start(self.work, data, a.workers)
        try:
            from confluent_kafka.admin import NewTopic

            fut = admin(b.bootstrap).create_topics([NewTopic(
                "segs", 1, 1, config={"internal.segment.bytes": str(a.segment_bytes)})])
            for f in fut.values():
                f.result(a.phase_timeout)
            leaders_ready(b.bootstrap, "segs", 1, a.phase_timeout)
            # batches of a quarter segment: a segment rolls every four or five of them
            small = ["-X", f"batch.size={a.segment_bytes // 4}"]
            out["produce_s"], _ = run_kcats([["kcat", "-P", "-b", b.bootstrap, "-t", "segs",
                                              "-l", str(lines), *KCAT_X, *small]], [None],
                                            self.env_kcat, a.phase_timeout)
        finally:
            stop_clean(b, a.phase_timeout * 5)
        logs = sorted((data / "logs").rglob("segs-0/*.log")) or sorted(data.rglob("segs-0/*.log"))
        out["segment_files"] = len(logs)
        table = []
        try:
            b, clean_s = start(self.work, data, a.workers)
            try:
                mem = memory(b)
                fetch_s = first_fetch(b.bootstrap, "segs", 0, n - 1, a.phase_timeout)
                # a record acknowledged just before the kill: recovery must keep it
                ack_s = first_ack(b.bootstrap, "segs", 0, a.phase_timeout)
            finally:
                kill_all(b)
            table.append([f"clean restart, {len(logs):,} segments", f"{clean_s:.2f}",
                          f"{fetch_s:.2f}", f"{mem['rss'] / 2**20:,.0f}",
                          f"{mem['uss'] / 2**20:,.0f}"])
            out |= {"clean_start_s": clean_s, "clean_fetch_s": fetch_s, "rss": mem["rss"],
                    "uss": mem["uss"], "ack_before_kill_s": ack_s}
            b, killed_s = start(self.work, data, a.workers)
            try:
                mem = memory(b)
                fetch_s = first_fetch(b.bootstrap, "segs", 0, n, a.phase_timeout)
            finally:
                b.stop()
            table.append(["after SIGKILL of every process", f"{killed_s:.2f}", f"{fetch_s:.2f}",
                          f"{mem['rss'] / 2**20:,.0f}", f"{mem['uss'] / 2**20:,.0f}"])
            table.append(["empty data dir (anchor)", f"{empty_s:.2f}", "-", "-", "-"])
            out |= {"killed_start_s": killed_s, "killed_fetch_s": fetch_s,
                    "killed_rss": mem["rss"], "empty_start_s": empty_s}
        finally:
            shutil.rmtree(data, ignore_errors=True)
        self.results["segments"] = out
        return _table(["one partition", "exec -> ready s", "+ fetch of last record s",
                       "RSS MiB", "USS MiB"], table)

    # - recovery with many segments -

    def recovery(self) -> str:
        a = self.args
        n = a.recovery_segments
        data = self.fresh("recovery")
        b, _ = start(self.work, data, a.workers)
        try:
            create_topic(b.bootstrap, "rec", 1, timeout=a.phase_timeout)
        finally:
            b.stop()
        (directory,) = data.glob("worker-*/rec-0")
        t0 = time.monotonic()
        write_segments(directory, n)
        written_s = time.monotonic() - t0
        out: dict[str, Any] = {"segments": n, "write_s": written_s}
        table = []
        try:
            for label, key in (("start after the crash (written)", "written"),
                               ("start after SIGKILL of every process", "killed"),
                               ("clean restart", "clean")):
                b, ready_s = start(self.work, data, a.workers, timeout=a.phase_timeout * 5)
                try:
                    mem = memory(b)
                    fetch_s = first_fetch(b.bootstrap, "rec", 0, n - 1, a.phase_timeout * 5)
                    if key == "written":
                        first_ack(b.bootstrap, "rec", 0, a.phase_timeout)  # acknowledged ...
                        n += 1
                finally:
                    if key == "written":
                        kill_all(b)  # ... and then the power cut
                    else:
                        stop_clean(b, a.phase_timeout * 5)
                said = what_recovery_did(b)
                out[key] = {"start_s": ready_s, "fetch_s": fetch_s, "rss": mem["rss"],
                            "workers_said": said}
                table.append([label, f"{ready_s:.2f}", f"{fetch_s:.2f}",
                              f"{mem['rss'] / 2**20:,.0f}", validated(said)])
        finally:
            shutil.rmtree(data, ignore_errors=True)
        self.results["recovery"] = out
        return _table([f"one partition, {a.recovery_segments:,} segments (written in "
                       f"{written_s:.0f} s)", "exec -> ready s", "+ fetch of last record s",
                       "RSS MiB", "validated at start"], table)

    # - idle and busy connections -

    def connections(self) -> str:
        a = self.args
        data = self.fresh("connections")
        b, _ = start(self.work, data, a.workers)
        socks: list[socket.socket] = []
        out: dict[str, Any] = {"idle": a.idle, "busy": a.busy}
        table = []
        try:
            create_topic(b.bootstrap, "busy", 10, timeout=a.phase_timeout)
            lines = self.work / "busy.txt"
            write_lines(lines, a.busy_records, 100)
            nodes = [f"{n.host}:{n.port}" for n in
                     admin(b.bootstrap).list_topics(timeout=10).brokers.values()]
            out["anchor_msg_s"] = self.busy(b, lines)
            before = memory(b)
            for i in range(a.idle):
                host, port = nodes[i % len(nodes)].rsplit(":", 1)
                s = socket.create_connection((host, int(port)), timeout=10)
                socks.append(s)
                api_versions(s, i)
            time.sleep(0.5)
            after = memory(b)
            out["rss_per_conn"] = (after["rss"] - before["rss"]) / a.idle
            out["uss_per_conn"] = (after["uss"] - before["uss"]) / a.idle
            out["busy_msg_s"] = self.busy(b, lines)
            for s in socks:
                api_versions(s, 0)  # every idle one is still served
        finally:
            for s in socks:
                s.close()
            b.stop()
            shutil.rmtree(data, ignore_errors=True)
        self.results["connections"] = out
        table.append([f"{a.busy} busy kcat producers alone (anchor)",
                      f"{out['anchor_msg_s']:,.0f}", "-", "-"])
        table.append([f"same beside {a.idle:,} idle connections", f"{out['busy_msg_s']:,.0f}",
                      f"{out['rss_per_conn'] / 1024:.1f}", f"{out['uss_per_conn'] / 1024:.1f}"])
        return _table(["load", "busy msg/s (all)", "RSS KiB/conn", "USS KiB/conn"], table)

    def busy(self, b: Broker, lines: Path) -> float:
        a = self.args
        argv = ["kcat", "-P", "-b", b.bootstrap, "-t", "busy", "-l", str(lines), *KCAT_X]
        seconds, _ = run_kcats([argv] * a.busy, [None] * a.busy, self.env_kcat, a.phase_timeout)
        return a.busy * a.busy_records / seconds

    # - large records -

    def large(self) -> str:
        a = self.args
        data = self.fresh("large")
        limit = 16 << 20
        b, _ = start(self.work, data, a.workers, [f"message.max.bytes={limit}"])
        big = ["-X", f"message.max.bytes={limit + 1024}"]
        fetch = ["-X", f"fetch.message.max.bytes={limit + 1024}", "-X",
                 f"fetch.max.bytes={2 * limit}", "-X", f"receive.message.max.bytes={3 * limit}"]
        table = []
        out = []
        try:
            for size, count in a.large:
                topic = f"large-{size}"
                create_topic(b.bootstrap, topic, 1, timeout=a.phase_timeout)
                lines = self.work / f"large-{size}.txt"
                write_lines(lines, count, size)
                try:
                    cpu0, k0 = b.cpu(), children_cpu()
                    p_s, _ = run_kcats([["kcat", "-P", "-b", b.bootstrap, "-t", topic, "-l",
                                         str(lines), *KCAT_X, *big]], [None], self.env_kcat,
                                       a.phase_timeout)
                    p_cpu, p_kcat = b.cpu() - cpu0, children_cpu() - k0
                    cpu0, k0 = b.cpu(), children_cpu()
                    c_s, got = run_kcats([["kcat", "-C", "-b", b.bootstrap, "-t", topic, "-e",
                                           "-o", "beginning", "-q", "-c", str(count),
                                           *KCAT_CONSUME_X, *fetch]], [None], self.env_kcat,
                                         a.phase_timeout, count_stdout=True)
                    c_cpu, c_kcat = b.cpu() - cpu0, children_cpu() - k0
                    if got != count * (size + 1):
                        raise PhaseError(f"kcat -C printed {got} bytes of {count * (size + 1)}")
                finally:
                    lines.unlink()
                    delete_topic(b.bootstrap, topic)
                row = {"size": size, "count": count, "produce_mb_s": count * size / p_s / 1e6,
                       "consume_mb_s": count * size / c_s / 1e6,
                       "produce_cpu_s_per_GB": p_cpu / (count * size / 1e9),
                       "consume_cpu_s_per_GB": c_cpu / (count * size / 1e9),
                       # kcat's CPU over the phase (issue 17's client-bound mark)
                       "produce_client_cpu_s": p_kcat, "produce_seconds": p_s,
                       "consume_client_cpu_s": c_kcat, "consume_seconds": c_s}
                out.append(row)
                table.append([f"{size / 2**20:g} MiB x {count}", f"{row['produce_mb_s']:,.0f}",
                              f"{row['produce_cpu_s_per_GB']:.2f}", _kcat_cpu(p_kcat, p_s),
                              f"{row['consume_mb_s']:,.0f}", f"{row['consume_cpu_s_per_GB']:.2f}",
                              _kcat_cpu(c_kcat, c_s)])
        finally:
            b.stop()
            shutil.rmtree(data, ignore_errors=True)
        self.results["large"] = out
        return _table(["kcat records", "produce MB/s", "broker CPU s/GB", "kcat CPU",
                       "consume MB/s", "broker CPU s/GB", "kcat CPU"], table)

    # - sustained produce, then catch-up while producing -

    def sustained(self) -> str:
        a = self.args
        size = 10240
        half = max(1000, a.sustained_bytes // size // 2)
        data = self.fresh("sustained")
        b, _ = start(self.work, data, a.workers)
        table = []
        try:
            create_topic(b.bootstrap, "sustained", 6, timeout=a.phase_timeout)
            t = a.phase_timeout
            (first,) = run_loads([["produce", b.bootstrap, "sustained", str(half), str(size),
                                   str(t)]], t + 30)
            prod, cons = run_loads([
                ["produce", b.bootstrap, "sustained", str(half), str(size), str(t)],
                ["consume", b.bootstrap, "sustained", "6", str(half), str(t)]], t + 30)
        finally:
            b.stop()
            shutil.rmtree(data, ignore_errors=True)
        rate = {name: r["count"] * size / (r["t1"] - r["t0"]) / 1e6
                for name, r in (("first", first), ("second", prod), ("catch_up", cons))}
        if min(first["count"], prod["count"], cons["count"]) < half:
            rate["incomplete"] = [first["count"], prod["count"], cons["count"]]
        self.results["sustained"] = {"bytes": 2 * half * size, **rate}
        table.append([f"produce the first {half * size / GiB:.2f} GiB alone",
                      f"{rate['first']:,.0f}"])
        table.append(["produce the second half, while", f"{rate['second']:,.0f}"])
        table.append(["  a consumer reads the first half", f"{rate['catch_up']:,.0f}"])
        return _table(["10 KiB records, confluent-kafka, 6 partitions", "MB/s"], table)


def what_recovery_did(b: Broker) -> list[str]:
    """The workers' ready lines of this start ("N logs opened after an unclean shutdown, ...;
    M recovered from their recovery points, X validated ..."): what recovery read."""
    found = []
    for line in b.log.read_text(errors="replace").splitlines():
        if " ready: " in line and "worker " in line:
            found.append(line.split(" ready: ", 1)[1].strip())
    return found


def validated(said: list[str]) -> str:
    """The bytes the workers validated at start, summed over their ready lines."""
    import re

    units = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    total = 0.0
    for line in said:
        m = re.search(r"([\d.]+) (bytes|KiB|MiB|GiB) validated", line)
        if m:
            total += float(m.group(1)) * units[m.group(2)]
    return "-" if not any("unclean" in line for line in said) else f"{total:,.0f} bytes"


def write_segments(directory: Path, count: int) -> None:
    """Replace the (empty) log in ``directory`` with ``count`` segments of one 100-byte record
    each, in Kafka's format, left as a crash leaves them: the recovery point (checkpoint) at
    the log end, no clean-shutdown marker, no summary, and a producer snapshot at the end (what
    a roll writes), so that a start validates nothing below the recovery point."""
    from shmq.protocol.records import encode_batch
    from shmq.storage import checkpoint, layout
    from shmq.storage.producer_state import ProducerStateManager

    log_dir = directory.parent
    for name in os.listdir(directory):
        if name != layout.PARTITION_METADATA:
            os.unlink(directory / name)
    batch = bytearray(encode_batch([(None, b"x" * 100, int(time.time() * 1000))]))
    for i in range(count):
        struct.pack_into(">q", batch, 0, i)  # baseOffset: outside the CRC
        log_path, index_path, time_path = layout.segment_paths(directory, i)
        log_path.write_bytes(batch)
        index_path.write_bytes(b"")
        time_path.write_bytes(b"")
    ProducerStateManager(directory).take_snapshot(count)
    recovery = checkpoint.read_offsets(log_dir / layout.RECOVERY_POINT_CHECKPOINT)
    recovery[("rec", 0)] = count
    checkpoint.write_offsets(log_dir / layout.RECOVERY_POINT_CHECKPOINT, recovery)
    for name in (layout.CLEAN_SHUTDOWN_FILE, "shmq-log-summary"):
        try:
            os.unlink(log_dir / name)
        except FileNotFoundError:
            pass


def raise_nofile(need: int) -> int:
    """Raise the soft descriptor limit towards ``need`` (up to the hard one); the new limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def api_versions(s: socket.socket, correlation: int) -> None:
    """ApiVersions v0 over ``s`` and read the whole answer."""
    client = b"scale"
    body = struct.pack(">hhih", 18, 0, correlation, len(client)) + client
    s.sendall(struct.pack(">i", len(body)) + body)
    (size,) = struct.unpack(">i", _read(s, 4))
    _read(s, size)


def _read(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise PhaseError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


# -- plot ---------------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("partitions", "start", "segments", "recovery", "connections",
                          "large", "sustained") if k in results]
    extra = 1 if "partitions" in results else 0
    n = len(panels) + extra
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    axs = iter(axes.flat)
    if "partitions" in results:
        rate_ax, cpu_ax = next(axs), next(axs)
        series: dict[str, list[tuple[int, float, float]]] = {}
        for r in results["partitions"]:
            label = f"{r['broker']} {row_label(Row(**{k: r[k] for k in Row._fields}))}"
            series.setdefault(label, []).append(
                (r["partitions"], r["msg_s"], r["cpu_s_per_M"]))
        # one colour per phase/client/keys, solid for shmq and dashed for Kafka
        kinds = sorted({label.split(" ", 1)[1] for label in series})
        for label, pts in sorted(series.items()):
            pts.sort()
            broker, kind = label.split(" ", 1)
            style = {"marker": "o", "label": label, "color": f"C{kinds.index(kind) % 10}",
                     "linestyle": "--" if broker == "kafka" else "-"}
            rate_ax.plot([p[0] for p in pts], [p[1] for p in pts], **style)
            cpu_ax.plot([p[0] for p in pts], [p[2] for p in pts], **style)
        for ax, what in ((rate_ax, "msg/s (median)"), (cpu_ax, "broker CPU s per M records")):
            ax.set_xscale("log")
            ax.set_xlabel("partitions")
            ax.set_ylabel(what)
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        rate_ax.set_title("throughput vs partitions")
        cpu_ax.set_title("broker CPU per record vs partitions")
    if "start" in results:
        ax = next(axs)
        s = results["start"]
        labels = ["clean restart", "after SIGKILL"]
        bottom = [0.0, 0.0]
        for key, name in (("start_s", "exec -> ready"), ("leaders_s", "+ leaders"),
                          ("first_ack_s", "+ first ack")):
            heights = [s[key], s["killed_" + key]]
            ax.bar(labels, heights, bottom=bottom, label=name)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.axhline(3, color="red", linestyle="--", linewidth=1, label="target 3 s")
        ax.set_ylabel("seconds")
        ax.set_title(f"start with {s['partitions']:,} partitions "
                     f"(RSS {s['rss'] / GiB:.2f} GiB, USS {s['uss'] / GiB:.2f} GiB)",
                     fontsize=9)
        ax.legend(fontsize=7)
    if "recovery" in results:
        ax = next(axs)
        s = results["recovery"]
        keys = [k for k in ("written", "killed", "clean") if k in s]
        xs = range(len(keys))
        ax.bar([x - 0.2 for x in xs], [s[k]["start_s"] for k in keys], 0.4, label="ready")
        ax.bar([x + 0.2 for x in xs], [s[k]["fetch_s"] for k in keys], 0.4,
               label="+ fetch of last")
        ax.set_xticks(list(xs), ["recover", "after SIGKILL", "clean"])
        ax.set_ylabel("seconds")
        ax.set_title(f"one partition, {s['segments']:,} segments", fontsize=9)
        ax.legend(fontsize=7)
    if "segments" in results:
        ax = next(axs)
        s = results["segments"]
        ax.bar(["empty", "clean", "clean+fetch", "SIGKILL", "SIGKILL+fetch"],
               [s["empty_start_s"], s["clean_start_s"], s["clean_fetch_s"],
                s["killed_start_s"], s["killed_fetch_s"]])
        ax.set_ylabel("seconds")
        ax.set_title(f"one partition, {s['segment_files']:,} segments: start / recovery",
                     fontsize=9)
    if "connections" in results:
        ax = next(axs)
        s = results["connections"]
        ax.bar(["busy alone", f"beside {s['idle']:,} idle"], [s["anchor_msg_s"],
                                                               s["busy_msg_s"]])
        ax.set_ylabel("msg/s, all busy producers")
        ax.set_title(f"{s['busy']} busy producers; {s['uss_per_conn'] / 1024:.1f} KiB USS "
                     "per idle connection", fontsize=9)
    if "large" in results:
        ax = next(axs)
        rows_ = results["large"]
        labels = [f"{r['size'] / 2**20:g} MiB" for r in rows_]
        xs = range(len(rows_))
        ax.bar([x - 0.2 for x in xs], [r["produce_mb_s"] for r in rows_], 0.4, label="produce")
        ax.bar([x + 0.2 for x in xs], [r["consume_mb_s"] for r in rows_], 0.4, label="consume")
        ax.set_xticks(list(xs), labels)
        ax.set_ylabel("MB/s (kcat)")
        ax.set_title("large records")
        ax.legend(fontsize=7)
    if "sustained" in results:
        ax = next(axs)
        s = results["sustained"]
        ax.bar(["produce alone", "produce +", "catch-up"], [s["first"], s["second"],
                                                           s["catch_up"]])
        ax.set_ylabel("MB/s")
        ax.set_title(f"sustained: {s['bytes'] / GiB:.1f} GiB of 10 KiB records", fontsize=9)
    for ax in axs:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------------


PARTS = ("partitions", "start", "segments", "recovery", "connections", "large", "sustained")


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        size, count = item.split(":")
        out.append((c.size_arg(size), int(count)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(PARTS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--partitions", default="1,6,64,1000,10000")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--clients", default="kcat,ck")
    ap.add_argument("--keys", default="null,keyed")
    ap.add_argument("--no-kafka", dest="kafka", action="store_false")
    ap.add_argument("--kafka-heap", default="1g")
    ap.add_argument("--start-partitions", type=int, default=10_000)
    ap.add_argument("--segments", type=int, default=1000)
    ap.add_argument("--segment-bytes", type=c.size_arg, default=65536)
    ap.add_argument("--recovery-segments", type=int, default=100_000)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--busy", type=int, default=10)
    ap.add_argument("--busy-records", type=int, default=20_000)
    ap.add_argument("--large", type=_sizes, default=_sizes("1M:100,10M:10"))
    ap.add_argument("--sustained-bytes", type=c.size_arg, default=2 * GiB)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--phase-timeout", type=float, default=120)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args(argv)
    a.partitions = [int(x) for x in a.partitions.split(",")]
    a.clients = a.clients.split(",")
    a.keys = a.keys.split(",")
    if unknown := set(a.keys) - {"null", "keyed"}:
        ap.error(f"unknown --keys {sorted(unknown)}; choose from null, keyed")
    parts = a.only.split(",")
    if unknown := set(parts) - set(PARTS):
        ap.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    if shutil.which("kcat") is None:
        ap.error("kcat is not installed (make setup installs it)")
    need = 2 * a.idle + 200
    if "connections" in parts and raise_nofile(need) < need:
        ap.error(f"ulimit -n must allow {need} descriptors for --idle {a.idle}")
    if "partitions" in parts and a.kafka:
        try:
            apache_kafka.fetch()
        except apache_kafka.KafkaUnavailable as e:
            ap.error(f"{e} (or run with --no-kafka)")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    c.print_environment("bench_scale")
    work = Path(tempfile.mkdtemp(prefix="shmq-scale-", dir=a.dir))
    c.byte_compile_shmq()
    tables = []
    scale = Scale(a, work)
    t_start = time.monotonic()
    try:
        for part in PARTS:
            if part not in parts:
                continue
            print(f"\n== {part}", flush=True)
            t0 = time.monotonic()
            tables.append((part, getattr(scale, part)(), time.monotonic() - t0))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for part, table, seconds in tables:
        print(f"\n{part} ({seconds:.0f} s)\n{table}")
    print(f"\ntotal {time.monotonic() - t_start:.0f} s")
    commit = c._commit()
    results = {"commit": commit, "utc": stamp, "args": {k: str(v) for k, v in vars(a).items()},
               **scale.results}
    json_path = a.json or RESULTS / f"scale-{stamp}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1))
    plot_path = a.plot or RESULTS / f"scale-{stamp}.png"
    plot(scale.results, plot_path, f"shmq bench_scale, commit {commit}, {stamp} UTC "
         "(client and broker on the same 2 cores)")
    print(f"  results: {json_path}\n  plot:    {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
