"""Producer-id expiry (issue 21 item 2) on shmq and on Apache Kafka 4.3, compared at the wire.

Kafka's ``ProducerStateManager.removeExpiredProducers`` forgets a producer whose last batch's max
timestamp is ``producer.id.expiration.ms`` old (and that has no open transaction), checked every
``producer.id.expiration.check.interval.ms``.  The check interval is a static broker config, so
this module starts its own Kafka broker with both lowered (one start for the module), and a shmq
broker with the same two settings.

What a forgotten producer looks like from outside (``ProducerAppendInfo.checkSequence``, KIP-360):
DescribeProducers no longer lists it; a retry of its last batch is appended again at a new offset
instead of answered as a duplicate; and any sequence is accepted, a continuing one, a gap or 0,
with no error (Kafka answers neither OUT_OF_ORDER_SEQUENCE_NUMBER nor UNKNOWN_PRODUCER_ID here
since 2.5).  A producer that keeps writing is remembered: its retry is a duplicate, its gap
OUT_OF_ORDER_SEQUENCE_NUMBER.  Idle is measured by the batches' own timestamps: a producer whose
batch carries a day-old timestamp is forgotten at the next check.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import apache_kafka
import pytest
from _broker import RunningBroker, reference_kafka, start_broker
from kafka_differences import assert_same, normalise
from kafka_wire import Wire, record_batch
from test_kafka_wire_diff import create_topic, describe_configs, init_producer_id, produce

EXPIRATION_MS = 3000
CHECK_MS = 250
SETTINGS = {"producer.id.expiration.ms": str(EXPIRATION_MS),
            "producer.id.expiration.check.interval.ms": str(CHECK_MS)}
DESCRIBE_PRODUCERS, INCREMENTAL_ALTER_CONFIGS = 61, 44
BROKER, SET, DELETE = 4, 0, 1
INVALID_CONFIG, INVALID_REQUEST = 40, 42
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DAY = 86_400_000
# 0.4 s apart: longer than the expiration time plus four checks
ACTIVE_BATCHES = (EXPIRATION_MS + 4 * CHECK_MS) // 400 + 1


@pytest.fixture(scope="module")
def kafka_expiring(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[apache_kafka.KafkaBroker]:
    with reference_kafka(tmp_path_factory.mktemp("kafka-pid-expiry"), SETTINGS,
                         groups=False) as k:
        yield k


@pytest.fixture(scope="module")
def shmq_expiring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    args = [a for k, v in SETTINGS.items() for a in ("--override", f"{k}={v}")]
    b = start_broker(tmp_path_factory.mktemp("shmq-pid-expiry") / "data", *args)
    try:
        yield b
    finally:
        assert b.stop() == 0, b.log_path.read_text()[-3000:]


def now_ms() -> int:
    return int(time.time() * 1000)


def expiry_scenario(wire: Wire, topic: str) -> dict[str, Any]:
    create_topic(wire, topic)
    names: dict[int, str] = {}
    for name in ("idle", "gapper", "active", "stale"):
        pid, _epoch = init_producer_id(wire)
        names[pid] = name
    ids = {name: pid for pid, name in names.items()}

    def send(who: str, seq: int, n: int = 2, ts: int | None = None) -> tuple[int, int]:
        stamp = now_ms() if ts is None else ts
        r = produce(wire, topic, record_batch([(b"k", b"v%d" % i, stamp) for i in range(n)],
                                              producer_id=ids[who], producer_epoch=0,
                                              base_sequence=seq))
        return r["error_code"], r["base_offset"]

    def producers() -> list[tuple[str, int, int]]:
        r = wire.send(DESCRIBE_PRODUCERS, 0, {"topics": [
            {"name": topic, "partition_indexes": [0]}]}, to=wire.leader(topic))
        (p,) = r["topics"][0]["partitions"]
        assert p["error_code"] == 0, p
        return sorted((names.get(a["producer_id"], "?"), a["producer_epoch"],
                       a["last_sequence"]) for a in p["active_producers"])

    out: dict[str, Any] = {"idle writes": send("idle", 0), "gapper writes": send("gapper", 0),
                           "active writes": send("active", 0)}
    out["known at first"] = producers()
    # a batch stamped a day ago: idle by its own timestamp from the start
    out["stale writes a day-old batch"] = send("stale", 0, ts=now_ms() - DAY)
    # the active producer writes every 0.4 s while the others stay idle past the expiration
    # time (a fixed count, so that both brokers assign the same offsets)
    seq = 2
    for _ in range(ACTIVE_BATCHES):
        time.sleep(0.4)
        out.setdefault("active's batches", []).append(send("active", seq))
        seq += 2
    out["known after the expiration time"] = producers()
    out["active retries its last batch"] = send("active", seq - 2)
    out["active skips a sequence"] = send("active", seq + 4)
    out["stale retries its batch"] = send("stale", 0)
    out["idle continues at 2"] = send("idle", 2)
    out["gapper skips to 9"] = send("gapper", 9)
    out["gapper retries 9"] = send("gapper", 9)
    out["gapper skips to 20"] = send("gapper", 20)
    out["known at the end"] = producers()
    return out


def test_idle_producer_ids_are_forgotten_alike(kafka_expiring: apache_kafka.KafkaBroker,
                                               shmq_expiring: RunningBroker) -> None:
    answers = {}
    for name, bootstrap in (("kafka", kafka_expiring.bootstrap),
                            ("shmq", shmq_expiring.bootstrap)):
        with Wire(bootstrap) as wire:
            answers[name] = normalise(expiry_scenario(wire, f"pid-expiry-{name}"))
    assert_same(answers["shmq"], answers["kafka"])
    got = answers["kafka"]
    end = got["active's batches"][-1][1] + 2  # the log end offset before the retries
    assert [p[0] for p in got["known at first"]] == ["active", "gapper", "idle"]
    assert [p[0] for p in got["known after the expiration time"]] == ["active"]
    # remembered: a duplicate answers the original offset; a gap is refused
    assert got["active retries its last batch"] == got["active's batches"][-1]
    assert got["active skips a sequence"][0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    # forgotten: sequence 0, a continuing sequence and a gap are all appended, with no error
    assert got["stale retries its batch"] == [0, end]
    assert got["idle continues at 2"] == [0, end + 2]
    assert got["gapper skips to 9"] == [0, end + 4]
    # ... and the producer is known again from there
    assert got["gapper retries 9"] == [0, end + 4]
    assert got["gapper skips to 20"][0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert [p[0] for p in got["known at the end"]] == ["active", "gapper", "idle", "stale"]



def configs_scenario(wire: Wire, topic: str) -> dict[str, Any]:
    """DescribeConfigs and IncrementalAlterConfigs of the two settings; then the expiration time
    raised cluster-wide at run time keeps an idle producer past the static 3 s, and deleting
    the dynamic value lets the next check forget it."""
    keys = list(SETTINGS)

    def describe() -> Any:
        return describe_configs(wire, [(BROKER, "1")], keys=keys) + describe_configs(
            wire, [(BROKER, "")], keys=keys)

    def alter(name: str, op: int, value: str | None, validate_only: bool = False,
              resource: str = "") -> Any:
        return wire.send(INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [
            {"resource_type": BROKER, "resource_name": resource, "configs": [
                {"name": name, "config_operation": op, "value": value}]}],
            "validate_only": validate_only})["responses"]

    out: dict[str, Any] = {"described": describe()}
    out["altered, validate only"] = [
        alter("producer.id.expiration.ms", SET, "5000", True),
        alter("producer.id.expiration.ms", SET, "5000", True, resource="1"),
        alter("producer.id.expiration.ms", SET, "0", True),
        alter("producer.id.expiration.ms", SET, "soon", True),
        alter("producer.id.expiration.check.interval.ms", SET, "1000", True),
        alter("log.retention.ms", SET, "soon", True),
        alter("num.partitions", SET, "x", True)]
    create_topic(wire, topic)
    pid, epoch = init_producer_id(wire)

    def producers() -> list[int]:
        r = wire.send(DESCRIBE_PRODUCERS, 0, {"topics": [
            {"name": topic, "partition_indexes": [0]}]}, to=wire.leader(topic))
        return [a["producer_id"] == pid for a in r["topics"][0]["partitions"][0]["active_producers"]]

    out["raised cluster-wide"] = alter("producer.id.expiration.ms", SET, "3600000")
    try:
        time.sleep(2 * CHECK_MS / 1000)  # Kafka applies it to its logs at once; shmq's workers
        #                                 at the next metadata push
        out["described while raised"] = describe()
        produce(wire, topic, record_batch([(b"k", b"v", now_ms())], producer_id=pid,
                                          producer_epoch=epoch, base_sequence=0))
        time.sleep((EXPIRATION_MS + 2 * CHECK_MS) / 1000)
        out["known past the static expiration time"] = producers()
    finally:
        out["lowered again"] = alter("producer.id.expiration.ms", DELETE, None)
    time.sleep(4 * CHECK_MS / 1000)
    out["known after"] = producers()
    return out


def test_expiration_configs_alike(kafka_expiring: apache_kafka.KafkaBroker,
                                  shmq_expiring: RunningBroker) -> None:
    """``producer.id.expiration.ms`` is a dynamic broker config in Kafka (per broker or
    cluster-wide, ``DynamicProducerStateManagerConfig``) and is listed by DescribeConfigs; its
    check interval is read-only.  The same descriptions, the same answers to changes, and the
    same effect of a change at run time on both brokers."""
    answers = {}
    for name, bootstrap in (("kafka", kafka_expiring.bootstrap),
                            ("shmq", shmq_expiring.bootstrap)):
        with Wire(bootstrap) as wire:
            answers[name] = normalise(configs_scenario(wire, f"pid-configs-{name}"),
                                      drop=("documentation",))
    assert_same(answers["shmq"], answers["kafka"])
    got = answers["kafka"]
    assert got["known past the static expiration time"] == [True]
    assert got["known after"] == []
    codes = [r[0]["error_code"] for r in got["altered, validate only"]]
    assert codes == [0, 0] + [INVALID_REQUEST] * 5  # Kafka 4.3: not INVALID_CONFIG
