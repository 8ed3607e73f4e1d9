"""What the driver asks before it plans: which partitions exist and their offset bounds.

Two catalogs answer the same questions:

* ``LocalCatalog`` - a shmq broker on this host.  Topics and partitions come from
  ``<data-dir>/run/broker.json`` (its slot directory), the log start and high watermark of
  each partition from the broker's shared-memory state table (one seqlocked read each, no
  round trip).  A slot that is not published yet, or that stays mid-write past the reader's
  spin budget, and timestamp lookups (Kafka's ListOffsets rules) are asked of the broker itself
  over the Kafka protocol.
* ``KafkaCatalog`` - any Kafka-protocol broker (a remote shmq, Apache Kafka) through
  confluent-kafka's AdminClient: Metadata and ListOffsets, as Spark's ``KafkaOffsetReaderAdmin``.

``open_catalog`` picks one: ``shmq.transport=kafka`` forces the second; otherwise the local one
is used when a running broker's data directory is found (``shmq.dataDir``; else the broker
named by ``kafka.bootstrap.servers`` is asked for its ``log.dirs`` and the directory is used if
it exists here and belongs to the same cluster; else the default data directory).
"""

from __future__ import annotations

import json
import logging
import os
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from spark_bridge.errors import BridgeError
from spark_bridge.options import default_data_dir

TopicPartition = tuple[str, int]
log = logging.getLogger("shmq.spark")
_TIMEOUT_S = 30.0
_INTERNAL_PREFIX = "__"


class Catalog(ABC):
    """Partition discovery and offset bounds for planning (driver side)."""

    transport: str = "kafka"
    bootstrap: str | None = None
    cluster_id: str | None = None
    data_dir: Path | None = None

    @abstractmethod
    def topics(self) -> dict[str, int]:
        """Topic name -> partition count (internal topics left out)."""

    @abstractmethod
    def earliest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""

    @abstractmethod
    def latest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark (last stable offset for read_committed) of each partition."""

    @abstractmethod
    def offsets_for_times(self, times: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """ListOffsets by timestamp: the first offset whose record timestamp is >= the time,
        or -1 where there is none."""

    def partition_dir(self, tp: TopicPartition) -> str | None:
        """The directory holding the partition's segments (local catalogs only)."""
        return None

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        pass

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- any Kafka broker ----------------------------------------------------------------------


class KafkaCatalog(Catalog):
    transport = "kafka"

    def __init__(self, bootstrap: str, conf: dict[str, str] | None = None,
                 isolation_level: str = "read_uncommitted") -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.isolation_level = isolation_level
        self.admin = AdminClient(client_conf(bootstrap, conf, admin=True))
        self._metadata: Any = None

    def _cluster(self) -> Any:
        from confluent_kafka import KafkaException

        try:
            md = self.admin.list_topics(timeout=_TIMEOUT_S)
        except KafkaException as exc:
            raise BridgeError(f"cannot reach the Kafka broker at {self.bootstrap}: "
                              f"{exc.args[0].str() if exc.args else exc}") from None
        self.cluster_id = md.cluster_id
        return md

    def topics(self) -> dict[str, int]:
        md = self._cluster()
        return {name: len(t.partitions) for name, t in md.topics.items()
                if t.error is None and not name.startswith(_INTERNAL_PREFIX)}

    def _list_offsets(self, specs: dict[TopicPartition, Any]) -> dict[TopicPartition, int]:
        from confluent_kafka import IsolationLevel, KafkaException
        from confluent_kafka import TopicPartition as TP

        if not specs:
            return {}
        level = (IsolationLevel.READ_COMMITTED if self.isolation_level == "read_committed"
                 else IsolationLevel.READ_UNCOMMITTED)
        futures = self.admin.list_offsets({TP(t, p): spec for (t, p), spec in specs.items()},
                                          isolation_level=level, request_timeout=_TIMEOUT_S)
        out = {}
        for tp, fut in futures.items():
            try:
                out[(tp.topic, tp.partition)] = fut.result().offset
            except KafkaException as exc:
                err = exc.args[0]
                raise BridgeError(f"cannot list the offsets of {tp.topic}-{tp.partition}: "
                                  f"{err.str() if hasattr(err, 'str') else err}") from None
        return out

    def earliest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets({tp: OffsetSpec.earliest() for tp in tps})

    def latest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets({tp: OffsetSpec.latest() for tp in tps})

    def offsets_for_times(self, times: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets({tp: OffsetSpec.for_timestamp(ts) for tp, ts in times.items()})


# -- a shmq broker on this host ------------------------------------------------------------


class LocalCatalog(Catalog):
    transport = "mmap"

    def __init__(self, data_dir: Path, conf: dict[str, str] | None = None,
                 isolation_level: str = "read_uncommitted") -> None:
        self.data_dir: Path = data_dir
        self.local_dir = data_dir
        self.conf = dict(conf or {})
        self.isolation_level = isolation_level
        self.info = read_run_file(data_dir)
        self.bootstrap = self.info.get("bootstrap")
        self.cluster_id = self.info.get("cluster_id")
        self._table: Any = None
        self._remote: KafkaCatalog | None = None

    def refresh(self) -> None:
        """Re-read broker.json (new topics, a restarted broker)."""
        info = read_run_file(self.local_dir)
        if info.get("state_table") != self.info.get("state_table") and self._table is not None:
            self._table.close()
            self._table = None
        self.info = info
        self.bootstrap = info.get("bootstrap")

    def _state_table(self) -> Any:
        if self._table is None:
            from shmq.ipc.state_table import StateTable, StateTableError

            name = self.info.get("state_table")
            if not name:
                raise BridgeError(f"the broker of {self.data_dir} publishes no state table")
            try:
                self._table = StateTable.attach(name)
            except FileNotFoundError:
                raise BridgeError(f"no shmq broker is running with data directory "
                                  f"{self.data_dir} (its state table {name} is gone); start "
                                  f"one with: shmq broker --data-dir {self.data_dir}") from None
            except (PermissionError, StateTableError) as exc:
                raise BridgeError(f"cannot use the state table of {self.data_dir}: "
                                  f"{exc}") from None
        return self._table

    def remote(self) -> KafkaCatalog:
        """The same broker over the Kafka protocol (for what shared memory does not hold)."""
        if self._remote is None:
            if not self.bootstrap:
                raise BridgeError(f"{self.data_dir}/run/broker.json names no bootstrap address")
            self._remote = KafkaCatalog(self.bootstrap, self.conf, self.isolation_level)
        return self._remote

    def topics(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for key in self.info.get("slots", {}):
            topic, _, part = key.rpartition("/")
            if topic.startswith(_INTERNAL_PREFIX):
                continue
            counts[topic] = max(counts.get(topic, 0), int(part) + 1)
        return counts

    def _states(self, tps: list[TopicPartition]) -> dict[TopicPartition, Any]:
        """Published slot states; partitions without one are left out (ask the broker)."""
        table = self._state_table()
        slots = self.info.get("slots", {})
        out = {}
        for tp in tps:
            slot = slots.get(f"{tp[0]}/{tp[1]}")
            if slot is None:
                continue
            state = None
            for _ in range(3):
                state = table.read(slot)
                if state is not None:
                    break
                time.sleep(0.001)
            if state is not None and state.leader >= 0 and state.high_watermark >= 0:
                out[tp] = state
        return out

    def earliest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        states = self._states(tps)
        out = {tp: s.log_start for tp, s in states.items()}
        missing = [tp for tp in tps if tp not in out]
        out.update(self.remote().earliest(missing) if missing else {})
        return out

    def latest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        states = self._states(tps)
        committed = self.isolation_level == "read_committed"
        out = {tp: s.last_stable if committed else s.high_watermark for tp, s in states.items()}
        missing = [tp for tp in tps if tp not in out]
        out.update(self.remote().latest(missing) if missing else {})
        return out

    def offsets_for_times(self, times: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        return self.remote().offsets_for_times(times)

    def partition_dir(self, tp: TopicPartition) -> str | None:
        return find_partition_dir(self.local_dir, tp, self._states([tp]).get(tp))

    def close(self) -> None:
        if self._table is not None:
            self._table.close()
            self._table = None
        self._remote = None


def find_partition_dir(data_dir: Path | str, tp: TopicPartition, state: Any = None) -> str | None:
    """``<data-dir>/worker-<leader>/<topic>-<partition>``: the leader named by the state slot,
    else whichever worker directory holds the partition."""
    name = f"{tp[0]}-{tp[1]}"
    base = Path(data_dir)
    if state is not None and state.leader > 0:
        path = base / f"worker-{state.leader}" / name
        if path.is_dir():
            return str(path)
    try:
        workers = sorted(p for p in base.iterdir() if p.name.startswith("worker-"))
    except OSError:
        return None
    for w in workers:
        if (w / name).is_dir():
            return str(w / name)
    return None


def read_run_file(data_dir: Path) -> dict[str, Any]:
    path = Path(data_dir) / "run" / "broker.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        if not Path(data_dir).exists():
            raise BridgeError(f"the data directory {data_dir} does not exist") from None
        raise BridgeError(f"no shmq broker is running with data directory {data_dir} "
                          f"({path} not found); start one with: shmq broker --data-dir "
                          f"{data_dir}") from None
    except PermissionError as exc:
        raise BridgeError(f"cannot read the data directory {data_dir}: {exc.strerror}") from None
    except (OSError, ValueError) as exc:
        raise BridgeError(f"cannot read {path}: {exc}") from None


# -- choosing ------------------------------------------------------------------------------


def client_conf(bootstrap: str, conf: dict[str, str] | None, *, admin: bool = False) -> dict:
    """confluent-kafka settings from the ``kafka.*`` options (librdkafka knows most Java names);
    Java-only names librdkafka rejects are dropped with a warning by ``make_client``."""
    out = {"bootstrap.servers": bootstrap, "client.id": "shmq-spark"}
    for k, v in (conf or {}).items():
        out[k] = v
    if admin:
        for k in ("isolation.level", "max.poll.records", "fetch.max.bytes"):
            out.pop(k, None)
    out.setdefault("log_level", "3")  # errors only: librdkafka's reconnect notices are noise
    return out


def open_catalog(opts: Any) -> Catalog:
    """The catalog for a query's options (a ``SourceOptions`` or ``SinkOptions``)."""
    transport = getattr(opts, "transport", "auto")
    conf = opts.kafka_conf
    if transport == "kafka":
        bootstrap = opts.bootstrap or _local_bootstrap(opts.data_dir or default_data_dir())
        return KafkaCatalog(bootstrap, conf, getattr(opts, "isolation_level", "read_uncommitted"))
    data_dir = locate_data_dir(opts.data_dir, opts.bootstrap, conf)
    if data_dir is not None:
        return LocalCatalog(data_dir, conf, getattr(opts, "isolation_level", "read_uncommitted"))
    if transport == "mmap":
        raise BridgeError(f"shmq.transport=mmap, but the broker at {opts.bootstrap} keeps no "
                          "data directory on this host (use shmq.transport=kafka or auto)")
    assert opts.bootstrap is not None
    return KafkaCatalog(opts.bootstrap, conf, getattr(opts, "isolation_level", "read_uncommitted"))


def _local_bootstrap(data_dir: Path) -> str:
    bootstrap = read_run_file(data_dir).get("bootstrap")
    if not bootstrap:
        raise BridgeError(f"{data_dir}/run/broker.json names no bootstrap address")
    return bootstrap


def locate_data_dir(data_dir: Path | None, bootstrap: str | None,
                    conf: dict[str, str]) -> Path | None:
    """The data directory of a running local broker for these options, or None (then the
    data is not local: read over the Kafka protocol)."""
    if data_dir is not None:
        read_run_file(data_dir)  # a clear error if there is no broker
        return data_dir
    if bootstrap is None:
        data_dir = default_data_dir()
        read_run_file(data_dir)
        return data_dir
    ports = {server.rsplit(":", 1)[-1] for server in bootstrap.split(",")}
    candidate = default_data_dir()
    try:
        info = json.loads((candidate / "run" / "broker.json").read_text())
        if str(info.get("bootstrap", "")).rsplit(":", 1)[-1] in ports and _is_local(candidate):
            return candidate
    except (OSError, ValueError):
        pass
    return _ask_broker_for_data_dir(bootstrap, conf)


def _is_local(data_dir: Path) -> bool:
    try:
        info = json.loads((data_dir / "run" / "broker.json").read_text())
        pid = int(info.get("controller_pid", 0))
        os.kill(pid, 0)
        return pid > 0
    except (OSError, ValueError, TypeError):
        return False


def _ask_broker_for_data_dir(bootstrap: str, conf: dict[str, str]) -> Path | None:
    """A shmq broker answers DescribeConfigs(broker 1) ``log.dirs`` with
    ``<data-dir>/worker-1``; the directory is ours if it exists here with a broker.json of the
    same cluster.  Apache Kafka (or a remote shmq) gives a directory that is not here, or is
    not a shmq data directory."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient(client_conf(bootstrap, conf, admin=True))
    try:
        md = admin.list_topics(timeout=_TIMEOUT_S)
    except KafkaException as exc:
        raise BridgeError(f"cannot reach the Kafka broker at {bootstrap}: "
                          f"{exc.args[0].str() if exc.args else exc}") from None
    node = min((b for b in md.brokers if b > 0), default=None)
    if node is None:
        return None
    resource = ConfigResource(ConfigResource.Type.BROKER, str(node))
    try:
        configs = admin.describe_configs([resource], request_timeout=_TIMEOUT_S)[resource].result()
    except KafkaException:
        return None
    entry = configs.get("log.dirs") or configs.get("log.dir")
    if entry is None or not entry.value:
        return None
    candidate = Path(entry.value.split(",")[0]).parent
    try:
        info = json.loads((candidate / "run" / "broker.json").read_text())
    except (OSError, ValueError):
        return None
    if info.get("cluster_id") != md.cluster_id or not _is_local(candidate):
        return None
    return candidate
