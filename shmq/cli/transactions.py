"""``shmq transactions``: Kafka's ``kafka-transactions.sh`` (``TransactionsCommand``).

    list [--state S ...] [--producer-id ID ...] [--duration-filter MS]
         TransactionalId  Coordinator  ProducerId  TransactionState   (ListTransactions)
    describe --transactional-id ID
         CoordinatorId  TransactionalId  ProducerId  ProducerEpoch  TransactionState
         TransactionTimeoutMs  CurrentTransactionStartTimeMs  TransactionDurationMs
         TopicPartitions                                                (DescribeTransactions)
    abort --transactional-id ID
         fence the id's producer and abort its open transaction (InitProducerId with the id:
         the coordinator bumps the epoch and writes ABORT markers)

Kafka's ``abort --topic --partition --producer-id ...`` writes markers for a *hanging*
transaction, one the coordinator no longer knows; shmq's workers verify every transactional
write that opens a transaction with the coordinator (KIP-890 part 1), so none can hang, and
that form is refused with a one-line explanation.  Output is Kafka's: tab-separated columns
under a header line.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from shmq.cli import CommandError
from shmq.cli._connect import add_connection_args, resolve_bootstrap

ERRORS = {15: "COORDINATOR_NOT_AVAILABLE", 16: "NOT_COORDINATOR", 51: "CONCURRENT_TRANSACTIONS",
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
    a = sub.add_parser("abort", help="abort a transaction")
    a.add_argument("--transactional-id")
    a.add_argument("--topic")
    a.add_argument("--partition", type=int)
    a.add_argument("--producer-id", type=int)
    a.add_argument("--producer-epoch", type=int)
    a.add_argument("--coordinator-epoch", type=int)
    a.add_argument("--start-offset", type=int)
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
        if args.transactional_id is None:
            raise CommandError("shmq verifies every transactional write with the coordinator "
                               "(KIP-890), so no transaction can hang: abort one by "
                               "--transactional-id")
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
