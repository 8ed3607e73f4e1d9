"""Real Spark (local[2]) against a real ``shmq broker``.

One SparkSession serves every Spark test (starting one costs 7-30 s on the 2-core box); it
loads Spark's own Kafka connector (``spark-sql-kafka-0-10`` of the installed pyspark's version,
fetched from Maven Central by Spark's Ivy into ``.cache/ivy``, ignored by git), which is the
oracle: ``format("kafka")`` reading the shmq broker over the wire must give what
``format("shmq")`` reads from the segments.  When the connector cannot be fetched, the oracle
tests skip with one line, or fail when ``CI`` is set (CI must not go green without the oracle).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
IVY = ROOT / ".cache" / "ivy"
MAVEN = "https://repo1.maven.org/maven2"

sys.path.insert(0, str(ROOT / "tests" / "integration"))  # its conftest imports _broker from there
_spec = importlib.util.spec_from_file_location(
    "shmq_test_broker", ROOT / "tests" / "integration" / "conftest.py")
assert _spec is not None and _spec.loader is not None
broker_support = importlib.util.module_from_spec(_spec)
sys.modules["shmq_test_broker"] = broker_support
_spec.loader.exec_module(broker_support)
start_broker = broker_support.start_broker
RunningBroker = broker_support.RunningBroker

os.environ.setdefault("SHMQ_LOG_LEVEL", "WARNING")


def connector_coordinates() -> tuple[str, str]:
    """(Maven coordinates, why not available or ""): the connector matching pyspark."""
    import pyspark

    version = pyspark.__version__
    artifact = "spark-sql-kafka-0-10_2.13"
    coords = f"org.apache.spark:{artifact}:{version}"
    if (IVY / "jars" / f"org.apache.spark_{artifact}-{version}.jar").exists():
        return coords, ""
    url = f"{MAVEN}/org/apache/spark/{artifact}/{version}/{artifact}-{version}.pom"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=15):
            return coords, ""
    except OSError as exc:
        return coords, f"Spark's Kafka connector {coords} cannot be fetched ({url}: {exc})"


@pytest.fixture(scope="session")
def spark_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """(SparkSession, why the Kafka connector is missing or "")."""
    import spark_bridge

    coords, missing = connector_coordinates()
    conf = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
            "spark.driver.memory": "1g"}
    if not missing:
        conf.update({"spark.jars.packages": coords, "spark.jars.ivy": str(IVY)})
    # Spark's block manager and artifact directories, and the native libraries its JVM unpacks,
    # go under the test run's temp dir, removed at the end (by default they are left in /tmp:
    # spark.local.dir and the JVM's java.io.tmpdir)
    scratch = str(tmp_path_factory.mktemp("spark-scratch"))
    conf.update({"spark.local.dir": scratch,
                 "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}"})
    session = spark_bridge.session("shmq-tests", conf=conf)
    try:
        yield session, missing
    finally:
        session.stop()
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def spark(spark_env: tuple[Any, str]) -> Any:
    return spark_env[0]


@pytest.fixture
def kafka_format(spark_env: tuple[Any, str]) -> str:
    """``"kafka"`` when Spark's connector is loaded; otherwise skip (fail under CI)."""
    missing = spark_env[1]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    return "kafka"


@pytest.fixture(scope="module")
def sbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    b = start_broker(tmp_path_factory.mktemp("spark") / "data")
    try:
        yield b
    finally:
        code = b.stop()
        assert code == 0, b.log_path.read_text()[-5000:]


def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        if "tests/spark" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.spark)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(600))
