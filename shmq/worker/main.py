"""Worker process entry: recover this worker's logs, serve Kafka requests, obey the controller.

Boot, in this order (a worker never answers a client before it knows the cluster):

1. Wait for the controller's first control message: the current cluster metadata (topics with
   their ids, partitions, leaders, epochs, configs, every broker's address).
2. Open the logs it hosts with their topics' effective configs (``LogManager.startup``):
   recovery validates only what follows each log's recovery record; logs of topics that are gone,
   or that were deleted and created again under the same name (another topic id), are deleted
   crash-safely; logs it leads and has none of yet are created.  After a clean shutdown no log
   is opened: each opens at its first use, and its offsets are published from the summary the
   shutdown wrote (``LogManager``, "Opening at first use").
3. Serve on the listening socket the controller bound and passed in (``--listen-fd``).  The
   controller keeps that socket open across restarts, so a client connecting while the worker
   restarts waits in the backlog instead of being refused and backing off.  Then report ``ready``
   with the metadata generation it holds, and log one line saying what recovery did.

Exit codes: 0 after a requested stop, ``BOOT_ERROR`` (3) when the worker cannot start (the
controller then halts instead of restarting it in a loop), 1 on anything else.  A worker exits
when its control channel closes: the controller is gone, and an orphan must not keep serving.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import setproctitle

from shmq.limits import Throttled

BOOT_ERROR = 3
RETENTION_CHECK_S = 300.0
CHECKPOINT_S = 60.0
# The event loop's thread asks the kernel for time slices this long (``shmq.ipc.sched``): a
# drain woken by a ring entry or a request then preempts a task that has run longer instead of
# waiting out its slice (1.4 ms here, up to a 4 ms tick), which was a tail of bench_shm's
# latency rows on a busy box; the worker's share of the CPU is unchanged.
# ``SHMQ_WORKER_SLICE_US=0`` leaves it alone.
LOOP_SLICE_US = 100.0

log = logging.getLogger("shmq.worker")
_throttled = Throttled(log)


class ControllerRpc:
    """The controller's API as seen from a worker: requests over the control channel."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.pending: dict[int, asyncio.Future] = {}
        self.ids = itertools.count(1)

    async def _call(self, op: str, **args: Any) -> Any:
        rid = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        self.channel.send({"type": "rpc", "id": rid, "op": op, "args": args})
        return await asyncio.wait_for(fut, 30)

    def reply(self, message: dict[str, Any]) -> None:
        fut = self.pending.pop(message["id"], None)
        if fut is not None and not fut.done():
            fut.set_result(message.get("result"))

    async def create_topics(self, topics: Sequence[Any], validate_only: bool) -> list[Any]:
        from shmq.broker.context import TopicResult

        out = await self._call("create_topics", validate_only=validate_only,
                               topics=[t.__dict__ for t in topics])
        return [TopicResult(**r) for r in out]

    async def delete_topics(self, names: Sequence[str], ids: Sequence[str] = ()) -> list[Any]:
        from shmq.broker.context import TopicResult

        out = await self._call("delete_topics", names=list(names), ids=list(ids))
        return [TopicResult(**r) for r in out]

    async def allocate_producer_ids(self, count: int) -> int:
        return int(await self._call("allocate_producer_ids", count=count))

    async def create_partitions(self, topics: list[dict[str, Any]],
                                validate_only: bool) -> list[dict[str, Any]]:
        out = await self._call("create_partitions", topics=topics, validate_only=validate_only)
        failed = {"error_code": -1, "error_message": "the controller could not do it"}
        return out if out is not None else [{"name": t["name"], **failed} for t in topics]

    async def alter_configs(self, resources: list[dict[str, Any]], validate_only: bool,
                            incremental: bool) -> list[dict[str, Any]]:
        out = await self._call("alter_configs", resources=resources,
                               validate_only=validate_only, incremental=incremental)
        failed = {"error_code": -1, "error_message": "the controller could not do it"}
        return out if out is not None else [dict(failed) for _ in resources]

    async def verify_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         topic: str, partition: int) -> int:
        out = await self._call("verify_txn", transactional_id=transactional_id,
                               producer_id=producer_id, producer_epoch=producer_epoch,
                               topic=topic, partition=partition)
        return 15 if out is None else int(out)  # COORDINATOR_NOT_AVAILABLE: retriable

    async def add_txn_partition(self, transactional_id: str, producer_id: int,
                                producer_epoch: int, topic: str, partition: int) -> int:
        """Transaction version 2 (Produce v12): the partition joins the producer's transaction
        at the coordinator (Kafka's AddPartitionsToTxnManager, not verify-only)."""
        out = await self._call("add_txn_partition", transactional_id=transactional_id,
                               producer_id=producer_id, producer_epoch=producer_epoch,
                               topic=topic, partition=partition)
        return 15 if out is None else int(out)  # COORDINATOR_NOT_AVAILABLE: retriable

    async def create_internal_topic(self, name: str, wait: bool = True) -> bool:
        return bool(await self._call("create_internal_topic", name=name, wait=wait))


def hosted_logs(meta: Any, node_id: int, base: Any) -> dict[tuple[str, int], Any]:
    """The logs this node must hold under ``meta``: every partition it is a replica of, with its
    topic's id and effective log config (overrides, dynamic broker configs, ``base``)."""
    from shmq.broker.dynamic_configs import effective_log_config
    from shmq.storage import HostedLog

    hosted = {}
    for name, info in meta.topics.items():
        config = None
        for part in info.partitions:
            if node_id in part.replicas or part.leader == node_id:
                if config is None:
                    config = effective_log_config(meta, base, node_id, name)
                hosted[(name, part.partition)] = HostedLog(info.topic_id, config)
    return hosted


def apply_metadata(ctx: Any, manager: Any, new: Any) -> None:
    """A metadata update: delete the logs it no longer hosts here (topics deleted, or deleted and
    created again: another topic id), apply configs, publish states, create the led logs."""
    removed = manager.remove_strays(hosted_logs(new, ctx.node_id, ctx.config.log))
    if removed:
        log.info("worker %d deleted the logs of deleted topics: %s", ctx.node_id,
                 ", ".join(removed))
    ctx.metadata = new
    ctx.wake_fetches()  # a parked fetch of a deleted or moved partition answers now
    apply_log_configs(ctx, manager)  # dynamic topic/broker configs, at once
    publish_states(ctx, manager)
    if create_led_logs(ctx, manager) or removed:
        refreeze()  # the new logs join the objects the collector skips, the removed ones go


def refreeze() -> None:
    """Collect everything once, then hide what is left from the cyclic collector
    (``gc.freeze``): the logs, segments, indexes and metadata a worker holds for its life, about
    a million objects at 10,000 partitions, which every full collection walked: half of a
    worker's busy samples in a 10,000-partition consume were ``gc_collect_main`` under the
    Fetch handler (py-spy --native).  A frozen object still goes when its last reference does
    (a log, a segment: no cycles); a frozen cycle (a connection's task, say) waits for the next
    refreeze: at start, when logs are created or removed, and every ``RETENTION_CHECK_S``."""
    gc.unfreeze()
    gc.collect()
    freeze()


# Objects frozen by the last ``freeze`` (the stats file's ``gc_frozen``).  Counted once per
# freeze, not once a second: ``gc.get_freeze_count`` walks the whole frozen list (35,000
# objects in an idle worker, cold in the cache), and in the stats write each second it was
# half of an idle worker's CPU (py-spy --native) and 9 % of the workers' CPU in a suite
# produce cell (perf), whose measured window includes the load processes' start-up.
_frozen_count = 0


def freeze() -> None:
    """``gc.freeze`` and count what it froze (``_frozen_count``)."""
    global _frozen_count
    gc.freeze()
    _frozen_count = gc.get_freeze_count()


def publish_states(ctx: Any, manager: Any) -> None:
    """Every log's offsets into its state table slot, the deferred ones' (not opened yet, see
    ``LogManager``) from what the last clean shutdown recorded."""
    topics = ctx.metadata.topics
    for logs in (manager.logs, manager.deferred):
        for (topic, partition), plog in list(logs.items()):
            if topic in topics:
                ctx.publish_state(topic, partition, plog)


def apply_log_configs(ctx: Any, manager: Any) -> None:
    """Give every live log the config its topic now has (AlterConfigs); a retention that got
    shorter deletes old segments now rather than at the next retention pass."""
    from shmq.broker.dynamic_configs import effective_log_config

    deleted = 0
    configs: dict[str, Any] = {}

    def config_of(topic: str) -> Any:
        if topic not in configs:
            configs[topic] = effective_log_config(ctx.metadata, ctx.config.log, ctx.node_id, topic)
        return configs[topic]

    now_ms = int(time.time() * 1000)
    for tp, deferred in list(manager.deferred.items()):
        if tp[0] in ctx.metadata.topics and config_of(tp[0]) != deferred.config:
            deferred.config = config_of(tp[0])
            if deferred.retention_due(now_ms):  # opened (with the new config) and applied
                deleted += manager.get_log(*tp).delete_old_segments(now_ms)
    for (topic, _partition), plog in list(manager.logs.items()):
        if topic not in ctx.metadata.topics:
            continue
        config = config_of(topic)
        if config != plog.config:
            plog.update_config(config)
            deleted += plog.delete_old_segments()
    if deleted:
        manager.checkpoint()


def create_led_logs(ctx: Any, manager: Any) -> int:
    """Create the log of every partition this node leads and has none of yet.

    Kafka creates a partition's log when its broker becomes the leader, not on the first
    request.  Created lazily, the first produce to each new partition paid for the directory,
    the three files and the index mappings (~0.5 ms each), one after another on the event loop:
    kcat's first requests to a new 64-partition topic, one partition each, waited for 32
    creations per worker.  Runs before the metadata is acknowledged, so CreateTopics and
    CreatePartitions answer once the logs exist.  A log that cannot be created is logged and
    left to the first request, which then gets the error."""
    from shmq.broker.dynamic_configs import effective_log_config

    wanted = []
    for name, info in ctx.metadata.topics.items():
        config = None  # the topic's, computed once for all its new partitions
        for p, part in enumerate(info.partitions):
            if part.leader != ctx.node_id or manager.holds(name, p):
                continue
            if config is None:
                try:
                    config = effective_log_config(ctx.metadata, ctx.config.log, ctx.node_id,
                                                  name)
                except Exception:  # a bad config must not stop the metadata update
                    log.exception("could not create the logs of %s", name)
                    break
            wanted.append((name, p, config, info.topic_id))
    if not wanted:
        return 0
    created = 0
    for (name, p), plog in manager.create_logs(wanted).items():
        if isinstance(plog, Exception):  # a disk error must not stop the metadata update
            log.error("could not create the log of %s-%d: %s", name, p, plog)
            continue
        ctx.publish_state(name, p, plog)
        created += 1
    return created


def attach_metrics(name: str, node_id: int) -> tuple[Any, Any]:
    """This worker's writer of the controller's metrics table (its region is its node id);
    every fsync of its logs is counted there too."""
    from shmq._fast._metrics_reference import FSYNC_HIST, FSYNCS
    from shmq.ipc.metrics_table import MetricsTable
    from shmq.storage.log import PartitionLog

    table = MetricsTable.attach(name, readonly=False)
    writer = table.writer(node_id)

    def flushed(ns: int) -> None:
        writer.add(FSYNCS)
        writer.observe(FSYNC_HIST, ns)

    PartitionLog.flush_observer = staticmethod(flushed)
    return table, writer


def publish_partition_gauges(ctx: Any, manager: Any,
                             last: dict[tuple[str, int], tuple[int, int, int]]) -> None:
    """Size and segment count of each led partition into its metrics slot (once a second,
    only for the logs whose offsets or segments changed since the last time)."""
    topics = ctx.metadata.topics
    for key, plog in list(manager.logs.items()):
        info = topics.get(key[0])
        if info is None or not 0 <= key[1] < len(info.partitions):
            continue
        now = (plog.log_end_offset, plog.log_start_offset, len(plog.segments))
        if last.get(key) == now:
            continue
        last[key] = now
        ctx.metrics.partition_gauges(info.partitions[key[1]].slot, plog.size_in_bytes,
                                     len(plog.segments))
    for key, deferred in list(manager.deferred.items()):  # as the last clean shutdown left them
        info = topics.get(key[0])
        if info is None or not 0 <= key[1] < len(info.partitions):
            continue
        now = (deferred.log_end_offset, deferred.log_start_offset, deferred.segment_count)
        if last.get(key) == now:
            continue
        last[key] = now
        ctx.metrics.partition_gauges(info.partitions[key[1]].slot, deferred.size_in_bytes,
                                     deferred.segment_count)


def write_stats(path: Path, text: str, last: str) -> str:
    """The stats file (``run/worker-<id>.stats.json``) each second: ``text`` replaces it
    atomically when it differs from ``last``, what was written last; otherwise only its
    modification time moves (readers take it as "current as of", ``tests/integration/_broker``),
    without the new inode and rename of a rewrite (160 us of CPU on this ext4).  Returns what
    the file now holds."""
    from shmq.storage import checkpoint

    if text == last:
        try:
            os.utime(path)
            return text
        except OSError:  # removed meanwhile: written again below
            pass
    checkpoint.write_atomically(path, text, sync=False)
    return text


# After this many producer ids expired at once, free heap pages go back to the OS (below).
TRIM_AFTER_EXPIRED = 1000


def flush_due(logs: list[Any]) -> None:
    """flush.messages / flush.ms and the periodic checkpoints for ``logs``, in a thread
    (housekeeping).  A failed fsync is answered to the next acks=all producer; here it is one
    line per interval."""
    now = int(time.time() * 1000)
    for plog in logs:
        try:
            plog.maybe_flush(now)
        except (OSError, ValueError) as exc:  # ValueError: closed meanwhile (topic deleted)
            _throttled(logging.ERROR, "flush", "scheduled flush of %s failed: %s",
                       plog.directory, exc)


def release_free_heap() -> None:
    """glibc's ``malloc_trim(0)``: return the free pages inside the heap, not only its top.

    The producer table's arrays shrink by realloc, which leaves holes inside glibc's heap that
    plain ``free`` never returns: after 100,000 producer ids came and went a worker stayed
    0.6 MiB (2 %) above its start without this, 0.0 MiB with it (test_producer_expiry.py).
    Takes about a millisecond; a no-op where libc has no malloc_trim."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: SIGTERM when the controller dies, even if EOF is missed."""
    from shmq.supervisor.forkserver import PR_SET_PDEATHSIG, prctl

    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def preload() -> None:
    """Import what ``run`` needs: the fork server does it once for every worker it forks."""
    import shmq.broker.config
    import shmq.broker.context
    import shmq.broker.metadata
    import shmq.broker.router
    import shmq.ipc.metrics_table
    import shmq.ipc.state_table
    import shmq.net.connection
    import shmq.storage
    import shmq.supervisor.control
    import shmq.worker.rings  # noqa: F401
    from shmq.protocol import codec

    codec.preload()


async def run(args: argparse.Namespace) -> int:
    from shmq.broker.config import BrokerConfig
    from shmq.broker.context import BrokerContext
    from shmq.broker.metadata import ClusterMetadata
    from shmq.broker.router import Router
    from shmq.limits import install_loop_handler, raise_nofile
    from shmq.net.connection import serve, stop_draining
    from shmq.storage import LogConfig, LogManager
    from shmq.supervisor.control import ControlChannel

    raise_nofile()  # a worker started by hand, or by exec, raises its own
    from shmq.limits import segment_budget
    from shmq.storage.descriptors import CACHE

    CACHE.configure(segment_budget())
    install_loop_handler(asyncio.get_running_loop(), log)
    settings = json.loads(args.config)
    config = BrokerConfig(data_dir=Path(settings["data_dir"]), host=settings["host"], port=0,
                          workers=settings["workers"],
                          num_partitions=settings["num_partitions"],
                          auto_create_topics=settings["auto_create_topics"],
                          message_max_bytes=settings["message_max_bytes"],
                          socket_request_max_bytes=settings["socket_request_max_bytes"],
                          queued_max_request_bytes=settings.get("queued_max_request_bytes",
                                                                256 << 20),
                          fetch_max_bytes=settings["fetch_max_bytes"],
                          flush_on_ack=settings["flush_on_ack"],
                          producer_id_expiration_ms=settings.get("producer_id_expiration_ms",
                                                                 86_400_000),
                          producer_id_expiration_check_interval_ms=settings.get(
                              "producer_id_expiration_check_interval_ms", 600_000),
                          log=LogConfig(**settings["log"]), cluster_id=settings["cluster_id"])
    channel = await ControlChannel.from_socket(socket.socket(fileno=args.control_fd))
    listener = socket.socket(fileno=args.listen_fd) if args.listen_fd >= 0 else None
    first = await channel.receive()  # the cluster metadata, before any log is opened
    if first is None:
        return 0  # the controller is gone
    try:
        if first.get("type") != "metadata":
            raise RuntimeError(f"expected the metadata first, got {first.get('type')!r}")
        metadata = ClusterMetadata.from_dict(first["metadata"])
        manager = LogManager(config.data_dir / f"worker-{args.node_id}", config.log)
        report = manager.startup(hosted=hosted_logs(metadata, args.node_id, config.log))
        rpc = ControllerRpc(channel)
        ctx = BrokerContext(node_id=args.node_id, config=config, metadata=metadata,
                            controller=rpc, logs=manager)
        if settings.get("state_table"):
            from shmq.ipc.state_table import StateTable

            ctx.state_table = StateTable.attach(settings["state_table"], readonly=False)
            ctx.state_reader = ctx.state_table
        def opened(tp: tuple[str, int], plog: Any) -> None:
            if tp[0] in ctx.metadata.topics:
                ctx.publish_state(tp[0], tp[1], plog)

        manager.on_open = opened  # a log the unclean start left unopened: its state once open
        metrics_table = None
        if settings.get("metrics_table"):
            metrics_table, ctx.metrics = attach_metrics(settings["metrics_table"], args.node_id)
        publish_states(ctx, manager)
        created = create_led_logs(ctx, manager)
        server = await serve(Router(ctx), config.host, args.port, config.socket_request_max_bytes,
                             ctx.stats, ctx.metrics, sock=listener,
                             queued_max_bytes=config.queued_max_request_bytes)
        from shmq.ipc.session import socket_path
        from shmq.worker.rings import RingServer

        ring_server = RingServer(ctx, socket_path(config.data_dir, args.node_id), ctx.stats)
        ring_server.start()  # the shared-memory produce path for local clients
    except Exception as exc:  # noqa: BLE001 - report any boot failure, then halt the broker
        log.error("worker %d failed to start: %s", args.node_id, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        channel.send({"type": "boot_error", "error": f"{type(exc).__name__}: {exc}"})
        await channel.writer.drain()
        return BOOT_ERROR
    port = server.sockets[0].getsockname()[1]
    freeze()  # what it holds for its life: out of the collector's walks (see refreeze;
    # no collection first: a full one at 10,000 partitions would lengthen the start)
    channel.send({"type": "ready", "port": port, "pid": os.getpid(),
                  "generation": metadata.generation})
    log.info("worker %d ready: %s%s", args.node_id, report.describe(),
             f"; {created} new logs created" if created else "")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def _markers(msg: dict[str, Any]) -> None:
        from shmq.broker.handlers.write_txn_markers import write_markers

        errors = await write_markers(ctx, msg["markers"], int(msg["coordinator_epoch"]))
        channel.send({"type": "txn_markers_reply", "id": msg["id"], "errors": errors})

    async def control() -> None:
        while True:
            msg = await channel.receive()
            if msg is None:
                stop.set()
                return
            kind = msg["type"]
            if kind == "metadata":
                if "base" not in msg:
                    new = ClusterMetadata.from_dict(msg["metadata"])
                elif msg["base"] == ctx.metadata.generation:  # only what changed since then
                    new = ctx.metadata.updated(msg["head"], msg["topics"], msg["removed"])
                else:  # not the copy the change was made against: the whole, please
                    log.warning("worker %d: metadata change against generation %s, has %d",
                                args.node_id, msg["base"], ctx.metadata.generation)
                    channel.send({"type": "metadata_resync"})
                    continue
                apply_metadata(ctx, manager, new)
                channel.send({"type": "metadata_ack", "generation": new.generation})
            elif kind == "rpc_reply":
                rpc.reply(msg)
            elif kind == "txn_markers":
                asyncio.ensure_future(_markers(msg))
            elif kind == "stats":
                channel.send({"type": "stats_reply", "id": msg["id"], "stats": dict(ctx.stats)})
            elif kind == "stop":
                stop.set()
                return

    stats_path = config.data_dir / "run" / f"worker-{args.node_id}.stats.json"

    gauges: dict[tuple[str, int], tuple[int, int, int]] = {}

    # fsyncs (flush.ms / flush.messages, checkpoints) run in threads: a disk whose flushes stall
    # for seconds must not stall fetches, metadata and the rest of this event loop
    from shmq.storage.log import PartitionLog

    PartitionLog.defer_flushes = True
    from shmq.ipc import sched

    sched.request_slice(sched.slice_us_from_env("SHMQ_WORKER_SLICE_US", LOOP_SLICE_US))

    async def housekeeping() -> None:
        last_retention = last_checkpoint = time.monotonic()
        stats_text = ""
        from shmq.worker.rings import note_event

        while True:
            await asyncio.sleep(1.0)
            turn_ns = time.monotonic_ns()
            now_ms = int(time.time() * 1000)
            # flush.messages / flush.ms, and the periodic checkpoint of logs whose recovery
            # point trails their durable offset (PartitionLog.flush_due)
            due = [plog for plog in manager.logs.values() if plog.flush_due(now_ms)]
            if due:
                await loop.run_in_executor(None, flush_due, due)
            if ctx.metrics is not None:
                publish_partition_gauges(ctx, manager, gauges)
            # counters for local tools and tests (e.g. bytes sent with sendfile), written by a
            # thread: replacing a file makes ext4 start its writeback in the rename, 0.6-3.2 ms
            # that every ring entry and request arriving then waited out on the loop (i14h)
            stats_text = await loop.run_in_executor(None, write_stats, stats_path, json.dumps(
                {"node_id": args.node_id, "pid": os.getpid(), **ctx.stats,
                 "gc_frozen": _frozen_count}) + "\n", stats_text)
            now = time.monotonic()
            if now - last_retention >= RETENTION_CHECK_S:
                refreeze()  # the cycles frozen since the last time go
                if manager.run_retention(checkpoint=False):  # local readers follow segments_gen
                    for (topic, partition), plog in list(manager.logs.items()):
                        if topic in ctx.metadata.topics:
                            ctx.publish_state(topic, partition, plog)
                    last_checkpoint = 0.0
                last_retention = now
            if now - last_checkpoint >= CHECKPOINT_S:
                await loop.run_in_executor(None, manager.write_checkpoint,
                                           manager.checkpoint_offsets())
                last_checkpoint = now
            note_event(1, turn_ns, time.monotonic_ns())

    async def expire_producers() -> None:
        """Kafka's PeriodicProducerExpirationCheck: producer ids idle for
        producer.id.expiration.ms are forgotten, every producer.id.expiration.check.interval.ms,
        and once at start (the logs were loaded before this worker knew the setting)."""
        from shmq.broker.dynamic_configs import producer_id_expiration_ms

        static_ms = config.producer_id_expiration_ms
        interval_s = config.producer_id_expiration_check_interval_ms / 1000
        while True:  # the expiration time is dynamic (per broker or cluster-wide), as in Kafka
            expiration_ms = producer_id_expiration_ms(ctx.metadata, args.node_id, static_ms)
            expired = manager.remove_expired_producers(expiration_ms)
            ctx.stats["producer_ids"] = manager.producer_count()
            if expired:
                ctx.stats["producer_ids_expired"] = ctx.stats.get("producer_ids_expired", 0) + expired
                log.info("worker %d: %d idle producer ids expired", args.node_id, expired)
                if expired >= TRIM_AFTER_EXPIRED:
                    release_free_heap()
            await asyncio.sleep(interval_s)

    tasks = [asyncio.ensure_future(control()), asyncio.ensure_future(housekeeping()),
             asyncio.ensure_future(expire_producers())]
    await stop.wait()
    await server.stop()
    ring_server.close()
    await stop_draining()
    for t in tasks:
        t.cancel()
    manager.shutdown()
    if ctx.state_table is not None:
        ctx.state_table.close()
    if metrics_table is not None:
        metrics_table.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="shmq-worker")
    p.add_argument("--node-id", type=int, required=True)
    p.add_argument("--control-fd", type=int, required=True)
    p.add_argument("--listen-fd", type=int, default=-1,
                   help="a bound, listening socket to serve on (else bind --port)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--config", required=True)
    args = p.parse_args(argv)
    from shmq._startup import configure_logging

    configure_logging(f"worker-{args.node_id}")
    _die_with_parent()
    try:
        data_dir = json.loads(args.config)["data_dir"]
    except (ValueError, KeyError, TypeError):
        data_dir = "?"
    # ps shows what each process is (a forked worker would show the controller's command line)
    setproctitle.setproctitle(f"shmq worker {args.node_id} {data_dir}")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
