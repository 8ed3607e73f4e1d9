"""Differential tests with real clients: confluent-kafka, kafka-python, aiokafka, kcat and Kafka's
Java client do the same things against shmq and against Apache Kafka 4.3, and see the same.

* every client writes (each with another codec, idempotently) and another client reads back:
  the same offsets, keys, values, headers and timestamps on both brokers, and what was sent;
* consumer groups with the range, roundrobin and cooperative-sticky assignors grow and shrink:
  the same assignments (by size: members are random ids), every record read once, the same
  committed offsets and group description;
* Kafka's Java client (tests/integration/java/JavaClient.java): admin calls, an idempotent
  producer (DescribeProducers), a group consumer that commits.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import apache_kafka
import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_clients import CODECS, JAVA_SOURCE, KCAT, READERS, WRITERS, Got, Rec, java, sample
from kafka_differences import assert_same
from test_groups import CkGroup, covers, crash_mid_join, produce, wait_until

BASE_TS = (int(time.time()) - 600) * 1000
# both brokers' default group.min.session.timeout.ms is 6000 (test_groups' FAST asks for 3000)
SESSION = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
N = 120


@pytest.fixture(scope="module")
def shmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path_factory.mktemp("clients-diff") / "data")
    try:
        yield b
    finally:
        assert b.stop() == 0, b.log_path.read_text()[-3000:]


@pytest.fixture(scope="module")
def both(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> dict[str, str]:
    return {"kafka": kafka.bootstrap, "shmq": shmq.bootstrap}


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    time.sleep(0.3)  # Kafka's broker learns the new leader from its controller


# -- produce and consume with every client ----------------------------------------------------

CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka", "kcat", "java"]


def normalised(got: list[Got], sent: list[Rec]) -> list[tuple]:
    """Records sent without a timestamp (what kcat can send) carry the producer's clock: the
    same on both brokers only in kind."""
    clock = all(r.timestamp < 0 for r in sent)
    return [(g.partition, g.offset, g.rec.key, g.rec.value, g.rec.headers,
             "<clock>" if clock else g.rec.timestamp, g.timestamp_type) for g in got]


@pytest.mark.parametrize("writer", CLIENTS)
def test_every_client_writes_and_another_reads_alike(both: dict[str, str], writer: str) -> None:
    if "kcat" in (writer, CLIENTS[(CLIENTS.index(writer) + 1) % len(CLIENTS)]) and KCAT is None:
        pytest.skip("kcat is not installed")
    reader = CLIENTS[(CLIENTS.index(writer) + 1) % len(CLIENTS)]
    codec = CODECS[CLIENTS.index(writer) % len(CODECS)]
    recs = sample(N, BASE_TS, text_only="kcat" in (writer, reader))
    topic = f"cd-{writer}-{uuid.uuid4().hex[:6]}"
    results = {}
    for name, bootstrap in both.items():
        create(bootstrap, topic)
        offsets = WRITERS[writer](bootstrap, topic, recs, codec=codec, idempotent=True)
        got = READERS[reader](bootstrap, topic, N)
        results[name] = {"offsets": offsets, "read": normalised(got, recs)}
    assert_same(results["shmq"], results["kafka"])
    read = results["kafka"]["read"]
    assert [r[1] for r in read] == list(range(N))
    for r, sent in zip(read, recs, strict=True):
        assert (r[2], r[3]) == (sent.key, sent.value)
        if sent.timestamp >= 0:
            assert r[4] == sent.headers and r[5] == sent.timestamp


# -- consumer groups --------------------------------------------------------------------------


def group_run(bootstrap: str, topic: str, group: str, strategy: str) -> dict[str, Any]:
    """Three members, a fourth, one leaves; what each phase looked like."""
    phases: dict[str, Any] = {}
    produced = produce(bootstrap, topic, 0, 300)
    g = CkGroup(bootstrap, topic, group, strategy)
    seen_total = 0
    try:
        for _ in range(3):
            g.add(**SESSION)
        wait_until(lambda: covers(g.assignments()), 30, g.poll, "3 members covering 6")
        phases["three members"] = sorted(len(a) for a in g.assignments())
        g.add(**SESSION)
        wait_until(lambda: covers(g.assignments()), 30, g.poll, "4 members covering 6")
        phases["four members"] = sorted(len(a) for a in g.assignments())
        leaving = g.consumers.pop(0)
        leaving.close()
        wait_until(lambda: covers(g.assignments()), 30, g.poll, "3 members after one left")
        phases["one left"] = sorted(len(a) for a in g.assignments())
        wait_until(lambda: produced <= g.seen, 30, g.poll, "every message consumed")
        seen_total = len(g.seen)
        for c in g.consumers:
            try:
                c.commit(asynchronous=False)
            except KafkaException as e:  # a member that read nothing since its last commit
                if e.args[0].code() != KafkaError._NO_OFFSET:
                    raise
    finally:
        g.close()
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    desc = admin.describe_consumer_groups([group])[group].result(30)
    phases["after close"] = {"state": str(desc.state), "members": len(desc.members),
                             "simple": desc.is_simple_consumer_group}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    committed = c.committed([TopicPartition(topic, p) for p in range(6)], timeout=30)
    c.close()
    phases["committed"] = sum(tp.offset for tp in committed)
    phases["read"] = seen_total
    return phases


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_group_rebalances_alike(both: dict[str, str], strategy: str) -> None:
    topic = f"cg-{strategy}-{uuid.uuid4().hex[:6]}"
    runs = {}
    for name, bootstrap in both.items():
        create(bootstrap, topic, 6)
        runs[name] = group_run(bootstrap, topic, f"{topic}-g", strategy)
    assert_same(runs["shmq"], runs["kafka"])
    assert runs["kafka"]["three members"] == [2, 2, 2] and runs["kafka"]["read"] == 300


def invalid_timestamp_run(bootstrap: str, topic: str) -> dict[str, Any]:
    """Each codec through confluent-kafka, and kafka-python: a record stamped 59 min ahead, then
    one 2 h ahead; what each delivery report said, and what the topic holds."""
    from confluent_kafka import Producer
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KpError

    hour = 3600_000
    out: dict[str, Any] = {}
    create(bootstrap, topic)
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        reports: list[Any] = []
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                      "linger.ms": 0, "message.send.max.retries": 0, "log_level": 0})
        now = int(time.time() * 1000)
        for ahead in (hour - 60_000, 2 * hour):
            p.produce(topic, b"x" * 200, partition=0, timestamp=now + ahead,
                      on_delivery=lambda err, msg, reports=reports: reports.append(
                          err.name() if err else msg.offset() >= 0))
            assert p.flush(30) == 0
        out[codec] = reports
    kp = KafkaProducer(bootstrap_servers=bootstrap, retries=0, compression_type="gzip")
    try:
        for ahead in (hour - 60_000, 2 * hour):
            try:
                kp.send(topic, b"x" * 200, partition=0,
                        timestamp_ms=int(time.time() * 1000) + ahead).get(30)
                out.setdefault("kafka-python gzip", []).append(True)
            except KpError as e:
                out.setdefault("kafka-python gzip", []).append(type(e).__name__)
    finally:
        kp.close(30)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-end", "log_level": 0})
    try:
        out["end offset"] = c.get_watermark_offsets(TopicPartition(topic, 0), 30)[1]
    finally:
        c.close()
    return out


def test_clients_get_invalid_timestamp_alike(both: dict[str, str]) -> None:
    """Issue 21 item 3 with real clients: Kafka 4's message.timestamp.after.max.ms (1 h) refuses
    a record 2 h ahead with INVALID_TIMESTAMP whatever the codec (the broker decompresses and
    reads every record); 59 minutes ahead is stored."""
    topic = f"ts-{uuid.uuid4().hex[:6]}"
    runs = {name: invalid_timestamp_run(bootstrap, topic) for name, bootstrap in both.items()}
    assert_same(runs["shmq"], runs["kafka"])
    assert runs["kafka"]["zstd"] == [True, "INVALID_TIMESTAMP"]
    assert runs["kafka"]["kafka-python gzip"] == [True, "InvalidTimestampError"]
    assert runs["kafka"]["end offset"] == 6


# Kafka's minimum session timeout (group.min.session.timeout.ms, 6000 on both brokers) for the
# member that dies; the survivors rebalance within max.poll.interval.ms, 45 s (test_groups).
CRASHER_SESSION_MS = 6000
REBALANCE_TIMEOUT_S = 45


@pytest.mark.parametrize("crasher", ["new", "existing", "existing closes"])
def test_member_dying_mid_join_resumes_alike(both: dict[str, str], tmp_path: Any,
                                             crasher: str) -> None:
    """Issue 21 item 1 on both brokers: a consumer killed (or closed) while its JoinGroup is
    parked (longer than its own session timeout) does not freeze the group until the rebalance
    timeout.  Kafka
    keeps it counted as joined (the parked request outlives its connection), completes the join
    when the others rejoin and expires it by its session timeout; the survivors own every
    partition again within the session timeout plus one rebalance.  The two brokers run at once
    (each its own group and clients), so the test costs one run."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(crash_mid_join, bootstrap, crasher.split()[0],
                                     _scratch(tmp_path, name), CRASHER_SESSION_MS,
                                     close=crasher.endswith("closes"))
                   for name, bootstrap in both.items()}
        took = {name: f.result() for name, f in futures.items()}
    print(f"\n{crasher} member killed mid-join, survivors own every partition after: "
          + ", ".join(f"{name} {t:.1f} s" for name, t in took.items()))
    # a member that closes gives up on its LeaveGroup after librdkafka's 5 s and disconnects;
    # Kafka still handles the LeaveGroup once the join completes (a closing channel's requests
    # are processed): the survivors do not wait for its session timeout
    bound = 5 + 4 if crasher.endswith("closes") else CRASHER_SESSION_MS / 1000 + 8
    for name, t in took.items():
        assert t < bound < REBALANCE_TIMEOUT_S / 3, (name, took)


def _scratch(tmp_path: Any, name: str) -> Any:
    path = tmp_path / name
    path.mkdir()
    return path


# -- Kafka's Java client -----------------------------------------------------------------------


def java_admin(bootstrap: str) -> dict[str, str]:
    topic = f"ja-{uuid.uuid4().hex[:6]}"
    out = java("admin", bootstrap, topic, topic + "-g")
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    return {k: v.replace(topic, "<topic>") for k, v in lines.items()}


@pytest.fixture(scope="module")
def admin_runs(both: dict[str, str]) -> dict[str, dict[str, str]]:
    return {name: java_admin(bs) for name, bs in both.items()}


def test_java_admin_client(admin_runs: dict[str, dict[str, str]]) -> None:
    """Topics, configs, partitions, offsets by spec, records deletion, cluster, group offsets,
    groups: every call answers as on Kafka."""
    assert_same(admin_runs["shmq"], admin_runs["kafka"])
    assert admin_runs["kafka"]["createTopics"] == "ok"
    assert admin_runs["kafka"]["listOffsets forTimestamp 1004"] == "offset=4 timestamp=1004"
    # issue 22: manual assignments, in CreateTopics and CreatePartitions, with no error
    assert admin_runs["kafka"]["createTopics manual assignment"] == "p0:replicas=1 p1:replicas=1"
    assert admin_runs["kafka"]["createPartitions manual assignment"] == \
        "partitions=3 p2:replicas=1"


def test_java_idempotent_producer(both: dict[str, str]) -> None:
    """Kafka's Java producer with idempotence (its default) and lz4: the offsets it reports,
    what a Java consumer reads, and the producer state DescribeProducers shows."""
    recs = sample(N, BASE_TS)
    runs = {}
    for name, bs in both.items():
        topic = f"jp-{uuid.uuid4().hex[:6]}"
        create(bs, topic)
        offsets = WRITERS["java"](bs, topic, recs, codec="lz4", idempotent=True)
        read = READERS["java"](bs, topic, N)
        producers = java("producers", bs, topic, "0").splitlines()
        runs[name] = {"offsets": offsets, "read": normalised(read, recs),
                      "producers": producers}
    assert_same(runs["shmq"], runs["kafka"])
    assert runs["kafka"]["producers"] == [
        f"producer epoch=0 lastSequence={N - 1} coordinatorEpoch=OptionalInt.empty "
        "txnStart=OptionalLong.empty"]


def java_transactions(bootstrap: str) -> list[str]:
    topic = f"jt-{uuid.uuid4().hex[:6]}"
    create(bootstrap, topic, 2)
    create(bootstrap, topic + "-src")
    out = java("txn", bootstrap, topic, topic + "-src", topic + "-g", topic + "-tid")
    # an exception's message names producer ids and epochs, the broker's own: its class stays
    lines = [re.sub(r"(: error \w+): .*", r"\1", line).replace(topic, "<t>")
             for line in out.splitlines()]
    # a consumer's polls interleave its partitions in no set order
    return sorted(lines, key=lambda line: (line.split("\t")[0], line) if "\t" in line else ("",))


def test_java_transactions(both: dict[str, str]) -> None:
    """Kafka's Java client (issue 16): a transactional producer commits with
    sendOffsetsToTransaction, aborts (its offsets too), commits again, is fenced by a second
    producer of its transactional id while a transaction is open (which is aborted; before
    that the admin client's abortTransaction, kafka-transactions.sh abort's call, ends it in
    one partition with WriteTxnMarkers), and the second commits.  read_committed and read_uncommitted Java consumers, the group's committed
    offset and DescribeTransactions/ListTransactions: the same on both brokers, line by line
    (offsets included: one marker per partition per transaction on both).  Both run
    transaction version 2 with this client (test_java_transaction_version_2)."""
    runs = {name: java_transactions(bs) for name, bs in both.items()}
    assert_same(runs["shmq"], runs["kafka"])
    lines = runs["kafka"]
    steps = dict(line.split(": ", 1) for line in lines if ": " in line)
    assert steps["fenced commit"] == "error ProducerFencedException", lines
    assert steps["abortTransaction"] == "ok txnStart=13", lines
    assert all(v == "ok" for k, v in steps.items() if k not in (
        "fenced commit", "abortTransaction", "listConsumerGroupOffsets", "describeTransactions",
        "listTransactions")), lines
    committed = sorted(line.rsplit("\t", 1)[1] for line in lines
                       if line.startswith("read_committed\t"))
    assert committed == sorted(f"c-{i}" for i in range(16)), lines
    everything = [line.rsplit("\t", 1)[1] for line in lines
                  if line.startswith("read_uncommitted\t")]
    assert len(everything) == 16 + 6 + 4, lines
    assert steps["listConsumerGroupOffsets"].startswith("{<t>-src-0=OffsetAndMetadata{offset=12,")
    assert steps["describeTransactions"] == "CompleteCommit partitions=0", lines


def test_java_transaction_version_2(both: dict[str, str]) -> None:
    """Kafka's Java client runs transaction version 2 (KIP-890 part 2) on both brokers: after
    every commit and abort the coordinator (DescribeTransactions) and the partition's leader
    (DescribeProducers, the marker's epoch) know an epoch one higher; read_committed reads
    exactly the committed records and the group has the last committed offset.  Without
    version 2 on shmq the epoch stays where initTransactions left it."""
    runs = {}
    for name, bs in both.items():
        topic = f"jv-{uuid.uuid4().hex[:6]}"
        create(bs, topic, 2)
        create(bs, topic + "-src")
        out = java("txnepochs", bs, topic, topic + "-src", topic + "-g", topic + "-tid")
        runs[name] = sorted((line.replace(topic, "<t>") for line in out.splitlines()),
                            key=lambda ln: (ln.split("\t")[0], ln) if "\t" in ln else ("",))
    assert_same(runs["shmq"], runs["kafka"])
    steps = dict(line.split(": ", 1) for line in runs["kafka"] if ": " in line)
    assert steps["initTransactions"] == "Empty coordinator +0 leader []", steps
    for i in range(3):
        assert steps[f"commit {i}"] == f"CompleteCommit coordinator +{2 * i + 1} leader [+{2 * i + 1}]"
        assert steps[f"abort {i}"] == f"CompleteAbort coordinator +{2 * i + 2} leader [+{2 * i + 2}]"
    assert steps["listConsumerGroupOffsets"].startswith("{<t>-src-0=OffsetAndMetadata{offset=3,")
    committed = sorted(line.rsplit("\t", 1)[1] for line in runs["kafka"]
                       if line.startswith("read_committed\t"))
    assert committed == sorted(f"c{n}-{i}" for n in range(3) for i in range(4))


def test_java_group_consumer(both: dict[str, str]) -> None:
    """A Java consumer subscribes, reads everything, commits and leaves; a second one in the
    same group finds nothing left and the committed offsets where the first stopped."""
    runs = {}
    for name, bs in both.items():
        topic = f"jg-{uuid.uuid4().hex[:6]}"
        create(bs, topic, 3)
        produce(bs, topic, 0, 90, partitions=3)
        first = java("group", bs, topic, topic + "-g", "90")
        second = java("group", bs, topic, topic + "-g", "0")
        runs[name] = {
            "first": sorted(line.replace(topic, "<t>") for line in first.splitlines()
                            if not line.startswith(("0\t", "1\t", "2\t"))),
            "records": sum(1 for line in first.splitlines() if re.match(r"^\d\t", line)),
            "second": second.replace(topic, "<t>").splitlines()}
    assert_same(runs["shmq"], runs["kafka"])
    assert runs["kafka"]["records"] == 90


def test_java_consumer_survives_a_leader_epoch_change(kafka: apache_kafka.KafkaBroker,
                                                      tmp_path: Any) -> None:
    """Issue 22: Kafka's Java consumer reads on across a leader change with a new leader epoch
    (the broker restarted with fewer workers: worker 3's partitions move, epoch + 1) with no
    unexpected error: every record once.  The consumer used to die of IllegalStateException
    on shmq's wrong epoch error codes."""
    import signal
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path / "data"
    topic = "epochs"
    b = start_broker(data, "--listeners", f"127.0.0.1:{port}", workers=3)
    out = tmp_path / "java.out"
    err = tmp_path / "java.err"
    proc = None
    try:
        create(b.bootstrap, topic, 3)
        produce(b.bootstrap, topic, 0, 30, partitions=3)
        classes = apache_kafka.compile_java(JAVA_SOURCE)
        cmd = apache_kafka.java_command("JavaClient", ["consume", b.bootstrap, topic, "60"],
                                        extra_classpath=[classes],
                                        jvm_opts=list(apache_kafka.QUICK_TOOL_OPTS))
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen(cmd, stdout=o, stderr=e, text=True)
        assert wait_until(lambda: len(out.read_text().splitlines()) >= 30, 60), err.read_text()
        before = _epochs(b.bootstrap, topic)
        assert b.stop() == 0
        b = start_broker(data, "--listeners", f"127.0.0.1:{port}", workers=2)
        after = _epochs(b.bootstrap, topic)
        assert sorted(p for p in after if after[p] > before[p]) != [], (before, after)
        produce(b.bootstrap, topic, 30, 30, partitions=3)
        assert proc.wait(90) == 0, err.read_text()[-3000:]
        got = [tuple(map(int, line.split("\t")[:2])) for line in out.read_text().splitlines()]
        assert sorted(got) == sorted({(i % 3, i // 3) for i in range(60)}), got
        assert "Exception" not in err.read_text(), err.read_text()[-3000:]
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        b.stop()


def _epochs(bootstrap: str, topic: str) -> dict[int, int]:
    """{partition: leader epoch} from a Metadata request (kafka-python's protocol classes)."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse
    from test_wire_bad_input import encode, read_frame

    host, port = bootstrap.split(":")
    import socket

    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(encode(MetadataRequest[7](topics=None, allow_auto_topic_creation=False), 9))
        frame = read_frame(sock, 10)
    response = MetadataResponse[7].decode(frame.body, header=True)
    (t,) = [t for t in response.topics if t.name == topic]
    return {p.partition_index: p.leader_epoch for p in t.partitions}
