"""How ``make test`` spreads the suite over its workers (pytest-xdist, ``-n 2 --dist loadgroup``).

Each test module is one group: its tests run in one worker, in file order, so a module-scoped
broker or Apache Kafka is started once, as in a serial run.  Every Spark module is in one
group: one worker holds the session-wide SparkSession (a JVM of 1 GiB whose start and Ivy
resolution cost 10-30 s), not one per worker.  That group is the longest (5-6 min), so it goes
first: one worker runs Spark while the other works through the rest.  Without xdist
(``pytest tests/x.py``) the marks do nothing.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def spark(item: pytest.Item) -> bool:
        return "/tests/spark/" in item.path.as_posix()

    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = "spark" if spark(item) else item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not spark(item))  # stable: file order within each part
