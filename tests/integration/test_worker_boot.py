"""How a partition worker boots and recovers: with the cluster metadata first (issues 21, 22, 23).

* A restarted worker answers nothing before it holds the current metadata and has opened its
  logs: a Metadata request sent the moment it is killed is answered, once it is back, with every
  topic and partition (it used to serve with an empty topic list first).
* A topic deleted while its leader was down, then created again under the same name, starts
  empty: the restarted worker deletes the old logs (another topic id) instead of serving them;
  the same after the whole broker went down.
* A topic with a non-default ``index.interval.bytes`` keeps its index files across a clean
  restart (they were rebuilt at every start: the logs were opened with the default config).
* Each worker start logs one line, at the default level, saying what recovery did.
* A consumer group and an idempotent producer across many worker kills: no partition count of
  0, no UNKNOWN_TOPIC_OR_PARTITION, no rebalance, nothing lost or duplicated (librdkafka's log
  and rebalance callbacks checked).  Three kills here (one per worker); fifty in the slow run (each worker killed
  no sooner than 10.5 s after its start: faster, the controller treats it as a crash loop and
  backs off before restarting it).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from test_wire_bad_input import encode, frame, read_frame
from test_worker_crash import (
    _alive,
    _ConfluentStream,
    _consume_all,
    _create_topic,
    _flush,
    _restart,
    _stop,
    _wait_until,
)

from shmq.storage.partition_metadata import read as read_topic_id

# -- a restarted worker answers with the metadata -------------------------------------------------


def _metadata_until_answered(port: int, deadline: float) -> MetadataResponse | None:
    """Metadata v4 for every topic, on a new connection, retried until a worker answers."""
    request = encode(MetadataRequest[4](topics=None, allow_auto_topic_creation=False), 9)
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(request)
                out = read_frame(sock, 10)
        except OSError:
            time.sleep(0.001)
            continue
        if out.kind == "response":
            return MetadataResponse[4].decode(out.body, header=True)
        time.sleep(0.001)
    return None


def test_a_restarted_worker_answers_only_with_the_metadata(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", workers=2)
    try:
        _create_topic(b.bootstrap, "m", 6)
        ports = {w["node_id"]: w["port"] for w in b.run_info["workers"]}
        # 6 restarts: the supervisor's crash-loop backoff makes the 7th to 10th (3.2 to 10 s each)
        # cost 30 s of the default run and add nothing the first six do not check
        for kill in range(6):
            pid = b.worker_pids()[1]
            os.kill(pid, signal.SIGKILL)
            answers = []
            deadline = time.monotonic() + 30
            while len(answers) < 20 and time.monotonic() < deadline:  # from the kill on
                answer = _metadata_until_answered(ports[1], deadline)
                if answer is not None:
                    answers.append(answer)
            assert len(answers) == 20, f"kill {kill}: worker 1 did not answer"
            for answer in answers:
                topics = {t.name: len(t.partitions) for t in answer.topics if not t.is_internal}
                assert topics == {"m": 6}, f"kill {kill}: a restarted worker answered {topics}"
                assert sorted(br.node_id for br in answer.brokers) == [0, 1, 2]
            assert _wait_until(lambda pid=pid: b.worker_pids()[1] != pid, 30)
    finally:
        code = _stop(b)
    assert code == 0, b.log_path.read_text()


def test_connections_wait_in_the_backlog_while_a_worker_restarts(tmp_path: Path) -> None:
    """The controller keeps the worker's listening socket: a connection made while the worker
    is down is accepted by the kernel and answered once the new worker serves (it used to be
    refused, and librdkafka backed off)."""
    b = start_broker(tmp_path / "data", workers=2)
    try:
        port = {w["node_id"]: w["port"] for w in b.run_info["workers"]}[2]
        pid = b.worker_pids()[2]
        os.kill(pid, signal.SIGKILL)
        assert _wait_until(lambda: not _alive(pid), 5)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # not refused
            sock.sendall(frame(bytes.fromhex("0012000000000007") + b"\x00\x02t0"))
            out = read_frame(sock, 30)  # ApiVersions v0, answered by the restarted worker
        assert out.kind == "response", out
        assert b.worker_pids()[2] != pid
    finally:
        code = _stop(b)
    assert code == 0, b.log_path.read_text()


# -- deleted data does not come back ----------------------------------------------------------------


def _keep_down(b: RunningBroker, node: int) -> int:
    """Kill worker ``node`` until the controller backs off (a crash loop): after the 7th death
    in a row it waits 3.2 s before the next start.  Returns the pid killed last."""
    for _ in range(6):
        _restart(b, node)
    pid = b.worker_pids()[node]
    os.kill(pid, signal.SIGKILL)
    assert _wait_until(lambda: "restarting it in 3.2 s" in b.log_path.read_text(), 15), (
        b.log_path.read_text()[-3000:])
    return pid


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int,
             **config: object) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  **config})
    for i, v in enumerate(values):
        p.produce(topic, v, partition=i % partitions)
    assert p.flush(30) == 0


def _high_watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw-probe"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)]
    finally:
        c.close()


def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result(20)


def _dirs(b: RunningBroker, topic: str) -> list[Path]:
    return sorted(b.data_dir.glob(f"worker-*/{topic}-*"))


def _deleted_and_recreated(b: RunningBroker, topic: str, old_id: str) -> None:
    """After the leader's restart: no directory of the old topic; a new topic of the same name
    is empty, its directories carry its own id."""
    import uuid

    assert not _dirs(b, topic), f"old logs still on disk: {_dirs(b, topic)}"
    assert not list(b.data_dir.glob("worker-*/*-delete"))
    _create_topic(b.bootstrap, topic, 2)
    assert _high_watermarks(b.bootstrap, topic, 2) == [0, 0]
    assert sum(len(v) for v in _consume_all(b.bootstrap, topic, 2).values()) == 0
    new_ids = {read_topic_id(d) for d in _dirs(b, topic)}
    assert len(new_ids) == 1 and uuid.UUID(old_id) not in new_ids
    _produce(b.bootstrap, topic, [b"new-%d" % i for i in range(4)], 2)
    got = sorted(v for recs in _consume_all(b.bootstrap, topic, 2).values() for _, v in recs)
    assert got == [b"new-%d" % i for i in range(4)]


def _setup_old_topic(b: RunningBroker, topic: str) -> tuple[int, str]:
    """A 2-partition topic led by both workers, with data; (leader of partition 0, its id)."""
    leaders = _create_topic(b.bootstrap, topic, 2)
    _produce(b.bootstrap, topic, [b"old-%d" % i for i in range(50)], 2)
    assert _high_watermarks(b.bootstrap, topic, 2) == [25, 25]
    (first_dir,) = [d for d in _dirs(b, topic) if d.name.endswith("-0")]
    topic_id = read_topic_id(first_dir)
    assert topic_id is not None
    return leaders[0], str(topic_id)


def test_a_topic_deleted_while_its_leader_was_down_comes_back_empty(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", workers=2)
    try:
        leader, old_id = _setup_old_topic(b, "dr")
        down = _keep_down(b, leader)
        _delete_topic(b.bootstrap, "dr")  # while the leader is down
        assert b.worker_pids()[leader] == down, "the leader came back before the delete"
        assert _wait_until(lambda: b.worker_pids()[leader] != down
                           and _alive(b.worker_pids()[leader]), 30)
        _deleted_and_recreated(b, "dr", old_id)
    finally:
        code = _stop(b)
    assert code == 0, b.log_path.read_text()


def test_a_topic_deleted_before_the_whole_broker_went_down_comes_back_empty(
        tmp_path: Path) -> None:
    """The delete reached the controller's metadata but never the leader (down, then the whole
    broker SIGKILLed): the next start removes the old logs before serving."""
    b = start_broker(tmp_path / "data", workers=2)
    try:
        leader, old_id = _setup_old_topic(b, "db")
        _keep_down(b, leader)
        _delete_topic(b.bootstrap, "db")
        b.proc.kill()  # the controller; the workers follow it
        b.proc.wait(30)
        assert _wait_until(lambda: not any(_alive(p) for p in b.worker_pids().values()), 10)
        assert _dirs(b, "db"), "the old logs should still be on disk before the restart"
    finally:
        _stop(b)
    b2 = start_broker(b.data_dir, workers=2)
    try:
        _deleted_and_recreated(b2, "db", old_id)
    finally:
        code = _stop(b2)
    assert code == 0, b2.log_path.read_text()


# -- per-topic log configs at start ---------------------------------------------------------------


def _index_files(b: RunningBroker, topic: str) -> dict[str, tuple[int, int, bytes]]:
    """(inode, mtime ns, bytes) of the .index / .timeindex files of inactive segments."""
    out = {}
    for d in _dirs(b, topic):
        logs = sorted(d.glob("*.log"))
        for log in logs[:-1]:
            for suffix in (".index", ".timeindex"):
                f = log.with_suffix(suffix)
                st = f.stat()
                out[f"{d.name}/{f.name}"] = (st.st_ino, st.st_mtime_ns, f.read_bytes())
    return out


def test_a_non_default_index_interval_is_not_rebuilt_at_a_clean_start(tmp_path: Path) -> None:
    """Issue 21 item 4: the logs were opened with the broker's default config, so a topic with
    ``index.interval.bytes=100`` failed the index check (built with 100, checked against 4096)
    and had every segment's indexes rebuilt at every clean start."""
    b = start_broker(tmp_path / "data", workers=2)
    topic = "small-interval"
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, 2, 1, config={
            "index.interval.bytes": "100", "internal.segment.bytes": "16384"})])[topic].result(15)
        # one record per batch: many batches, several segments, many index entries
        _produce(b.bootstrap, topic, [b"v%05d" % i + b"." * 150 for i in range(1200)], 2,
                 **{"batch.num.messages": 1, "linger.ms": 0})
    finally:
        assert _stop(b) == 0
    before = _index_files(b, topic)
    assert len(before) >= 10, sorted(before)
    b2 = start_broker(b.data_dir, workers=2)
    try:
        got = _consume_all(b2.bootstrap, topic, 2)  # reads every segment (checking its indexes)
        assert sum(len(v) for v in got.values()) == 1200
        res = ConfigResource("topic", topic)
        admin = AdminClient({"bootstrap.servers": b2.bootstrap})  # alive until the result
        assert admin.describe_configs([res])[res].result(15)["index.interval.bytes"].value == "100"
    finally:
        assert _stop(b2) == 0, b2.log_path.read_text()
    after = _index_files(b2, topic)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert not changed, f"index files rewritten by the restart: {changed}"


# -- what recovery did, at the default log level ---------------------------------------------------


def _worker_logs(b: RunningBroker, node: int) -> list[Path]:
    return sorted(p for p in (b.data_dir / f"worker-{node}").iterdir()
                  if p.is_dir() and (p / "partition.metadata").exists())


def test_each_worker_start_logs_what_recovery_did(tmp_path: Path) -> None:
    """One line per start.  A kill right after acks=all answers finds the acknowledged bytes
    past the recovery record (an acknowledgement's flush does not move it): the log is opened
    and recovered from the record.  Once the worker's timer took the idle log's checkpoint
    (``CHECKPOINT_INTERVAL_MS``), the record names the log's end and the next kill leaves it to
    open at first use (LogManager, "After an unclean shutdown")."""
    from shmq.storage import recovery_point
    from shmq.storage.log import CHECKPOINT_INTERVAL_MS

    env = {k: v for k, v in os.environ.items() if k != "SHMQ_LOG_LEVEL"}
    b = start_broker(tmp_path / "data", workers=2, env=env)
    try:
        _create_topic(b.bootstrap, "r", 2)
        _produce(b.bootstrap, "r", [b"x" * 1000] * 200, 2)
        (log_dir,) = _worker_logs(b, 1)
        record = recovery_point.read(log_dir)
        # the produce takes ~0.2 s: its last flush took no checkpoint unless the box was slow
        behind = record is None or record.offset < 100
        _restart(b, 1)
        assert _wait_until(lambda: len(re.findall(r"worker-1 INFO worker 1 ready",
                                                  b.log_path.read_text())) == 2, 10)
        # idle now: its checkpoint comes within the interval plus a housekeeping round
        assert _wait_until(lambda: (r := recovery_point.read(log_dir)) is not None
                           and r.offset == 100, CHECKPOINT_INTERVAL_MS / 1000 + 5)
        _restart(b, 1)
        assert _wait_until(lambda: len(re.findall(r"worker-1 INFO worker 1 ready",
                                                  b.log_path.read_text())) == 3, 10)
        assert sorted(v for _, v in _consume_all(b.bootstrap, "r", 2)[
            int(log_dir.name.rsplit("-", 1)[1])]) == [b"x" * 1000] * 100
    finally:
        assert _stop(b) == 0
    lines = [ln for ln in b.log_path.read_text().splitlines() if " INFO worker " in ln]
    assert len(lines) == 4, lines  # two workers started, one restarted twice
    assert not behind or re.search(r"worker 1 ready: 1 logs opened after an unclean shutdown; "
                                   r"1 recovered from their recovery points, \d+(\.\d+)? KiB "
                                   r"validated(; indexes of 1 segments rebuilt)? in "
                                   r"\d+\.\d\d s", lines[2]), lines[2]
    assert re.search(r"worker 1 ready: 0 logs opened after an unclean shutdown, 1 left to open "
                     r"at first use; 0 recovered from their recovery points, 0 bytes validated "
                     r"in \d+\.\d\d s", lines[3]), lines[3]
    assert all(" DEBUG " not in ln for ln in b.log_path.read_text().splitlines())


def test_every_acknowledged_record_survives_a_kill_right_after_its_answer(
        tmp_path: Path) -> None:
    """acks=all answers go after the ``.log`` fdatasync only.  1,000 records, the idle log's
    checkpoint (the record at 1,000), 2,000 more, and the worker SIGKILLed the moment the last
    delivery report arrives, with those 2,000 acknowledged past the recovery record.  The
    restarted worker resumes at the record and validates them (their index entries rebuilt
    from the recorded index state): every acknowledged record reads back once, in order, and
    ListOffsets by timestamp finds each probed record on both sides of the record's offset."""
    from shmq.storage import recovery_point
    from shmq.storage.log import CHECKPOINT_INTERVAL_MS

    env = {k: v for k, v in os.environ.items() if k != "SHMQ_LOG_LEVEL"}
    b = start_broker(tmp_path / "data", workers=2, env=env)
    try:
        node = _create_topic(b.bootstrap, "acked", 1)[0]
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 1,
                      "batch.size": 16384})
        acked: list[int] = []

        def produce(numbers: range) -> None:
            for i in numbers:
                p.produce("acked", b"%06d" % i + b"." * 200, partition=0, timestamp=T0 + i,
                          on_delivery=lambda err, msg: err is None and acked.append(int(
                              msg.value()[:6])))
                if i % 500 == 499:
                    p.poll(0)
            assert p.flush(30) == 0

        produce(range(1000))
        (log_dir,) = _worker_logs(b, node)
        # the worker's timer checkpoints the idle log: the record names offset 1000
        assert _wait_until(lambda: (r := recovery_point.read(log_dir)) is not None
                           and r.offset == 1000, CHECKPOINT_INTERVAL_MS / 1000 + 5)
        produce(range(1000, 3000))
        record = recovery_point.read(log_dir)
        _restart(b, node)  # the moment the last answer came
        assert _wait_until(lambda: len(re.findall(rf"worker-{node} INFO worker {node} ready",
                                                  b.log_path.read_text())) == 2, 10)
        got = _consume_all(b.bootstrap, "acked", 1)[0]
        assert [int(v[:6]) for _, v in got] == sorted(acked) == list(range(3000))
        assert [o for o, _ in got] == list(range(3000))
        consumer = KafkaConsumer(bootstrap_servers=b.bootstrap)
        try:  # one partition per call (librdkafka merges repeats of a partition in one)
            tp = KafkaTopicPartition("acked", 0)
            probes = [0, 1, 777, 1500, 2998, 2999]
            assert [consumer.offsets_for_times({tp: T0 + i})[tp].offset
                    for i in probes] == probes
        finally:
            consumer.close()
    finally:
        assert _stop(b) == 0
    restart = [ln for ln in b.log_path.read_text().splitlines()
               if f" INFO worker {node} ready" in ln][-1]
    if record.offset < 3000:  # the acknowledged bytes after the record (unless a slow box
        # took a checkpoint in the second produce): validated from the record, not rebuilt
        assert re.search(r"1 logs opened after an unclean shutdown; 1 recovered from their "
                         r"recovery points, \d+(\.\d+)? KiB validated in", restart), restart


T0 = 1_700_000_000_000


# -- a consumer group and an idempotent producer across worker kills -------------------------------


BAD_LOG = re.compile(r"partition count changed|unknown topic|UNKNOWN_TOPIC|does not exist|"
                     r"Topic .* is unknown|all broker connections are down|ALL_BROKERS_DOWN",
                     re.IGNORECASE)


class _GroupMember(threading.Thread):
    """A subscribed confluent-kafka consumer: records what it reads, every rebalance callback,
    every error, and librdkafka's topic / metadata / group log lines."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.seen: Counter[bytes] = Counter()
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.errors: list[str] = []
        self.log_lines: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: self.log_lines.append(record.getMessage())  # type: ignore
        logger = logging.getLogger(f"rdkafka-{id(self)}")
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": "boot-group",
            "auto.offset.reset": "earliest", "enable.auto.commit": True,
            "session.timeout.ms": 10000, "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500, "debug": "topic,metadata,cgrp",
            "error_cb": lambda err: self.errors.append(str(err)),
        }, logger=logger)
        self.consumer.subscribe(
            [topic], on_assign=lambda c, ps: self.assigned.append(sorted(p.partition for p in ps)),
            on_revoke=lambda c, ps: self.revoked.append(sorted(p.partition for p in ps)))

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for msg in self.consumer.consume(500, 0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            self.errors.append(f"message error: {err}")
                        continue
                    self.seen[msg.value()] += 1
        finally:
            self.consumer.close()

    def bad_log_lines(self, partitions: int) -> list[str]:
        """Lines where the topic vanished or changed; the first discovery of its partitions
        (from 0, unknown, to their count) is the one expected change."""
        bad = [ln for ln in self.log_lines if BAD_LOG.search(ln)]
        first = f"partition count changed from 0 to {partitions}"
        if bad and first in bad[0]:
            bad = bad[1:]
        return bad


STABLE_S = 10.5  # the controller's STABLE_AFTER_S (10 s), and a margin: a worker killed sooner
# after its start counts as crash-looping and is restarted after a back-off (up to 10 s)


def _kills_under_a_group(tmp_path: Path, kills: int, workers: int = 3) -> None:
    """Kill workers round-robin, each one no sooner than STABLE_S after its last start, under a
    consumer group and an idempotent acks=all producer."""
    topic, partitions = "grp", 6
    b = start_broker(tmp_path / "data", workers=workers)
    try:
        leaders = _create_topic(b.bootstrap, topic, partitions)
        member = _GroupMember(b.bootstrap, topic)
        member.start()
        assert _wait_until(lambda: member.assigned, 30), "the group never assigned partitions"
        acked: dict[int, tuple[int, int, float]] = {}
        failed: dict[int, str] = {}
        sent_at: list[float] = []
        lock = threading.Lock()

        def on_ack(n: int, partition: int, offset: int) -> None:
            with lock:
                acked[n] = (partition, offset, time.monotonic())

        def on_fail(n: int, err: str) -> None:
            with lock:
                failed[n] = err

        stream = _ConfluentStream(b.bootstrap, on_ack, on_fail)
        fatal: list[str] = []
        started = {node: time.monotonic() for node in range(1, workers + 1)}
        kill_times: list[tuple[float, int]] = []

        def send_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                n = len(sent_at)
                sent_at.append(time.monotonic())
                stream.send(topic, n, n % partitions)
                time.sleep(0.002)

        try:
            for k in range(kills):
                node = 1 + k % workers
                send_for(max(0.3, started[node] + STABLE_S - time.monotonic()))
                pid = b.worker_pids()[node]
                kill_times.append((time.monotonic(), node))
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while not (b.worker_pids().get(node) not in (None, pid)
                           and _alive(b.worker_pids()[node])):
                    send_for(0.01)  # traffic across the restart
                    assert time.monotonic() < deadline, f"worker {node} not restarted"
                started[node] = time.monotonic()
            send_for(0.5)
            remaining = _flush(stream, 60, fatal)
        finally:
            stream.close()
        n = len(sent_at)
        assert not fatal and remaining == 0, (fatal, remaining)
        assert not failed, f"{len(failed)} sends failed, e.g. {sorted(failed.items())[:5]}"
        assert len(acked) == n
        # the group member read every message (at least once: it may re-read after a restart)
        assert _wait_until(lambda: set(member.seen) >= {str(i).encode() for i in range(n)}, 60), (
            f"the group member read {len(member.seen)} of {n}")
        member.stop.set()
        member.join(30)
        # no rebalance: one assignment of all partitions, no revocation until it left
        assert len(member.assigned) == 1 and member.assigned[0] == list(range(partitions)), (
            member.assigned)
        assert member.revoked in ([], [list(range(partitions))]), member.revoked
        bad = member.bad_log_lines(partitions)
        assert not bad, f"librdkafka saw the topic vanish or change: {bad[:5]}"
        assert not [e for e in member.errors if BAD_LOG.search(e) or "UNKNOWN" in e], (
            member.errors)
        # nothing lost or duplicated, every message where it was acknowledged
        final = _consume_all(b.bootstrap, topic, partitions, timeout=60)
        counts = Counter(int(v) for recs in final.values() for _, v in recs)
        assert not {m: c for m, c in counts.items() if c > 1}, "duplicates stored"
        assert set(counts) == set(acked), "acknowledged messages lost"
        for p, recs in final.items():
            for o, v in recs:
                assert acked[int(v)][:2] == (p, o)
        # kill -> first acknowledgement of a message sent after it, to the killed worker
        restore = []
        for t_kill, node in kill_times:
            parts = {p for p, leader in leaders.items() if leader == node}
            firsts = [t for m, (p, _, t) in acked.items() if p in parts and sent_at[m] > t_kill]
            restore.append(min(firsts) - t_kill)
        restore.sort()
        print(f"{kills} kills: kill -> first acknowledgement median "
              f"{restore[len(restore) // 2]:.3f} s, max {restore[-1]:.3f} s; {n} messages")
    finally:
        code = _stop(b)
    assert code == 0, b.log_path.read_text()[-3000:]


def test_worker_kills_under_a_consumer_group_and_an_idempotent_producer(tmp_path: Path) -> None:
    _kills_under_a_group(tmp_path, 3)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_fifty_worker_kills_under_a_consumer_group_and_an_idempotent_producer(
        tmp_path: Path) -> None:
    _kills_under_a_group(tmp_path, 50)


# -- fewer workers than before: the missing workers' logs move to the new leaders -----------------


@pytest.mark.parametrize("how", ["clean", "sigkill"])
def test_fewer_workers_keep_every_record(tmp_path: Path, how: str) -> None:
    """Started again with ``--workers 2`` after 3, the partitions of worker 3 get new leaders and
    their logs follow them (they stayed under ``worker-3/`` and the new leaders served empty
    logs: every record of worker 3's partitions was gone).  DeleteRecords' log start offset moves
    with the log; after a SIGKILL of the whole broker the moved logs are recovered."""
    data = tmp_path / "data"
    b = start_broker(data, workers=3)
    try:
        leaders = _create_topic(b.bootstrap, "shrink", 6)
        assert 3 in leaders.values()
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
        for i in range(600):
            p.produce("shrink", value=b"v%d" % i, partition=i % 6)
        assert p.flush(30) == 0
        gone = min(q for q, node in leaders.items() if node == 3)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        fut = admin.delete_records([TopicPartition("shrink", gone, 40)])
        fut[TopicPartition("shrink", gone, 40)].result(15)
        if how == "sigkill":
            os.kill(b.proc.pid, signal.SIGKILL)
            for pid in b.worker_pids().values():
                _wait_until(lambda pid=pid: not _alive(pid), 10)
            b.proc.wait()
        assert _stop(b) == (0 if how == "clean" else -signal.SIGKILL)
    finally:
        _stop(b)
    env = {k: v for k, v in os.environ.items() if k != "SHMQ_LOG_LEVEL"}  # INFO lines shown
    b = start_broker(data, workers=2, env=env)
    try:
        md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics("shrink", timeout=10)
        assert {part.leader for part in md.topics["shrink"].partitions.values()} <= {1, 2}
        probe = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "shrink-probe"})
        try:
            lows = [probe.get_watermark_offsets(TopicPartition("shrink", q), timeout=10)[0]
                    for q in range(6)]
        finally:
            probe.close()
        assert lows == [40 if q == gone else 0 for q in range(6)]
        got = _consume_all(b.bootstrap, "shrink", 6, starts={gone: 40})
        for q in range(6):
            start = 40 if q == gone else 0
            assert [v for _, v in got[q]] == [b"v%d" % i for i in range(q, 600, 6)][start:], q
            assert got[q][0][0] == start
        assert not (data / "worker-3").exists()
        assert "from worker 3 to worker" in b.log_path.read_text()
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
        p.produce("shrink", value=b"after", partition=gone)
        assert p.flush(30) == 0
    finally:
        assert _stop(b) == 0, b.log_path.read_text()


def test_what_a_worker_holds_is_frozen_out_of_the_collector(tmp_path: Path) -> None:
    """A worker freezes its objects at start (``gc.freeze``), and again once a topic's logs
    are created or removed (``refreeze``): the logs of a new topic join the frozen objects
    the cyclic collector no longer walks, and those of a deleted one leave them."""
    b = start_broker(tmp_path / "data", workers=1)
    try:
        (booted,) = b.worker_stats(time.time())
        assert booted["gc_frozen"] > 0, booted
        # an idle worker's stats do not change: the file is touched each second, not written
        # again (a new inode and a rename each second, see ``write_stats``)
        stats = b.data_dir / "run" / f"worker-{booted['node_id']}.stats.json"
        inode = stats.stat().st_ino
        assert b.worker_stats(time.time()) == [booted]
        assert stats.stat().st_ino == inode
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("frozen", 300)], operation_timeout=30)["frozen"].result(30)
        (grown,) = b.worker_stats(time.time())
        assert grown["gc_frozen"] > booted["gc_frozen"] + 300 * 5, (booted, grown)
        admin.delete_topics(["frozen"], operation_timeout=30)["frozen"].result(30)
        deadline = time.monotonic() + 30
        while True:
            (shrunk,) = b.worker_stats(time.time())
            if shrunk["gc_frozen"] < grown["gc_frozen"] - 300 * 5:
                break
            assert time.monotonic() < deadline, (grown, shrunk)
            time.sleep(0.2)
    finally:
        assert b.stop() == 0, b.log_path.read_text()
