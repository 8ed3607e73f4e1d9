"""How ``make test`` spreads the suite over its workers (pytest-xdist, ``-n 2 --dist loadscope``).

Each test module is one unit of work: its tests run in one worker, in file order, so a
module-scoped broker or Apache Kafka is started once, as in a serial run.  All Spark modules are
one unit: one worker holds the session-wide SparkSession (a JVM of 1 GiB whose start and Ivy
resolution cost 10-30 s; two sessions resolving into one Ivy cache at once break each other),
not one per worker.  That unit is the longest (5-6 min), so it goes first: one worker runs
Spark while the other works through the rest.

The units are made here (``pytest_xdist_make_scheduler``), not with ``xdist_group`` marks and
``--dist loadgroup``: pytest-xdist 3.8 names a group by rewriting ``item._nodeid``, which pytest 9
no longer reads, so those marks group nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

SPARK = "tests/spark/"


def _unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "spark" if path.startswith(SPARK) else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _unit(item.nodeid) != "spark")  # stable: file order otherwise
