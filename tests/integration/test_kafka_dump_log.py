"""Kafka's own kafka-dump-log (DumpLogSegments) reads shmq's data dir, and ``shmq dump-log``
prints what it prints, on shmq's files and on Kafka's.

Every Python/C client (confluent-kafka, kafka-python, aiokafka, kcat) writes every compression
type, idempotently, to its own topic on a shmq broker and on the reference Kafka broker.  shmq is
then stopped cleanly (indexes trimmed, producer snapshots written).  Kafka's tool must read every
segment, index, time index and snapshot with no error, find the records that were sent (codec,
producer id, count, payloads), pass its index checks, and print exactly the lines that
``shmq dump-log`` prints for the same files.  Transactions (a committed and an aborted one:
control batches, end-transaction markers, the aborted-transaction index) are dumped by both
tools from shmq's files and from Kafka's own.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import apache_kafka
import pytest
from _broker import start_broker
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_clients import CODECS, KCAT, WRITERS, Rec, sample

CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka", "kcat")
N = 300
BASE_TS = (int(time.time()) - 600) * 1000
# small index intervals so that every segment has offset and time index entries
TOPIC_CONFIGS = {"index.interval.bytes": "1024"}


@dataclass
class Written:
    shmq_dir: Path                      # shmq's data dir, the broker stopped
    kafka_dir: Path                     # the reference broker's log dir, live
    topics: dict[str, tuple[str, str]]  # topic -> (client, codec)
    sent: dict[str, list[Rec]]


def topic_name(client: str, codec: str) -> str:
    return f"dl-{client}-{codec}"


def records_for(client: str) -> list[Rec]:
    return sample(N, BASE_TS, text_only=client == "kcat")


def write_everything(bootstrap: str, topics: dict[str, tuple[str, str]]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for f in admin.create_topics([NewTopic(t, 1, 1, config=TOPIC_CONFIGS) for t in topics],
                                 operation_timeout=30).values():
        f.result(60)
    time.sleep(0.5)  # Kafka's broker learns the new leaders from its controller
    for topic, (client, codec) in topics.items():
        WRITERS[client](bootstrap, topic, records_for(client), codec=codec, idempotent=True)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory,
            kafka: apache_kafka.KafkaBroker) -> Iterator[Written]:
    if KCAT is None:
        pytest.skip("kcat is not installed")
    topics = {topic_name(c, z): (c, z) for c in CLIENTS for z in CODECS}
    b = start_broker(tmp_path_factory.mktemp("dump-log") / "data")
    try:
        write_everything(b.bootstrap, topics)
    finally:
        assert b.stop() == 0, b.log_path.read_text()[-3000:]
    write_everything(kafka.bootstrap, topics)
    yield Written(b.data_dir, kafka.log_dir, topics,
                  {t: records_for(c) for t, (c, _) in topics.items()})


def partition_dir(root: Path, topic: str) -> Path:
    found = list(root.glob(f"{topic}-0")) + list(root.glob(f"worker-*/{topic}-0"))
    assert len(found) == 1, (topic, found)
    return found[0]


def files(root: Path, topics: list[str], *suffixes: str) -> list[str]:
    out: list[str] = []
    for t in topics:
        d = partition_dir(root, t)
        out += sorted(str(p) for s in suffixes for p in d.glob(f"*{s}"))
    return out


def kafka_dump(*args: str) -> subprocess.CompletedProcess[str]:
    return apache_kafka.run_tool("dump-log", *args, timeout=300)


def shmq_dump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shmq", "dump-log", *args],
                          capture_output=True, text=True, timeout=300)


_REPORT_HEAD = re.compile(r"^(Mismatches in :|Found timestamp mismatch in :|Found out of order "
                          r"timestamp in :|The following indexed offsets are not found in :|"
                          r"Non-consecutive offsets in )")


def report_blocks(stderr: str) -> list[list[str]]:
    """DumpLogSegments' end-of-run report as blocks (a heading and its lines), sorted: Kafka
    keeps the files in a HashMap, so the order of the blocks is Java's hashing, not the
    order of --files."""
    blocks: list[list[str]] = []
    for line in stderr.splitlines():
        if _REPORT_HEAD.match(line) or not blocks:
            blocks.append([line])
        else:
            blocks[-1].append(line)
    return sorted(blocks)


BATCH = re.compile(r"^baseOffset: (\d+) lastOffset: (\d+) count: (\d+) baseSequence: (-?\d+) "
                   r"lastSequence: (-?\d+) producerId: (-?\d+) producerEpoch: (-?\d+) .* "
                   r"compresscodec: (\w+) crc: \d+ isvalid: (\w+)$")
RECORD = re.compile(r"^\| offset: (\d+) CreateTime: (-?\d+) keySize: (-?\d+) valueSize: (-?\d+) "
                    r"sequence: (-?\d+) headerKeys: \[(.*)\](?: key: (.*?))?(?: payload: (.*))?$")


def test_kafka_dump_log_reads_every_client_and_codec(written: Written) -> None:
    topics = sorted(written.topics)
    logs = files(written.shmq_dir, topics, ".log")
    assert len(logs) >= len(topics)
    r = kafka_dump("--deep-iteration", "--print-data-log", "--files", ",".join(logs))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr[-3000:]
    by_file: dict[str, list[str]] = {}
    current = ""
    for line in r.stdout.splitlines():
        if line.startswith("Dumping "):
            current = line.removeprefix("Dumping ")
            by_file[current] = []
        else:
            by_file[current].append(line)
    for topic in topics:
        client, codec = written.topics[topic]
        lines = [line for f in files(written.shmq_dir, [topic], ".log") for line in by_file[f]]
        assert not any(line.startswith("Found ") for line in lines), lines[-3:]
        batches = [BATCH.match(line) for line in lines if line.startswith("baseOffset")]
        records = [RECORD.match(line) for line in lines if line.startswith("|")]
        assert all(batches) and all(records), (topic, lines[:4])
        assert len(records) == N, topic
        assert [int(m[1]) for m in records] == list(range(N)), topic  # type: ignore[index]
        assert {m[9] for m in batches} == {"true"}, topic  # type: ignore[index]
        codecs = {m[8] for m in batches}  # type: ignore[index]
        assert codec in codecs and codecs <= {codec, "none"}, (topic, codecs)
        pids = {int(m[6]) for m in batches}  # type: ignore[index]
        assert len(pids) == 1 and min(pids) >= 0, (topic, pids)  # one idempotent producer
        seqs = [(int(m[4]), int(m[5])) for m in batches]  # type: ignore[index]
        assert seqs[0][0] == 0, topic
        assert all(b[0] == a[1] + 1 for a, b in zip(seqs, seqs[1:], strict=False)), topic
        sent = written.sent[topic]
        for m, rec in zip(records, sent, strict=True):
            assert m is not None
            key_size = -1 if rec.key is None else len(rec.key)
            value_size = -1 if rec.value is None else len(rec.value)
            assert (int(m[3]), int(m[4])) == (key_size, value_size), (topic, m[0])
            if rec.timestamp >= 0:
                assert int(m[2]) == rec.timestamp
            if rec.value:
                assert m[8] == rec.value.decode(), (topic, m[0])
            assert m[6] == ",".join(k for k, _ in rec.headers), (topic, m[0])


@pytest.mark.parametrize("broker", ["shmq", "kafka"])
def test_shmq_dump_log_prints_what_kafka_dump_log_prints(written: Written, broker: str) -> None:
    """The same files, both tools, every line the same (stdout and stderr); on shmq's files
    and on the reference broker's."""
    root = written.shmq_dir if broker == "shmq" else written.kafka_dir
    topics = sorted(written.topics)
    every = files(root, topics, ".log", ".index", ".timeindex", ".snapshot")
    for args in (["--print-data-log"], ["--deep-iteration"], []):
        k = kafka_dump(*args, "--files", ",".join(every))
        s = shmq_dump(*args, "--files", ",".join(every))
        assert k.returncode == 0 and s.returncode == 0, (k.stderr[-2000:], s.stderr[-2000:])
        assert s.stdout.splitlines() == k.stdout.splitlines()
        assert report_blocks(s.stderr) == report_blocks(k.stderr)


def test_kafka_index_checks_pass_on_shmq_indexes(written: Written) -> None:
    """--verify-index-only and --index-sanity-check over every index shmq wrote: no mismatch,
    every index sane; shmq dump-log reports the same."""
    indexes = files(written.shmq_dir, sorted(written.topics), ".index", ".timeindex")
    entries = 0
    for f in indexes:
        if f.endswith(".index"):
            entries += Path(f).stat().st_size // 8
    assert entries >= len(written.topics), "no index entries to check"
    # an index without entries (a segment of one batch: its first batch never gets one)
    # prints "<file> is empty." instead
    verify = kafka_dump("--verify-index-only", "--files", ",".join(indexes))
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr[-3000:]
    for line in verify.stdout.splitlines():
        assert line.startswith("Dumping ") or line.endswith(".index is empty."), line
    sanity = kafka_dump("--index-sanity-check", "--files", ",".join(indexes))
    assert sanity.returncode == 0 and sanity.stderr == "", sanity.stderr[-3000:]
    for line in sanity.stdout.splitlines():
        assert line.startswith("Dumping ") or line.endswith((
            " passed sanity check.", ".index is empty.")), line
    assert sum(line.endswith(" passed sanity check.")
               for line in sanity.stdout.splitlines()) >= len(written.topics)
    for args, k in ((["--verify-index-only"], verify), (["--index-sanity-check"], sanity)):
        s = shmq_dump(*args, "--files", ",".join(indexes))
        assert (s.returncode, s.stdout, s.stderr) == (0, k.stdout, k.stderr)


def write_transactions(bootstrap: str, topic: str) -> None:
    """confluent-kafka's transactional producer: commit, abort, commit (five records each)."""
    from confluent_kafka import Producer

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30)[topic].result(60)
    time.sleep(0.5)
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 0,
                  "transactional.id": "dl-txn", "linger.ms": 5})
    p.init_transactions(60)
    for i, commit in enumerate((True, False, True)):
        p.begin_transaction()
        for j in range(5):
            p.produce(topic, key=b"k%d" % j, value=b"txn%d-%d" % (i, j), timestamp=BASE_TS + j)
        p.flush(30)
        if commit:
            p.commit_transaction(60)
        else:
            p.abort_transaction(60)


@pytest.mark.parametrize("broker", ["kafka", "shmq"])
def test_dump_logs_of_transactions(kafka: apache_kafka.KafkaBroker, tmp_path: Path,
                                   broker: str) -> None:
    """A transactional producer (confluent-kafka) commits one transaction and aborts another,
    on the reference broker (its files read live) and on shmq (stopped cleanly); on the segment,
    indexes, snapshots and ``.txnindex`` both tools print the same lines, the markers
    (``endTxnMarker: COMMIT``/``ABORT``) and the aborted range included: Kafka's tool reads
    shmq's transactions as its own."""
    topic = "dl-transactions"
    if broker == "kafka":
        write_transactions(kafka.bootstrap, topic)
        root = kafka.log_dir
    else:
        b = start_broker(tmp_path / "data")
        try:
            write_transactions(b.bootstrap, topic)
            time.sleep(0.5)  # the last commit's markers are written behind its answer
        finally:
            assert b.stop() == 0, b.log_path.read_text()[-3000:]
        root = b.data_dir
    d = partition_dir(root, topic)
    every = sorted(str(f) for f in d.iterdir()
                   if f.suffix in (".log", ".index", ".timeindex", ".snapshot", ".txnindex"))
    assert any(f.endswith(".txnindex") for f in every), every  # the aborted transaction
    for args in (["--print-data-log"], ["--deep-iteration"], []):
        k = kafka_dump(*args, "--files", ",".join(every))
        s = shmq_dump(*args, "--files", ",".join(every))
        assert k.returncode == 0 and s.returncode == 0, (k.stderr[-2000:], s.stderr[-2000:])
        if args:  # records (and so markers) are printed
            assert "endTxnMarker: ABORT" in k.stdout and "endTxnMarker: COMMIT" in k.stdout
            assert "isTransactional: true" in k.stdout
        assert s.stdout.splitlines() == k.stdout.splitlines()
        assert report_blocks(s.stderr) == report_blocks(k.stderr)


def test_kafka_reads_transaction_state_values_v1(tmp_path: Path) -> None:
    """Kafka's ``--transaction-log-decoder`` reads the ``__transaction_state`` records shmq's
    transaction coordinator writes (``TransactionLogValue`` v1, the flexible version): every
    state of a transaction version 2 commit and of an abort whose end rotates the producer id,
    with ``ClientTransactionVersion``, ``NextProducerId`` and ``PreviousProducerId`` where shmq
    writes them (an independent decoder of the bytes: Kafka 4.3.1's generated one)."""
    import asyncio
    import json

    from shmq.coordinator.transactions import TransactionCoordinator, TxnConfig

    ids = iter(range(1001, 1100))

    async def new_producer_id() -> int:
        return next(ids)

    async def markers(*_: object) -> None:
        return None

    async def scenario() -> None:
        c = TransactionCoordinator(tmp_path, TxnConfig(partitions=1), new_producer_id, markers,
                                   markers, lambda topic: 2, lambda: 50)
        c.start()
        try:
            _, pid, _ = await c.init_producer_id("t-dump", 60_000)
            await c.add_partition_implicitly("t-dump", pid, 0, "t", 1)
            assert (await c.end_txn("t-dump", pid, 0, True, 2))[0] == 0
            c.txns["t-dump"].producer_epoch = 32766  # white box: 32765 transactions later
            await c.add_partition_implicitly("t-dump", pid, 32766, "t", 0)
            assert await c.end_txn("t-dump", pid, 32766, False, 2) == (0, 1002, 0)
            await asyncio.sleep(0.05)  # the Complete record's flush is not awaited
        finally:
            c.close()

    asyncio.run(scenario())
    segments = sorted(str(p) for p in tmp_path.glob("__transaction_state-*/*.log"))
    out = kafka_dump("--files", ",".join(segments), "--transaction-log-decoder")
    assert out.returncode == 0 and "Exception" not in out.stdout + out.stderr, out
    values = [json.loads(line.split(" payload: ", 1)[1]) for line in out.stdout.splitlines()
              if " payload: " in line]
    assert {v["version"] for v in values} == {"1"}
    got = [(d["producerId"], d.get("previousProducerId"), d.get("nextProducerId"),
            d["producerEpoch"], d["transactionStatus"], d.get("clientTransactionVersion"),
            d["transactionPartitions"]) for d in (v["data"] for v in values)]
    assert got == [
        (1001, None, None, 0, 0, None, None),                                    # Empty
        (1001, None, None, 0, 1, 2, [{"topic": "t", "partitionIds": [1]}]),     # Ongoing
        (1001, None, None, 1, 2, 2, [{"topic": "t", "partitionIds": [1]}]),     # PrepareCommit
        (1001, None, None, 1, 4, 2, []),                                         # CompleteCommit
        (1001, None, None, 32766, 1, 2, [{"topic": "t", "partitionIds": [0]}]),
        (1001, None, 1002, 32767, 3, 2, [{"topic": "t", "partitionIds": [0]}]),  # PrepareAbort
        (1002, 1001, None, 0, 5, 2, []),                                         # CompleteAbort
    ], out.stdout
