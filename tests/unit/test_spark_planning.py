"""spark_bridge's option parsing and planning rules, without Spark (Spark's own connector is the
oracle for the same rules in ``tests/spark``; here: bad input, and properties of the splits)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_bridge import planning
from spark_bridge.catalog import Catalog
from spark_bridge.errors import BridgeError, DataLossError
from spark_bridge.options import OffsetSpec, parse_sink, parse_source
from spark_bridge.planning import OffsetRange, rate_limit, split_ranges


def bad(options: dict, match: str, streaming: bool = False) -> None:
    with pytest.raises(BridgeError, match=match) as info:
        parse_source(options, streaming=streaming)
    text = str(info.value)
    assert text.startswith("shmq: ") and "\n" not in text


def test_bad_source_options_are_one_line_errors() -> None:
    bad({}, "one of the options assign, subscribe, subscribePattern must be given")
    bad({"subscribe": "a", "assign": '{"a":[0]}'}, "only one of the options")
    bad({"subscribe": " , "}, "no topics to subscribe to")
    bad({"subscribePattern": "("}, "not a valid regular expression")
    bad({"assign": "a,b"}, "no topic partitions to assign")
    bad({"assign": '{"a": [0,'}, "option 'assign' is not valid JSON")
    bad({"assign": '{"a": ["x"]}'}, "must map topics to lists of partition numbers")
    bad({"subscribe": "a", "startingOffsets": '{"a": {"0": 1'}, "not valid JSON")
    bad({"subscribe": "a", "startingOffsets": '{"a": {"zero": 1}}'},
        "must map topics to {partition: number}")
    bad({"subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, "an offset is >= 0")
    bad({"subscribe": "a", "startingOffsets": "first"}, "must be earliest, latest or JSON")
    bad({"subscribe": "a", "startingOffsets": "latest"}, "can't be latest for batch")
    bad({"subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, "can't be latest")
    bad({"subscribe": "a", "endingOffsets": "earliest"}, "can't be earliest for batch")
    bad({"subscribe": "a", "endingOffsets": "latest"}, "not valid in streaming", streaming=True)
    bad({"subscribe": "a", "startingOffsets": '{"a": {"0": 9}}',
         "endingOffsets": '{"a": {"0": 3}}'}, "is after the ending one")
    bad({"subscribe": "a", "startingOffsets": '{"a": {"0": 1}}',
         "endingOffsets": '{"a": {"1": 3}}'}, "must name the same topic partitions")
    bad({"subscribe": "a", "startingTimestamp": "yesterday"}, "one number of milliseconds")
    bad({"subscribe": "a", "failOnDataLoss": "yes"}, "must be true or false")
    bad({"subscribe": "a", "minPartitions": "0"}, "must be positive")
    bad({"subscribe": "a", "maxOffsetsPerTrigger": "lots"}, "must be a whole number")
    bad({"subscribe": "a", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "3"},
        "is higher than maxOffsetsPerTrigger")
    bad({"subscribe": "a", "maxTriggerDelay": "soon"}, "must be a duration")
    bad({"subscribe": "a", "shmq.batchRows": "-5"}, "'shmq.batchRows' must be positive")
    bad({"subscribe": "a", "shmq.batchBytes": "8M"}, "'shmq.batchBytes' must be a whole number")
    bad({"subscribe": "a", "kafka.auto.offset.reset": "earliest"}, "'auto.offset.reset' is not")
    bad({"subscribe": "a", "kafka.value.deserializer": "x"}, "'value.deserializer' is not")
    bad({"subscribe": "a", "kafka.enable.auto.commit": "true"}, "never commits")
    bad({"subscribe": "a", "kafka.isolation.level": "dirty"}, "read_uncommitted or")
    bad({"subscribe": "a", "shmq.transport": "pigeon"}, "must be one of auto, mmap, kafka")
    bad({"subscribe": "a", "kafka.bootstrap.servers": " "}, "is empty")
    with pytest.raises(BridgeError, match="'key.serializer' is not supported"):
        parse_sink({"topic": "t", "kafka.key.serializer": "x"})


def test_option_names_are_case_insensitive_and_typed() -> None:
    o = parse_source({"SUBSCRIBE": "a, b", "StartingOffsets": '{"a":{"0":5,"1":-2}}',
                      "maxTriggerDelay": "2m", "kafka.isolation.level": "READ_COMMITTED",
                      "kafka.group.id": "ignored", "kafka.fetch.min.bytes": "1"},
                     streaming=True)
    assert o.topics == ("a", "b")
    assert o.starting == OffsetSpec("offsets", {("a", 0): 5, ("a", 1): -2})
    assert o.max_trigger_delay_ms == 120_000
    assert o.isolation_level == "read_committed"
    assert o.kafka_conf == {"fetch.min.bytes": "1"}
    assert parse_source({"subscribe": "a"}, streaming=True).starting.kind == "latest"
    assert parse_source({"subscribe": "a"}, streaming=False).starting.kind == "earliest"
    # Kafka's precedence: a global timestamp over timestamps per partition over offsets
    o = parse_source({"subscribe": "a", "startingTimestamp": "5", "startingOffsets": "latest",
                      "startingOffsetsByTimestamp": '{"a":{"0":1}}'}, streaming=True)
    assert o.starting == OffsetSpec("timestamp", 5)


class FakeCatalog(Catalog):
    def __init__(self, topics: dict[str, int], start: int = 0, end: int = 100) -> None:
        self._topics, self.start, self.end = topics, start, end

    def topics(self) -> dict[str, int]:
        return dict(self._topics)

    def earliest(self, tps: list) -> dict:
        return {tp: self.start for tp in tps}

    def latest(self, tps: list) -> dict:
        return {tp: self.end for tp in tps}

    def offsets_for_times(self, times: dict) -> dict:
        return {tp: (-1 if ts > 1000 else ts) for tp, ts in times.items()}


def test_partition_selection_and_its_errors() -> None:
    cat = FakeCatalog({"events": 3, "audit": 1, "events-eu": 2})
    sel = planning.assigned_partitions
    assert sel(cat, parse_source({"subscribePattern": "events.*"}, streaming=False),
               strict=True) == [("events", 0), ("events", 1), ("events", 2), ("events-eu", 0),
                                ("events-eu", 1)]
    # Kafka matches the whole name
    assert sel(cat, parse_source({"subscribePattern": "event"}, streaming=True),
               strict=False) == []
    with pytest.raises(BridgeError, match="matches no topic"):
        sel(cat, parse_source({"subscribePattern": "event"}, streaming=False), strict=True)
    with pytest.raises(BridgeError, match="unknown topic 'nope' in option 'subscribe'"):
        sel(cat, parse_source({"subscribe": "events,nope"}, streaming=False), strict=True)
    with pytest.raises(BridgeError, match="names partition audit-4, but topic 'audit' has 1"):
        sel(cat, parse_source({"assign": '{"audit":[4]}'}, streaming=False), strict=True)


def test_batch_ranges_offsets_out_of_range() -> None:
    cat = FakeCatalog({"t": 2}, start=10, end=50)

    def ranges(**o: str) -> list:
        return planning.batch_ranges(cat, parse_source({"subscribe": "t", **o},
                                                       streaming=False))

    assert ranges() == [OffsetRange("t", 0, 10, 50), OffsetRange("t", 1, 10, 50)]
    with pytest.raises(BridgeError, match="startingOffsets for t-1 is 70, past the end"):
        ranges(startingOffsets=json.dumps({"t": {"0": 12, "1": 70}}))
    with pytest.raises(BridgeError, match="endingOffsets for t-0 is 51, past the end"):
        ranges(endingOffsets=json.dumps({"t": {"0": 51, "1": -1}}))
    with pytest.raises(BridgeError, match="must give every assigned partition"):
        ranges(startingOffsets=json.dumps({"t": {"0": 12}}))
    with pytest.raises(DataLossError, match="partition starts at offset 10"):
        ranges(startingOffsets=json.dumps({"t": {"0": 3, "1": -2}}))
    assert ranges(startingOffsets=json.dumps({"t": {"0": 3, "1": -2}}),
                  failOnDataLoss="false")[0] == OffsetRange("t", 0, 10, 50)
    with pytest.raises(BridgeError, match="no offset of t-0 has a timestamp at or after 5000"):
        ranges(startingTimestamp="5000")
    assert ranges(startingTimestamp="5000", startingOffsetsByTimestampStrategy="latest") == []


def test_rate_limit_examples() -> None:
    # Kafka's proportional split: floor of the share, but at least one offset for a partition
    # whose share is below one
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    until = {("t", 0): 1000, ("t", 1): 10, ("t", 2): 0}
    assert rate_limit(100, start, until, {}) == {("t", 0): 99, ("t", 1): 1, ("t", 2): 0}
    # a new partition starts at its earliest offset
    assert rate_limit(10, {("t", 0): 5}, {("t", 0): 15, ("t", 1): 10}, {("t", 1): 0}) == \
        {("t", 0): 10, ("t", 1): 5}
    assert rate_limit(10, start, start, {}) == start


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 10_000), min_size=1, max_size=8),
       limit=st.integers(1, 50_000))
def test_rate_limit_never_overshoots(sizes: list[int], limit: int) -> None:
    start = {("t", p): 100 * p for p in range(len(sizes))}
    until = {tp: off + s for (tp, off), s in zip(start.items(), sizes, strict=True)}
    got = rate_limit(limit, start, until, {})
    assert all(start[tp] <= got[tp] <= until[tp] for tp in got)
    taken = sum(got[tp] - start[tp] for tp in got)
    assert taken <= max(limit, 0) + len(sizes)  # a share below one rounds up to one
    if sum(sizes) <= limit:
        assert got == until


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=10),
       min_partitions=st.one_of(st.none(), st.integers(1, 40)),
       max_records=st.one_of(st.none(), st.integers(1, 3000)))
def test_split_ranges_cover_each_partition_exactly(sizes: list[int], min_partitions: int | None,
                                                   max_records: int | None) -> None:
    ranges = [OffsetRange("t", p, 7 * p, 7 * p + s) for p, s in enumerate(sizes)]
    out = split_ranges(ranges, min_partitions, max_records)
    for r in ranges:
        pieces = sorted((x.start, x.end) for x in out if x.partition == r.partition)
        if r.size == 0:
            assert not pieces
            continue
        assert pieces[0][0] == r.start and pieces[-1][1] == r.end
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(pieces, pieces[1:], strict=False))
        if max_records:
            assert all(b - a <= max_records for a, b in pieces)
    if min_partitions is None and max_records is None:
        assert len(out) == sum(1 for s in sizes if s)


def test_unreadable_data_dir_and_partition_directory(tmp_path: Path) -> None:
    from spark_bridge.catalog import open_catalog
    from spark_bridge.reading import ReadPlan, _read_mmap

    a_file = tmp_path / "a-file"
    a_file.write_bytes(b"not a data directory")
    with pytest.raises(BridgeError, match=f"cannot read {a_file}/run/broker.json: .*Not a "
                                          "directory"):
        open_catalog(parse_source({"subscribe": "a", "shmq.dataDir": str(a_file)},
                                  streaming=False))
    # an executor whose partition directory cannot be listed: one line, not a traceback
    with pytest.raises(BridgeError, match=f"cannot read the segments of a-0 in {a_file}: Not a "
                                          "directory"):
        list(_read_mmap(ReadPlan(transport="mmap"), "a", 0, 0, 10, str(a_file)))
    assert a_file.read_bytes() == b"not a data directory"


def test_malformed_stream_offsets_and_sink_options() -> None:
    # a streaming offset Spark hands back from a checkpoint must have Kafka's shape
    for garbage in ({"t": 5}, {"t": {"zero": 1}}, {"t": {"0": "x"}}, ["t"]):
        with pytest.raises(BridgeError, match="not a Kafka source offset"):
            planning.from_json(garbage)  # type: ignore[arg-type]
    assert planning.from_json({"t": {"0": 42, "1": 7}}) == {("t", 0): 42, ("t", 1): 7}
    with pytest.raises(BridgeError, match="must be one of auto, mmap, kafka"):
        parse_sink({"topic": "t", "shmq.transport": "carrier"})
    with pytest.raises(BridgeError, match="'kafka.bootstrap.servers' is empty"):
        parse_sink({"topic": "t", "kafka.bootstrap.servers": ""})


def test_sink_schema_rules() -> None:
    """Kafka's ``KafkaWriter.validateQuery``: which columns, of which types."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    from spark_bridge.sink import check_sink_schema

    def schema(**cols: Any) -> StructType:
        return StructType([StructField(n, t) for n, t in cols.items()])

    headers = ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))
    assert check_sink_schema(schema(value=BinaryType(), key=StringType(), headers=headers,
                                    partition=IntegerType(), topic=StringType()), None) == \
        ("topic", "key", "value", "headers", "partition")
    assert check_sink_schema(schema(value=StringType(), topic=StringType()), "t") == ("value",)
    for cols, topic, message in [
        ({"key": StringType()}, "t", "required attribute 'value' not found"),
        ({"value": StringType()}, None, "topic option required"),
        ({"value": StringType(), "topic": IntegerType()}, None,
         "topic attribute unsupported type int"),
        ({"value": StringType(), "key": LongType()}, "t", "key attribute unsupported type bigint"),
        ({"value": StringType(), "partition": LongType()}, "t",
         "partition attribute unsupported type bigint"),
        ({"value": StringType(), "timestamp": StringType()}, "t",
         "timestamp attribute unsupported type string"),
        ({"value": StringType(), "headers": ArrayType(StringType())}, "t",
         "headers attribute unsupported type array<string>"),
        ({"value": StringType(), "headers": ArrayType(
            StructType().add("key", BinaryType()).add("value", BinaryType()))}, "t",
         "headers attribute unsupported type"),
    ]:
        with pytest.raises(BridgeError, match=message):
            check_sink_schema(schema(**cols), topic)
