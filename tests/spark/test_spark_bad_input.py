"""Bad input to ``format("shmq")``: each a one-line error naming the problem, raised before or
while the query runs, and nothing stored changes (every file of the data directory hashes the
same before and after)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from _spark_data import create_topics, produce_confluent


def files_digest(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "run" not in path.relative_to(root).parts[:1] \
                and path.suffix in (".log", ".index", ".timeindex", ".snapshot", ".json", "") \
                and not path.name.endswith(".stats.json"):
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def settled_digest(root: Path, timeout: float = 30.0) -> dict[str, str]:
    """``files_digest`` once the broker is done writing on its own: a worker's periodic
    checkpoint (``CHECKPOINT_INTERVAL_MS`` after the last acknowledgement) msyncs the indexes
    and writes the recovery record, creating index files a lazy segment had not written yet."""
    from shmq.storage.log import CHECKPOINT_INTERVAL_MS

    pause = 1.5 * CHECKPOINT_INTERVAL_MS / 1000
    deadline = time.monotonic() + timeout
    digest = files_digest(root)
    while True:
        time.sleep(pause)
        again = files_digest(root)
        if again == digest or time.monotonic() > deadline:
            return again
        digest = again


def error_of(action: Any) -> str:
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark wraps it; the text is checked
        action()
    return str(info.value)


def one_line(text: str, expected: str) -> None:
    lines = [ln for ln in text.splitlines() if "shmq: " in ln]
    assert lines, text[-3000:]
    line = lines[-1][lines[-1].index("shmq: "):]
    assert expected in line, line


@pytest.fixture(scope="module")
def data(sbroker: Any) -> str:
    create_topics(sbroker.bootstrap, {"bad-a": 2, "bad-corrupt": 1})
    produce_confluent(sbroker.bootstrap, "bad-a", 300, "lz4")
    produce_confluent(sbroker.bootstrap, "bad-corrupt", 400, "none", partitions=1)
    return sbroker.bootstrap


def load(spark: Any, bootstrap: str | None, **options: str) -> Any:
    r = spark.read.format("shmq")
    if bootstrap:
        r = r.option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_bad_options_and_offsets(spark: Any, sbroker: Any, data: str) -> None:
    before = settled_digest(sbroker.data_dir)
    cases = [
        ({"subscribe": "bad-a,no-such-topic"}, "unknown topic 'no-such-topic'"),
        ({"assign": '{"bad-a": [0, 7]}'}, "names partition bad-a-7, but topic 'bad-a' has 2"),
        ({"subscribe": "bad-a", "startingOffsets": '{"bad-a": {"0": 1,}}'},
         "option 'startingOffsets' is not valid JSON"),
        ({"subscribe": "bad-a", "startingOffsets": '{"bad-a": {"0": 1, "1": 99999}}'},
         "startingOffsets for bad-a-1 is 99999, past the end of the partition"),
        ({"subscribe": "bad-a", "endingOffsets": '{"bad-a": {"0": 1, "1": 5000}}'},
         "endingOffsets for bad-a-1 is 5000, past the end of the partition"),
        ({"subscribePattern": "bad-b.*"}, "option 'subscribePattern' 'bad-b.*' matches no topic"),
        ({"subscribe": "bad-a", "kafka.auto.offset.reset": "earliest"},
         "Kafka option 'auto.offset.reset' is not supported"),
    ]
    for options, expected in cases:
        one_line(error_of(lambda o=options: load(spark, data, **o).collect()), expected)
    assert files_digest(sbroker.data_dir) == before


def test_missing_and_unreadable_data_dirs(spark: Any, tmp_path: Path, sbroker: Any,
                                          data: str) -> None:
    missing = tmp_path / "nowhere"
    one_line(error_of(lambda: load(spark, None, subscribe="bad-a",
                                   **{"shmq.dataDir": str(missing)}).collect()),
             f"the data directory {missing} does not exist")
    idle = tmp_path / "idle"
    idle.mkdir()
    one_line(error_of(lambda: load(spark, None, subscribe="bad-a",
                                   **{"shmq.dataDir": str(idle)}).collect()),
             f"no shmq broker is running with data directory {idle}")
    (idle / "run").mkdir()
    (idle / "run" / "broker.json").write_text("{not json")
    one_line(error_of(lambda: load(spark, None, subscribe="bad-a",
                                   **{"shmq.dataDir": str(idle)}).collect()),
             f"cannot read {idle}/run/broker.json")
    dead = tmp_path / "dead"
    (dead / "run").mkdir(parents=True)
    info = json.loads((sbroker.data_dir / "run" / "broker.json").read_text())
    info["state_table"] = "/shmq-st-00000000000000000000000000000000"
    (dead / "run" / "broker.json").write_text(json.dumps(info))
    one_line(error_of(lambda: load(spark, None, subscribe="bad-a",
                                   **{"shmq.dataDir": str(dead)}).collect()),
             f"no shmq broker is running with data directory {dead}")


def test_corrupt_segment_is_an_error_naming_the_file(spark: Any, sbroker: Any,
                                                     data: str) -> None:
    segment = next(sbroker.data_dir.glob("worker-*/bad-corrupt-0/00000000000000000000.log"))
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    segment.write_bytes(bytes(raw))
    before = settled_digest(sbroker.data_dir)
    text = error_of(lambda: load(spark, data, subscribe="bad-corrupt").collect())
    one_line(text, f"{segment}: invalid record batch at byte ")
    assert "CRC-32C mismatch" in text
    assert files_digest(sbroker.data_dir) == before
