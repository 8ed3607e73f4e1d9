"""Differential tests at the wire: the same raw requests to shmq and to Apache Kafka 4.3, the
same answers.

Each test runs one scenario (a function of a ``Wire``) against both brokers, passes the answers
through ``kafka_differences.normalise`` (identities and clocks only) and compares them.  Requests
are built from plain values and encoded with kio; record batches are built by kafka-python, so
both brokers store the same bytes.  The reference broker is the session's ``kafka`` fixture; shmq
runs with two workers, as a user would start it.
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import apache_kafka
import crc32c
import pytest
from _broker import RunningBroker, start_broker
from kafka_differences import assert_same, normalise
from kafka_wire import Wire, produce_body, record_batch

NO_UUID = "00000000-0000-0000-0000-000000000000"
T0 = 1_700_000_000_000  # record timestamps: fixed, so both brokers store identical batches

# API keys
PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, INIT_PRODUCER_ID = 18, 19, 20, 21, 22
DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 37, 44


@pytest.fixture(scope="module")
def shmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path_factory.mktemp("wire-diff") / "data")
    try:
        yield b
    finally:
        assert b.stop() == 0, b.log_path.read_text()[-3000:]


Scenario = Callable[[Wire, str], Any]


def on_both(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker, scenario: Scenario,
            drop: tuple[str, ...] = ()) -> Any:
    """Run ``scenario(wire, topic)`` on each broker with the same fresh topic name; the
    normalised answers must be equal.  Returns Kafka's (normalised) answer."""
    topic = f"diff-{uuid.uuid4().hex[:10]}"
    answers = {}
    for name, bootstrap in (("kafka", kafka.bootstrap), ("shmq", shmq.bootstrap)):
        with Wire(bootstrap) as wire:
            answers[name] = normalise(scenario(wire, topic), drop)
    assert_same(answers["shmq"], answers["kafka"])
    return answers["kafka"]


# -- helpers ----------------------------------------------------------------------------------


def create_topic(wire: Wire, topic: str, partitions: int = 1, **configs: str) -> dict:
    """CreateTopics v7, then wait until every partition has a leader that serves it."""
    r = wire.send(CREATE_TOPICS, 7, {"topics": [
        {"name": topic, "num_partitions": partitions, "replication_factor": 1,
         "assignments": [], "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
        "timeout": 30_000, "validate_only": False})
    assert r["topics"][0]["error_code"] == 0, r
    deadline = time.monotonic() + 30
    while True:
        try:
            for p in range(partitions):
                leader = wire.leader(topic, p)
                got = wire.send(LIST_OFFSETS, 8, list_offsets_body(topic, p, -1), to=leader)
                assert got["topics"][0]["partitions"][0]["error_code"] == 0
            return r
        except (LookupError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def list_offsets_body(topic: str, partition: int, timestamp: int, epoch: int = -1) -> dict:
    return {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
        {"partition_index": partition, "current_leader_epoch": epoch, "timestamp": timestamp}]}]}


def produce(wire: Wire, topic: str, records: bytes, partition: int = 0, acks: int = -1,
            version: int = 9) -> dict:
    """Produce to the partition's leader; the partition's answer."""
    try:
        leader = wire.leader(topic, partition)
    except LookupError:
        leader = wire.leader(topic, 0)
    r = wire.send(PRODUCE, version, produce_body(topic, partition, records, acks), to=leader)
    return r["responses"][0]["partition_responses"][0]


def fetch_body(topic: str, partition: int, offset: int, max_bytes: int = 1 << 20,
               epoch: int = -1) -> dict:
    return {"cluster_id": None, "replica_id": -1, "replica_state": None, "max_wait": 0,
            "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                {"partition": partition, "current_leader_epoch": epoch, "fetch_offset": offset,
                 "last_fetched_epoch": -1, "log_start_offset": -1,
                 "partition_max_bytes": max_bytes}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def records(n: int, start: int = 0, value_size: int = 10) -> list[tuple[bytes, bytes, int]]:
    return [(b"k%d" % i, (b"v%d-" % i).ljust(value_size, b"x"), T0 + i)
            for i in range(start, start + n)]


def corrupt_crc(batch: bytes) -> bytes:
    b = bytearray(batch)
    b[-1] ^= 0xFF  # a record byte: covered by the CRC
    return bytes(b)


# -- ApiVersions --------------------------------------------------------------------------------


def test_api_versions_are_kafkas(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    """Every API shmq advertises, Kafka 4.3 advertises; shmq's maximum is Kafka 4.0's, never
    above 4.3's, its minimum Kafka's or lower (the versions Kafka 4.0 removed that carry no
    records, served as Kafka 3.9 did; differences table, row 2)."""
    tables = {}
    for name, bootstrap in (("kafka", kafka.bootstrap), ("shmq", shmq.bootstrap)):
        with Wire(bootstrap) as wire:
            r = wire.send(API_VERSIONS, 3, {"client_software_name": "shmq-diff",
                                            "client_software_version": "1"})
            assert r["error_code"] == 0
            tables[name] = {a["api_key"]: (a["min_version"], a["max_version"])
                            for a in r["api_keys"]}
    assert set(tables["shmq"]) <= set(tables["kafka"])
    for key, (lo, hi) in tables["shmq"].items():
        k_lo, k_hi = tables["kafka"][key]
        assert lo <= k_lo and hi <= k_hi, (key, (lo, hi), (k_lo, k_hi))


def test_unsupported_api_versions_version(kafka: apache_kafka.KafkaBroker,
                                          shmq: RunningBroker) -> None:
    """ApiVersions at a version the broker does not know: UNSUPPORTED_VERSION in a v0 answer
    that still lists ApiVersions itself (KIP-511), so the client can retry lower."""
    def scenario(wire: Wire, topic: str) -> Any:
        payload = wire.frame(API_VERSIONS, 3, {"client_software_name": "x",
                                               "client_software_version": "1"})
        payload = payload[:2] + (127).to_bytes(2, "big") + payload[4:]
        r = wire.send_frame(API_VERSIONS, 0, payload)
        versions = {a["api_key"]: a for a in r["api_keys"]}
        return r["error_code"], versions[API_VERSIONS]["min_version"], \
            versions[API_VERSIONS]["max_version"]

    assert on_both(kafka, shmq, scenario) == [35, 0, 4]


def test_request_above_the_advertised_version_closes_the_connection(
        kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    """A Metadata request at a version no broker advertises: the connection is closed."""
    def scenario(wire: Wire, topic: str) -> Any:
        payload = wire.frame(METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                            "include_topic_authorized_operations": False})
        payload = payload[:2] + (99).to_bytes(2, "big") + payload[4:]
        try:
            wire.send_frame(METADATA, 12, payload)
        except (ConnectionError, OSError) as e:
            return "closed", type(e).__name__
        return "answered"

    on_both(kafka, shmq, scenario)


# -- Metadata -------------------------------------------------------------------------------


def metadata(wire: Wire, topics: list[str] | None, auto_create: bool = False,
             version: int = 12) -> dict:
    body: dict[str, Any] = {"topics": None if topics is None else
                            [{"name": t, "topic_id": NO_UUID} for t in topics]}
    if version >= 4:
        body["allow_auto_topic_creation"] = auto_create
    if 8 <= version:
        body["include_topic_authorized_operations"] = False
    if 8 <= version <= 10:
        body["include_cluster_authorized_operations"] = False
    if version < 10:
        body["topics"] = None if topics is None else [{"name": t} for t in topics]
    return wire.send(METADATA, version, body)


@pytest.mark.parametrize("version", [1, 4, 9, 12])
def test_metadata(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker, version: int) -> None:
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, 3)
        # v1-v3 always ask for auto-creation (differences table, row 6): no missing topic there
        missing = [topic + "-missing"] if version >= 4 else []
        named = metadata(wire, [topic, *missing, "bad name!"], version=version)
        named["topics"].sort(key=lambda t: t["name"])
        return named

    on_both(kafka, shmq, scenario)


@pytest.mark.parametrize("version", [1, 12])
def test_metadata_auto_creates_topics(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker,
                                      version: int) -> None:
    """auto.create.topics.enable (both default true): the topic appears with num.partitions (1)
    partitions; invalid names are INVALID_TOPIC_EXCEPTION and not created.  The first answer
    for the new topic is the one intended difference (table row 6)."""
    def scenario(wire: Wire, topic: str) -> Any:
        first = metadata(wire, [topic, "bad name!"], auto_create=True, version=version)
        first["topics"].sort(key=lambda t: t["name"])
        new = first["topics"][1]
        if new["error_code"] == 3:  # Kafka: UNKNOWN_TOPIC_OR_PARTITION while it is created
            assert new["partitions"] == []
        else:  # shmq: created before the answer
            assert new["error_code"] == 0 and len(new["partitions"]) == 1, new
        first["topics"][1] = "<being created, or created>"
        deadline = time.monotonic() + 30
        while True:
            later = metadata(wire, [topic], auto_create=True, version=version)
            t = later["topics"][0]
            if t["error_code"] == 0 and all(p["leader_id"] >= 0 for p in t["partitions"]):
                break
            assert time.monotonic() < deadline, later
            time.sleep(0.05)
        return first, later

    on_both(kafka, shmq, scenario)


# -- CreateTopics, CreatePartitions, DeleteTopics ---------------------------------------------


def create_topics(wire: Wire, topics: list[dict], validate_only: bool = False,
                  version: int = 7) -> list[dict]:
    for t in topics:
        t.setdefault("replication_factor", 1)
        t.setdefault("assignments", [])
        t.setdefault("configs", [])
    r = wire.send(CREATE_TOPICS, version, {"topics": topics, "timeout": 30_000,
                                            "validate_only": validate_only})
    return sorted(r["topics"], key=lambda t: t["name"])


BAD_NAMES = ["", ".", "..", "x" * 250, "bad name!", "tøpic", "a/b"]


def test_create_topics_errors(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, 2)
        answers = [create_topics(wire, [{"name": n, "num_partitions": 1}]) for n in BAD_NAMES]
        answers.append(create_topics(wire, [{"name": topic, "num_partitions": 1}]))
        answers.append(create_topics(wire, [
            {"name": topic + "-cfg", "num_partitions": 1,
             "configs": [{"name": "retention.ms", "value": "soon"}]},
            {"name": topic + "-unknown", "num_partitions": 1,
             "configs": [{"name": "no.such.config", "value": "1"}]},
            {"name": topic + "-zero", "num_partitions": 0},
            {"name": topic + "-negative", "num_partitions": -5},
            {"name": topic + "-rf0", "num_partitions": 1, "replication_factor": 0},
            {"name": topic + "-internal", "num_partitions": 1,
             "configs": [{"name": "cleanup.policy", "value": "deleted"}]},
        ]))
        answers.append(create_topics(wire, [{"name": topic + "-dup", "num_partitions": 1},
                                            {"name": topic + "-dup", "num_partitions": 1}]))
        return answers

    on_both(kafka, shmq, scenario)


def test_create_topics_validate_only_and_defaults(kafka: apache_kafka.KafkaBroker,
                                                  shmq: RunningBroker) -> None:
    """validate_only creates nothing; -1 partitions / replication factor take the broker's
    defaults."""
    def scenario(wire: Wire, topic: str) -> Any:
        checked = create_topics(wire, [{"name": topic, "num_partitions": 3}], validate_only=True)
        after = metadata(wire, [topic])["topics"][0]["error_code"]
        defaults = create_topics(wire, [{"name": topic + "-d", "num_partitions": -1,
                                         "replication_factor": -1}])
        return checked, after, defaults

    on_both(kafka, shmq, scenario)


def test_create_topics_answers_the_topic_configs(kafka: apache_kafka.KafkaBroker,
                                                 shmq: RunningBroker) -> None:
    def scenario(wire: Wire, topic: str) -> Any:
        return create_topics(wire, [{"name": topic, "num_partitions": 2, "configs": [
            {"name": "retention.ms", "value": "3600000"}]}])

    on_both(kafka, shmq, scenario, drop=("documentation",))


def test_create_topics_refuses_colliding_names(kafka: apache_kafka.KafkaBroker,
                                               shmq: RunningBroker) -> None:
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic + ".a")
        return create_topics(wire, [{"name": topic + "_a", "num_partitions": 1}])

    on_both(kafka, shmq, scenario)


def test_create_topics_manual_assignments(kafka: apache_kafka.KafkaBroker,
                                          shmq: RunningBroker) -> None:
    def scenario(wire: Wire, topic: str) -> Any:
        node = metadata(wire, None)["brokers"][-1]["node_id"]
        ok = create_topics(wire, [{"name": topic, "num_partitions": -1, "replication_factor": -1,
                                   "assignments": [{"partition_index": i, "broker_ids": [node]}
                                                   for i in range(3)]}])
        both = create_topics(wire, [{"name": topic + "-b", "num_partitions": 3,
                                     "assignments": [{"partition_index": 0,
                                                      "broker_ids": [node]}]}])
        return ok, both, len(metadata(wire, [topic])["topics"][0]["partitions"])

    on_both(kafka, shmq, scenario)


def test_create_partitions(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    def grow(wire: Wire, topics: list[tuple[str, int]], validate_only: bool = False) -> list:
        r = wire.send(CREATE_PARTITIONS, 3, {"topics": [
            {"name": n, "count": c, "assignments": None} for n, c in topics],
            "timeout": 30_000, "validate_only": validate_only})
        return sorted(r["results"], key=lambda t: t["name"])

    def partitions(wire: Wire, topic: str, want: int) -> int:
        """The count Metadata shows once it is ``want`` (or after 15 s): Kafka's broker applies
        a CreatePartitions to its metadata cache shortly after the call returns."""
        deadline = time.monotonic() + 15
        while True:
            n = len(metadata(wire, [topic])["topics"][0]["partitions"])
            if n == want or time.monotonic() > deadline:
                return n
            time.sleep(0.05)

    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, 2)
        return [grow(wire, [(topic, 1)]), grow(wire, [(topic, 2)]),
                grow(wire, [(topic, 4)], validate_only=True),
                len(metadata(wire, [topic])["topics"][0]["partitions"]),
                grow(wire, [(topic, 3)]),
                partitions(wire, topic, 3),
                grow(wire, [(topic + "-missing", 3)]), grow(wire, [("bad name!", 3)]),
                grow(wire, [(topic, 5), (topic, 6)])]

    on_both(kafka, shmq, scenario)


def test_delete_topics(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    def delete(wire: Wire, names: list[str]) -> list:
        r = wire.send(DELETE_TOPICS, 5, {"topic_names": names, "timeout": 30_000})
        return sorted(r["responses"], key=lambda t: t["name"])

    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic)
        return [delete(wire, [topic]), delete(wire, [topic + "-missing"]),
                delete(wire, ["bad name!"])]

    on_both(kafka, shmq, scenario)


# -- Produce ----------------------------------------------------------------------------------


def test_produce_and_fetch_store_the_same_bytes(kafka: apache_kafka.KafkaBroker,
                                                shmq: RunningBroker) -> None:
    """The same batches (plain and gzip) get the same offsets, and Fetch returns the same record
    bytes: only the base offset and leader epoch are stamped, as Kafka does."""
    # built once: a gzip member carries the second it was written in
    batches = [record_batch(records(5)), record_batch(records(7, 5), codec=1),
               record_batch(records(1, 12))]

    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic)
        acks = [produce(wire, topic, batches[0]), produce(wire, topic, batches[1]),
                produce(wire, topic, batches[2], acks=1)]
        leader = wire.leader(topic)
        fetched = [wire.send(FETCH, 12, fetch_body(topic, 0, offset), to=leader)
                   for offset in (0, 3, 5, 12, 13)]
        return acks, fetched

    on_both(kafka, shmq, scenario)


def test_produce_errors(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, 1, **{"max.message.bytes": "2000"})
        good = record_batch(records(2))
        return {
            "bad crc": produce(wire, topic, corrupt_crc(good)),
            "too large": produce(wire, topic, record_batch(records(3, value_size=1500))),
            "unknown partition": produce(wire, topic, good, partition=7),
            "unknown topic": produce_to(wire, topic + "-x", good, via=topic),
            "acks 2": produce(wire, topic, good, acks=2),
            "stored": produce(wire, topic, good),
        }

    on_both(kafka, shmq, scenario)


def produce_to(wire: Wire, other: str, batch: bytes, via: str) -> dict:
    """Produce to topic ``other`` on the node that leads partition 0 of topic ``via``."""
    r = wire.send(PRODUCE, 9, produce_body(other, 0, batch), to=wire.leader(via))
    return r["responses"][0]["partition_responses"][0]


def test_produce_to_a_compacted_topic_needs_keys(kafka: apache_kafka.KafkaBroker,
                                                 shmq: RunningBroker) -> None:
    """Kafka's LogValidator: a record without a key on a topic whose cleanup.policy includes
    compact is INVALID_RECORD, and nothing of the batch is stored."""
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, 1, **{"cleanup.policy": "compact"})
        keyless = record_batch([(b"a", b"1", T0), (None, b"2", T0)])
        gz = record_batch([(None, b"1", T0)], codec=1)
        return [produce(wire, topic, keyless), produce(wire, topic, gz),
                produce(wire, topic, record_batch([(b"a", b"1", T0)]))]

    on_both(kafka, shmq, scenario)


def patch_batch(batch: bytes, at: int, value: bytes, crc: bool = True) -> bytes:
    """``batch`` with the header bytes at ``at`` replaced and, unless ``crc`` is False, the CRC
    recomputed (the ``crc32c`` package)."""
    b = bytearray(batch)
    b[at:at + len(value)] = value
    if crc:
        b[17:21] = crc32c.crc32c(bytes(b[21:])).to_bytes(4, "big")
    return bytes(b)


def test_produce_strict_batch_checks_are_invalid_record(kafka: apache_kafka.KafkaBroker,
                                                         shmq: RunningBroker) -> None:
    """``ProduceRequest.validateRecords`` and ``LogValidator.validateBatch`` throw
    InvalidRecordException (INVALID_RECORD, no message); a bad CRC or a length under the header
    is CorruptRecordException (CORRUPT_MESSAGE).  Nothing is appended either way.  The cases of
    test_produce_rules.py (issue 21 item 5), on both brokers."""
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic)
        good = record_batch(records(3))
        bad = {
            "sequence": patch_batch(record_batch(records(1), producer_id=7, producer_epoch=0,
                                                 base_sequence=0), 53, (-1).to_bytes(4, "big",
                                                                                     signed=True)),
            "count": patch_batch(good, 57, (5).to_bytes(4, "big")),
            "delta": patch_batch(good, 23, (1).to_bytes(4, "big")),
            "control": patch_batch(good, 21, (0x20).to_bytes(2, "big")),
            "magic 1": patch_batch(good, 16, b"\x01"),
            "truncated": good[:-1],
            "crc": corrupt_crc(good),
            "short": patch_batch(good, 8, (40).to_bytes(4, "big"), crc=False)[:52],
        }
        out = {case: produce(wire, topic, batch) for case, batch in bad.items()}
        out["then a good batch"] = produce(wire, topic, good)
        return out

    on_both(kafka, shmq, scenario)


def test_produce_timestamps_out_of_range(kafka: apache_kafka.KafkaBroker,
                                         shmq: RunningBroker) -> None:
    """``LogValidator.validateTimestamp`` (issue 21 item 3): CreateTime timestamps older than
    ``message.timestamp.before.max.ms`` or newer than ``message.timestamp.after.max.ms`` (1 h by
    default) are INVALID_TIMESTAMP with one record error per record out of range, and nothing is
    appended; a LogAppendTime topic takes any timestamp.  Compared: the codes and the failing
    record indexes (the messages carry each broker's clock)."""
    now = int(time.time() * 1000)

    def answer(r: dict) -> tuple:
        return (r["error_code"], sorted(e["batch_index"] for e in r.get("record_errors") or []),
                r["base_offset"])

    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, **{"message.timestamp.before.max.ms": "3600000"})
        create_topic(wire, topic + "-lat", **{"message.timestamp.type": "LogAppendTime"})
        future = now + 2 * 3600_000
        cases = {
            "now": [(b"k", b"v", now)],
            "old, one of three": [(b"k", b"v", now), (b"k", b"v", T0), (b"k", b"v", now)],
            "two hours ahead": [(b"k", b"v", future), (b"k", b"v", future)],
            "no timestamps": [(b"k", b"v", -1)],
        }
        out = {case: answer(produce(wire, topic, record_batch(recs)))
               for case, recs in cases.items()}
        # a compressed batch is decompressed and every record checked alike
        out["gzip, the middle one ahead"] = answer(produce(wire, topic, record_batch(
            [(b"k", b"v" * 300, now), (b"k", b"v" * 300, future), (b"k", b"v" * 300, now)],
            codec=1)))
        out["log append time"] = answer(produce(wire, topic + "-lat", record_batch(
            [(b"k", b"v", T0), (b"k", b"v", future)])))
        return out

    answers = on_both(kafka, shmq, scenario)
    assert answers["old, one of three"][:2] == [32, [1]]
    assert answers["two hours ahead"][:2] == [32, [0, 1]]
    assert answers["gzip, the middle one ahead"][:2] == [32, [1]]


def stored_batches(wire: Wire, topic: str) -> list[dict]:
    """Every batch of the partition as fetched: the header fields a broker may rewrite, a log
    append time replaced by "<now>", whether the CRC holds (the ``crc32c`` package), and the
    record bytes after the header."""
    r = wire.send(FETCH, 12, fetch_body(topic, 0, 0), to=wire.leader(topic))
    data = r["responses"][0]["partitions"][0]["records"] or b""
    out = []
    while len(data) >= 61:
        size = struct.unpack_from(">i", data, 8)[0] + 12
        b, data = data[:size], data[size:]
        attributes, _, base_ts, max_ts = struct.unpack_from(">hiqq", b, 21)
        log_append_time = bool(attributes & 0x08)
        out.append({"offset": struct.unpack_from(">q", b, 0)[0], "attributes": attributes,
                    "base_timestamp": base_ts,
                    "max_timestamp": "<now>" if log_append_time else max_ts,
                    "crc_ok": crc32c.crc32c(b[21:]) == struct.unpack_from(">I", b, 17)[0],
                    "records": b[61:]})
    return out


def test_produce_batch_header_timestamps(kafka: apache_kafka.KafkaBroker,
                                         shmq: RunningBroker) -> None:
    """``LogValidator`` (issue 21 item 3): the stored max timestamp is derived from the records,
    not the producer's header (``setMaxTimestamp``, CRC recomputed); a producer-set LogAppendTime
    attribute is INVALID_TIMESTAMP on a LogAppendTime topic and on a CreateTime topic when a
    record has no timestamp, and rewritten to CreateTime otherwise; a LogAppendTime topic stamps
    the broker's clock in the header.  Compared: the answers and every stored batch header."""
    def log_append_time(batch: bytes) -> bytes:  # the attribute bit, the codec kept
        return patch_batch(batch, 21, (struct.unpack_from(">h", batch, 21)[0] | 0x08
                                       ).to_bytes(2, "big"))

    gzip = record_batch(records(3, 3, value_size=300), codec=1)
    assert struct.unpack_from(">h", gzip, 21)[0] & 7 == 1  # compressed (kafka-python may not)
    lying = patch_batch(record_batch(records(3)), 35, (T0 - 5).to_bytes(8, "big"))
    lying_gzip = patch_batch(gzip, 35, (T0).to_bytes(8, "big"))
    append_time = log_append_time(record_batch(records(2, 6)))
    append_time_gzip = log_append_time(record_batch(records(2, 8, value_size=300), codec=1))
    untimed = log_append_time(record_batch([(b"k", b"v", -1)]))

    def answer(r: dict) -> tuple:
        return (r["error_code"], sorted(e["batch_index"] for e in r.get("record_errors") or []),
                r["base_offset"])

    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic)
        create_topic(wire, topic + "-lat", **{"message.timestamp.type": "LogAppendTime"})
        out: dict[str, Any] = {}
        for name, batch in (("lying max", lying), ("lying max, gzip", lying_gzip),
                            ("LogAppendTime attribute", append_time),
                            ("LogAppendTime attribute, gzip", append_time_gzip),
                            ("LogAppendTime attribute, no timestamp", untimed)):
            out[name] = answer(produce(wire, topic, batch))
            out[name + " on a LogAppendTime topic"] = answer(produce(wire, topic + "-lat", batch))
        out["plain on a LogAppendTime topic"] = answer(
            produce(wire, topic + "-lat", record_batch(records(2))))
        out["stored"] = stored_batches(wire, topic)
        out["stored on the LogAppendTime topic"] = stored_batches(wire, topic + "-lat")
        return out

    got = on_both(kafka, shmq, scenario, drop=("log_append_time",))
    assert [b["max_timestamp"] for b in got["stored"]] == [T0 + 2, T0 + 5, T0 + 7, T0 + 9]
    assert [b["attributes"] for b in got["stored"]] == [0, 1, 0, 1]  # CreateTime, as the topic
    assert got["LogAppendTime attribute on a LogAppendTime topic"][0] == 32


def test_produce_undecompressible_batch(kafka: apache_kafka.KafkaBroker,
                                        shmq: RunningBroker) -> None:
    """A batch whose attributes say gzip over bytes that are not gzip, with a valid CRC: Kafka's
    decompression throws a KafkaException that ReplicaManager answers as UNKNOWN_SERVER_ERROR;
    shmq answers CORRUPT_MESSAGE (kafka_differences.py, row 14).  Nothing is stored on either."""
    plain = record_batch(records(2))
    gzip_claimed = patch_batch(plain, 21, (0x01).to_bytes(2, "big"))
    answers = {}
    for name, bootstrap in (("kafka", kafka.bootstrap), ("shmq", shmq.bootstrap)):
        topic = f"diff-{uuid.uuid4().hex[:10]}"
        with Wire(bootstrap) as wire:
            create_topic(wire, topic)
            answers[name] = [produce(wire, topic, gzip_claimed)["error_code"],
                             produce(wire, topic, plain)["base_offset"]]
    assert answers == {"kafka": [-1, 0], "shmq": [2, 0]}


# -- Idempotence ----------------------------------------------------------------------------


def init_producer_id(wire: Wire) -> tuple[int, int]:
    """A producer id; retried while the broker answers COORDINATOR_LOAD_IN_PROGRESS (Kafka does
    until its first block of ids arrives from the controller), as clients do."""
    deadline = time.monotonic() + 30
    while True:
        r = wire.send(INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": -1,
                                            "producer_id": -1, "producer_epoch": -1})
        if r["error_code"] != 14 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r["error_code"] == 0, r
    return r["producer_id"], r["producer_epoch"]


def idempotence_scenario(wire: Wire, topic: str) -> Any:
    create_topic(wire, topic)
    pid, epoch = init_producer_id(wire)

    def send(seq: int, n: int = 2, ep: int = epoch, p: int = pid) -> dict:
        return produce(wire, topic, record_batch(records(n, seq), producer_id=p,
                                                 producer_epoch=ep, base_sequence=seq))

    answers = {"first": send(0), "second": send(2), "duplicate of first": send(0),
               "duplicate of second": send(2), "gap": send(7), "next": send(4),
               "older duplicate": send(0)}
    answers["higher epoch from 0"] = send(0, ep=epoch + 1)
    answers["old epoch"] = send(6, ep=epoch)
    other, other_epoch = init_producer_id(wire)
    answers["new producer at 3"] = send(3, ep=other_epoch, p=other)
    answers["unknown producer id"] = send(0, p=other + 1000, ep=0)
    return answers


def test_idempotent_sequences_and_epochs(kafka: apache_kafka.KafkaBroker,
                                         shmq: RunningBroker) -> None:
    """Duplicates get the original offsets; gaps are OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch
    is INVALID_PRODUCER_EPOCH; a new producer must start at sequence 0.  (A duplicate's
    log_append_time is the next test's.)"""
    on_both(kafka, shmq, idempotence_scenario, drop=("log_append_time",))


def test_idempotent_duplicate_answers_the_original_timestamp(kafka: apache_kafka.KafkaBroker,
                                                             shmq: RunningBroker) -> None:
    on_both(kafka, shmq, idempotence_scenario)


# -- WriteTxnMarkers ----------------------------------------------------------------------------

WRITE_TXN_MARKERS = 27


def markers_body(*markers: tuple, version: int = 1) -> dict:
    """(producer id, epoch, commit, coordinator epoch, {topic: [partitions]}[, txn version])"""
    out = []
    for pid, epoch, commit, coordinator_epoch, topics, *tv in markers:
        m = {"producer_id": pid, "producer_epoch": epoch, "transaction_result": commit,
             "coordinator_epoch": coordinator_epoch,
             "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}
        if version >= 2:
            m["transaction_version"] = tv[0] if tv else 0
        out.append(m)
    return {"markers": out}


def _read_committed(wire: Wire, topic: str, leader: Any, offset: int, pid: int) -> dict:
    """A read_committed Fetch of partition 0 from ``offset``: its error, HW and LSO, and which
    aborted transactions it lists (``pid``'s or not, first offset)."""
    fetch = fetch_body(topic, 0, offset)
    fetch["isolation_level"] = 1
    got = wire.send(FETCH, 12, fetch, to=leader)["responses"][0]["partitions"][0]
    return {"read_committed": {k: got[k] for k in ("error_code", "high_watermark",
                                                   "last_stable_offset")},
            "aborted": [(a["producer_id"] == pid, a["first_offset"])
                        for a in got["aborted_transactions"]]}


def write_txn_markers_scenario(wire: Wire, topic: str) -> Any:
    """kafka-transactions.sh's abort of a hanging transaction and a coordinator's markers, sent
    by hand to the partition's leader: what is written, what is refused, and what a
    read_committed reader then sees."""
    create_topic(wire, topic, 2)
    leader = wire.leader(topic, 0)
    out: dict[str, Any] = {}
    tid = f"{topic}-tid"

    def send(name: str, *markers: tuple, version: int = 1, to: Any = leader) -> None:
        r = wire.send(WRITE_TXN_MARKERS, version, markers_body(*markers, version=version), to=to)
        # the producer id is the broker's own; topics come in a Java HashMap's order on Kafka
        out[name] = [{"producer_id": "<pid>" if m["producer_id"] == pid else m["producer_id"],
                      "topics": sorted(m["topics"], key=lambda t: t["name"])}
                     for m in r["markers"]]

    pid = -1
    send("empty")
    deadline = time.monotonic() + 30
    for _ in range(2):  # epoch 1: an older epoch exists
        while True:  # Kafka creates __transaction_state at the first FindCoordinator
            wire.send(10, 4, {"key_type": 1, "coordinator_keys": [tid]})
            r = wire.send(INIT_PRODUCER_ID, 4, {"transactional_id": tid,
                                                "transaction_timeout": 60_000,
                                                "producer_id": -1, "producer_epoch": -1})
            if r["error_code"] not in (14, 15, 16, 51) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert r["error_code"] == 0, r
    pid, epoch = r["producer_id"], r["producer_epoch"]
    r = wire.send(24, 3, {"v3_and_below_transactional_id": tid,
                          "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
                          "v3_and_below_topics": [{"name": topic, "partitions": [0]}]})
    out["add partitions"] = r["results_by_topic_v3_and_below"]
    body = produce_body(topic, 0, record_batch(records(3), producer_id=pid, producer_epoch=epoch,
                                               base_sequence=0, transactional=True))
    body["transactional_id"] = tid
    out["transactional produce"] = wire.send(PRODUCE, 9, body, to=leader)[
        "responses"][0]["partition_responses"][0]
    lso = list_offsets_body(topic, 0, -1)
    lso["isolation_level"] = 1
    out["lso while open"] = wire.send(LIST_OFFSETS, 8, lso, to=leader)["topics"]
    send("unknown topic and partition", (pid, epoch, False, 0, {topic: [7], "nope-" + topic: [0]}))
    send("older producer epoch", (pid, epoch - 1, False, 0, {topic: [0]}))
    send("abort", (pid, epoch, False, 3, {topic: [0]}))
    send("older coordinator epoch", (pid, epoch, False, 2, {topic: [0]}))
    send("two markers of one producer", (pid, epoch, True, 3, {topic: [0]}),
         (pid, epoch, False, 3, {topic: [0]}))
    send("v2, transaction version 0", (pid, epoch, False, 3, {topic: [0]}, 0), version=2)
    out["lso after"] = wire.send(LIST_OFFSETS, 8, lso, to=leader)["topics"]
    out.update(_read_committed(wire, topic, leader, 0, pid))
    wire.send(26, 3, {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
                      "committed": False})  # the coordinator's own end (its markers: no-ops)
    return out


def test_write_txn_markers(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    """WriteTxnMarkers v1-2 (issue 16 item 3) at a partition's leader: an ABORT ends the open
    transaction (the LSO moves, Fetch lists it aborted); unknown topics and partitions are
    UNKNOWN_TOPIC_OR_PARTITION, an older producer epoch INVALID_PRODUCER_EPOCH, an older
    coordinator epoch TRANSACTION_COORDINATOR_FENCED; answers are grouped by producer id."""
    got = on_both(kafka, shmq, write_txn_markers_scenario)
    assert got["empty"] == []
    codes = {name: sorted(p["error_code"] for m in got[name] for t in m["topics"]
                          for p in t["partitions"])
             for name in ("unknown topic and partition", "older producer epoch", "abort",
                          "older coordinator epoch", "two markers of one producer")}
    assert codes == {"unknown topic and partition": [3, 3], "older producer epoch": [47],
                     "abort": [0], "older coordinator epoch": [52],
                     "two markers of one producer": [0]}, got
    assert got["aborted"] == [[True, 0]], got


# -- Transaction version 2 (KIP-890 part 2) ---------------------------------------------------

END_TXN, TXN_OFFSET_COMMIT, DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS = 26, 28, 61, 65


def txn_v2_scenario(wire: Wire, topic: str) -> Any:
    """A transaction version 2 client's requests, by hand: Produce v12 and TxnOffsetCommit v5
    add their partitions themselves, EndTxn v5 bumps the epoch and answers it, a retry of an
    end is answered again, late or fenced writes and markers are refused; then an EndTxn v4
    (a version 0 client) on the same id.  Producer ids are the brokers' own: answers name them
    ``<pid>``, and epochs count from the first one."""
    create_topic(wire, topic, 2)
    leader = wire.leader(topic, 0)
    tid, group = f"{topic}-tid", f"{topic}-g"
    out: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    while True:  # Kafka creates __transaction_state at the first FindCoordinator
        wire.send(10, 4, {"key_type": 1, "coordinator_keys": [tid]})
        wire.send(10, 4, {"key_type": 0, "coordinator_keys": [group]})
        r = wire.send(INIT_PRODUCER_ID, 5, {"transactional_id": tid,
                                            "transaction_timeout": 60_000,
                                            "producer_id": -1, "producer_epoch": -1})
        if r["error_code"] not in (14, 15, 16, 51) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r["error_code"] == 0, r
    pid, e0 = r["producer_id"], r["producer_epoch"]

    def ids(value: Any) -> Any:
        """The broker's producer id as <pid>, epochs as e0+n."""
        if isinstance(value, dict):
            return {k: ("<pid>" if k == "producer_id" and v == pid else
                        f"e0+{v - e0}" if k == "producer_epoch" and v >= 0 else ids(v))
                    for k, v in value.items()}
        if isinstance(value, list):
            return [ids(v) for v in value]
        return value

    def produce_txn(name: str, seq: int, epoch: int, p: int = pid, t: str = tid,
                    partition: int = 0) -> None:
        body = produce_body(topic, partition, record_batch(
            records(2, seq), producer_id=p, producer_epoch=epoch, base_sequence=seq,
            transactional=True))
        body["transactional_id"] = t
        r = wire.send(PRODUCE, 12, body, to=wire.leader(topic, partition))
        out[name] = r["responses"][0]["partition_responses"][0]

    def end(name: str, epoch: int, commit: bool, version: int = 5, p: int = pid,
            t: str = tid) -> dict:
        r = wire.send(END_TXN, version, {"transactional_id": t, "producer_id": p,
                                         "producer_epoch": epoch, "committed": commit})
        out[name] = ids(r)
        return r

    def describe(name: str) -> None:
        """DescribeTransactions once the end is complete (Kafka answers EndTxn before its
        markers are written)."""
        until = time.monotonic() + 15
        while True:
            d = wire.send(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [tid]})
            state = d["transaction_states"][0]
            if not state["transaction_state"].startswith("Prepare") \
                    or time.monotonic() > until:
                break
            time.sleep(0.05)
        # Kafka lists the topics of a HashSet of partitions (TransactionMetadata.topicPartitions):
        # their order follows the hash of the test's random topic name, not a rule
        state = {**state, "topics": sorted(state["topics"], key=lambda t: t["topic"])}
        out[name] = ids({k: v for k, v in state.items() if k != "transaction_start_time"})

    def producers(name: str) -> None:
        r = wire.send(DESCRIBE_PRODUCERS, 0, {"topics": [{"name": topic,
                                                          "partition_indexes": [0]}]}, to=leader)
        out[name] = ids([{k: v for k, v in s.items() if k != "last_timestamp"}
                         for s in r["topics"][0]["partitions"][0]["active_producers"]])

    def offsets(name: str, epoch: int, offset: int, p: int = pid) -> None:
        r = wire.send(TXN_OFFSET_COMMIT, 5, {
            "transactional_id": tid, "group_id": group, "producer_id": p,
            "producer_epoch": epoch, "generation_id": -1, "member_id": "",
            "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                {"partition_index": 0, "committed_offset": offset,
                 "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
        out[name] = r["topics"]

    produce_txn("v12 opens the transaction", 0, e0)
    produce_txn("v12 again", 2, e0)
    offsets("TxnOffsetCommit v5 adds the offsets partition", e0, 7)
    describe("ongoing")
    end("EndTxn v5 commit", e0, True)
    describe("after commit")
    end("EndTxn v5 commit retried", e0, True)
    end("EndTxn v5 abort retried after a commit", e0, False)
    end("EndTxn v5 commit of no transaction", e0 + 1, True)
    produce_txn("v12 with the ended epoch", 4, e0)
    producers("producers after commit")
    offsets("TxnOffsetCommit v5 with the ended epoch", e0, 9)
    end("EndTxn v5 abort of no transaction", e0 + 1, False)
    describe("after empty abort")
    produce_txn("v12 at the new epoch", 0, e0 + 2)
    r = wire.send(27, 2, markers_body((pid, e0 + 2, True, 0, {topic: [0]}, 2), version=2),
                  to=leader)
    out["TV2 marker at the open transaction's epoch"] = [
        p["error_code"] for m in r["markers"] for t in m["topics"] for p in t["partitions"]]
    end("EndTxn v5 with a higher epoch", e0 + 5, True)
    end("EndTxn v5 unknown producer id", e0 + 2, True, p=pid + 1000)
    end("EndTxn v5 unknown transactional id", 0, True, t=tid + "-nope")
    produce_txn("v12 unknown producer id", 0, 0, p=pid + 1000, partition=1)
    produce_txn("v12 unknown transactional id", 0, 0, t=tid + "-nope", partition=1)
    end("EndTxn v4 abort (transaction version 0)", e0 + 2, False, version=4)
    describe("after v4 abort")
    producers("producers after v4 abort")
    lso = list_offsets_body(topic, 0, -1)
    lso["isolation_level"] = 1
    out["lso"] = wire.send(LIST_OFFSETS, 8, lso, to=leader)["topics"]
    # from the aborted transaction's first offset: Kafka rolls a segment at the commit marker
    # (the records' 2023 timestamps are older than segment.ms) and a Fetch reads one segment
    out.update(_read_committed(wire, topic, leader, 5, pid))
    r = wire.send(9, 8, {"groups": [{"group_id": group, "topics": [
        {"name": topic, "partition_indexes": [0]}]}], "require_stable": True})
    out["committed offset"] = [(p["committed_offset"], p["error_code"])
                               for p in r["groups"][0]["topics"][0]["partitions"]]
    return out


def test_transaction_version_2(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    """Transaction version 2 (issue 16, KIP-890 part 2) at the wire, the same on shmq and on
    Kafka 4.3: implicit AddPartitions by Produce v12 and TxnOffsetCommit v5, the epoch bump and
    its answer at EndTxn v5, retries, fencing of the ended epoch, Kafka's error codes."""
    got = on_both(kafka, shmq, txn_v2_scenario)
    assert got["v12 opens the transaction"]["error_code"] == 0
    assert got["EndTxn v5 commit"] == {"throttle_time": 0, "error_code": 0,
                                       "producer_id": "<pid>", "producer_epoch": "e0+1"}
    assert got["EndTxn v5 commit retried"]["producer_epoch"] == "e0+1"
    assert got["v12 with the ended epoch"]["error_code"] == 47
    assert got["after empty abort"]["producer_epoch"] == "e0+2"
    assert got["TV2 marker at the open transaction's epoch"] == [47]
    assert got["aborted"] == [[True, 5]]


def test_api_versions_finalize_transaction_version_2(kafka: apache_kafka.KafkaBroker,
                                                      shmq: RunningBroker) -> None:
    """``transaction.version`` is finalized at 2 on both (Kafka 4.x clients run KIP-890 part 2
    with shmq as with Kafka), and supported 0-2."""
    def scenario(wire: Wire, topic: str) -> Any:
        r = wire.send(API_VERSIONS, 4, {"client_software_name": "shmq-diff",
                                        "client_software_version": "1"})
        supported = {f["name"]: (f["min_version"], f["max_version"])
                     for f in r["supported_features"]}
        finalized = {f["name"]: (f["min_version_level"], f["max_version_level"])
                     for f in r["finalized_features"]}
        return supported.get("transaction.version"), finalized.get("transaction.version"), \
            r["finalized_features_epoch"] >= 0

    assert on_both(kafka, shmq, scenario) == [[0, 2], [2, 2], True]


def test_idempotent_duplicate_on_a_log_append_time_topic(kafka: apache_kafka.KafkaBroker,
                                                         shmq: RunningBroker) -> None:
    """Issue 21 item 5: a duplicate's answer carries the original batch's log append time
    (``UnifiedLog.append`` answers the duplicate's ``BatchMetadata.timestamp``), not -1 or the
    broker's clock at the retry."""
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, **{"message.timestamp.type": "LogAppendTime"})
        pid, epoch = init_producer_id(wire)
        batch = record_batch(records(2), producer_id=pid, producer_epoch=epoch, base_sequence=0)
        first = produce(wire, topic, batch)
        time.sleep(0.05)  # a later clock for the retry
        retry = produce(wire, topic, batch)
        return {"first": first, "retry": retry,
                "same log append time": retry["log_append_time"] == first["log_append_time"]}

    got = on_both(kafka, shmq, scenario)
    assert got["same log append time"] is True and got["first"]["log_append_time"] == "<now>"


def test_list_offsets_over_records_without_timestamps(kafka: apache_kafka.KafkaBroker,
                                                      shmq: RunningBroker) -> None:
    """Issue 21 item 5: every record without a timestamp (-1): MAX_TIMESTAMP (-3) finds the first
    record (offset 0, timestamp -1), as Kafka's ``UnifiedLog.fetchOffsetByTimestamp``; a lookup
    by time finds nothing."""
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic)
        produce(wire, topic, record_batch([(b"a", b"0", -1), (b"b", b"1", -1)]))
        produce(wire, topic, record_batch([(b"c", b"2", -1)]))
        leader = wire.leader(topic)
        return {ts: wire.send(LIST_OFFSETS, 8, list_offsets_body(topic, 0, ts),
                              to=leader)["topics"][0]["partitions"][0]
                for ts in (-3, -2, -1, 0, T0)}

    got = on_both(kafka, shmq, scenario)
    assert (got[-3]["offset"], got[-3]["timestamp"]) == (0, -1)


# -- Fetch ------------------------------------------------------------------------------------


def fetch_errors_scenario(wire: Wire, topic: str) -> Any:
    create_topic(wire, topic)
    produce(wire, topic, record_batch(records(4)))
    leader = wire.leader(topic)
    out = {}
    for name, offset in (("at hw", 4), ("beyond", 100), ("negative", -1)):
        out[name] = wire.send(FETCH, 12, fetch_body(topic, 0, offset), to=leader)
    out["unknown partition"] = wire.send(FETCH, 12, fetch_body(topic, 5, 0), to=leader)
    out["small max bytes"] = wire.send(FETCH, 12, fetch_body(topic, 0, 0, max_bytes=10),
                                       to=leader)
    return out


def test_fetch_errors_and_bounds(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    """Error partitions carry -1 offsets and (an unknown partition) an empty aborted list."""
    on_both(kafka, shmq, fetch_errors_scenario)


def test_requests_sent_before_a_close_are_still_handled(kafka: apache_kafka.KafkaBroker,
                                                       shmq: RunningBroker) -> None:
    """A client pipelines a Produce behind a long-polling Fetch and closes its connection at
    once: Kafka's ``Selector`` keeps the closing channel until the requests it had read are
    processed (in order, one at a time), so the Produce is appended when the Fetch ends.  (The
    same rule lets a consumer's LeaveGroup held behind a parked JoinGroup take effect:
    test_kafka_clients_diff.py::test_member_dying_mid_join_resumes_alike.)"""
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic)
        leader = wire.leader(topic)
        long_poll = {**fetch_body(topic, 0, 0), "max_wait": 1000, "min_bytes": 1}
        wire.send(FETCH, 12, long_poll, to=leader, expect_response=False)
        for acks in (0, 1):
            wire.send(PRODUCE, 9, produce_body(topic, 0, record_batch(records(2)), acks),
                      to=leader, expect_response=False)
        wire.close()
        deadline = time.monotonic() + 10
        with Wire(wire.bootstrap[0] + ":" + str(wire.bootstrap[1])) as again:
            while True:
                r = again.send(LIST_OFFSETS, 8, list_offsets_body(topic, 0, -1), to=leader)
                end = r["topics"][0]["partitions"][0]["offset"]
                if end == 4 or time.monotonic() > deadline:
                    return end

    assert on_both(kafka, shmq, scenario) == 4


# -- ListOffsets --------------------------------------------------------------------------------


def list_offsets_scenario(wire: Wire, topic: str) -> Any:
    create_topic(wire, topic)
    # timestamps out of order inside and across batches
    produce(wire, topic, record_batch([(b"a", b"0", T0 + 50), (b"b", b"1", T0 + 10),
                                       (b"c", b"2", T0 + 70)]))
    produce(wire, topic, record_batch([(b"d", b"3", T0 + 20), (b"e", b"4", T0 + 90)]))
    produce(wire, topic, record_batch([(b"f", b"5", T0 + 90), (b"g", b"6", T0 + 30)],
                                      codec=1))
    leader = wire.leader(topic)
    out = {}
    for ts in (-1, -2, -3, -4, T0, T0 + 10, T0 + 11, T0 + 50, T0 + 70, T0 + 71, T0 + 90,
               T0 + 91):
        r = wire.send(LIST_OFFSETS, 8, list_offsets_body(topic, 0, ts), to=leader)
        out[ts] = r["topics"][0]["partitions"][0]
    r = wire.send(LIST_OFFSETS, 8, list_offsets_body(topic, 3, -1), to=leader)
    out["unknown partition"] = r["topics"][0]["partitions"][0]
    r = wire.send(LIST_OFFSETS, 1, {"replica_id": -1, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": T0 + 20}]}]},
        to=leader)
    out["v1"] = r["topics"][0]["partitions"][0]
    return out


def test_list_offsets_by_time(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    """Offsets and timestamps of every lookup (the leader epoch is the next test's)."""
    on_both(kafka, shmq, list_offsets_scenario, drop=("leader_epoch",))


def test_list_offsets_leader_epoch(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    on_both(kafka, shmq, list_offsets_scenario)


# -- DescribeConfigs and (Incremental)AlterConfigs --------------------------------------------


def describe_configs(wire: Wire, resources: list[tuple[int, str]], synonyms: bool = True,
                     keys: list[str] | None = None) -> list[dict]:
    r = wire.send(DESCRIBE_CONFIGS, 4, {"resources": [
        {"resource_type": t, "resource_name": n, "configuration_keys": keys}
        for t, n in resources], "include_synonyms": synonyms, "include_documentation": False})
    for res in r["results"]:
        res["configs"].sort(key=lambda c: c["name"])
    return r["results"]


def test_describe_topic_configs(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    """Every topic config: value, source, read-only, sensitive, type and synonyms."""
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, 1, **{"retention.ms": "3600000", "cleanup.policy":
                                        "compact,delete", "segment.bytes": "1048576"})
        return [describe_configs(wire, [(2, topic)]),
                describe_configs(wire, [(2, topic)], synonyms=False,
                                 keys=["retention.ms", "min.insync.replicas", "no.such"]),
                describe_configs(wire, [(2, topic + "-missing"), (2, "bad name!")])]

    on_both(kafka, shmq, scenario, drop=("documentation",))


BROKER_CONFIGS = ["log.retention.ms", "log.retention.hours", "log.segment.bytes",
                  "message.max.bytes", "num.partitions", "auto.create.topics.enable",
                  "log.cleanup.policy", "log.roll.ms", "min.insync.replicas"]


def test_describe_broker_configs(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    """The broker configs a topic default comes from, as DescribeConfigs lists them."""
    def scenario(wire: Wire, topic: str) -> Any:
        return [describe_configs(wire, [(4, "1")], keys=BROKER_CONFIGS),
                describe_configs(wire, [(4, "")], keys=BROKER_CONFIGS)]

    on_both(kafka, shmq, scenario, drop=("documentation",))


def alter(wire: Wire, topic: str, ops: list[tuple[str, int, str | None]],
          validate_only: bool = False) -> list:
    r = wire.send(INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [
        {"resource_type": 2, "resource_name": topic, "configs": [
            {"name": n, "config_operation": op, "value": v} for n, op, v in ops]}],
        "validate_only": validate_only})
    return r["responses"]


def test_incremental_alter_configs(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic)
        out = [alter(wire, topic, [("retention.ms", SET, "600000")]),
               alter(wire, topic, [("cleanup.policy", APPEND, "compact")]),
               alter(wire, topic, [("cleanup.policy", SUBTRACT, "delete")]),
               alter(wire, topic, [("segment.ms", DELETE, None)]),
               alter(wire, topic, [("retention.ms", SET, "soon")]),
               alter(wire, topic, [("no.such.config", SET, "1")]),
               alter(wire, topic, [("retention.ms", APPEND, "1")]),
               alter(wire, topic, [("segment.bytes", SET, "10")]),
               alter(wire, topic, [("cleanup.policy", SET, "deleted")]),
               alter(wire, topic, [("retention.ms", SET, "1"), ("retention.ms", SET, "2")]),
               alter(wire, topic, [("retention.ms", SET, "5")], validate_only=True),
               alter(wire, topic + "-missing", [("retention.ms", SET, "5")])]
        out.append(describe_configs(wire, [(2, topic)], synonyms=False,
                                    keys=["retention.ms", "cleanup.policy", "segment.ms"]))
        return out

    on_both(kafka, shmq, scenario, drop=("documentation",))


def test_incremental_alter_configs_null_set(kafka: apache_kafka.KafkaBroker,
                                            shmq: RunningBroker) -> None:
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic)
        return alter(wire, topic, [("retention.ms", 0, None)])

    on_both(kafka, shmq, scenario)


def test_alter_configs_replaces_overrides(kafka: apache_kafka.KafkaBroker,
                                          shmq: RunningBroker) -> None:
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, 1, **{"retention.ms": "3600000"})

        def alter_all(configs: dict[str, str], name: str = topic) -> list:
            return wire.send(ALTER_CONFIGS, 2, {"resources": [
                {"resource_type": 2, "resource_name": name, "configs": [
                    {"name": k, "value": v} for k, v in configs.items()]}],
                "validate_only": False})["responses"]

        out = [alter_all({"segment.ms": "100000"}),
               describe_configs(wire, [(2, topic)], synonyms=False,
                                keys=["retention.ms", "segment.ms"]),
               alter_all({"retention.ms": "x"}), alter_all({"nope": "1"}),
               alter_all({"retention.ms": "1"}, topic + "-missing")]
        return out

    on_both(kafka, shmq, scenario, drop=("documentation",))


# -- DeleteRecords ------------------------------------------------------------------------------


def test_delete_records(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    def scenario(wire: Wire, topic: str) -> Any:
        create_topic(wire, topic, 2)
        produce(wire, topic, record_batch(records(10)))
        leader = wire.leader(topic)

        def delete(partition: int, offset: int) -> dict:
            r = wire.send(DELETE_RECORDS, 2, {"topics": [{"name": topic, "partitions": [
                {"partition_index": partition, "offset": offset}]}], "timeout": 30_000},
                to=wire.leader(topic, partition) if partition < 2 else leader)
            return r["topics"][0]["partitions"][0]

        out = {"to 4": delete(0, 4), "to 2 again": delete(0, 2), "to hw (-1)": delete(0, -1),
               "beyond hw": delete(0, 11), "empty partition": delete(1, 0),
               "unknown partition": delete(5, 1)}
        out["earliest"] = wire.send(LIST_OFFSETS, 8, list_offsets_body(topic, 0, -2),
                                    to=leader)["topics"][0]["partitions"][0]
        out["fetch below start"] = wire.send(FETCH, 12, fetch_body(topic, 0, 3), to=leader)
        return out

    on_both(kafka, shmq, scenario, drop=("leader_epoch",))


def test_crc_oracle_is_crc32c() -> None:
    """corrupt_crc changes a byte the CRC covers (kafka-python's builder writes CRC-32C)."""
    batch = record_batch(records(2))
    assert int.from_bytes(batch[17:21], "big") == crc32c.crc32c(batch[21:])
    assert crc32c.crc32c(corrupt_crc(batch)[21:]) != int.from_bytes(batch[17:21], "big")


# -- Groups -----------------------------------------------------------------------------------

FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT = 10, 8, 9, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 13, 14, 15, 16, 42
OFFSET_DELETE = 47


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: the topics a member subscribes to (what OffsetDelete's
    GROUP_SUBSCRIBED_TO_TOPIC check reads)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def group_scenario(wire: Wire, topic: str) -> Any:
    """One member's life in a classic group, every answer kept: join (MEMBER_ID_REQUIRED, then
    generation 1 as leader), sync, heartbeats and commits with good and bad generations and
    members, fetch, describe, list, delete while not empty, offset delete while subscribed,
    leave, then the empty group's offsets deleted and the group deleted (twice)."""
    create_topic(wire, topic, 2)
    group = topic + "-g"
    out: dict[str, Any] = {}
    deadline = time.monotonic() + 60
    while True:  # as clients do: Kafka creates __consumer_offsets at the first FindCoordinator
        found = wire.send(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
        if found["coordinators"][0]["error_code"] != 15 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    out["find coordinator"] = found

    def join(member: str) -> dict:
        while True:  # COORDINATOR_LOAD_IN_PROGRESS, or NOT_COORDINATOR while Kafka's new
            # __consumer_offsets partition has no leader yet: clients retry both
            r = wire.send(JOIN_GROUP, 9, {
                "group_id": group, "session_timeout": 10_000, "rebalance_timeout": 30_000,
                "member_id": member, "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": subscription(topic)}],
                "reason": None})
            if r["error_code"] not in (14, 16) or time.monotonic() > deadline:
                return r
            time.sleep(0.1)

    first = join("")
    out["join without member id"] = first
    member = first["member_id"]
    joined = join(member)
    out["join"] = joined
    generation = joined["generation_id"]
    assignment = b"\x00\x00\x00\x00\x00\x01" + struct.pack(">h", len(topic)) + topic.encode() \
        + struct.pack(">iii", 2, 0, 1) + struct.pack(">i", -1)

    def sync(gen: int, who: str) -> dict:
        return wire.send(SYNC_GROUP, 5, {
            "group_id": group, "generation_id": gen, "member_id": who, "group_instance_id": None,
            "protocol_type": "consumer", "protocol_name": "range",
            "assignments": [{"member_id": member, "assignment": assignment}]})

    out["sync"] = sync(generation, member)
    out["sync, wrong generation"] = sync(generation + 5, member)

    def heartbeat(gen: int, who: str) -> dict:
        return wire.send(HEARTBEAT, 4, {"group_id": group, "generation_id": gen,
                                        "member_id": who, "group_instance_id": None})

    out["heartbeat"] = heartbeat(generation, member)
    out["heartbeat, wrong generation"] = heartbeat(generation + 1, member)
    out["heartbeat, unknown member"] = heartbeat(generation, "nobody")

    def commit(gen: int, who: str, name: str = topic, offset: int = 5) -> dict:
        return wire.send(OFFSET_COMMIT, 9, {
            "group_id": group, "generation_id_or_member_epoch": gen, "member_id": who,
            "group_instance_id": None, "topics": [{"name": name, "partitions": [
                {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
                 "committed_metadata": "meta"},
                {"partition_index": 1, "committed_offset": offset + 1,
                 "committed_leader_epoch": -1, "committed_metadata": None}]}]})

    out["commit"] = commit(generation, member)
    out["commit, old generation"] = commit(generation - 1, member)
    out["commit, unknown member"] = commit(generation, "nobody")
    out["commit, unknown topic"] = commit(generation, member, name=topic + "-none")
    out["commit, too much metadata"] = wire.send(OFFSET_COMMIT, 9, {
        "group_id": group, "generation_id_or_member_epoch": generation, "member_id": member,
        "group_instance_id": None, "topics": [{"name": topic, "partitions": [
            {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
             "committed_metadata": "m" * 5000}]}]})

    def fetch(g: str = group) -> dict:
        return wire.send(OFFSET_FETCH, 8, {"groups": [
            {"group_id": g, "topics": [{"name": topic, "partition_indexes": [0, 1, 7]}]}],
            "require_stable": False})

    out["fetch"] = fetch()
    out["fetch, unknown group"] = fetch(group + "-none")

    def describe() -> dict:
        return wire.send(DESCRIBE_GROUPS, 5, {"groups": [group],
                                              "include_authorized_operations": False})

    out["describe"] = describe()
    listed = wire.send(LIST_GROUPS, 5, {"states_filter": [], "types_filter": []})
    out["list"] = [g for g in listed["groups"] if g["group_id"] == group]
    listed = wire.send(LIST_GROUPS, 5, {"states_filter": ["Empty"], "types_filter": []})
    out["list Empty"] = [g for g in listed["groups"] if g["group_id"] == group]

    def delete(g: str = group) -> dict:
        return wire.send(DELETE_GROUPS, 2, {"groups_names": [g]})

    def offset_delete(g: str = group) -> dict:
        return wire.send(OFFSET_DELETE, 0, {"group_id": g, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0}]}]})

    out["delete while stable"] = delete()
    out["offset delete while subscribed"] = offset_delete()
    out["leave"] = wire.send(LEAVE_GROUP, 5, {"group_id": group, "members": [
        {"member_id": member, "group_instance_id": None, "reason": "done"}]})
    out["leave again"] = wire.send(LEAVE_GROUP, 5, {"group_id": group, "members": [
        {"member_id": member, "group_instance_id": None, "reason": None}]})
    out["describe after leave"] = describe()
    out["commit as a simple group"] = commit(-1, "", offset=3)
    out["offset delete"] = offset_delete()
    out["fetch after offset delete"] = fetch()
    out["delete"] = delete()
    out["delete again"] = delete()
    out["offset delete, unknown group"] = offset_delete(group + "-none")
    return out


def test_group_lifecycle(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    on_both(kafka, shmq, group_scenario)


def consumer_offsets_metadata(wire: Wire, group: str) -> dict[str, Any]:
    """__consumer_offsets' Metadata once a group has asked for its coordinator: the first
    FindCoordinator makes the topic (Kafka: its controller creates it)."""
    deadline = time.monotonic() + 60
    while True:
        found = wire.send(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
        if found["coordinators"][0]["error_code"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    while True:
        md: dict[str, Any] = metadata(wire, ["__consumer_offsets"])["topics"][0]
        if md["error_code"] == 0 and md["partitions"] or time.monotonic() > deadline:
            return md
        time.sleep(0.1)


def consumer_offsets_scenario(wire: Wire, topic: str) -> Any:
    """__consumer_offsets as clients see it once a group has used it: listed internal with 50
    partitions, not creatable again, its configs (segment.bytes is the next test's)."""
    name = "__consumer_offsets"
    md = consumer_offsets_metadata(wire, topic + "-g")
    md["partitions"] = len(md["partitions"])  # offsets.topic.num.partitions (both 50)
    out: dict[str, Any] = {"metadata": md}
    out["create"] = create_topics(wire, [{"name": name, "num_partitions": 1}])
    out["describe configs"] = describe_configs(wire, [(2, name)], synonyms=False,
                                               keys=["cleanup.policy", "compression.type"])
    return out


def test_consumer_offsets_topic(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> None:
    on_both(kafka, shmq, consumer_offsets_scenario)


def test_consumer_offsets_differences(shmq: RunningBroker) -> None:
    """Differences table, row 7, on shmq only (deleting the reference's __consumer_offsets
    would take every group's offsets of the test session with it): DeleteTopics refuses it,
    and its segments are offsets.topic.segment.bytes, 16 MiB."""
    with Wire(shmq.bootstrap) as wire:
        consumer_offsets_metadata(wire, "offsets-differences-g")  # it exists, whatever ran before
        r = wire.send(DELETE_TOPICS, 5, {"topic_names": ["__consumer_offsets"],
                                         "timeout": 30_000})
        assert r["responses"][0]["error_code"] == 42, r
        (result,) = describe_configs(wire, [(2, "__consumer_offsets")], synonyms=False,
                                     keys=["segment.bytes"])
        assert result["configs"][0]["value"] == "16777216", result
