"""bench_scale's ``partitions`` part: its keyed rows' data and its table (perf/bench_scale.py).

The keyed rows exist to fill every partition of a 1,000-partition topic: the keys must spread
under both partitioners a client may use, librdkafka's default (``consistent_random``: CRC-32 of
the key, zlib's polynomial) and Kafka's Java one (murmur2; kafka-python's is the oracle)."""

from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
from kafka.partitioner.default import murmur2

PERF = Path(__file__).resolve().parents[2] / "perf"


@pytest.fixture
def perf(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    monkeypatch.syspath_prepend(str(PERF))
    import bench_scale
    import suite_load

    return bench_scale, suite_load


@pytest.mark.parametrize("partitions", [6, 1000])
def test_the_keys_spread_over_every_partition(
        perf: tuple[ModuleType, ModuleType], partitions: int) -> None:
    _, suite_load = perf
    keys = suite_load.keys(200_000)
    assert len(set(keys)) == len(keys)
    crc = Counter(zlib.crc32(k) % partitions for k in keys)
    java = Counter((murmur2(k) & 0x7FFFFFFF) % partitions for k in keys)
    for hashed in (crc, java):
        assert len(hashed) == partitions
        # spread evenly, not merely touched: 200 a partition at 1,000 partitions
        assert min(hashed.values()) > 0.5 * len(keys) / partitions


def test_the_keyed_lines_carry_those_keys_and_the_null_rows_values(
        perf: tuple[ModuleType, ModuleType], tmp_path: Path) -> None:
    """kcat ``-K:`` splits each line at its first ``:``: the key is ``suite_load.keys``'s and
    the value is the null-key file's line, ``size`` bytes (the consume phase counts them)."""
    bench_scale, suite_load = perf
    n, size = 12_345, 100
    bench_scale.write_keyed_lines(tmp_path / "keyed", n, size)
    bench_scale.write_lines(tmp_path / "null", n, size)
    keyed = (tmp_path / "keyed").read_bytes().splitlines()
    assert [line.split(b":", 1)[0] for line in keyed] == suite_load.keys(n)
    assert [line.split(b":", 1)[1] for line in keyed] == (tmp_path / "null").read_bytes().splitlines()
    assert {len(line.split(b":", 1)[1]) for line in keyed} == {size}


def test_each_row_is_divided_by_its_own_six_partition_row(
        perf: tuple[ModuleType, ModuleType]) -> None:
    bench_scale, _ = perf
    Row = bench_scale.Row

    def samples(rate: float, counted: bool) -> list[dict[str, float]]:
        extra = {"Produce": 0, "Fetch": 5, "ListOffsets": 6, "long_polls": 1} if counted else {}
        return [{"seconds": 1.0, "msg_s": rate * f, "cpu_s_per_M": 0.1, "client_cpu_s": 0.5,
                 "with_data": 6, **extra} for f in (0.9, 1.0, 1.1)]

    rows = {}
    for broker, base in (("shmq", 1000.0), ("kafka", 400.0)):
        for keys, share in (("null", 0.5), ("keyed", 0.25)):
            rows[Row(broker, "kcat", "consume", keys, 6)] = samples(base, broker == "shmq")
            rows[Row(broker, "kcat", "consume", keys, 1000)] = samples(base * share,
                                                                        broker == "shmq")
    table, out = bench_scale.partition_rows(rows)
    got = {(r[0], r[1], r[2]): r[8] for r in table}
    assert got == {
        ("shmq", "consume kcat", "6"): "1.00x", ("kafka", "consume kcat", "6"): "1.00x",
        ("shmq", "consume kcat", "1,000"): "0.50x", ("kafka", "consume kcat", "1,000"): "0.50x",
        ("shmq", "consume kcat keyed", "6"): "1.00x",
        ("kafka", "consume kcat keyed", "6"): "1.00x",
        ("shmq", "consume kcat keyed", "1,000"): "0.25x",
        ("kafka", "consume kcat keyed", "1,000"): "0.25x"}
    # the null-key rows first, each partition count's shmq row beside its Kafka row
    assert [(r[0], r[1], r[2]) for r in table][:4] == [
        ("shmq", "consume kcat", "6"), ("kafka", "consume kcat", "6"),
        ("shmq", "consume kcat", "1,000"), ("kafka", "consume kcat", "1,000")]
    kafka_row = next(r for r in table if r[0] == "kafka")
    assert kafka_row[-2:] == ["-", "-"]  # no metrics table on Kafka: no request counts
    assert {r["broker"] for r in out} == {"shmq", "kafka"}
    assert all(r["vs_6"] is not None for r in out)
