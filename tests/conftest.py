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

It also closes the sockets kafka-python (a test oracle) drops; see ``_close_dropped_sockets``.
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


def _close_dropped_sockets() -> None:
    """kafka-python 3.0.12 drops the socket of a connect that fails or is cancelled unclosed.

    ``KafkaNetSocket.sock_connect`` raises on a refused connect, and a consumer closed while a
    connect waits for the socket to be writable cancels it; neither path closes the socket.
    The refusal is logged with its exception, whose traceback holds the socket, and pytest keeps
    a test's log records to its end; the socket is collected later, and ``filterwarnings =
    error`` turns Python's warning into a failure of whichever test is running then (CI failed
    so in test_kafka_python_group at 58fb36d).  Closing the socket on those paths keeps the warning for every other leak.
    """
    try:
        from kafka.net.inet import KafkaNetSocket
    except ImportError:
        return
    sock_connect = KafkaNetSocket.sock_connect

    async def closing_sock_connect(self: Any, net: Any, sock: Any, sockaddr: Any,
                                   timeout_at: Any = None) -> Any:
        try:
            return await sock_connect(self, net, sock, sockaddr, timeout_at=timeout_at)
        except BaseException:
            sock.close()
            raise

    KafkaNetSocket.sock_connect = closing_sock_connect


_close_dropped_sockets()
