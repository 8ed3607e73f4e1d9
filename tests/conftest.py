"""How ``make test`` spreads the suite over its workers (pytest-xdist, ``-n 2 --dist loadgroup``).

Each test module is one group: its tests run in one worker, in file order, so a module-scoped
broker or Apache Kafka is started once, as in a serial run.  Every Spark module is in one
group: one worker holds the session-wide SparkSession (a JVM of 1 GiB whose start and Ivy
resolution cost 10-30 s), not one per worker.  Without xdist (``pytest tests/x.py``) the marks
do nothing.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = item.path.as_posix()
        group = "spark" if "/tests/spark/" in path else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
