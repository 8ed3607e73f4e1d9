"""Admin APIs through real clients: confluent-kafka's AdminClient and kafka-python's
KafkaAdminClient against a real broker (CreatePartitions, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, DeleteRecords, DescribeCluster, DescribeProducers)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)

HOUR_MS = 3600 * 1000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    home = tmp_path_factory.mktemp("admin")
    b = start_broker(home / "data")
    try:
        yield b
    finally:
        code = b.stop()
        log = b.log_path.read_text()
        shutil.rmtree(home)
        assert code == 0, log


@pytest.fixture(scope="module")
def admin(cluster: RunningBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})


def create(admin: AdminClient, name: str, partitions: int = 1, **configs: str) -> None:
    new = NewTopic(name, partitions, 1, config={k.replace("_", "."): v for k, v in configs.items()})
    for f in admin.create_topics([new], request_timeout=30).values():
        f.result()


def produce(b: RunningBroker, topic: str, count: int, partition: int = 0, size: int = 100,
            timestamp: int = 0, **conf: object) -> None:
    # one record per batch: segments roll between batches
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "batch.num.messages": 1,
                  "log_level": 0, **conf})
    for i in range(count):
        p.produce(topic, b"%06d" % i + b"x" * (size - 6), partition=partition,
                  timestamp=timestamp)
        p.poll(0)
    assert p.flush(30) == 0


def watermarks(b: RunningBroker, topic: str, partition: int = 0) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wm", "log_level": 0})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10,
                                       cached=False)
    finally:
        c.close()


def segment_files(b: RunningBroker, topic: str, partition: int = 0) -> list[Path]:
    return sorted(b.data_dir.glob(f"worker-*/{topic}-{partition}/*.log"))


def error_of(future: object) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        future.result()  # type: ignore[attr-defined]
    return info.value.args[0]


def configs_of(admin: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    (f,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return f.result()


def incremental(admin: AdminClient, topic: str, *ops: tuple[str, str | None, AlterConfigOpType]
                ) -> object:
    entries = [ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops]
    (f,) = admin.incremental_alter_configs(
        [ConfigResource("topic", topic, incremental_configs=entries)]).values()
    return f


def default_broker_config(b: RunningBroker, name: str, value: str | None) -> int:
    """IncrementalAlterConfigs SET (or DELETE, value None) of a cluster-wide broker default."""
    from kio.schema.incremental_alter_configs.v1.request import (
        AlterableConfig,
        AlterConfigsResource,
        IncrementalAlterConfigsRequest,
    )

    from shmq.cli.configs import kafka_call

    request = IncrementalAlterConfigsRequest(resources=(AlterConfigsResource(
        resource_type=4, resource_name="", configs=(AlterableConfig(
            name=name, config_operation=0 if value is not None else 1, value=value),)),),
        validate_only=False)
    return int(kafka_call(b.bootstrap, request, 10).responses[0].error_code)


# --- CreatePartitions ------------------------------------------------------------------------


def test_create_partitions_grows_and_never_shrinks(cluster: RunningBroker,
                                                   admin: AdminClient) -> None:
    create(admin, "grow", 2)
    (f,) = admin.create_partitions([NewPartitions("grow", 5)]).values()
    assert f.result() is None
    md = admin.list_topics("grow", timeout=10)
    assert sorted(md.topics["grow"].partitions) == [0, 1, 2, 3, 4]
    produce(cluster, "grow", 3, partition=4)          # the new partition takes records
    assert watermarks(cluster, "grow", 4) == (0, 3)
    (f,) = admin.create_partitions([NewPartitions("grow", 3)]).values()
    err = error_of(f)
    assert err.code() == KafkaError.INVALID_PARTITIONS
    assert "The topic grow currently has 5 partition(s); 3 would not be an increase." in err.str()
    (f,) = admin.create_partitions([NewPartitions("grow", 5)]).values()
    assert error_of(f).code() == KafkaError.INVALID_PARTITIONS
    (f,) = admin.create_partitions([NewPartitions("no-such-topic", 5)]).values()
    assert error_of(f).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    (f,) = admin.create_partitions([NewPartitions("grow", 9)], validate_only=True).values()
    assert f.result() is None
    assert len(admin.list_topics("grow", timeout=10).topics["grow"].partitions) == 5


def test_logs_exist_when_create_topics_and_create_partitions_answer(
        cluster: RunningBroker, admin: AdminClient) -> None:
    """Kafka creates a partition's log when its broker becomes the leader; here the workers
    create them before they acknowledge the metadata, so the first produce finds them."""
    def log_dirs(topic: str) -> list[str]:
        return sorted(d.name for d in cluster.data_dir.glob(f"worker-*/{topic}-*")
                      if (d / "00000000000000000000.log").is_file())

    create(admin, "eager", 6)
    assert log_dirs("eager") == [f"eager-{p}" for p in range(6)]
    (f,) = admin.create_partitions([NewPartitions("eager", 9)]).values()
    assert f.result() is None
    assert log_dirs("eager") == sorted(f"eager-{p}" for p in range(9))
    (f,) = admin.create_partitions([NewPartitions("eager", 12)], validate_only=True).values()
    assert f.result() is None
    assert len(log_dirs("eager")) == 9  # validate_only creates nothing


# --- DescribeConfigs / AlterConfigs / IncrementalAlterConfigs -------------------------------


def test_describe_configs_lists_every_topic_config_with_its_default(admin: AdminClient) -> None:
    create(admin, "described", 1, retention_ms="3600000")
    entries = configs_of(admin, "described")
    for name in ("cleanup.policy", "retention.ms", "retention.bytes", "segment.bytes",
                 "segment.ms", "max.message.bytes", "min.insync.replicas",
                 "message.timestamp.type", "compression.type", "flush.messages"):
        assert name in entries, name
    retention = entries["retention.ms"]
    assert (retention.value, retention.source) == ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert not retention.is_default and not retention.is_read_only and not retention.is_sensitive
    segment = entries["segment.bytes"]
    assert (segment.value, segment.source) == ("1073741824", ConfigSource.DEFAULT_CONFIG.value)
    assert segment.is_default
    assert entries["cleanup.policy"].value == "delete"
    (f,) = admin.describe_configs([ConfigResource("topic", "no-such-topic")]).values()
    assert error_of(f).code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_broker_configs(admin: AdminClient) -> None:
    (f,) = admin.describe_configs([ConfigResource("broker", "1")]).values()
    entries = f.result()
    assert entries["broker.id"].value == "1" and entries["broker.id"].is_read_only
    # Kafka 4.3: log.retention.ms has no default of its own (168 is log.retention.hours')
    assert entries["log.retention.ms"].value is None
    assert not entries["log.retention.ms"].is_read_only
    assert entries["log.retention.hours"].value == "168"
    assert entries["log.retention.hours"].is_read_only
    assert entries["num.partitions"].value == "1"


def test_incremental_alter_set_delete_append_subtract(admin: AdminClient) -> None:
    create(admin, "altered", 1)
    assert incremental(admin, "altered", ("retention.ms", "1000", AlterConfigOpType.SET),
                       ("max.message.bytes", "2048", AlterConfigOpType.SET)).result() is None
    entries = configs_of(admin, "altered")
    assert entries["retention.ms"].value == "1000"
    assert entries["max.message.bytes"].value == "2048"
    assert incremental(admin, "altered", ("cleanup.policy", "compact",
                                          AlterConfigOpType.APPEND)).result() is None
    assert configs_of(admin, "altered")["cleanup.policy"].value == "delete,compact"
    assert incremental(admin, "altered", ("cleanup.policy", "delete",
                                          AlterConfigOpType.SUBTRACT)).result() is None
    assert configs_of(admin, "altered")["cleanup.policy"].value == "compact"
    assert incremental(admin, "altered", ("retention.ms", None, AlterConfigOpType.DELETE),
                       ("cleanup.policy", None, AlterConfigOpType.DELETE)).result() is None
    entries = configs_of(admin, "altered")
    assert entries["retention.ms"].value == str(7 * 24 * HOUR_MS) and entries["retention.ms"].is_default
    assert entries["cleanup.policy"].value == "delete"
    assert entries["max.message.bytes"].value == "2048"


@pytest.mark.parametrize(("name", "value", "message"), [
    ("no.such.config", "1", "Unknown topic config name: no.such.config"),
    ("retention.ms", "soon", "Invalid value soon for configuration retention.ms: Not a number "
                             "of type LONG"),
    ("retention.ms", "-7", "Invalid value -7 for configuration retention.ms: Value must be at "
                           "least -1"),
    ("cleanup.policy", "shred", "Invalid value shred for configuration cleanup.policy"),
    ("segment.bytes", "99999999999", "Not a number of type INT"),
    ("min.insync.replicas", "0", "Value must be at least 1"),
    ("message.timestamp.type", "Tuesday", "String must be one of: CreateTime, LogAppendTime"),
    ("compression.type", "gzip", "compression.type"),
])
def test_invalid_configs_are_invalid_config(admin: AdminClient, name: str, value: str,
                                            message: str) -> None:
    if "invalid-cfg" not in admin.list_topics(timeout=10).topics:
        create(admin, "invalid-cfg", 1)
    err = error_of(incremental(admin, "invalid-cfg", (name, value, AlterConfigOpType.SET)))
    assert err.code() == KafkaError.INVALID_CONFIG
    assert message in err.str()
    entries = configs_of(admin, "invalid-cfg")  # nothing changed
    assert name not in entries or entries[name].is_default


def test_append_to_a_scalar_config_is_invalid(admin: AdminClient) -> None:
    create(admin, "append-scalar", 1)
    err = error_of(incremental(admin, "append-scalar", ("retention.ms", "5",
                                                        AlterConfigOpType.APPEND)))
    assert err.code() == KafkaError.INVALID_CONFIG
    assert "Can't APPEND to key retention.ms because its type is not LIST." in err.str()


def test_create_topic_with_bad_config_is_invalid_config(admin: AdminClient) -> None:
    for configs in ({"retention.ms": "x"}, {"not.a.config": "1"}):
        (f,) = admin.create_topics([NewTopic("bad-create", 1, 1, config=configs)]).values()
        assert error_of(f).code() == KafkaError.INVALID_CONFIG
    assert "bad-create" not in admin.list_topics(timeout=10).topics


def test_legacy_alter_configs_replaces_all_overrides(admin: AdminClient) -> None:
    create(admin, "legacy", 1, retention_ms="5000", segment_ms="60000")
    with pytest.deprecated_call():
        (f,) = admin.alter_configs([ConfigResource(
            "topic", "legacy", set_config={"retention.bytes": "1000000"})]).values()
    assert f.result() is None
    entries = configs_of(admin, "legacy")
    assert entries["retention.bytes"].value == "1000000"
    assert entries["retention.ms"].is_default and entries["segment.ms"].is_default


def test_retention_change_takes_effect_at_once(cluster: RunningBroker,
                                               admin: AdminClient) -> None:
    create(admin, "retained", 1, internal_segment_bytes="2048")
    old = int(time.time() * 1000) - 2 * HOUR_MS
    produce(cluster, "retained", 60, size=200, timestamp=old)    # two hours old, ~7 segments
    produce(cluster, "retained", 5, size=200)                     # new
    before = segment_files(cluster, "retained")
    assert len(before) >= 5
    assert watermarks(cluster, "retained") == (0, 65)
    assert incremental(admin, "retained", ("retention.ms", str(HOUR_MS),
                                           AlterConfigOpType.SET)).result() is None
    low, high = watermarks(cluster, "retained")
    assert high == 65 and 0 < low <= 60       # old segments gone, the newest records kept
    after = segment_files(cluster, "retained")
    assert len(after) < len(before)
    assert all(p not in after for p in before[:3])
    # retention.bytes too: shrink to about one segment
    assert incremental(admin, "retained", ("retention.bytes", "1",
                                           AlterConfigOpType.SET)).result() is None
    low2, high2 = watermarks(cluster, "retained")
    assert low2 >= low and high2 == 65


def test_segment_bytes_change_applies_to_the_live_log(cluster: RunningBroker,
                                                      admin: AdminClient) -> None:
    create(admin, "resegment", 1)
    produce(cluster, "resegment", 10, size=200)
    assert len(segment_files(cluster, "resegment")) == 1
    assert incremental(admin, "resegment", ("internal.segment.bytes", "1024",
                                            AlterConfigOpType.SET)).result() is None
    produce(cluster, "resegment", 20, size=200)
    assert len(segment_files(cluster, "resegment")) > 3


def test_max_message_bytes_change_is_enforced(cluster: RunningBroker, admin: AdminClient) -> None:
    create(admin, "small-messages", 1)
    produce(cluster, "small-messages", 1, size=5000)
    assert incremental(admin, "small-messages", ("max.message.bytes", "1000",
                                                 AlterConfigOpType.SET)).result() is None
    p = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 0,
                  "compression.type": "none"})
    errors: list[KafkaError] = []
    p.produce("small-messages", b"y" * 5000, partition=0,
              on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE


def test_broker_configs_change_topic_defaults(cluster: RunningBroker,
                                             admin: AdminClient) -> None:
    create(admin, "follows-default", 1)
    # one broker's dynamic config (confluent-kafka)
    (f,) = admin.incremental_alter_configs([ConfigResource("broker", "1", incremental_configs=[
        ConfigEntry("log.segment.bytes", "5000000",
                    incremental_operation=AlterConfigOpType.SET)])]).values()
    assert f.result() is None
    (f,) = admin.describe_configs([ConfigResource("broker", "1")]).values()
    entry = f.result()["log.segment.bytes"]
    assert (entry.value, entry.source) == ("5000000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    # the cluster-wide default: librdkafka and kafka-python refuse the empty broker name, so
    # the request goes out as Java's AdminClient sends it
    assert default_broker_config(cluster, "log.retention.bytes", "123456789") == 0
    entry = configs_of(admin, "follows-default")["retention.bytes"]
    assert entry.value == "123456789"
    assert entry.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    assert default_broker_config(cluster, "log.retention.bytes", None) == 0
    entry = configs_of(admin, "follows-default")["retention.bytes"]
    assert (entry.value, entry.source) == ("-1", ConfigSource.DEFAULT_CONFIG.value)
    # INVALID_REQUEST for a broker config, as Kafka 4.3 (test_kafka_producer_expiry_diff.py)
    assert default_broker_config(cluster, "log.retention.bytes", "lots") == 42
    (f,) = admin.incremental_alter_configs([ConfigResource("broker", "1", incremental_configs=[
        ConfigEntry("log.segment.bytes", None,
                    incremental_operation=AlterConfigOpType.DELETE)])]).values()
    assert f.result() is None
    # read-only and unknown broker configs are refused
    for name, code in (("num.partitions", KafkaError.INVALID_REQUEST),
                       ("no.such.broker.config", KafkaError.INVALID_CONFIG)):
        (f,) = admin.incremental_alter_configs([ConfigResource("broker", "1", incremental_configs=[
            ConfigEntry(name, "3", incremental_operation=AlterConfigOpType.SET)])]).values()
        assert error_of(f).code() == code


# --- DeleteRecords ----------------------------------------------------------------------------


def test_delete_records_moves_the_log_start_and_consumers_reset(cluster: RunningBroker,
                                                                admin: AdminClient) -> None:
    create(admin, "trimmed", 1, internal_segment_bytes="4096")
    produce(cluster, "trimmed", 100, size=200)
    (f,) = admin.delete_records([TopicPartition("trimmed", 0, 40)]).values()
    result = f.result()
    assert result.low_watermark == 40
    assert watermarks(cluster, "trimmed") == (40, 100)
    assert segment_files(cluster, "trimmed")[0].name != "00000000000000000000.log"
    # a consumer at an older offset is out of range and resets (auto.offset.reset=earliest)
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "trim-reader",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "log_level": 0})
    try:
        c.assign([TopicPartition("trimmed", 0, 10)])
        first = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            msg = c.poll(1)
            if msg is not None and msg.error() is None:
                first = msg
        assert first is not None and first.offset() == 40
        assert first.value()[:6] == b"000040"
    finally:
        c.close()
    # with auto.offset.reset=error the consumer sees the out-of-range error itself
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "trim-strict",
                  "auto.offset.reset": "error", "enable.auto.commit": False, "log_level": 0})
    try:
        c.assign([TopicPartition("trimmed", 0, 5)])
        seen = None
        deadline = time.monotonic() + 30
        while seen is None and time.monotonic() < deadline:
            msg = c.poll(1)
            if msg is not None and msg.error() is not None:
                seen = msg.error()
        assert seen is not None and seen.code() == KafkaError._AUTO_OFFSET_RESET
    finally:
        c.close()


def test_delete_records_beyond_the_high_watermark_is_out_of_range(
        cluster: RunningBroker, admin: AdminClient) -> None:
    create(admin, "trim-bounds", 1)
    produce(cluster, "trim-bounds", 10)
    (f,) = admin.delete_records([TopicPartition("trim-bounds", 0, 11)]).values()
    assert error_of(f).code() == KafkaError.OFFSET_OUT_OF_RANGE
    (f,) = admin.delete_records([TopicPartition("trim-bounds", 0, -1)]).values()  # = HW
    assert f.result().low_watermark == 10
    assert watermarks(cluster, "trim-bounds") == (10, 10)
    produce(cluster, "trim-bounds", 2)
    assert watermarks(cluster, "trim-bounds") == (10, 12)


# --- DescribeCluster ----------------------------------------------------------------------------


def test_describe_cluster(cluster: RunningBroker, admin: AdminClient) -> None:
    desc = admin.describe_cluster().result()
    assert desc.cluster_id == cluster.run_info["cluster_id"]
    assert desc.controller.id == 0
    ports = {w["node_id"]: w["port"] for w in cluster.run_info["workers"]}
    assert {n.id: n.port for n in desc.nodes if n.id != 0} == ports
    # librdkafka describes the cluster with Metadata: DescribeCluster itself, both versions
    from kio.schema.describe_cluster.v0.request import DescribeClusterRequest as V0
    from kio.schema.describe_cluster.v1.request import DescribeClusterRequest as V1

    from shmq.cli.configs import kafka_call

    r0 = kafka_call(cluster.bootstrap, V0(include_cluster_authorized_operations=True), 10)
    assert (int(r0.error_code), r0.cluster_id, r0.controller_id) == (0, desc.cluster_id, 0)
    assert {b.broker_id: b.port for b in r0.brokers if b.broker_id != 0} == ports
    assert r0.cluster_authorized_operations > 0
    r1 = kafka_call(cluster.bootstrap, V1(include_cluster_authorized_operations=False,
                                          endpoint_type=1), 10)
    assert int(r1.error_code) == 0 and len(r1.brokers) == len(ports) + 1
    assert r1.cluster_authorized_operations == -2**31
    r1 = kafka_call(cluster.bootstrap, V1(include_cluster_authorized_operations=False,
                                          endpoint_type=2), 10)
    assert int(r1.error_code) == 114  # MISMATCHED_ENDPOINT_TYPE: ask a controller endpoint


# --- kafka-python's KafkaAdminClient ---------------------------------------------------------


def test_kafka_python_admin_client(cluster: RunningBroker) -> None:
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewPartitions as KNewPartitions
    from kafka.admin import NewTopic as KNewTopic
    from kafka.errors import InvalidPartitionsError

    k = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        k.create_topics([KNewTopic("kp-admin", 1, 1)])
        k.create_partitions({"kp-admin": KNewPartitions(total_count=3)})
        assert len(k.describe_topics(["kp-admin"])[0]["partitions"]) == 3
        with pytest.raises(InvalidPartitionsError):
            k.create_partitions({"kp-admin": KNewPartitions(total_count=2)})
        with pytest.raises(InvalidPartitionsError):
            k.create_partitions({"kp-admin": KNewPartitions(total_count=-4)})
        # legacy AlterConfigs, then IncrementalAlterConfigs
        k.alter_configs([KConfigResource(ConfigResourceType.TOPIC, "kp-admin",
                                         configs={"retention.ms": "7200000"})], incremental=False)
        k.alter_configs([KConfigResource(ConfigResourceType.TOPIC, "kp-admin",
                                         configs={"segment.ms": "600000"})], incremental=True)
        described = k.describe_configs([KConfigResource(ConfigResourceType.TOPIC, "kp-admin")],
                                       include_synonyms=True, config_filter="all")
        text = repr(described)
        assert "7200000" in text and "600000" in text and "segment.bytes" in text
        produce(cluster, "kp-admin", 20)
        k.delete_records({KTopicPartition("kp-admin", 0): 15})
        assert watermarks(cluster, "kp-admin") == (15, 20)
        cluster_info = k.describe_cluster()
        assert cluster_info["cluster_id"] == cluster.run_info["cluster_id"]
        assert cluster_info["controller_id"] == 0
        # a retention change through kafka-python deletes old segments
        k.create_topics([KNewTopic("kp-retained", 1, 1,
                                   topic_configs={"internal.segment.bytes": "2048"})])
        produce(cluster, "kp-retained", 30, size=200,
                timestamp=int(time.time() * 1000) - 2 * HOUR_MS)
        produce(cluster, "kp-retained", 10, size=200)
        before = segment_files(cluster, "kp-retained")
        k.alter_configs([KConfigResource(ConfigResourceType.TOPIC, "kp-retained",
                                         configs={"retention.ms": str(HOUR_MS)})])
        low, high = watermarks(cluster, "kp-retained")
        assert 20 <= low <= 30 and high == 40
        assert len(segment_files(cluster, "kp-retained")) < len(before)
    finally:
        k.close()
    # a kafka-python consumer below the log start offset resets (auto_offset_reset)
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=15000)
    try:
        tp = KTopicPartition("kp-admin", 0)
        consumer.assign([tp])
        consumer.seek(tp, 3)
        first = next(iter(consumer))
        assert first.offset == 15
    finally:
        consumer.close()


# --- DescribeProducers, and what survives a restart ------------------------------------------


def test_describe_producers_is_served_by_the_leader(cluster: RunningBroker,
                                                    admin: AdminClient) -> None:
    from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest

    from shmq.cli.configs import kafka_call

    create(admin, "producers", 1)
    produce(cluster, "producers", 5, **{"enable.idempotence": True})
    leader = admin.list_topics("producers", timeout=10).topics["producers"].partitions[0].leader
    ports = {w["node_id"]: w["port"] for w in cluster.run_info["workers"]}
    request = DescribeProducersRequest(topics=(TopicRequest(name="producers",
                                                            partition_indexes=(0, 7)),))
    response = kafka_call(f"127.0.0.1:{ports[leader]}", request, 10)
    part, missing = response.topics[0].partitions
    assert int(part.error_code) == 0 and len(part.active_producers) == 1
    state = part.active_producers[0]
    assert state.producer_id >= 0 and state.last_sequence == 4
    assert int(missing.error_code) == 3
    host, port = cluster.bootstrap.split(":")
    response = kafka_call(f"{host}:{port}", request, 10)     # the controller leads nothing
    assert int(response.topics[0].partitions[0].error_code) == 6


def test_configs_and_partitions_survive_a_restart(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data")
    try:
        a = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 0})
        create(a, "durable", 1)
        (f,) = a.create_partitions([NewPartitions("durable", 3)]).values()
        f.result()
        assert incremental(a, "durable", ("retention.ms", str(HOUR_MS), AlterConfigOpType.SET),
                           ("internal.segment.bytes", "2048", AlterConfigOpType.SET)).result() is None
        old = int(time.time() * 1000) - 2 * HOUR_MS
        produce(b, "durable", 40, size=200, timestamp=old)
        produce(b, "durable", 3, size=200)
    finally:
        assert b.stop() == 0
    b = start_broker(tmp_path / "data")
    try:
        a = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 0})
        entries = configs_of(a, "durable")
        assert entries["retention.ms"].value == str(HOUR_MS)
        assert entries["internal.segment.bytes"].value == "2048"
        assert len(a.list_topics("durable", timeout=10).topics["durable"].partitions) == 3
        # the restarted worker runs the topic's config: a retention pass (shortened here to
        # make it due now) deletes the two-hour-old segments
        assert incremental(a, "durable", ("retention.ms", str(HOUR_MS - 1),
                                          AlterConfigOpType.SET)).result() is None
        low, high = watermarks(b, "durable")
        assert high == 43 and low > 0
    finally:
        assert b.stop() == 0
        shutil.rmtree(tmp_path)
