"""Dynamic configs and the controller's admin decisions, without sockets or processes
(``shmq.broker.dynamic_configs``, ``shmq.broker.admin``), plus the handlers over a context."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from shmq.broker import dynamic_configs as dc
from shmq.broker.admin import plan_alter_configs, plan_create_partitions
from shmq.broker.metadata import ClusterMetadata, MetadataStore
from shmq.storage.log_config import LogConfig


def _meta(tmp_path: Path) -> MetadataStore:
    store = MetadataStore(tmp_path)
    store.metadata.brokers = {0: ("127.0.0.1", 1), 1: ("127.0.0.1", 2), 2: ("127.0.0.1", 3)}
    store.create_topic("t", 2, [1, 2], {"retention.ms": "1000"})
    return store


def test_every_log_config_field_has_a_kafka_config() -> None:
    fields = {d.log_field for d in dc.TOPIC_CONFIGS.values() if d.log_field}
    assert fields == set(LogConfig.KAFKA_NAMES.values())
    for d in dc.TOPIC_CONFIGS.values():  # the documented defaults are LogConfig's
        if d.log_field and d.default is not None:  # internal.segment.bytes has none
            assert str(getattr(LogConfig(), d.log_field)) == d.default, d.name


@pytest.mark.parametrize(("name", "value", "stored"), [
    ("retention.ms", " 5000 ", "5000"), ("retention.ms", "-1", "-1"),
    ("cleanup.policy", "compact, delete", "compact,delete"), ("preallocate", "TRUE", "true"),
    ("min.cleanable.dirty.ratio", "0.25", "0.25"), ("retention.bytes", "-5", "-5"),
])
def test_valid_values_are_normalized(name: str, value: str, stored: str) -> None:
    assert dc.validate_value(dc.TOPIC_CONFIGS[name], value) == stored


@pytest.mark.parametrize(("name", "value"), [
    ("retention.ms", "x"), ("retention.ms", "-2"), ("segment.bytes", str(2**31)),
    ("cleanup.policy", "delete,shred"), ("cleanup.policy", ""), ("preallocate", "yes"),
    ("message.timestamp.type", "createtime"), ("compression.type", "zstd"),
    ("remote.storage.enable", "true"), ("min.cleanable.dirty.ratio", "nan?"),
])
def test_invalid_values(name: str, value: str) -> None:
    with pytest.raises(dc.ConfigChangeError) as info:
        dc.validate_value(dc.TOPIC_CONFIGS[name], value)
    assert info.value.code == dc.INVALID_CONFIG
    assert str(info.value).startswith(f"Invalid value {value} for configuration {name}: ")


def test_effective_log_config_layers(tmp_path: Path) -> None:
    store = _meta(tmp_path)
    meta = store.metadata
    base = LogConfig(segment_bytes=1 << 20)
    assert dc.effective_log_config(meta, base, 1, "t").retention_ms == 1000
    meta.broker_configs = {"": {"log.retention.bytes": "500", "log.segment.bytes": "4096"},
                           "2": {"log.segment.bytes": "8192"}}
    on1 = dc.effective_log_config(meta, base, 1, "t")
    on2 = dc.effective_log_config(meta, base, 2, "t")
    assert (on1.retention_bytes, on1.segment_bytes) == (500, 4096)
    assert on2.segment_bytes == 8192
    entries = {e.name: e for e in dc.describe_topic(meta, base, 2, "t", None)}
    seg = entries["segment.bytes"]
    assert (seg.value, seg.source) == ("8192", dc.DYNAMIC_BROKER_CONFIG)
    assert [s[2] for s in seg.synonyms] == [dc.DYNAMIC_BROKER_CONFIG,
                                            dc.DYNAMIC_DEFAULT_BROKER_CONFIG,
                                            dc.STATIC_BROKER_CONFIG, dc.DEFAULT_CONFIG]
    ret = entries["retention.ms"]
    assert (ret.value, ret.source) == ("1000", dc.TOPIC_CONFIG)
    # Kafka lists synonyms from the first one named log.retention.ms: not the default 168 hours
    assert ret.synonyms == [("retention.ms", "1000", dc.TOPIC_CONFIG)]
    assert entries["segment.ms"].value == "604800000"   # not log.roll.hours' 168
    assert [e.name for e in dc.describe_topic(meta, base, 1, "t", ["flush.ms", "nope"])] == [
        "flush.ms"]


def test_incremental_operations() -> None:
    current = {"cleanup.policy": "delete", "retention.ms": "5"}
    new = dc.apply_ops(current, [("cleanup.policy", dc.APPEND, "compact,delete"),
                                 ("retention.ms", dc.DELETE, None),
                                 ("segment.ms", dc.SET, "1000")], dc.topic_def, True)
    assert new == {"cleanup.policy": "delete,compact", "segment.ms": "1000"}
    assert current == {"cleanup.policy": "delete", "retention.ms": "5"}  # not mutated
    new = dc.apply_ops(new, [("cleanup.policy", dc.SUBTRACT, "delete")], dc.topic_def, True)
    assert new["cleanup.policy"] == "compact"
    # SUBTRACT from the default; removing every item of cleanup.policy is invalid
    with pytest.raises(dc.ConfigChangeError):
        dc.apply_ops({}, [("cleanup.policy", dc.SUBTRACT, "delete")], dc.topic_def, True)
    with pytest.raises(dc.ConfigChangeError) as info:
        dc.apply_ops({}, [("retention.ms", dc.APPEND, "1")], dc.topic_def, True)
    assert info.value.code == dc.INVALID_CONFIG
    with pytest.raises(dc.ConfigChangeError) as info:
        dc.apply_ops({}, [("retention.ms", 5, "1")], dc.topic_def, True)
    assert info.value.code == dc.INVALID_REQUEST
    # legacy AlterConfigs: the request is the whole new set
    assert dc.apply_ops(current, [("segment.ms", dc.SET, "7")], dc.topic_def, False) == {
        "segment.ms": "7"}


def test_plan_create_partitions(tmp_path: Path) -> None:
    """ReplicationControlManager.createPartitions: the count must grow; a manual assignment
    gives each new partition registered brokers (the workers), none twice, as many as the
    topic's other partitions have."""
    meta = _meta(tmp_path).metadata
    workers = [1, 2]

    def plan(*topics: dict) -> tuple[list[tuple[int, str | None]], dict]:
        results, grow = plan_create_partitions(meta, list(topics), workers)
        return [(r["error_code"], r["error_message"]) for r in results], grow

    results, grow = plan({"name": "t", "count": 4, "assignments": None},
                         {"name": "nope", "count": 4, "assignments": None},
                         {"name": "bad name", "count": 4, "assignments": None})
    # Kafka's controller only looks the name up: an invalid one is an unknown topic
    assert [code for code, _ in results] == [0, 3, 3] and grow == {"t": None}
    assert plan({"name": "t", "count": 2}) == (
        [(37, "Topic already has 2 partition(s).")], {})
    for count in (1, 0, -1):
        assert plan({"name": "t", "count": count}) == ([(37, f"The topic t currently has 2 "
                                                         f"partition(s); {count} would not be "
                                                         "an increase.")], {})
    assert plan({"name": "t", "count": 4, "assignments": [[2], [1]]}) == ([(0, None)],
                                                                          {"t": [2, 1]})
    registered = "The manual partition assignment includes broker {}, but no such broker is " \
                 "registered."
    for assignments, message in (
            ([[1]], "Attempted to add 2 additional partition(s), but only 1 assignment(s) were "
                    "specified."),
            ([[0], [1]], registered.format(0)),  # node 0 is the controller: no logs there
            ([[1], [77]], registered.format(77)),
            ([[1, 1], [2]], "The manual partition assignment includes the broker 1 more than "
                            "once."),
            ([[1, 2], [2]], "The manual partition assignment includes a partition with 2 "
                            "replica(s), but this is not consistent with previous partitions, "
                            "which have 1 replica(s)."),
            ([[], [2]], "The manual partition assignment includes an empty replica list.")):
        assert plan({"name": "t", "count": 4, "assignments": assignments}) == (
            [(39, message)], {}), assignments
    # QuorumController.MAX_RECORDS_PER_USER_OP: 10,000 new partitions in one request at most
    assert plan({"name": "t", "count": 10_002})[1] == {"t": None}
    too_many = plan({"name": "t", "count": 10_003}, {"name": "nope", "count": 1})
    assert too_many == ([(44, "Unable to perform excessively large batch operation.")] * 2, {})
    assert plan({"name": "t", "count": 3}, {"name": "t", "count": 3}) == (
        [(42, "Duplicate topic name.")], {})


def test_store_adds_partitions_with_fresh_slots(tmp_path: Path) -> None:
    store = _meta(tmp_path)
    store.create_topic("u", 1, [1, 2])
    store.add_partitions("t", 5, [1, 2])
    slots = [p.slot for t in store.metadata.topics.values() for p in t.partitions]
    assert len(slots) == len(set(slots)) == 6
    assert [p.partition for p in store.metadata.topics["t"].partitions] == [0, 1, 2, 3, 4]
    again = MetadataStore(tmp_path)  # persisted
    assert len(again.metadata.topics["t"].partitions) == 5
    store.set_configs(4, "", {"log.retention.ms": "5"})
    store.set_configs(2, "t", {"segment.ms": "9"})
    again = MetadataStore(tmp_path)
    assert again.metadata.broker_configs == {"": {"log.retention.ms": "5"}}
    assert again.metadata.topics["t"].configs == {"segment.ms": "9"}
    store.set_configs(4, "", {})
    assert MetadataStore(tmp_path).metadata.broker_configs == {}


def test_plan_alter_configs(tmp_path: Path) -> None:
    meta = _meta(tmp_path).metadata
    base = LogConfig()
    results, changes = plan_alter_configs(meta, base, [
        {"resource_type": 2, "resource_name": "t", "configs": [["retention.ms", 0, "7"]]},
        {"resource_type": 2, "resource_name": "nope", "configs": [["retention.ms", 0, "7"]]},
        {"resource_type": 4, "resource_name": "1", "configs": [["log.roll.ms", 0, "60000"]]},
        {"resource_type": 4, "resource_name": "", "configs": [["num.partitions", 0, "3"]]},
        {"resource_type": 8, "resource_name": "1", "configs": []},
    ], True)
    assert [r["error_code"] for r in results] == [0, 3, 0, 42, 42]
    assert changes == {(2, "t"): {"retention.ms": "7"}, (4, "1"): {"log.roll.ms": "60000"}}
    assert meta.topics["t"].configs == {"retention.ms": "1000"}  # planning changes nothing
    # no change: nothing to store
    results, changes = plan_alter_configs(meta, base, [
        {"resource_type": 2, "resource_name": "t", "configs": [["retention.ms", 0, "1000"]]}],
        True)
    assert results[0]["error_code"] == 0 and changes == {}


def test_log_update_config_reaches_every_segment(tmp_path: Path) -> None:
    from shmq.storage.log import PartitionLog

    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=4096), clean_shutdown=True)
    try:
        new = dataclasses.replace(log.config, segment_bytes=8192, retention_ms=5)
        log.update_config(new)
        assert log.config is new and all(s.config is new for s in log.segments)
    finally:
        log.close()


def test_handlers_over_a_context(tmp_path: Path) -> None:
    """DescribeConfigs and DescribeCluster need no socket: a context with metadata will do."""
    from kio.schema.describe_cluster.v1.request import DescribeClusterRequest
    from kio.schema.describe_configs.v4.request import (
        DescribeConfigsRequest,
        DescribeConfigsResource,
    )

    from shmq.broker.config import BrokerConfig
    from shmq.broker.handlers import describe_cluster, describe_configs

    meta: ClusterMetadata = _meta(tmp_path).metadata
    ctx = SimpleNamespace(metadata=meta, config=BrokerConfig(data_dir=tmp_path, workers=2),
                          node_id=1)
    header = SimpleNamespace(api_version=4)
    request = DescribeConfigsRequest(resources=(
        DescribeConfigsResource(resource_type=2, resource_name="t", configuration_keys=None),
        DescribeConfigsResource(resource_type=2, resource_name="x", configuration_keys=None),
        DescribeConfigsResource(resource_type=4, resource_name="9", configuration_keys=None),
    ), include_synonyms=False, include_documentation=True)
    response = asyncio.run(describe_configs.handle(ctx, header, request))  # type: ignore[arg-type]
    ok, missing, broker = response.results
    # every topic config but internal.segment.bytes (listed only where a topic sets it)
    assert int(ok.error_code) == 0 and len(ok.configs) == len(dc.TOPIC_CONFIGS) - 1
    assert all(c.documentation and c.synonyms == () for c in ok.configs)
    assert (int(missing.error_code), int(broker.error_code)) == (3, 42)
    header = SimpleNamespace(api_version=1)
    response = asyncio.run(describe_cluster.handle(  # type: ignore[arg-type]
        ctx, header, DescribeClusterRequest(include_cluster_authorized_operations=False,
                                            endpoint_type=1)))
    assert response.cluster_id == meta.cluster_id and len(response.brokers) == 3


def test_producer_id_expiration_is_a_dynamic_broker_config(tmp_path: Path) -> None:
    """Kafka's ProducerStateManagerConfig: producer.id.expiration.ms changes at run time (one
    broker's value over the cluster-wide one over the static one); its check interval is
    read-only.  Both are listed with their synonyms."""
    from shmq.broker.config import BrokerConfig

    meta = _meta(tmp_path).metadata
    config = BrokerConfig(data_dir=tmp_path, producer_id_expiration_ms=3000)
    assert dc.producer_id_expiration_ms(meta, 1, 3000) == 3000
    meta.broker_configs = {"": {"producer.id.expiration.ms": "60000"},
                           "2": {"producer.id.expiration.ms": "5000"}}
    assert dc.producer_id_expiration_ms(meta, 1, 3000) == 60000
    assert dc.producer_id_expiration_ms(meta, 2, 3000) == 5000
    entries = {e.name: e for e in dc.describe_broker(meta, config, 2, None)}
    e = entries["producer.id.expiration.ms"]
    assert (e.value, e.source, e.read_only) == ("5000", dc.DYNAMIC_BROKER_CONFIG, False)
    assert [s[2] for s in e.synonyms] == [dc.DYNAMIC_BROKER_CONFIG,
                                          dc.DYNAMIC_DEFAULT_BROKER_CONFIG,
                                          dc.STATIC_BROKER_CONFIG, dc.DEFAULT_CONFIG]
    e = entries["producer.id.expiration.check.interval.ms"]
    assert (e.value, e.source, e.read_only) == ("600000", dc.DEFAULT_CONFIG, True)
    assert dc.broker_def("producer.id.expiration.ms").at_least == 1
    with pytest.raises(dc.ConfigChangeError) as info:
        dc.broker_def("producer.id.expiration.check.interval.ms")
    assert info.value.code == dc.INVALID_REQUEST
    assert str(info.value).endswith("[producer.id.expiration.check.interval.ms]")
    with pytest.raises(dc.InvalidValueError):
        dc.apply_ops({}, [("producer.id.expiration.ms", dc.SET, "0")], dc.broker_def, True)
