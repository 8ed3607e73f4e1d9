"""Which transport a client uses: shared memory when the broker is on this host, else Kafka.

``shmq.transport`` (``auto`` by default):

* ``kafka``: confluent-kafka, always (any Kafka cluster, or shmq over TCP);
* ``shm``: the shared-memory data path, or an error saying why it is not possible;
* ``auto``: the shared-memory path when ``shmq.data.dir`` names a running broker, or when a
  ``bootstrap.servers`` address on this host belongs to a shmq broker whose data dir is
  readable here (its ``run/broker.json``, found as ``shmq.ipc.client.find_data_dir`` does); a
  remote address, a broker that is not shmq, or files this process cannot read mean Kafka.

Only addresses of this host are probed (a remote cluster costs nothing at construction, as with
confluent-kafka); the probe of a local address that is not found in a default data dir asks the
broker for its ``log.dirs`` over the Kafka protocol (one DescribeConfigs).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from functools import lru_cache
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException

from shmq.client.config import ClientConfig, invalid

PROBE_TIMEOUT_S = 5.0


@lru_cache(maxsize=1)
def _host_addresses() -> frozenset[str]:
    names = {"localhost", socket.gethostname()}
    addrs: set[str] = set()
    for name in names:
        try:
            for info in socket.getaddrinfo(name, None):
                addrs.add(str(info[4][0]))
        except OSError:
            pass
    return frozenset(addrs)


def is_local_address(host: str) -> bool:
    host = host.strip("[]")
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            ips = {str(i[4][0]) for i in socket.getaddrinfo(host, None)}
        except OSError:
            return False
        return any(is_local_address(i) for i in ips)
    return ip.is_loopback or ip.is_unspecified or str(ip) in _host_addresses()


def _split_bootstrap(bootstrap: str) -> list[tuple[str, str]]:
    out = []
    for item in bootstrap.split(","):
        item = item.strip()
        if "://" in item:
            item = item.split("://", 1)[1]
        if not item:
            continue
        host, _, port = item.rpartition(":")
        out.append((host or item, port))
    return out


def _running_broker(data_dir: Path) -> dict | None:
    try:
        info = json.loads((data_dir / "run" / "broker.json").read_text())
    except (OSError, ValueError):
        return None
    return info if info.get("state_table") else None


def local_data_dir(config: ClientConfig) -> Path | None:
    """The data dir of the local broker to use over shared memory, or None for Kafka."""
    if config.transport == "kafka":
        return None
    why = ""
    if config.data_dir is not None:
        data_dir = Path(os.path.expanduser(str(config.data_dir)))
        info = _running_broker(data_dir)
        if info is not None:
            if "bootstrap.servers" not in config.rd and info.get("bootstrap"):
                config.rd["bootstrap.servers"] = info["bootstrap"]
            return data_dir
        why = f"no running shmq broker in {data_dir}"
    else:
        from shmq.ipc.client import NotLocalError, find_data_dir

        bootstrap = str(config.rd.get("bootstrap.servers", config.rd.get("metadata.broker.list",
                                                                         "")))
        for host, port in _split_bootstrap(bootstrap):
            if not is_local_address(host):
                why = f"{host}:{port} is not an address of this host"
                continue
            try:
                return find_data_dir(f"{host}:{port}", timeout=PROBE_TIMEOUT_S)
            except NotLocalError as exc:
                why = str(exc)
                # 127.0.0.1 and localhost name the same broker.json entry differently
                if host == "localhost":
                    try:
                        return find_data_dir(f"127.0.0.1:{port}", timeout=PROBE_TIMEOUT_S)
                    except NotLocalError:
                        pass
        if not bootstrap:
            why = "neither bootstrap.servers nor shmq.data.dir is set"
    if config.transport == "shm":
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG,
                                        f"shmq.transport=shm: no local shmq broker ({why})"))
    return None


def check_transport_value(value: str) -> None:
    if value not in ("auto", "shm", "kafka"):
        raise invalid("shmq.transport", value)
