"""Helpers of the monitoring tests: the broker's HTTP listener, Debian binaries, traffic."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from _broker import RunningBroker


def require_binary(name: str) -> str:
    """The path of a Debian tool the test needs; `make setup` installs it, so in CI a missing
    one fails the test rather than skipping it."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (make setup installs it)")
        pytest.skip(f"{name} is not installed (make setup installs it)")
    return path


def http_address(broker: RunningBroker) -> str:
    address = broker.run_info.get("http")
    assert address, broker.run_info
    return address


def get(address: str, path: str, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://{address}{path}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def snapshot(address: str) -> dict[str, Any]:
    status, _, body = get(address, "/api/v1/snapshot")
    assert status == 200
    return json.loads(body)


def metrics(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics parsed by prometheus_client's own parser (the oracle for the format):
    {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    status, headers, body = get(address, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{key} not in /metrics: " + ", ".join(
        str(k) for k in samples if k[0] == name)
    return samples[key]


def produce(bootstrap: str, topic: str, count: int, *, partitions: int | None = None,
            rate: float | None = None, size: int = 100) -> None:
    """``count`` records, acks=all, each acknowledged (paced at ``rate`` records/s if given)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    failed = []
    start = time.monotonic()
    payload = b"x" * size
    for i in range(count):
        kwargs = {"partition": i % partitions} if partitions else {}
        p.produce(topic, payload, on_delivery=lambda err, _m: err and failed.append(err),
                  **kwargs)
        if rate:
            wait = start + (i + 1) / rate - time.monotonic()
            if wait > 0:
                p.poll(wait)
        else:
            p.poll(0)
    assert p.flush(30) == 0
    assert not failed, failed[:3]


def consume(bootstrap: str, topic: str, group: str, count: int, timeout: float = 30) -> Any:
    """A subscribed consumer that read and committed exactly ``count`` records; still open
    (the caller closes it), so its group has a member."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + timeout
    while got < count and time.monotonic() < deadline:
        msgs = c.consume(min(500, count - got), 0.5)
        for m in msgs:
            assert m.error() is None, m.error()
        got += len(msgs)
        if msgs:
            c.commit(asynchronous=False)
    assert got == count
    return c
