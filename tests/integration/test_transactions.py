"""Transactions end to end with real clients: confluent-kafka's transactional producer (commit,
abort, send_offsets_to_transaction), read_committed consumers of confluent-kafka, kafka-python
and kcat, fencing of a zombie, timeouts, Kafka's error codes for out-of-order and malformed
transactional requests, and recovery after worker and controller SIGKILLs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import uuid

import pytest
from _broker import start_broker
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(bootstrap: str, name: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def txn_producer(bootstrap: str, tid: str, **extra: object) -> Producer:
    conf = {"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5}
    conf.update(extra)
    return Producer(conf)


def consume_all(bootstrap: str, topic: str, isolation: str, expect: int | None = None,
                timeout: float = 20, partitions: int = 3) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "isolation.level": isolation,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    eof.add(msg.partition())
                    if len(eof) == partitions and (expect is None or len(out) >= expect):
                        break
                    continue
                raise AssertionError(msg.error())
            out.append(msg.value())
            eof.discard(msg.partition())
    finally:
        c.close()
    return out


def test_commit_and_abort_read_committed(broker) -> None:
    create_topic(broker.bootstrap, "tx")
    p = txn_producer(broker.bootstrap, "tid-1")
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(30):
        p.produce("tx", b"c1-%d" % i, partition=i % 3)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(20):
        p.produce("tx", b"a-%d" % i, partition=i % 3)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(10):
        p.produce("tx", b"c2-%d" % i, partition=i % 3)
    p.commit_transaction(30)
    committed = consume_all(broker.bootstrap, "tx", "read_committed", 40)
    assert sorted(committed) == sorted([b"c1-%d" % i for i in range(30)]
                                       + [b"c2-%d" % i for i in range(10)])
    everything = consume_all(broker.bootstrap, "tx", "read_uncommitted", 60)
    assert len(everything) == 60  # control records are never handed to the application
    # kcat (librdkafka, read_committed via -X) sees the committed ones only
    kcat = shutil.which("kcat")
    if kcat:
        out = subprocess.run([kcat, "-b", broker.bootstrap, "-C", "-t", "tx", "-e", "-q",
                              "-X", "isolation.level=read_committed", "-f", "%s\\n"],
                             capture_output=True, timeout=60, check=True).stdout.split()
        assert sorted(out) == sorted(committed)
    # kafka-python's read_committed consumer
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed",
                       auto_offset_reset="earliest", enable_auto_commit=False,
                       consumer_timeout_ms=3000)
    kc.assign([KTP("tx", i) for i in range(3)])
    got = [m.value for m in kc]
    kc.close()
    assert sorted(got) == sorted(committed)


def test_open_transaction_holds_lso_until_commit(broker) -> None:
    create_topic(broker.bootstrap, "lso", 1)
    p = txn_producer(broker.bootstrap, "tid-lso")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("lso", b"x", partition=0)
    p.flush(30)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lso-g",
                  "isolation.level": "read_committed"})
    lo, hi = c.get_watermark_offsets(TopicPartition("lso", 0), timeout=10)
    assert hi == 0  # read_committed's high offset is the LSO (ListOffsets isolation 1)
    p.commit_transaction(30)
    lo, hi = c.get_watermark_offsets(TopicPartition("lso", 0), timeout=10)
    assert hi == 2  # the record and its COMMIT marker
    c.close()


def test_consume_transform_produce_offsets(broker) -> None:
    create_topic(broker.bootstrap, "in", 1)
    create_topic(broker.bootstrap, "out", 1)
    src = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(50):
        src.produce("in", b"%d" % i, partition=0)
    src.flush(30)
    group = "ctp"
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    c.assign([TopicPartition("in", 0)])
    p = txn_producer(broker.bootstrap, "ctp-1")
    p.init_transactions(30)
    seen = 0
    while seen < 50:
        msgs = c.consume(20, 5)
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce("out", m.value(), partition=0)
        seen += len(msgs)
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(),
                                      30)
        if seen == 50:
            p.abort_transaction(30)  # the last batch is aborted: offsets too
        else:
            p.commit_transaction(30)
    c.close()
    check = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    committed = check.committed([TopicPartition("in", 0)], timeout=10)[0].offset
    check.close()
    out = consume_all(broker.bootstrap, "out", "read_committed", partitions=1)
    assert len(out) == committed > 0
    assert out == [b"%d" % i for i in range(committed)]


def test_zombie_is_fenced(broker) -> None:
    create_topic(broker.bootstrap, "fz", 1)
    old = txn_producer(broker.bootstrap, "tid-z")
    old.init_transactions(30)
    old.begin_transaction()
    old.produce("fz", b"zombie", partition=0)
    old.flush(30)
    new = txn_producer(broker.bootstrap, "tid-z")
    new.init_transactions(60)  # aborts the zombie's open transaction, bumps the epoch
    new.begin_transaction()
    new.produce("fz", b"new", partition=0)
    new.commit_transaction(30)
    old.produce("fz", b"late", partition=0)
    with pytest.raises(KafkaException) as exc:
        old.commit_transaction(10)
    assert exc.value.args[0].fatal() or "fenced" in str(exc.value).lower()
    assert consume_all(broker.bootstrap, "fz", "read_committed", partitions=1) == [b"new"]


def test_timed_out_transaction_is_aborted(tmp_path) -> None:
    b = start_broker(tmp_path / "data", "--override",
                     "transaction.abort.timed.out.transaction.cleanup.interval.ms=200")
    try:
        create_topic(b.bootstrap, "to", 1)
        p = txn_producer(b.bootstrap, "tid-to", **{"transaction.timeout.ms": 1000})
        p.init_transactions(30)
        p.begin_transaction()
        p.produce("to", b"hung", partition=0)
        p.flush(30)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "to-g",
                      "isolation.level": "read_committed"})
        deadline = time.monotonic() + 15
        hi = 0
        while time.monotonic() < deadline and hi == 0:
            hi = c.get_watermark_offsets(TopicPartition("to", 0), timeout=10)[1]
            time.sleep(0.2)
        c.close()
        assert hi == 2  # aborted by the coordinator: the LSO moved past its marker
        assert consume_all(b.bootstrap, "to", "read_committed", partitions=1) == []
        with pytest.raises(KafkaException):
            p.commit_transaction(10)
    finally:
        assert b.stop() == 0


# -- the wire, by hand: Kafka's error codes for out-of-order and malformed requests --------

def _request(port: int, api_key: int, version: int, body: bytes, flexible: bool = False) -> bytes:
    header = struct.pack(">hhi", api_key, version, 7) + struct.pack(">h", 4) + b"test"
    if flexible:
        header += b"\x00"
    frame = header + body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv(s, 4))[0]
        return _recv(s, size)


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _str(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    return struct.pack(">h", len(s)) + s.encode()


def test_protocol_errors(broker) -> None:
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    create_topic(broker.bootstrap, "pe", 1)
    # EndTxn v1 for an id never initialised: INVALID_PRODUCER_ID_MAPPING (49)
    resp = _request(port, 26, 1, _str("nobody") + struct.pack(">qhb", 5, 0, 1))
    assert struct.unpack_from(">h", resp, 8)[0] == 49
    # InitProducerId v1 with a timeout over transaction.max.timeout.ms: 50
    resp = _request(port, 22, 1, _str("t1") + struct.pack(">i", 3_600_000))
    assert struct.unpack_from(">h", resp, 8)[0] == 50
    resp = _request(port, 22, 1, _str("t1") + struct.pack(">i", 60_000))
    err, pid, epoch = struct.unpack_from(">hqh", resp, 8)
    assert err == 0 and epoch == 0
    # EndTxn before any partition was added: INVALID_TXN_STATE (48)
    resp = _request(port, 26, 1, _str("t1") + struct.pack(">qhb", pid, epoch, 1))
    assert struct.unpack_from(">h", resp, 8)[0] == 48
    # AddPartitionsToTxn v1 with a wrong epoch: INVALID_PRODUCER_EPOCH (47, v<2), v2: FENCED (90)
    body = _str("t1") + struct.pack(">qh", pid, epoch + 1) + struct.pack(">i", 1) + _str("pe") \
        + struct.pack(">ii", 1, 0)
    resp = _request(port, 24, 1, body)
    assert struct.unpack_from(">h", resp, len(resp) - 2)[0] == 47
    resp = _request(port, 24, 2, body)
    assert struct.unpack_from(">h", resp, len(resp) - 2)[0] == 90
    # an unknown partition: UNKNOWN_TOPIC_OR_PARTITION (3)
    body = _str("t1") + struct.pack(">qh", pid, epoch) + struct.pack(">i", 1) + _str("pe") \
        + struct.pack(">ii", 1, 9)
    resp = _request(port, 24, 2, body)
    assert struct.unpack_from(">h", resp, len(resp) - 2)[0] == 3
    # an empty transactional id: INVALID_REQUEST (42); negative timeout: 50
    resp = _request(port, 22, 1, _str("") + struct.pack(">i", 60_000))
    assert struct.unpack_from(">h", resp, 8)[0] == 42
    resp = _request(port, 22, 1, _str("t-neg") + struct.pack(">i", -5))
    assert struct.unpack_from(">h", resp, 8)[0] == 50
    # TxnOffsetCommit v0 outside a transaction: INVALID_TXN_STATE (48); an unknown id: 49
    def txn_offset_commit(tid: str, p: int, e: int) -> int:
        body = _str(tid) + _str("g1") + struct.pack(">qh", p, e) + struct.pack(">i", 1) \
            + _str("pe") + struct.pack(">i", 1) + struct.pack(">iq", 0, 5) + _str(None)
        resp = _request(port, 28, 0, body)
        return struct.unpack_from(">h", resp, len(resp) - 2)[0]

    assert txn_offset_commit("t1", pid, epoch) == 48
    assert txn_offset_commit("nobody", 77, 0) == 49
    # AddOffsetsToTxn v0 with an empty group: INVALID_GROUP_ID (24)
    resp = _request(port, 25, 0, _str("t1") + struct.pack(">qh", pid, epoch) + _str(""))
    assert struct.unpack_from(">h", resp, 8)[0] == 24
    # a worker is not the coordinator
    worker_port = broker.run_info["workers"][0]["port"]
    resp = _request(worker_port, 26, 1, _str("t1") + struct.pack(">qhb", pid, epoch, 1))
    assert struct.unpack_from(">h", resp, 8)[0] == 16
    # a truncated request ends the connection only; the broker keeps serving
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        frame = struct.pack(">hhi", 26, 1, 9) + _str("x") + b"\x00\x01"
        s.sendall(struct.pack(">i", len(frame)) + frame)
        assert s.recv(10) == b""
    resp = _request(port, 22, 1, _str("t1") + struct.pack(">i", 60_000))
    assert struct.unpack_from(">hqh", resp, 8) == (0, pid, epoch + 1)


def _kio_response(api_key: int, version: int, raw: bytes):
    """Decode a response body (after the correlation id and, flexible, its tags) with kio."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    cls = load_response_schema(api_key, version)
    return entity_reader(cls)(memoryview(raw), 5)[0]  # after correlation id + header tags


def test_describe_and_list_transactions(broker) -> None:
    create_topic(broker.bootstrap, "dl", 2)
    p = txn_producer(broker.bootstrap, "tid-dl")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("dl", b"x", partition=1)
    p.flush(30)
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    # ListTransactions v1 (flexible): no state filter, no producer filter, duration -1
    resp = _kio_response(66, 1, _request(port, 66, 1, b"\x01\x01" + struct.pack(">q", -1)
                                         + b"\x00", flexible=True))
    states = {t.transactional_id: t.transaction_state for t in resp.transaction_states}
    assert states == {"tid-dl": "Ongoing"}
    resp = _kio_response(66, 0, _request(port, 66, 0, b"\x02\x07Bogus!\x01\x00",
                                         flexible=True))
    assert resp.unknown_state_filters == ("Bogus!",) and resp.transaction_states == ()
    # DescribeTransactions v0: the open transaction's partitions; an unknown id: 105
    body = b"\x03" + b"\x07tid-dl" + b"\x05nope" + b"\x00"
    resp = _kio_response(65, 0, _request(port, 65, 0, body, flexible=True))
    one, unknown = resp.transaction_states
    assert one.error_code == 0 and one.transaction_state == "Ongoing"
    assert [(t.topic, list(t.partitions)) for t in one.topics] == [("dl", [1])]
    assert unknown.error_code == 105
    p.commit_transaction(30)
    resp = _kio_response(65, 0, _request(port, 65, 0, body, flexible=True))
    assert resp.transaction_states[0].transaction_state == "CompleteCommit"
    # __transaction_state is listed and readable: its records are Kafka's TransactionLog ones
    from shmq.coordinator.records import partition_for
    from shmq.coordinator.transactions import TxnState, decode_key, decode_value

    md = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert len(md.topics["__transaction_state"].partitions) == 50
    part = partition_for("tid-dl", 50)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ts-reader",
                  "enable.partition.eof": True})
    c.assign([TopicPartition("__transaction_state", part, 0)])
    states = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            break
        if decode_key(m.key()) == "tid-dl":
            states.append(decode_value("tid-dl", m.value()).state)
    c.close()
    assert states[0] == TxnState.EMPTY and states[-1] == TxnState.COMPLETE_COMMIT
    assert TxnState.ONGOING in states and TxnState.PREPARE_COMMIT in states


@pytest.mark.parametrize("victim", ["worker", "controller"])
def test_transactions_survive_sigkill(tmp_path, victim: str) -> None:
    """A transaction committed before a SIGKILL stays committed, one aborted stays aborted and
    one left open is aborted by its timeout after the restart; read_committed agrees."""
    data = tmp_path / "data"
    args = ("--override", "transaction.abort.timed.out.transaction.cleanup.interval.ms=200")
    b = start_broker(data, *args, workers=1)
    try:
        create_topic(b.bootstrap, "k", 2)
        p = txn_producer(b.bootstrap, "tid-k", **{"transaction.timeout.ms": 2000})
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(10):
            p.produce("k", b"c-%d" % i, partition=i % 2)
        p.commit_transaction(30)
        p.begin_transaction()
        for i in range(5):
            p.produce("k", b"a-%d" % i, partition=i % 2)
        p.flush(30)
        p.abort_transaction(30)
        p.begin_transaction()
        for i in range(5):
            p.produce("k", b"o-%d" % i, partition=i % 2)
        p.flush(30)
        if victim == "worker":
            os.kill(b.worker_pids()[1], signal.SIGKILL)
        else:
            os.kill(b.proc.pid, signal.SIGKILL)
            b.proc.wait()
            for pid in b.worker_pids().values():  # workers exit when the controller dies
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.05)
            b.stop()
            b = start_broker(data, *args, workers=1)
        deadline = time.monotonic() + 20
        got: list[bytes] = []
        while time.monotonic() < deadline:
            got = consume_all(b.bootstrap, "k", "read_committed", partitions=2, timeout=10)
            c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "kk",
                          "isolation.level": "read_committed"})
            his = [c.get_watermark_offsets(TopicPartition("k", i), timeout=10)[1]
                   for i in range(2)]
            c.close()
            if sum(his) >= 26:  # 20 records + commit, abort and timeout-abort markers
                break
            time.sleep(0.3)
        assert sorted(got) == sorted(b"c-%d" % i for i in range(10))
        assert sum(his) == 26
    finally:
        b.stop()


def test_kafka_python_and_aiokafka_transactional_producers(broker) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer

    create_topic(broker.bootstrap, "kp", 2)
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="tid-kp")
    kp.init_transactions()
    kp.begin_transaction()
    for i in range(10):
        kp.send("kp", b"kp-c-%d" % i, partition=i % 2)
    kp.commit_transaction()
    kp.begin_transaction()
    for i in range(5):
        kp.send("kp", b"kp-a-%d" % i, partition=i % 2)
    kp.flush()
    kp.abort_transaction()
    kp.close()

    async def aio() -> None:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="tid-aio")
        await p.start()
        try:
            async with p.transaction():
                for i in range(10):
                    await p.send("kp", b"aio-c-%d" % i, partition=i % 2)
            await p.begin_transaction()
            for i in range(5):
                await p.send("kp", b"aio-a-%d" % i, partition=i % 2)
            await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(aio())
    want = sorted([b"kp-c-%d" % i for i in range(10)] + [b"aio-c-%d" % i for i in range(10)])
    assert sorted(consume_all(broker.bootstrap, "kp", "read_committed", 20,
                              partitions=2)) == want
    assert len(consume_all(broker.bootstrap, "kp", "read_uncommitted", 30, partitions=2)) == 30


def test_shared_memory_reader_honours_read_committed(broker) -> None:
    """The local mmap reader stops at the LSO and drops aborted batches (from .txnindex)."""
    from shmq.ipc.client import attach

    create_topic(broker.bootstrap, "shm", 1)
    p = txn_producer(broker.bootstrap, "tid-shm")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("shm", b"c1", partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce("shm", b"aborted", partition=0)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce("shm", b"open", partition=0)
    p.flush(30)
    with attach(broker.data_dir) as local:
        committed = local.read("shm", 0, 0, isolation="read_committed")
        assert [r.value for r in committed.records()] == [b"c1"]
        assert committed.last_stable_offset == 4  # c1, commit, aborted, abort; "open" at 4
        table = local.read_arrow("shm", 0, 0, isolation="read_committed")[0]
        assert table.column("value").to_pylist() == [b"c1"]
        everything = local.read("shm", 0, 0, isolation="read_uncommitted")
        assert [r.value for r in everything.records()] == [b"c1", b"aborted", b"open"]
        p.commit_transaction(30)
        later = local.read("shm", 0, 0, isolation="read_committed", timeout=5)
        assert [r.value for r in later.records()] == [b"c1", b"open"]


def _produce(port: int, tid: str | None, topic: str, partition: int, batch: bytes) -> int:
    body = _str(tid) + struct.pack(">hi", -1, 10000) + struct.pack(">i", 1) + _str(topic) \
        + struct.pack(">ii", 1, partition) + struct.pack(">i", len(batch)) + batch
    resp = _request(port, 0, 3, body)
    # correlation id, [topic [partition, error, ...]]
    name_len = struct.unpack_from(">h", resp, 8)[0]
    return struct.unpack_from(">h", resp, 8 + 2 + name_len + 4 + 4)[0]


def test_late_or_unexpected_transactional_writes_are_refused(broker) -> None:
    """KIP-890 part 1: a transactional batch for a partition its transaction has not added,
    or arriving after the transaction ended, is INVALID_TXN_STATE and leaves no transaction
    hanging (the LSO reaches the HW)."""
    from shmq.protocol.records import encode_batch

    create_topic(broker.bootstrap, "late", 1)
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    resp = _request(port, 22, 1, _str("t-late") + struct.pack(">i", 60_000))
    err, pid, epoch = struct.unpack_from(">hqh", resp, 8)
    assert err == 0

    def batch(seq: int) -> bytes:
        return bytes(encode_batch([(None, b"v%d" % seq)], producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, transactional=True))

    leader = None
    for w in broker.run_info["workers"]:
        code = _produce(w["port"], "t-late", "late", 0, batch(0))
        if code != 6:
            leader = w["port"]
            break
    assert leader is not None
    assert code == 48  # not added to the transaction
    assert _produce(leader, None, "late", 0, batch(0)) == 48  # no transactional id
    add = _str("t-late") + struct.pack(">qh", pid, epoch) + struct.pack(">i", 1) + _str("late") \
        + struct.pack(">ii", 1, 0)
    resp = _request(port, 24, 2, add)
    assert struct.unpack_from(">h", resp, len(resp) - 2)[0] == 0
    assert _produce(leader, "t-late", "late", 0, batch(0)) == 0
    resp = _request(port, 26, 2, _str("t-late") + struct.pack(">qhb", pid, epoch, 1))
    assert struct.unpack_from(">h", resp, 8)[0] == 0
    assert _produce(leader, "t-late", "late", 0, batch(1)) == 48  # after its end
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "late-g",
                  "isolation.level": "read_committed"})
    assert c.get_watermark_offsets(TopicPartition("late", 0), timeout=10)[1] == 2
    c.close()


def test_end_txn_whose_client_leaves_still_completes(broker) -> None:
    """The client of an EndTxn closes its connection while the markers cannot be written (the
    workers are stopped): the coordinator still finishes the transaction once they can be (as
    Kafka's marker channel does), it is not left in PrepareCommit for good (which fenced every
    later producer of the id with CONCURRENT_TRANSACTIONS: the wedge of the kill soak)."""
    create_topic(broker.bootstrap, "gone", 1)
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    resp = _request(port, 22, 1, _str("t-gone") + struct.pack(">i", 60_000))
    err, pid, epoch = struct.unpack_from(">hqh", resp, 8)
    assert err == 0
    add = _str("t-gone") + struct.pack(">qh", pid, epoch) + struct.pack(">i", 1) \
        + _str("gone") + struct.pack(">ii", 1, 0)
    resp = _request(port, 24, 2, add)
    assert struct.unpack_from(">h", resp, len(resp) - 2)[0] == 0
    describe = b"\x02" + b"\x07t-gone" + b"\x00"

    def state() -> str:
        raw = _request(port, 65, 0, describe, flexible=True)
        return _kio_response(65, 0, raw).transaction_states[0].transaction_state

    pids = list(broker.worker_pids().values())
    for w in pids:
        os.kill(w, signal.SIGSTOP)
    try:
        header = struct.pack(">hhi", 26, 2, 7) + _str("test")
        frame = header + _str("t-gone") + struct.pack(">qhb", pid, epoch, 1)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(struct.pack(">i", len(frame)) + frame)
            time.sleep(1.0)  # the coordinator is writing the markers; the client goes away
        time.sleep(0.5)
        assert state() == "PrepareCommit"
    finally:
        for w in pids:
            os.kill(w, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while state() != "CompleteCommit" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert state() == "CompleteCommit"
    resp = _request(port, 22, 1, _str("t-gone") + struct.pack(">i", 60_000))
    assert struct.unpack_from(">hqh", resp, 8) == (0, pid, epoch + 1)


def test_write_txn_markers_bad_input_and_offsets(broker) -> None:
    """WriteTxnMarkers (27) on the wire: markers into partitions a node does not host, negative
    and unknown partitions, an empty topic name are UNKNOWN_TOPIC_OR_PARTITION; a truncated
    request closes its connection only; on the controller a COMMIT marker into
    ``__consumer_offsets`` makes a producer's pending transactional offsets visible, as the
    transaction coordinator's own marker does (kafka-transactions.sh abort/commit by hand)."""
    from kafka_wire import Wire

    create_topic(broker.bootstrap, "wm", 2)
    with Wire(broker.bootstrap) as wire:
        leader = wire.leader("wm", 0)
        other = next(("127.0.0.1", w["port"]) for w in broker.run_info["workers"]
                     if w["port"] != leader[1])

        def codes(to, *markers, version=1):
            body = {"markers": [{"producer_id": pid, "producer_epoch": 0,
                                 "transaction_result": commit, "coordinator_epoch": 0,
                                 "topics": [{"name": t, "partition_indexes": ps}
                                            for t, ps in topics.items()],
                                 "transaction_version": 0}
                                for pid, commit, topics in markers]}
            r = wire.send(27, version, body, to=to)
            return {(m["producer_id"], t["name"], p["partition_index"]): p["error_code"]
                    for m in r["markers"] for t in m["topics"] for p in t["partitions"]}

        assert codes(leader, (77, False, {"wm": [-1, 9], "": [0], "nope": [0]})) == {
            (77, "wm", -1): 3, (77, "wm", 9): 3, (77, "", 0): 3, (77, "nope", 0): 3}
        # a worker hosts its own partitions only; the controller hosts none of wm's
        hosted = codes(other, (78, False, {"wm": [0, 1]}), version=2)
        assert sorted(hosted.values()) == [0, 3]
        assert codes(wire.bootstrap, (79, False, {"wm": [0]})) == {(79, "wm", 0): 3}
        assert codes(leader, (80, False, {"wm": [0]}), (81, True, {"wm": [0]})) == {
            (80, "wm", 0): 0, (81, "wm", 0): 0}
    # a transactional offset commit left pending, committed by a marker sent by hand
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    from shmq.coordinator.records import partition_for

    p = txn_producer(broker.bootstrap, "tid-wm")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("wm", b"x", partition=0)
    group = "g-wm"
    # read_uncommitted: OffsetFetch without require_stable (else UNSTABLE_OFFSET_COMMIT, retried)
    meta = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                     "isolation.level": "read_uncommitted"})
    p.send_offsets_to_transaction([TopicPartition("wm", 0, 42)],
                                  meta.consumer_group_metadata(), 30)
    p.flush(30)
    raw = _request(port, 65, 0, b"\x02" + b"\x07tid-wm" + b"\x00", flexible=True)
    state = _kio_response(65, 0, raw).transaction_states[0]
    pid, epoch = state.producer_id, state.producer_epoch
    assert meta.committed([TopicPartition("wm", 0)], timeout=10)[0].offset < 0
    with Wire(broker.bootstrap) as wire:
        part = partition_for(group, 50)
        body = {"markers": [{"producer_id": pid, "producer_epoch": epoch,
                             "transaction_result": True, "coordinator_epoch": 0,
                             "topics": [{"name": "__consumer_offsets",
                                         "partition_indexes": [part, 50]}]}]}
        r = wire.send(27, 1, body)
        got = {p["partition_index"]: p["error_code"] for p in r["markers"][0]["topics"][0]["partitions"]}
        assert got == {part: 0, 50: 3}
    assert meta.committed([TopicPartition("wm", 0)], timeout=10)[0].offset == 42
    meta.close()
    p.commit_transaction(30)
    # a truncated WriteTxnMarkers ends its connection only
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        frame = struct.pack(">hhi", 27, 1, 9) + _str("x") + b"\x00\x02\x00\x00"
        s.sendall(struct.pack(">i", len(frame)) + frame)
        assert s.recv(10) == b""
    assert _request(port, 22, 1, _str("tid-wm2") + struct.pack(">i", 60_000))[8:10] == b"\x00\x00"


def test_retry_of_a_written_batch_after_its_transaction_ended(broker) -> None:
    """A transactional batch written, its answer lost (a worker killed), its transaction
    aborted, then the client's retry of it: answered as a duplicate with its offsets, not
    INVALID_TXN_STATE.  The refusal told librdkafka the sequence numbers were unused; it gave
    them to the next transaction's records, which the log then took for duplicates of the
    aborted batch: 100 records lost in the 100,000-record kill soak.  A batch never written
    still gets INVALID_TXN_STATE (KIP-890)."""
    from shmq.protocol.records import encode_batch

    create_topic(broker.bootstrap, "retry", 1)
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    resp = _request(port, 22, 1, _str("t-retry") + struct.pack(">i", 60_000))
    err, pid, epoch = struct.unpack_from(">hqh", resp, 8)
    assert err == 0

    def batch(seq: int, n: int = 3) -> bytes:
        return bytes(encode_batch([(None, b"v%d" % (seq + i)) for i in range(n)],
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                  transactional=True))

    leader = next(w["port"] for w in broker.run_info["workers"]
                  if _produce(w["port"], "t-retry", "retry", 0, batch(0)) != 6)
    add = _str("t-retry") + struct.pack(">qh", pid, epoch) + struct.pack(">i", 1) \
        + _str("retry") + struct.pack(">ii", 1, 0)
    resp = _request(port, 24, 2, add)
    assert struct.unpack_from(">h", resp, len(resp) - 2)[0] == 0
    assert _produce(leader, "t-retry", "retry", 0, batch(0)) == 0
    resp = _request(port, 26, 2, _str("t-retry") + struct.pack(">qhb", pid, epoch, 0))
    assert struct.unpack_from(">h", resp, 8)[0] == 0  # aborted
    assert _produce(leader, "t-retry", "retry", 0, batch(0)) == 0  # the retry: a duplicate
    assert _produce(leader, "t-retry", "retry", 0, batch(3)) == 48  # never written: refused
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "retry-g",
                  "isolation.level": "read_uncommitted"})
    assert c.get_watermark_offsets(TopicPartition("retry", 0), timeout=10)[1] == 4  # 3 + ABORT
    c.close()


def test_transactions_cli(broker) -> None:
    import sys

    def shmq(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "shmq", "transactions",
                               "--bootstrap-server", broker.bootstrap, *args],
                              capture_output=True, text=True, timeout=60)

    create_topic(broker.bootstrap, "cli", 2)
    p = txn_producer(broker.bootstrap, "tid-cli")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("cli", b"x", partition=1)
    p.flush(30)
    out = shmq("list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["TransactionalId", "Coordinator", "ProducerId",
                                "TransactionState"]
    assert lines[1].split()[0::3] == ["tid-cli", "Ongoing"]
    out = shmq("describe", "--transactional-id", "tid-cli")
    assert out.returncode == 0, out.stderr
    row = out.stdout.splitlines()[1].split()
    assert row[1] == "tid-cli" and row[4] == "Ongoing" and row[-1] == "cli-1"
    assert shmq("describe", "--transactional-id", "nope").returncode == 1
    out = shmq("abort", "--transactional-id", "tid-cli")
    assert out.returncode == 0, out.stderr
    assert shmq("list", "--state", "Ongoing").stdout.splitlines()[1:] == []
    with pytest.raises(KafkaException):
        p.commit_transaction(10)  # fenced by the abort
    assert consume_all(broker.bootstrap, "cli", "read_committed", partitions=2) == []
    assert shmq("abort", "--topic", "cli", "--partition", "0").returncode == 1


def test_producer_perf_test_transactional_and_console_consumer(broker) -> None:
    """``shmq producer-perf-test --transactional-id`` commits its records in transactions;
    ``shmq console-consumer --isolation-level read_committed`` reads them back."""
    import sys

    create_topic(broker.bootstrap, "ppt", 1)
    out = subprocess.run([sys.executable, "-m", "shmq", "producer-perf-test", "--topic", "ppt",
                          "--num-records", "3000", "--record-size", "100", "--throughput", "-1",
                          "--transactional-id", "ppt-1", "--transaction-duration-ms", "200",
                          "--producer-props", f"bootstrap.servers={broker.bootstrap}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "3000 records sent" in out.stdout
    out = subprocess.run([sys.executable, "-m", "shmq", "console-consumer",
                          "--bootstrap-server", broker.bootstrap, "--topic", "ppt",
                          "--from-beginning", "--isolation-level", "read_committed",
                          "--max-messages", "3000", "--timeout-ms", "20000"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 3000
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ppt-g",
                  "isolation.level": "read_committed"})
    hi = c.get_watermark_offsets(TopicPartition("ppt", 0), timeout=10)[1]
    c.close()
    assert hi > 3000  # the records and at least one COMMIT marker, all committed


def test_find_hanging_and_abort_by_start_offset(tmp_path) -> None:
    """``shmq transactions find-hanging`` and ``abort --topic --partition --start-offset`` (or
    ``--producer-id --producer-epoch --coordinator-epoch``), as kafka-transactions.sh: a
    transaction its coordinator lists is not hanging; once the coordinator's state is lost
    (``__transaction_state`` deleted while the broker is down) the partition's open
    transaction is, it holds the LSO, and an abort by its start offset releases it."""
    import sys

    data = tmp_path / "data"
    b = start_broker(data)

    def shmq(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "shmq", "transactions",
                               "--bootstrap-server", b.bootstrap, *args],
                              capture_output=True, text=True, timeout=60)

    try:
        create_topic(b.bootstrap, "hang", 2)
        plain = Producer({"bootstrap.servers": b.bootstrap})
        plain.produce("hang", b"before", partition=1)
        plain.flush(30)
        p = txn_producer(b.bootstrap, "tid-hang")
        p.init_transactions(30)
        p.begin_transaction()
        p.produce("hang", b"open", partition=1)
        p.flush(30)
        time.sleep(0.05)
        out = shmq("find-hanging", "--topic", "hang", "--max-transaction-timeout", "0")
        assert out.returncode == 0 and out.stdout.split() == [
            "Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
            "StartOffset", "LastTimestamp", "Duration(min)"], out  # its coordinator knows it
        assert b.stop() == 0
        for d in (data / "controller").glob("__transaction_state-*"):
            shutil.rmtree(d)
        b = start_broker(data)
        plain = Producer({"bootstrap.servers": b.bootstrap})
        plain.produce("hang", b"after", partition=1)
        plain.flush(30)
        assert consume_all(b.bootstrap, "hang", "read_committed", partitions=2,
                           timeout=5) == [b"before"]  # the LSO is held at 1
        out = shmq("find-hanging", "--topic", "hang", "--max-transaction-timeout", "0")
        assert out.returncode == 0, out.stderr
        rows = [line.split() for line in out.stdout.splitlines()[1:]]
        assert [(r[0], r[1], r[4], r[5]) for r in rows] == [("hang", "1", "-1", "1")], out
        pid, epoch = rows[0][2], rows[0][3]
        by_broker = [shmq("find-hanging", "--broker-id", n, "--max-transaction-timeout", "0")
                     for n in ("1", "2")]
        assert sum(len(o.stdout.splitlines()) - 1 for o in by_broker) == 1  # hang-1's replica
        # bad requests: no transaction starts at 0; an epoch below the producer's; no scope
        out = shmq("abort", "--topic", "hang", "--partition", "1", "--start-offset", "0")
        assert out.returncode == 1 and "Could not find any open transactions starting at " \
            "offset 0 on partition hang-1" in out.stderr, out
        out = shmq("abort", "--topic", "hang", "--partition", "1", "--producer-id", pid,
                   "--producer-epoch", str(int(epoch) - 1), "--coordinator-epoch", "0")
        assert out.returncode == 1 and "INVALID_PRODUCER_EPOCH" in out.stderr, out
        out = shmq("abort", "--topic", "hang", "--partition", "1", "--producer-id", pid)
        assert out.returncode == 1 and "--producer-epoch" in out.stderr, out
        assert shmq("find-hanging").returncode == 1
        assert shmq("find-hanging", "--partition", "1", "--broker-id", "1").returncode == 1
        out = shmq("abort", "--topic", "hang", "--partition", "1", "--start-offset", "1")
        assert out.returncode == 0 and out.stdout == "", out
        assert sorted(consume_all(b.bootstrap, "hang", "read_committed", partitions=2,
                                  expect=2)) == [b"after", b"before"]
        out = shmq("find-hanging", "--topic", "hang", "--max-transaction-timeout", "0")
        assert out.stdout.splitlines()[1:] == []
    finally:
        assert b.stop() == 0, b.log_path.read_text()[-3000:]
