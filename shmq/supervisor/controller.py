"""The controller process: Kafka node 0, metadata owner, and the workers' supervisor.

Theory of operation (gunicorn's Arbiter, STYLE.md §6)
-----------------------------------------------------
* Boot: lock the data dir, load the metadata, bind the bootstrap listener and one listening
  socket per worker (so every broker address is known before any worker starts), spawn N
  workers (each a fork of the fork server, ``forkserver.py``, or else a ``python -m
  shmq.worker``, with a socketpair as control channel and its listening socket passed in),
  send each the current metadata as its first message, wait until each reports ready (it has
  opened its logs with that metadata and serves), then write ``run/broker.json`` (0600) so
  local tools find the broker.  The controller keeps every worker's listening socket open for
  the broker's lifetime: while a worker restarts, clients that connect wait in the backlog.
* Serve: the controller answers ApiVersions, Metadata, CreateTopics, DeleteTopics and
  InitProducerId itself, and the workers' RPCs for the same admin operations.  It leads the
  internal topic ``__consumer_offsets`` (the group coordinator's log) and serves Fetch and
  ListOffsets for it (``shmq.broker.internal_topics``).  The transaction coordinator runs here
  too (``shmq.coordinator.transactions``, its ``__transaction_state`` log beside the offsets):
  its markers go to the partitions' workers over their control channels
  (``write_txn_markers``, retried through worker restarts), and workers ask it to verify a
  transactional write that opens a transaction (``verify_txn``).  A metadata change
  is answered only after every live worker acknowledged it, so a client that creates a topic and
  produces at once never reaches a worker that has not heard of the topic.
* Supervise: a worker that exits is restarted on the same port after recovering its logs; a
  worker that fails at boot (exit code BOOT_ERROR, or a ``boot_error`` message) halts the broker
  with its message instead of crash-looping.  A worker that dies again within
  ``STABLE_AFTER_S`` of its start is restarted after a doubling delay (0.1 s up to 10 s), so a
  crash loop neither spins nor takes the other workers' partitions down (gunicorn restarts
  crashed workers without limit; only boot failures halt it).
* Stop: SIGINT/SIGTERM only set an event; the main task then asks each worker to stop (clean
  shutdown: flushed logs, trimmed indexes, ``.kafka_cleanshutdown``), waits, and exits.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shmq.broker.config import BrokerConfig
from shmq.broker.context import BrokerContext, TopicRequest, TopicResult
from shmq.broker.internal_topics import InternalLogs, offsets_topic_configs
from shmq.broker.metadata import (
    INTERNAL_TOPICS,
    OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    MetadataStore,
)
from shmq.broker.router import Router
from shmq.limits import Throttled, install_loop_handler, nofile
from shmq.net.connection import serve, stop_draining
from shmq.storage import checkpoint
from shmq.storage.relocate import relocate_orphan_logs
from shmq.supervisor.control import ControlChannel
from shmq.supervisor.forkserver import ForkedProcess, ForkServer
from shmq.worker.main import BOOT_ERROR

log = logging.getLogger("shmq.controller")
_throttled = Throttled(log)

UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST, UNKNOWN_TOPIC_ID = 3, 42, 100
STABLE_AFTER_S = 10.0  # a worker that ran this long before dying restarts at once
PREPARE_AFTER_S = 2.0  # __consumer_offsets partitions are created this long after it is listed
RESTART_BACKOFF_S, RESTART_BACKOFF_MAX_S = 0.1, 10.0


class BootError(Exception):
    """The broker cannot start (a worker failed at boot, the data dir is locked, ...)."""


class WorkerHandle:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.proc: subprocess.Popen | ForkedProcess | None = None
        self.started_by = ""  # "fork" (the fork server) or "exec"
        self.channel: ControlChannel | None = None
        self.listener: socket.socket | None = None  # bound by the controller, served by the worker
        self.port = 0
        self.acked_generation = -1
        self.sent_generation = -1
        self.sent_topics: dict[str, str] | None = None  # the topics' JSON it was last sent
        self.ready = asyncio.Event()
        self.acked = asyncio.Condition()
        self.started = 0.0  # monotonic time of its last ready message
        self.quick_crashes = 0  # deaths in a row within STABLE_AFTER_S of starting
        self.restarts = 0
        self.boot_error: str | None = None
        self.marker_waits: dict[int, asyncio.Future] = {}  # txn_markers requests, by id


class Controller:
    def __init__(self, config: BrokerConfig, forks: ForkServer | None = None) -> None:
        self.config = config
        self.forks = forks
        self.data_dir = config.data_dir
        self.workers = {i: WorkerHandle(i) for i in range(1, config.workers + 1)}
        self.stop_event = asyncio.Event()
        self.halt_reason: str | None = None
        self.store: MetadataStore | None = None
        self.port = 0
        self.state_table: Any = None
        self.shm_tracker: Any = None
        self.metrics_table: Any = None   # shmq.ipc.MetricsTable (None: collection off)
        self.http: Any = None            # shmq.monitor.http.MonitorServer (None: no listener)
        self._marker_ids = 0

    # -- ControllerApi ----------------------------------------------------------------------

    async def create_topics(self, topics: Sequence[TopicRequest],
                            validate_only: bool) -> list[TopicResult]:
        """Kafka's CreateTopics (``admin.plan_create_topics`` decides); answered once every
        live worker has the new metadata, so the logs exist when the client hears back."""
        assert self.store is not None
        from shmq.broker.admin import plan_create_topics

        results, creations = plan_create_topics(self.store.metadata, topics, self.config.log,
                                                self.config.num_partitions, sorted(self.workers))
        if validate_only:  # Kafka draws the id it would have given the topic
            for c in creations:
                results[c.index].topic_id = str(uuid.uuid4())
            return results
        if not creations:
            return results
        for c in creations:
            info = self.store.create_topic(c.name, c.partitions, sorted(self.workers), c.configs,
                                           c.leaders)
            self._reset_metric_slots(info.partitions)
            results[c.index].topic_id = info.topic_id
        await self.publish_metadata()
        return results

    async def delete_topics(self, names: Sequence[str],
                            ids: Sequence[str] = ()) -> list[TopicResult]:
        """Delete topics named by name or by id (``ControllerApis.deleteTopics`` resolves ids
        and names first; the caller has answered requests naming a topic twice or both ways).
        A name that resolves to an id also given is INVALID_REQUEST."""
        assert self.store is not None
        meta = self.store.metadata
        by_id = {t.topic_id: t.name for t in meta.topics.values()}
        results: list[TopicResult] = []
        doomed: dict[str, str] = {}  # id -> name
        for topic_id in ids:
            name = by_id.get(topic_id)
            if name is None:
                results.append(TopicResult(None, UNKNOWN_TOPIC_ID,
                                           "This server does not host this topic ID.", topic_id))
            elif name in INTERNAL_TOPICS:
                results.append(_internal_not_deleted(name, topic_id))
            else:
                doomed[topic_id] = name
        for name in names:
            info = meta.topics.get(name)
            if info is None:
                results.append(TopicResult(name, UNKNOWN_TOPIC_OR_PARTITION,
                                           "This server does not host this topic-partition."))
            elif name in INTERNAL_TOPICS:
                results.append(_internal_not_deleted(name, info.topic_id))
            elif info.topic_id in doomed:
                del doomed[info.topic_id]
                results.append(TopicResult(name, INVALID_REQUEST, "The provided topic name maps "
                                           "to an ID that was already supplied.", info.topic_id))
            else:
                doomed[info.topic_id] = name
        for topic_id, name in doomed.items():
            self.store.delete_topic(name)
            results.append(TopicResult(name, 0, None, topic_id))
        if doomed:
            await self.publish_metadata()
            if self.ctx.coordinator is not None:  # their committed offsets go too
                self.ctx.coordinator.on_topics_deleted(list(doomed.values()))
        return results

    async def create_internal_topic(self, name: str, wait: bool = True) -> bool:
        """List an internal topic whose coordinator runs here (Kafka creates it on the first
        FindCoordinator or Metadata request naming it); False for one that has none yet.
        ``wait``: return once every worker has the new metadata (a Metadata answer lists the
        topic from any node), else at once (FindCoordinator does not need the workers)."""
        assert self.store is not None
        if name in self.store.metadata.topics:
            return True
        if name == TRANSACTION_STATE_TOPIC and self.ctx.txn_coordinator is not None:
            published = self._register_txn_topic()
            if wait:
                await asyncio.shield(published)
            return True
        if name != OFFSETS_TOPIC or self.ctx.coordinator is None:
            return False
        published = self._register_offsets_topic()
        if wait:  # the requesting client may go away meanwhile: the workers hear of it anyway
            await asyncio.shield(published)
        return True

    def _register_offsets_topic(self) -> asyncio.Future:
        """List ``__consumer_offsets`` (at once here) and tell the workers (the future); its
        partition logs are created in a thread meanwhile, as Kafka creates them with the
        topic."""
        assert self.store is not None
        self.store.register_internal_topic(
            OFFSETS_TOPIC, self.ctx.coordinator.log.partitions,
            offsets_topic_configs(self.config.offsets_topic_segment_bytes))
        self._prepare_offsets_partitions()
        task = asyncio.ensure_future(self.publish_metadata())
        task.add_done_callback(_log_failure("publishing the metadata"))
        return task

    def _register_txn_topic(self) -> asyncio.Future:
        """List ``__transaction_state`` (Kafka creates it at the first FindCoordinator for a
        transactional id); its partition logs are created on first use."""
        assert self.store is not None
        self.store.register_internal_topic(
            TRANSACTION_STATE_TOPIC, self.ctx.txn_coordinator.log.partitions,
            offsets_topic_configs(self.config.offsets_topic_segment_bytes))
        task = asyncio.ensure_future(self.publish_metadata())
        task.add_done_callback(_log_failure("publishing the metadata"))
        return task

    def _txn_appended(self, partition: int) -> None:
        assert self.store is not None
        if TRANSACTION_STATE_TOPIC not in self.store.metadata.topics:
            self._register_txn_topic()
        self.ctx.notify_data(TRANSACTION_STATE_TOPIC, partition)

    def _prepare_offsets_partitions(self) -> None:
        """Create the partition logs in a thread, starting ``PREPARE_AFTER_S`` from now: the
        first groups, which listed the topic, commit meanwhile without competing with 100
        fsyncs for the disk (they create their own partition if it is not there yet)."""
        loop = asyncio.get_running_loop()

        def start() -> None:
            if self.ctx.coordinator.log.closed:
                return
            prepared = loop.run_in_executor(None, self.ctx.coordinator.log.prepare)
            prepared.add_done_callback(_log_failure(f"creating the {OFFSETS_TOPIC} partitions"))

        loop.call_later(PREPARE_AFTER_S, start)

    def _offsets_appended(self, partition: int) -> None:
        """The coordinator appended to ``__consumer_offsets-<partition>``: the topic is listed
        from its first record on, and long-polling fetches of the partition wake up."""
        assert self.store is not None
        if OFFSETS_TOPIC not in self.store.metadata.topics:
            self._register_offsets_topic()
        self.ctx.notify_data(OFFSETS_TOPIC, partition)

    # -- transaction markers ----------------------------------------------------------------

    async def write_txn_markers(self, markers: list[tuple[Any, ...]]) -> None:
        """Write COMMIT/ABORT markers into worker partitions (Kafka's
        ``TransactionMarkerChannelManager``): each to its partition's leader over the control
        channel, retried (with a doubling pause up to 1 s) while the worker is down or
        restarting, until every marker is written or its partition is gone.  A marker refused
        for an older producer or coordinator epoch counts as written (Kafka gives up on those)."""
        from shmq.coordinator.transactions import COORDINATOR_EPOCH

        pending = list(markers)
        pause = 0.05
        rounds = 0
        while pending and not self.stop_event.is_set():
            rounds += 1
            meta = self.ctx.metadata
            by_node: dict[int, list[tuple[Any, ...]]] = {}
            for m in pending:
                leader = meta.leader_of(m[0], m[1]) if m[0] in meta.topics else None
                if leader is None or leader < 0:
                    log.warning("transaction marker for %s-%d dropped: no such partition",
                                m[0], m[1])
                    continue
                by_node.setdefault(leader, []).append(m)
            nodes = list(by_node)
            answers = await asyncio.gather(*(self._send_markers(n, by_node[n], COORDINATOR_EPOCH)
                                             for n in nodes))
            pending = []
            refused: dict[tuple[str, int], int | None] = {}
            for node, errors in zip(nodes, answers, strict=True):
                codes: list[int | None] = list(errors) if errors else [None] * len(by_node[node])
                for m, code in zip(by_node[node], codes, strict=True):
                    if code in (47, 52):
                        log.warning("transaction marker for %s-%d (producer %d epoch %d) "
                                    "refused with error %d", m[0], m[1], m[2], m[3], code)
                    elif code not in (0, 3):
                        pending.append(m)
                        refused[(m[0], m[1])] = code
            if pending and rounds % 20 == 0:  # about every 20 s once the pause is 1 s
                log.warning("transaction markers not written after %d attempts: %s (None: the "
                            "worker is down or did not answer)", rounds,
                            ", ".join(f"{t}-{p}: {c}" for (t, p), c in sorted(refused.items())))
            if pending:
                await asyncio.sleep(pause)
                pause = min(1.0, pause * 2)
        if pending:
            raise ConnectionError("stopping with transaction markers unwritten")

    async def _send_markers(self, node: int, markers: list[Any],
                            coordinator_epoch: int) -> list[int] | None:
        w = self.workers.get(node)
        if w is None or w.channel is None or not w.ready.is_set():
            return None
        self._marker_ids += 1
        rid = self._marker_ids
        fut = asyncio.get_running_loop().create_future()
        w.marker_waits[rid] = fut
        try:
            w.channel.send({"type": "txn_markers", "id": rid, "coordinator_epoch":
                            coordinator_epoch, "markers": [list(m) for m in markers]})
            return await asyncio.wait_for(fut, 30)  # type: ignore[no-any-return]
        except (ConnectionError, RuntimeError, asyncio.TimeoutError):
            return None
        finally:
            w.marker_waits.pop(rid, None)

    async def _offsets_marker(self, partition: int, producer_id: int, producer_epoch: int,
                              commit: bool, transaction_version: int = 0) -> None:
        from shmq.coordinator.transactions import COORDINATOR_EPOCH

        coordinator = self.ctx.coordinator
        where = coordinator.write_txn_marker(partition, producer_id, producer_epoch,
                                             COORDINATOR_EPOCH, commit, transaction_version)
        await coordinator.log.durable(*where)

    def _start_txn_coordinator(self) -> Any:
        """The transaction coordinator, its ``__transaction_state`` log under
        ``<data dir>/controller`` replayed before the listener opens."""
        from shmq.coordinator.transactions import TransactionCoordinator, TxnConfig

        c = self.config
        assert self.store is not None
        registered = self.store.metadata.topics.get(TRANSACTION_STATE_TOPIC)

        def topic_partitions(topic: str) -> int | None:
            info = self.ctx.metadata.topics.get(topic)
            if info is None and topic == OFFSETS_TOPIC:
                return self.ctx.coordinator.log.partitions
            return None if info is None else len(info.partitions)

        coordinator = TransactionCoordinator(
            self.data_dir / "controller", TxnConfig(
                max_timeout_ms=c.transaction_max_timeout_ms,
                abort_check_interval_ms=c.transaction_abort_timed_out_transaction_cleanup_interval_ms,
                partitions=c.transaction_state_log_num_partitions,
                segment_bytes=c.offsets_topic_segment_bytes),
            self.ctx.next_producer_id, self.write_txn_markers, self._offsets_marker,
            topic_partitions, lambda: self.ctx.coordinator.log.partitions,
            registered_partitions=None if registered is None else len(registered.partitions))
        self.ctx.logs.add(TRANSACTION_STATE_TOPIC, coordinator.log.log)
        coordinator.log.on_append = self._txn_appended
        return coordinator

    async def allocate_producer_ids(self, count: int) -> int:
        assert self.store is not None
        return await self.store.allocate_producer_ids(count)

    async def create_partitions(self, topics: list[dict[str, Any]],
                                validate_only: bool) -> list[dict[str, Any]]:
        assert self.store is not None
        from shmq.broker.admin import plan_create_partitions

        results, grow = plan_create_partitions(self.store.metadata, topics, sorted(self.workers))
        if grow and not validate_only:
            counts = {t["name"]: int(t["count"]) for t in topics}
            for name, leaders in grow.items():
                before = len(self.store.metadata.topics[name].partitions)
                self.store.add_partitions(name, counts[name], sorted(self.workers), leaders)
                self._reset_metric_slots(self.store.metadata.topics[name].partitions[before:])
            await self.publish_metadata()
        return results

    async def alter_configs(self, resources: list[dict[str, Any]], validate_only: bool,
                            incremental: bool) -> list[dict[str, Any]]:
        assert self.store is not None
        from shmq.broker.admin import plan_alter_configs

        results, changes = plan_alter_configs(self.store.metadata, self.config.log, resources,
                                              incremental)
        if changes and not validate_only:
            for (rtype, name), configs in changes.items():
                self.store.set_configs(rtype, name, configs)
            await self.publish_metadata()
        return results

    # -- metadata to workers ----------------------------------------------------------------

    async def publish_metadata(self) -> None:
        """Send the current metadata to every worker that has not got it (one still booting
        too: it applies it right after it starts serving) and wait for the ready ones' acks.

        The sending runs to its end even when the request that changed the store is cancelled
        (its client went away): the workers must hear of every change, and a failure nobody
        awaits any more is logged instead of lost."""
        task = asyncio.ensure_future(self._send_metadata())
        task.add_done_callback(_log_failure("publishing the metadata"))
        await asyncio.shield(task)

    async def _send_metadata(self) -> None:
        assert self.store is not None
        meta = self.store.metadata
        self.ctx.metadata = meta
        for w in self.workers.values():
            if w.channel is not None and w.sent_generation < meta.generation:
                self._send_metadata_to(w)
        live = [w for w in self.workers.values() if w.channel is not None and w.ready.is_set()
                and w.acked_generation < meta.generation]

        async def acked(w: WorkerHandle) -> None:
            async with w.acked:
                await w.acked.wait_for(lambda: w.acked_generation >= meta.generation)

        if live:
            try:
                await asyncio.wait_for(asyncio.gather(*(acked(w) for w in live)), 10)
            except asyncio.TimeoutError:
                # slow workers (a slow disk creating thousands of logs, a loaded box): the change
                # is committed and they apply it when they get to it; the request is answered
                # (it was: the connection aborted, TimeoutError being an OSError), and clients
                # retry NOT_LEADER / UNKNOWN_TOPIC until the worker has it, as with Kafka's
                # asynchronous metadata propagation
                _throttled(logging.WARNING, "metadata-ack",
                           "workers have not applied metadata generation %d within 10 s; "
                           "answering anyway, they apply it when they get to it",
                           meta.generation)
        if self.port:
            self.write_run_file()  # the slot directory changed

    def _send_metadata_to(self, w: WorkerHandle) -> None:
        """The current metadata to ``w``: whole the first time, then what changed since the
        generation it was last sent (``MetadataStore.message_for``; control messages arrive in
        order, and a worker whose copy is not that generation asks for the whole again)."""
        assert self.store is not None and w.channel is not None
        sent = w.sent_topics if w.sent_generation >= 0 else None
        line, w.sent_topics = self.store.message_for(sent, w.sent_generation)
        w.channel.send_line(line)
        w.sent_generation = self.store.metadata.generation

    def _reset_metric_slots(self, partitions: Any) -> None:
        """Zero the metrics of new partitions' slots, which a deleted partition may have used:
        no worker leads them until the new metadata is published."""
        if self.metrics_table is not None:
            for p in partitions:
                self.metrics_table.reset_partition(p.slot)

    # -- workers ----------------------------------------------------------------------------

    def _open_state_table(self, run: Path) -> None:
        """The shared state table: stale objects of a crashed predecessor are removed first."""
        from shmq.ipc.state_table import ShmTracker, StateTable, remove_stale, stale_names

        old = run / "broker.json"
        if old.exists():
            try:
                remove_stale(stale_names(json.loads(old.read_text()).get("shm", [])))
            except (ValueError, OSError):
                log.warning("could not read %s to remove stale shared memory", old)
        assert self.store is not None
        slots = max(4096, 2 * self.store.metadata.slots_needed())
        self.shm_tracker = ShmTracker()
        self.state_table = StateTable.create(slots, tracker=self.shm_tracker)
        if self.config.metrics_enabled:
            from shmq.ipc.metrics_table import MetricsTable

            self.metrics_table = MetricsTable.create(
                len(self.workers) + 1, slots, boot_id=self.state_table.boot_id,
                tracker=self.shm_tracker)

    def _worker_settings(self) -> str:
        c = self.config
        assert self.store is not None
        return json.dumps({
            "data_dir": str(c.data_dir), "host": c.host, "workers": c.workers,
            "num_partitions": c.num_partitions, "auto_create_topics": c.auto_create_topics,
            "message_max_bytes": c.message_max_bytes,
            "socket_request_max_bytes": c.socket_request_max_bytes,
            "queued_max_request_bytes": c.queued_max_request_bytes,
            "fetch_max_bytes": c.fetch_max_bytes,
            "flush_on_ack": c.flush_on_ack, "log": asdict(c.log),
            "producer_id_expiration_ms": c.producer_id_expiration_ms,
            "producer_id_expiration_check_interval_ms":
                c.producer_id_expiration_check_interval_ms,
            "cluster_id": self.store.metadata.cluster_id,
            "state_table": self.state_table.name if self.state_table else None,
            "metrics_table": self.metrics_table.name if self.metrics_table else None})

    def bind_listener(self, w: WorkerHandle) -> None:
        """The worker's listening socket, bound once: its port stays the same across restarts."""
        from shmq.net.connection import listening_socket

        if w.listener is None:
            w.listener = listening_socket(self.config.host, w.port)
            w.port = w.listener.getsockname()[1]

    async def spawn(self, w: WorkerHandle) -> None:
        """Start worker ``w`` and send it the current metadata, its first control message."""
        assert self.store is not None and w.listener is not None
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = ["--node-id", str(w.node_id), "--port", str(w.port),
                "--config", self._worker_settings()]
        w.ready.clear()
        w.proc = None
        w.acked_generation = w.sent_generation = -1
        w.sent_topics = None
        fds = {"--control-fd": child, "--listen-fd": w.listener}
        if self.forks is not None:
            try:
                w.proc = await asyncio.get_running_loop().run_in_executor(
                    None, self.forks.fork, argv, fds)
                w.started_by = "fork"
            except OSError as exc:
                log.warning("fork server failed (%s); starting worker %d with exec",
                            exc, w.node_id)
                self.forks = None
        if w.proc is None:
            w.started_by = "exec"
            passed = [a for flag, sock in fds.items() for a in (flag, str(sock.fileno()))]
            w.proc = subprocess.Popen(
                [sys.executable, "-m", "shmq.worker", *passed, *argv],
                pass_fds=[sock.fileno() for sock in fds.values()], close_fds=True)
        child.close()
        w.channel = await ControlChannel.from_socket(parent)
        self._send_metadata_to(w)  # whole: sent_generation is -1
        asyncio.ensure_future(self._listen(w, w.channel, w.proc))

    async def _listen(self, w: WorkerHandle, channel: ControlChannel,
                      proc: subprocess.Popen | ForkedProcess) -> None:
        while True:
            msg = await channel.receive()
            if msg is None:
                break
            kind = msg["type"]
            if kind == "ready":
                w.started = time.monotonic()
                async with w.acked:  # it serves with the metadata it booted with
                    w.acked_generation = msg.get("generation", -1)
                    w.acked.notify_all()
                w.ready.set()
            elif kind == "boot_error":
                w.boot_error = msg["error"]
            elif kind == "metadata_resync":  # its copy was not the base of a change
                log.warning("worker %d asked for the whole metadata", w.node_id)
                w.sent_generation, w.sent_topics = -1, None
                task = asyncio.ensure_future(self.publish_metadata())
                task.add_done_callback(_log_failure("publishing the metadata"))
            elif kind == "metadata_ack":
                async with w.acked:
                    w.acked_generation = msg["generation"]
                    w.acked.notify_all()
            elif kind == "rpc":
                asyncio.ensure_future(self._rpc(channel, msg))
            elif kind == "txn_markers_reply":
                fut = w.marker_waits.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg["errors"])
        channel.close()
        for fut in w.marker_waits.values():  # the worker is gone: its markers are retried
            if not fut.done():
                fut.set_result(None)
        w.marker_waits.clear()
        if w.channel is channel:
            w.channel = None
        await self._reap(w, proc)

    async def _rpc(self, channel: ControlChannel, msg: dict[str, Any]) -> None:
        op, args = msg["op"], msg["args"]
        try:
            if op == "create_topics":
                res = await self.create_topics([TopicRequest(**t) for t in args["topics"]],
                                               args["validate_only"])
                result: Any = [r.__dict__ for r in res]
            elif op == "delete_topics":
                result = [r.__dict__ for r in await self.delete_topics(args["names"],
                                                                       args.get("ids", ()))]
            elif op == "allocate_producer_ids":
                result = await self.allocate_producer_ids(int(args["count"]))
            elif op == "create_partitions":
                result = await self.create_partitions(args["topics"], args["validate_only"])
            elif op == "alter_configs":
                result = await self.alter_configs(args["resources"], args["validate_only"],
                                                  args["incremental"])
            elif op == "verify_txn":
                coordinator = self.ctx.txn_coordinator
                result = 15 if coordinator is None else coordinator.verify(
                    args["transactional_id"], int(args["producer_id"]),
                    int(args["producer_epoch"]), args["topic"], int(args["partition"]))
            elif op == "add_txn_partition":
                coordinator = self.ctx.txn_coordinator
                result = 15 if coordinator is None else await coordinator.add_partition_implicitly(
                    args["transactional_id"], int(args["producer_id"]),
                    int(args["producer_epoch"]), args["topic"], int(args["partition"]))
            elif op == "create_internal_topic":
                result = await self.create_internal_topic(args["name"], args["wait"])
            else:
                result = None
        except Exception:  # noqa: BLE001 - a failed RPC must not kill the controller
            log.exception("control RPC %s failed", op)
            result = None
        channel.send({"type": "rpc_reply", "id": msg["id"], "result": result})

    async def _reap(self, w: WorkerHandle, proc: subprocess.Popen | ForkedProcess) -> None:
        loop = asyncio.get_running_loop()
        code = await loop.run_in_executor(None, proc.wait)
        if self.stop_event.is_set():
            return
        if code == BOOT_ERROR or w.boot_error:
            self.halt(f"worker {w.node_id} failed to start: {w.boot_error or f'exit code {code}'}")
            return
        # died before it was ready (a crash during recovery, say), or soon after
        quick = not w.ready.is_set() or time.monotonic() - w.started < STABLE_AFTER_S
        w.quick_crashes = w.quick_crashes + 1 if quick else 0
        if w.quick_crashes > 1:
            delay = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (w.quick_crashes - 2))
            log.error("worker %d (pid %d) exited with %s, %d times in a row within %.0f s of "
                      "starting; restarting it in %.1f s", w.node_id, proc.pid, code,
                      w.quick_crashes, STABLE_AFTER_S, delay)
            try:
                await asyncio.wait_for(self.stop_event.wait(), delay)
                return  # stopping
            except asyncio.TimeoutError:
                pass
        else:
            log.warning("worker %d (pid %d) exited with %s; restarting it", w.node_id, proc.pid,
                        code)
        w.restarts += 1
        await self.spawn(w)
        await asyncio.wait_for(w.ready.wait(), 60)
        await self.publish_metadata()
        self.write_run_file()

    def halt(self, reason: str) -> None:
        self.halt_reason = reason
        self.stop_event.set()

    # -- run --------------------------------------------------------------------------------

    def write_run_file(self) -> None:
        run = self.data_dir / "run"
        info = {
            "bootstrap": f"{self.config.host}:{self.port}",
            "controller_pid": os.getpid(),
            "cluster_id": self.store.metadata.cluster_id if self.store else "",
            "state_table": self.state_table.name if self.state_table else None,
            "metrics_table": self.metrics_table.name if self.metrics_table else None,
            "http": self.http.address if self.http else None,
            "slots": self.store.metadata.slot_directory() if self.store else {},
            "workers": [{"node_id": w.node_id, "port": w.port,
                         "pid": w.proc.pid if w.proc else None, "started_by": w.started_by}
                        for w in self.workers.values()],
            "shm": self.shm_tracker.to_json() if self.shm_tracker else [],
        }
        # not fsynced: it describes this run (a crashed process leaves it in the page cache;
        # after a machine crash it is rewritten at start), and a slow disk must not stall the loop
        checkpoint.write_atomically(run / "broker.json", json.dumps(info, indent=2) + "\n",
                                    sync=False)

    async def run(self, ready_line: bool = True) -> int:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        run = self.data_dir / "run"
        run.mkdir(mode=0o700, exist_ok=True)
        lock_fd = os.open(run / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BootError(f"another shmq broker is using {self.data_dir}") from None
        self.store = MetadataStore(self.data_dir)
        self.store.reassign_missing(sorted(self.workers))
        moved = relocate_orphan_logs(self.data_dir, {
            (t.name, p.partition): p.leader
            for t in self.store.metadata.topics.values() if not t.internal
            for p in t.partitions}, set(self.workers))
        for topic, partition, old, new in moved:
            log.info("the log of %s-%d moved from worker %d to worker %d, its new leader",
                     topic, partition, old, new)
        self._open_state_table(run)
        loop = asyncio.get_running_loop()
        install_loop_handler(loop, log)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop_event.set)
        self.ctx = BrokerContext(node_id=0, config=self.config, metadata=self.store.metadata,
                                 controller=self, logs=InternalLogs(),
                                 state_reader=self.state_table)
        if self.metrics_table is not None:
            self.ctx.metrics = self._count_fsyncs(self.metrics_table.writer(0))
        self.ctx.coordinator = self._start_coordinator()
        self.ctx.txn_coordinator = self._start_txn_coordinator()
        ending = self.ctx.txn_coordinator.load()
        if TRANSACTION_STATE_TOPIC not in self.store.metadata.topics \
                and self.ctx.txn_coordinator.log.has_records():
            self.store.register_internal_topic(
                TRANSACTION_STATE_TOPIC, self.ctx.txn_coordinator.log.partitions,
                offsets_topic_configs(self.config.offsets_topic_segment_bytes))
        server = await serve(Router(self.ctx), self.config.host, self.config.port,
                             self.config.socket_request_max_bytes, self.ctx.stats,
                             self.ctx.metrics,
                             queued_max_bytes=self.config.queued_max_request_bytes)
        self.port = server.sockets[0].getsockname()[1]
        try:
            for w in self.workers.values():
                self.bind_listener(w)
            meta = self.store.metadata  # every address is known before any worker starts
            meta.brokers = {0: (self.config.host, self.port)}
            meta.brokers.update({w.node_id: (self.config.host, w.port)
                                 for w in self.workers.values()})
            self.store.save()
            self.ctx.metadata = meta
            for w in self.workers.values():
                await self.spawn(w)
            all_ready: asyncio.Future[Any] = asyncio.gather(
                *(w.ready.wait() for w in self.workers.values()))
            halt: asyncio.Future[Any] = asyncio.ensure_future(self.stop_event.wait())
            done, _ = await asyncio.wait([halt, all_ready], timeout=120,
                                         return_when=asyncio.FIRST_COMPLETED)
            all_ready.cancel()
            await asyncio.gather(all_ready, return_exceptions=True)  # retrieve the cancellation
            if halt in done or not all(w.ready.is_set() for w in self.workers.values()):
                raise BootError(self.halt_reason or "workers did not start within 120 s")
            halt.cancel()
            await self.publish_metadata()  # if it changed while they booted
            self.ctx.txn_coordinator.start(ending)  # markers need the workers
            self._start_http()
            self.write_run_file()
            if ready_line:
                web = f", dashboard http://{self.http.address}/" if self.http else ""
                print(f"shmq broker ready: bootstrap {self.config.host}:{self.port} "
                      f"({len(self.workers)} workers, data dir {self.data_dir}{web}, "
                      f"{nofile()} file descriptors per process)", flush=True)
            await self.stop_event.wait()
        finally:
            await self.shutdown(server)
            os.close(lock_fd)
        if self.halt_reason:
            raise BootError(self.halt_reason)
        return 0

    @staticmethod
    def _count_fsyncs(writer: Any) -> Any:
        """The controller's fsyncs (``__consumer_offsets``) into its region, like a worker's."""
        from shmq._fast._metrics_reference import FSYNC_HIST, FSYNCS
        from shmq.storage.log import PartitionLog

        def flushed(ns: int) -> None:
            writer.add(FSYNCS)
            writer.observe(FSYNC_HIST, ns)

        PartitionLog.flush_observer = staticmethod(flushed)
        return writer

    def _start_http(self) -> None:
        """The HTTP listener (``--http-listener``), a thread of its own (``monitor.http``).
        The default port falls back to a free one when taken; a port given explicitly that
        cannot be bound stops the broker."""
        from shmq.monitor.listener import parse_listener

        where = parse_listener(self.config.http_listener)
        if where is None:
            return
        from shmq.monitor.collector import Collector, controller_view
        from shmq.monitor.http import MonitorServer

        collector = Collector(self.metrics_table, self.state_table)
        loop = asyncio.get_running_loop()
        default = self.config.http_listener == BrokerConfig.http_listener
        for port in (where[1], 0) if default else (where[1],):
            server = MonitorServer(collector, where[0], port, lambda: controller_view(self), loop)
            try:
                server.start()
            except OSError as exc:
                if port and default:
                    log.warning("HTTP listener %s:%d: %s; using a free port", where[0], port,
                                exc.strerror)
                    continue
                raise BootError(f"cannot listen on --http-listener "
                                f"{self.config.http_listener}: {exc.strerror}") from None
            collector.http_address = server.address
            self.http = server
            return

    def _start_coordinator(self) -> Any:
        """The group coordinator, its ``__consumer_offsets`` log under ``<data dir>/controller``
        replayed before the listener opens.  The topic's partition count is the one registered
        in the metadata; a log from before it was registered is placed into
        ``offsets.topic.num.partitions`` partitions first, then registered."""
        from shmq.coordinator import CoordinatorConfig, GroupCoordinator

        c = self.config
        assert self.store is not None
        registered = self.store.metadata.topics.get(OFFSETS_TOPIC)

        def topic_partitions(topic: str) -> int | None:
            info = self.ctx.metadata.topics.get(topic)
            return None if info is None else len(info.partitions)

        coordinator = GroupCoordinator(self.data_dir / "controller", CoordinatorConfig(
            initial_rebalance_delay_ms=c.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=c.group_min_session_timeout_ms,
            max_session_timeout_ms=c.group_max_session_timeout_ms,
            offsets_retention_ms=c.offsets_retention_minutes * 60_000,
            retention_check_interval_ms=c.offsets_retention_check_interval_ms,
            offset_metadata_max_bytes=c.offset_metadata_max_bytes,
            offsets_partitions=c.offsets_topic_num_partitions,
            offsets_segment_bytes=c.offsets_topic_segment_bytes), topic_partitions,
            registered_partitions=None if registered is None else len(registered.partitions),
            on_append=self._offsets_appended)
        self.ctx.coordinator = coordinator
        self.ctx.logs.add(OFFSETS_TOPIC, coordinator.log.log)
        if registered is None and coordinator.log.has_records():
            self._register_offsets_topic()  # an upgraded broker's committed offsets
        elif registered is not None:
            self._prepare_offsets_partitions()  # any a crash left uncreated
        coordinator.load()
        return coordinator

    async def shutdown(self, server: Any) -> None:
        self.stop_event.set()
        await server.stop()
        await stop_draining()
        if self.http is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.http.stop)
        if self.ctx.txn_coordinator is not None:
            self.ctx.txn_coordinator.close()
        if self.ctx.coordinator is not None:
            self.ctx.coordinator.close()
        for w in self.workers.values():
            if w.channel is not None:
                try:
                    w.channel.send({"type": "stop"})
                except (ConnectionError, RuntimeError):
                    pass
        loop = asyncio.get_running_loop()
        for w in self.workers.values():
            if w.proc is not None:
                try:
                    await asyncio.wait_for(loop.run_in_executor(None, w.proc.wait), 30)
                except asyncio.TimeoutError:
                    w.proc.kill()
                    w.proc.wait()
        try:
            (self.data_dir / "run" / "broker.json").unlink()
        except FileNotFoundError:
            pass
        if self.state_table is not None:
            self.state_table.unlink()
            self.state_table.close()
        if self.metrics_table is not None:
            self.metrics_table.unlink()
            self.metrics_table.close()
        for w in self.workers.values():
            if w.listener is not None:
                w.listener.close()
                w.listener = None


def _log_failure(what: str) -> Any:
    """A done callback that logs the failure of a task nobody awaits."""

    def check(task: asyncio.Future) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed: %s", what, task.exception())

    return check


def _internal_not_deleted(name: str, topic_id: str) -> TopicResult:
    """Kafka 4 would delete an internal topic, and every committed offset with it; shmq's
    coordinators own theirs."""
    return TopicResult(name, INVALID_REQUEST, f"'{name}' is an internal topic of the "
                       "coordinators and cannot be deleted", topic_id)
