"""Fixtures for the integration tests: a real ``shmq broker`` on an ephemeral loopback port
(``broker``) and one Apache Kafka broker for the session (``kafka``); the helpers behind them
are in ``_broker.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _broker import (  # noqa: F401  (re-exported for modules that import them from conftest)
    KAFKA_FEATURES,
    KAFKA_TEST_OVERRIDES,
    RunningBroker,
    _remove_stale_shm,
    apache_kafka,
    reference_kafka,
    start_broker,
)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path / "data")
    try:
        yield b
    finally:
        code = b.stop()
        assert code == 0, b.log_path.read_text()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[apache_kafka.KafkaBroker]:
    """One Apache Kafka broker for the whole test session (``reference_kafka``); a test that
    needs a static broker setting of its own starts another with ``reference_kafka``."""
    with reference_kafka(tmp_path_factory.mktemp("apache-kafka")) as k:
        yield k


def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        if "integration" in str(item.fspath) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(240))


os.environ.setdefault("SHMQ_LOG_LEVEL", "WARNING")
