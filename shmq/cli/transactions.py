"""``shmq transactions``: Kafka's ``kafka-transactions.sh`` (``TransactionsCommand``).

    list [--state S ...] [--producer-id ID ...] [--duration-filter MS]
         TransactionalId  Coordinator  ProducerId  TransactionState   (ListTransactions)
    describe --transactional-id ID
         CoordinatorId  TransactionalId  ProducerId  ProducerEpoch  TransactionState
         TransactionTimeoutMs  CurrentTransactionStartTimeMs  TransactionDurationMs
         TopicPartitions                                                (DescribeTransactions)
    abort --topic T --partition P --start-offset O
    abort --topic T --partition P --producer-id ID --producer-epoch E --coordinator-epoch C
         Kafka's abort of a hanging transaction (``Admin.abortTransaction``): with
         --start-offset the partition leader's DescribeProducers names the producer whose open
         transaction starts there; then an ABORT marker goes to the leader (WriteTxnMarkers,
         which every shmq worker serves).  Silent on success, as Kafka's.
    abort --transactional-id ID
         (shmq's own) fence the id's producer and abort its open transaction (InitProducerId
         with the id: the coordinator bumps the epoch and writes ABORT markers)
    find-hanging (--topic T [--partition P] | --broker-id N) [--max-transaction-timeout MIN]
         open transactions older than the timeout (DescribeProducers at each leader) that
         their coordinator does not list with that partition (ListTransactions,
         DescribeTransactions): Topic Partition ProducerId ProducerEpoch CoordinatorEpoch
         StartOffset LastTimestamp Duration(min)

shmq's workers verify every transactional write that opens a transaction with the coordinator
(KIP-890 part 1; version 2 clients add their partitions through it), so a hanging transaction
needs a write from outside the protocol (a marker lost on a disk, a tool); ``find-hanging``
and ``abort --topic`` are there for it, as in Kafka.  Output is Kafka's: tab-separated columns
under a header line; errors go to stderr with exit code 1.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from shmq.cli import CommandError
from shmq.cli._connect import add_connection_args, resolve_bootstrap

ERRORS = {3: "UNKNOWN_TOPIC_OR_PARTITION", 6: "NOT_LEADER_OR_FOLLOWER",
          15: "COORDINATOR_NOT_AVAILABLE", 16: "NOT_COORDINATOR", 47: "INVALID_PRODUCER_EPOCH",
          48: "INVALID_TXN_STATE", 51: "CONCURRENT_TRANSACTIONS",
          52: "TRANSACTION_COORDINATOR_FENCED", 56: "KAFKA_STORAGE_ERROR",
          105: "TRANSACTIONAL_ID_NOT_FOUND", 90: "PRODUCER_FENCED"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "transactions", help="list, describe and abort transactions (kafka-transactions.sh)",
        description="This tool is used to analyze the transactional state of producers in "
                    "the cluster. Flags and output are those of Kafka's kafka-transactions.sh.")
    add_connection_args(p)
    sub = p.add_subparsers(dest="action", metavar="<action>")
    sub.required = True
    ls = sub.add_parser("list", help="list transactions")
    ls.add_argument("--state", action="append", default=[],
                    help="only transactions in this state (Ongoing, PrepareCommit, ...)")
    ls.add_argument("--producer-id", action="append", type=int, default=[],
                    help="only transactions of this producer id")
    ls.add_argument("--duration-filter", type=int, default=-1, metavar="MS",
                    help="only transactions running longer than this many milliseconds")
    d = sub.add_parser("describe", help="describe the state of an active transactional-id")
    d.add_argument("--transactional-id", required=True)
    a = sub.add_parser("abort", help="abort a hanging transaction (requires administrative "
                                     "privileges), or the open transaction of an id")
    a.add_argument("--transactional-id", help="(shmq) fence this id and abort its transaction")
    a.add_argument("--topic", help="topic name")
    a.add_argument("--partition", type=int, help="partition number")
    a.add_argument("--start-offset", type=int, help="start offset of the transaction to abort")
    a.add_argument("--producer-id", type=int, help="producer id")
    a.add_argument("--producer-epoch", type=int, help="producer epoch")
    a.add_argument("--coordinator-epoch", type=int, help="coordinator epoch")
    f = sub.add_parser("find-hanging", help="find hanging transactions")
    f.add_argument("--broker-id", type=int, help="broker id to search for hanging transactions")
    f.add_argument("--max-transaction-timeout", type=int, default=15, metavar="MINUTES",
                   help="maximum transaction timeout in minutes to limit the scope of the "
                        "search (15 minutes by default)")
    f.add_argument("--topic", help="topic name to limit search to (required if --partition "
                                   "is specified)")
    f.add_argument("--partition", type=int, help="partition number")
    return p


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cols = [header, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    return "\n".join("\t".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cols)


def run(args: argparse.Namespace) -> int:
    from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
    from kio.schema.list_transactions.v1.request import ListTransactionsRequest
    from kio.schema.types import ProducerId
    from kio.static.primitive import i16, i32Timedelta

    from shmq.cli.configs import BrokerError, kafka_call

    address = resolve_bootstrap(args)
    timeout = 30.0
    try:
        if args.action == "list":
            resp = kafka_call(address, ListTransactionsRequest(
                state_filters=tuple(args.state), producer_id_filters=tuple(args.producer_id),
                duration_filter=args.duration_filter), timeout)
            if resp.error_code.value:
                raise CommandError(f"ListTransactions failed: {_name(resp.error_code.value)}")
            print(_table(["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
                         [[t.transactional_id, 0, t.producer_id, t.transaction_state]
                          for t in resp.transaction_states]))
            return 0
        if args.action == "describe":
            resp = kafka_call(address, DescribeTransactionsRequest(
                transactional_ids=(args.transactional_id,)), timeout)
            t = resp.transaction_states[0]
            if t.error_code.value:
                raise CommandError(f"Failed to describe transactional-id "
                                   f"{args.transactional_id}: {_name(t.error_code.value)}")
            start = int(t.transaction_start_time.timestamp() * 1000)
            started = t.transaction_state not in ("Empty", "CompleteCommit",
                                                  "CompleteAbort") and start > 0
            partitions = ",".join(f"{tp.topic}-{p}" for tp in t.topics for p in tp.partitions)
            print(_table(
                ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
                 "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
                 "TransactionDurationMs", "TopicPartitions"],
                [[0, t.transactional_id, t.producer_id, t.producer_epoch, t.transaction_state,
                  int(t.transaction_timeout.total_seconds() * 1000),
                  start if started else "None",
                  int(time.time() * 1000) - start if started else "None", partitions]]))
            return 0
        if args.action == "find-hanging":
            return _find_hanging(address, args, timeout)
        if args.transactional_id is None:
            return _abort_in_partition(address, args, timeout)
        import datetime

        for _ in range(100):
            resp = kafka_call(address, InitProducerIdRequest(
                transactional_id=args.transactional_id,
                transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
                producer_id=ProducerId(-1), producer_epoch=i16(-1)), timeout)
            if resp.error_code.value != 51:  # CONCURRENT_TRANSACTIONS: the abort is under way
                break
            time.sleep(0.1)
        if resp.error_code.value:
            raise CommandError(f"abort failed: {_name(resp.error_code.value)}")
        print(f"Aborted the open transaction of {args.transactional_id} (if any); its "
              f"producer is fenced: producer id {resp.producer_id}, epoch "
              f"{resp.producer_epoch}")
        return 0
    except (BrokerError, OSError) as exc:
        raise CommandError(str(exc)) from None


def _name(code: int) -> str:
    return ERRORS.get(code, str(code))


# -- hanging transactions -----------------------------------------------------------------------


class _Partition:
    """A partition as Metadata lists it: its leader's address and its replicas."""

    def __init__(self, topic: str, partition: int, leader: str | None,
                 replicas: tuple[int, ...]) -> None:
        self.topic, self.partition, self.leader, self.replicas = topic, partition, leader, replicas


def _partitions(address: str, topics: list[str] | None, timeout: float) -> list[_Partition]:
    """Metadata v12 of ``topics`` (None: every topic, internal ones too)."""
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.types import TopicName

    from shmq.cli.configs import kafka_call

    resp = kafka_call(address, MetadataRequest(
        topics=None if topics is None else tuple(
            MetadataRequestTopic(topic_id=None, name=TopicName(t)) for t in topics),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False), timeout)
    nodes = {int(b.node_id): f"{b.host}:{b.port}" for b in resp.brokers}
    out = []
    for t in resp.topics:
        if t.error_code.value:
            raise CommandError(f"Failed to describe topic {t.name}: {_name(t.error_code.value)}")
        for p in t.partitions:
            out.append(_Partition(str(t.name), int(p.partition_index),
                                  nodes.get(int(p.leader_id)),
                                  tuple(int(r) for r in p.replica_nodes)))
    return out


def _producers(leader: str, parts: list[_Partition], timeout: float) -> dict[tuple[str, int], Any]:
    """DescribeProducers v0 at one leader: (topic, partition) -> its active producers."""
    from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
    from kio.schema.types import TopicName
    from kio.static.primitive import i32

    from shmq.cli.configs import kafka_call

    by_topic: dict[str, list[int]] = {}
    for p in parts:
        by_topic.setdefault(p.topic, []).append(p.partition)
    resp = kafka_call(leader, DescribeProducersRequest(topics=tuple(
        TopicRequest(name=TopicName(t), partition_indexes=tuple(i32(i) for i in ps))
        for t, ps in by_topic.items())), timeout)
    out = {}
    for t in resp.topics:
        for p in t.partitions:
            if p.error_code.value:
                raise CommandError(f"Failed to validate producer state for partition "
                                   f"{t.name}-{p.partition_index}: "
                                   f"{p.error_message or _name(p.error_code.value)}")
            out[(str(t.name), int(p.partition_index))] = p.active_producers
    return out


def _abort_in_partition(address: str, args: argparse.Namespace, timeout: float) -> int:
    """``Admin.abortTransaction``: an ABORT marker at the partition's leader."""
    from kio.schema.types import ProducerId
    from kio.schema.write_txn_markers.v1.request import (
        WritableTxnMarker,
        WritableTxnMarkerTopic,
        WriteTxnMarkersRequest,
    )
    from kio.static.primitive import i16, i32

    from shmq.cli.configs import kafka_call

    if args.topic is None or args.partition is None:
        raise CommandError("abort needs --topic and --partition (and --start-offset, or "
                           "--producer-id, --producer-epoch and --coordinator-epoch), or "
                           "--transactional-id")
    tp = f"{args.topic}-{args.partition}"
    if args.start_offset is None and args.producer_id is None:
        raise CommandError("The transaction to abort must be identified either with "
                           "--start-offset (for brokers on 3.0 or above) or with "
                           "--producer-id, --producer-epoch, and --coordinator-epoch (for "
                           "older brokers)")
    found = [p for p in _partitions(address, [args.topic], timeout)
             if p.partition == args.partition]
    if not found or found[0].leader is None:
        raise CommandError(f"Failed to abort transaction: partition {tp} has no leader")
    leader = found[0].leader
    if args.start_offset is None:
        if args.producer_epoch is None:
            raise CommandError("Missing required argument --producer-epoch")
        if args.coordinator_epoch is None:
            raise CommandError("Missing required argument --coordinator-epoch")
        pid, epoch = args.producer_id, args.producer_epoch
        coordinator_epoch = max(args.coordinator_epoch, 0)  # -1: opened by a new producer id
    else:
        states = _producers(leader, found, timeout).get((args.topic, args.partition), ())
        state = next((s for s in states
                      if int(s.current_txn_start_offset) == args.start_offset), None)
        if state is None:
            raise CommandError(f"Could not find any open transactions starting at offset "
                               f"{args.start_offset} on partition {tp}")
        pid, epoch = int(state.producer_id), int(state.producer_epoch)
        coordinator_epoch = max(int(state.coordinator_epoch), 0)
    spec = (f"AbortTransactionSpec(topicPartition={tp}, producerId={pid}, "
            f"producerEpoch={epoch}, coordinatorEpoch={coordinator_epoch})")
    resp = kafka_call(leader, WriteTxnMarkersRequest(markers=(WritableTxnMarker(
        producer_id=ProducerId(pid), producer_epoch=i16(epoch), transaction_result=False,
        topics=(WritableTxnMarkerTopic(name=args.topic,
                                       partition_indexes=(i32(args.partition),)),),
        coordinator_epoch=i32(coordinator_epoch)),)), timeout)
    codes = [p.error_code.value for m in resp.markers for t in m.topics for p in t.partitions]
    if codes != [0]:
        raise CommandError(f"Failed to abort transaction {spec}: "
                           f"{', '.join(_name(c) for c in codes) or 'no answer'}")
    return 0


def _find_hanging(address: str, args: argparse.Namespace, timeout: float) -> int:
    """Kafka's ``FindHangingTransactionsCommand``."""
    from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
    from kio.schema.list_transactions.v1.request import ListTransactionsRequest
    from kio.schema.types import ProducerId, TransactionalId
    from kio.static.primitive import i64

    from shmq.cli.configs import kafka_call

    if args.topic is None and args.broker_id is None:
        raise CommandError("The `find-hanging` command requires either --topic or "
                           "--broker-id to limit the scope of the search")
    if args.partition is not None and args.topic is None:
        raise CommandError("The --partition argument requires --topic to be provided")
    max_ms = args.max_transaction_timeout * 60_000
    parts = _partitions(address, None if args.topic is None else [args.topic], timeout)
    parts = [p for p in parts if (args.partition is None or p.partition == args.partition)
             and (args.broker_id is None or args.broker_id in p.replicas)]
    by_leader: dict[str, list[_Partition]] = {}
    for p in parts:
        if p.leader is not None:
            by_leader.setdefault(p.leader, []).append(p)
    now = int(time.time() * 1000)
    candidates: list[tuple[str, int, Any]] = []
    for leader, ps in by_leader.items():
        for (topic, partition), states in sorted(_producers(leader, ps, timeout).items()):
            candidates += [(topic, partition, s) for s in states
                           if int(s.current_txn_start_offset) >= 0
                           and now - int(s.last_timestamp) > max_ms]
    hanging = candidates
    if candidates:
        pids = sorted({int(s.producer_id) for _, _, s in candidates})
        listed = kafka_call(address, ListTransactionsRequest(
            state_filters=(), producer_id_filters=tuple(ProducerId(p) for p in pids),
            duration_filter=i64(-1)), timeout)
        tids = {int(t.producer_id): str(t.transactional_id) for t in listed.transaction_states}
        described: dict[str, set[tuple[str, int]] | None] = {}
        if tids:
            resp = kafka_call(address, DescribeTransactionsRequest(
                transactional_ids=tuple(TransactionalId(t) for t in sorted(set(tids.values())))),
                timeout)
            for t in resp.transaction_states:
                if t.error_code.value and t.error_code.value != 105:
                    raise CommandError(f"Failed to describe {len(tids)} transactions: "
                                       f"{_name(t.error_code.value)}")
                described[str(t.transactional_id)] = None if t.error_code.value else {
                    (str(tp.topic), int(i)) for tp in t.topics for i in tp.partitions}
        hanging = [(topic, partition, s) for topic, partition, s in candidates
                   if (known := described.get(tids.get(int(s.producer_id), ""))) is None
                   or (topic, partition) not in known]
    print(_table(["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
                  "StartOffset", "LastTimestamp", "Duration(min)"],
                 [[topic, partition, s.producer_id, s.producer_epoch, s.coordinator_epoch,
                   s.current_txn_start_offset, s.last_timestamp,
                   (now - int(s.last_timestamp)) // 60_000]
                  for topic, partition, s in hanging]))
    return 0

