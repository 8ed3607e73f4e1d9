"""Crashes on the shared-memory path (issue 14 item 2; reliability.md §6, S2).

* A worker killed with SIGKILL under an idempotent acks=all ring stream, with a live local
  reader: the producer notices within 100 ms, reattaches, resends; every acknowledged record is
  in the log exactly once, nothing is duplicated, and every record the reader saw is in the final
  log at the same offset (it never read past the high watermark).
* Client processes killed with SIGKILL at random moments while they produce: the worker reclaims
  their rings (no mapping, no descriptor left), appends only whole entries (every batch in the
  log decodes, each client's records are a gap-free prefix of what it sent), and keeps serving.
  Mixed with worker kills; at the end neither ``/dev/shm`` nor ``/proc/<pid>/fd`` hold anything
  new.  The default run does a few cycles; ``-m slow`` does 100 (SHMQ_SHM_KILL_CYCLES).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka.admin import AdminClient, NewTopic

from shmq.ipc.client import attach

READER = """
import json, select, sys
from shmq.ipc.client import attach
local = attach(sys.argv[1])
offsets, seen, errors = {0: 0, 1: 0}, {0: [], 1: []}, []
print("ready", flush=True)
try:
    while not select.select([sys.stdin], [], [], 0)[0]:
        for p in (0, 1):
            r = local.read("crash", p, offsets[p], 1000, timeout=0.02)
            seen[p] += [(x.offset, x.value.decode()) for x in r.records()]
            offsets[p] = r.next_offset
except Exception as exc:
    errors.append(repr(exc))
print(json.dumps({"seen": seen, "errors": errors}))
"""

CHILD = """
import sys, time
from shmq.ipc.client import attach
data_dir, tag, partition = sys.argv[1], sys.argv[2], int(sys.argv[3])
broker = attach(data_dir, reattach_timeout=60)
n = 0
while True:
    batch = [b"%s-%d" % (tag.encode(), n + i) for i in range(20)]
    broker.send_batch("kills", partition, batch, acks=1)
    n += 20
    broker.poll(0)
    if n == 200:
        print("ready", flush=True)
"""


def _shm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("shmq-")}


def _shm_of(pids: list[int]) -> set[str]:
    """The shmq names these processes map or hold open: the broker's own objects.  Other
    brokers on this host (another worker of the suite, other engineers' suites, one killed -9
    whose table waits for its next start) own the rest of /dev/shm, which is not this test's."""
    names = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                names |= {line.rsplit("/", 1)[-1].split()[0] for line in f if "/dev/shm/shmq-" in line}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/shmq-"):
                    names.add(os.path.basename(target))
        except OSError:
            continue
    return names


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _ring_maps(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as f:
        return sum("shmq-ring" in line for line in f)


def _kill_worker(b: RunningBroker, node: int) -> float:
    pid = b.worker_pids()[node]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the controller restarts it and rewrites broker.json
        try:
            new = b.worker_pids()[node]
        except (OSError, ValueError, KeyError):
            new = pid
        if new != pid and new is not None:
            return killed
        time.sleep(0.02)
    raise AssertionError(f"worker {node} was not restarted")


def _all_values(local, topic: str, partition: int) -> list[tuple[int, bytes]]:
    out, offset = [], 0
    while True:
        r = local.read(topic, partition, offset, 100_000)
        if not len(r):
            return out
        out += [(x.offset, x.value) for x in r.records()]  # decode_batches checks every CRC
        offset = r.next_offset


def test_worker_sigkill_under_ring_stream_with_live_reader(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data")
    reader: subprocess.Popen | None = None
    producer = None
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("crash", 2, 1)])["crash"].result(30)
        producer = attach(b.data_dir)
        # the live reader is another process (a thread would share the producer's GIL and
        # delay its noticing a death): it reads until stdin closes, then prints what it saw
        reader = subprocess.Popen([sys.executable, "-c", READER, str(b.data_dir)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert reader.stdout is not None and reader.stdout.readline().startswith("ready")
        acked: dict[int, list[bytes]] = {0: [], 1: []}
        futures = []
        kills: list[float] = []

        def killer() -> None:  # the kills come from elsewhere, as a crash would
            for i in range(3):
                time.sleep(0.6)
                kills.append(_kill_worker(b, 1 + i % 2))

        kth = threading.Thread(target=killer)
        n = 0
        started = time.monotonic()
        try:
            kth.start()
            while n < 30_000 or kth.is_alive():
                p = (n // 50) % 2
                batch = [b"v%06d" % (n + i) for i in range(50)]
                futures.append((p, batch, producer.send_batch("crash", p, batch)))
                n += 50
                producer.poll(0)
                assert time.monotonic() - started < 120
            assert producer.flush(60) == 0
        finally:
            kth.join(60)
            out, _ = reader.communicate("", timeout=60)
        seen_json = json.loads(out)
        seen = {int(p): [(o, v.encode()) for o, v in rows] for p, rows in seen_json["seen"].items()}
        reader_errors = seen_json["errors"]
        for p, batch, f in futures:
            r = f.result(0)
            assert r.error_code == 0
            acked[p] += batch
        assert not reader_errors, reader_errors
        assert producer.reattached >= len(kills), (producer.reattached, kills)
        # noticed within 100 ms of each kill (the session's socket reports the death at once)
        for killed in kills:
            noticed = [t for _, t in producer.losses if t >= killed]
            assert noticed and noticed[0] - killed < 0.1, (killed, producer.losses)
        for p in (0, 1):
            final = _all_values(producer, "crash", p)
            values = [v for _, v in final]
            dup = [v for v, c in Counter(values).items() if c > 1]
            assert not dup, f"partition {p}: {len(dup)} duplicated, e.g. {dup[:3]}"
            assert set(acked[p]) <= set(values), f"partition {p}: acknowledged records lost"
            assert [o for o, _ in final] == list(range(len(final)))
            by_offset = dict(final)
            changed = [(o, v) for o, v in seen[p] if by_offset.get(o) != v]
            assert not changed, f"the reader saw {len(changed)} records not in the final log"
    finally:
        if producer is not None:
            producer.close(timeout=5)
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait()
        assert b.stop() == 0, b.log_path.read_text()


def _kill_cycles(tmp_path: Path, cycles: int) -> None:
    my_fds = _fds(os.getpid())
    b = start_broker(tmp_path / "data", workers=1)
    table = b.run_info["state_table"].lstrip("/")
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("kills", 1, 1)])["kills"].result(30)
        del admin
        worker = b.worker_pids()[1]
        # descriptors of this worker with no client, measured once the first client is gone:
        # a new partition's .log is opened at its first append (not at its creation), and then
        # stays open
        baseline: int | None = None
        rng = random.Random(14)
        tags = []
        for cycle in range(cycles):
            tag = f"c{cycle}"
            tags.append(tag)
            child = subprocess.Popen([sys.executable, "-c", CHILD, str(b.data_dir), tag, "0"],
                                     stdout=subprocess.PIPE, text=True)
            try:
                assert child.stdout is not None
                line = child.stdout.readline()
                assert line.startswith("ready"), line
                time.sleep(rng.uniform(0, 0.05))
                if cycle % 10 == 9:  # a worker kill while the client streams
                    _kill_worker(b, 1)
                    worker = b.worker_pids()[1]
                    baseline = None  # measured again once this client is gone
                    time.sleep(rng.uniform(0.05, 0.2))
                child.send_signal(signal.SIGKILL)
            finally:
                child.kill()
                child.wait()
                child.stdout.close()
            # the worker reclaims the dead client's rings
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _ring_maps(worker):
                time.sleep(0.01)
            assert _ring_maps(worker) == 0, f"cycle {cycle}: a dead client's ring is still mapped"
            if baseline is None:
                baseline = _fds(worker)
            deadline = time.monotonic() + 5
            while _fds(worker) > baseline and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _fds(worker) <= baseline, (cycle, baseline, os.listdir(f"/proc/{worker}/fd"))
        local = attach(b.data_dir)
        try:
            values = [v.decode() for _, v in _all_values(local, "kills", 0)]
        finally:
            local.close()
        per_tag: dict[str, list[int]] = {}
        for v in values:
            tag, n = v.rsplit("-", 1)
            per_tag.setdefault(tag, []).append(int(n))
        for tag in tags:
            got = per_tag.get(tag, [])
            assert got == list(range(len(got))), f"{tag}: records missing or out of order"
            assert len(got) >= 200 and len(got) % 20 == 0, (tag, len(got))  # whole batches
        assert _ring_maps(worker) == 0
        ours = _shm_of([b.proc.pid, *b.worker_pids().values()]) | {table}
    finally:
        assert b.stop() == 0, b.log_path.read_text()
    assert table in ours and len(ours) >= 2, ours  # the state and metrics tables at least
    leaked = ours & _shm_names()
    assert not leaked, leaked
    assert _fds(os.getpid()) <= my_fds


def test_client_and_worker_kills_leave_nothing_behind(tmp_path: Path) -> None:
    _kill_cycles(tmp_path, 10)


@pytest.mark.slow
def test_client_and_worker_kills_leave_nothing_behind_100_cycles(tmp_path: Path) -> None:
    _kill_cycles(tmp_path, int(os.environ.get("SHMQ_SHM_KILL_CYCLES", "100")))
