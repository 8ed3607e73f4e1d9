"""Offsets and ranges: Spark's Kafka source's planning rules, over a ``Catalog``.

Ported from the behaviour of ``KafkaOffsetReaderAdmin`` (which partitions, how starting and
ending offsets resolve), ``KafkaOffsetRangeCalculator`` (``minPartitions``,
``maxRecordsPerPartition``) and ``KafkaMicroBatchStream`` (``maxOffsetsPerTrigger``'s
proportional split, ``minOffsetsPerTrigger`` with ``maxTriggerDelay``), so that the same
options give the same ranges and the same micro-batches as ``format("kafka")``.

One difference: every offset is resolved at planning (``latest`` is the high watermark when the
query is planned), where Kafka's batch source may resolve ``latest`` when a task starts.  A
task so always reads the same, repeatable range, whichever executor runs it and whenever.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from spark_bridge.catalog import Catalog, TopicPartition
from spark_bridge.errors import BridgeError, DataLossError
from spark_bridge.options import EARLIEST, LATEST, OffsetSpec, SourceOptions

log = logging.getLogger("shmq.spark")
PartitionOffsets = dict[TopicPartition, int]


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def assigned_partitions(catalog: Catalog, opts: SourceOptions, *,
                        strict: bool) -> list[TopicPartition]:
    """The partitions the options select, in (topic, partition) order.  ``strict`` (batch
    queries): a named topic or partition that does not exist, or a pattern that matches no
    topic, is an error; a stream waits for them instead."""
    topics = catalog.topics()
    if opts.strategy == "assign":
        out = []
        for t, p in opts.assigned:
            if t not in topics or p >= topics[t]:
                if strict:
                    what = (f"topic {t!r} does not exist" if t not in topics
                            else f"topic {t!r} has {topics[t]} partitions")
                    raise BridgeError(f"option 'assign' names partition {t}-{p}, but {what}")
                continue
            out.append((t, p))
        return sorted(set(out))
    if opts.strategy == "subscribe":
        missing = [t for t in opts.topics if t not in topics]
        if missing and strict:
            raise BridgeError(f"unknown topic{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(repr(t) for t in missing)} in option 'subscribe'")
        names = [t for t in opts.topics if t in topics]
    else:
        assert opts.pattern is not None
        names = [t for t in topics if opts.pattern.fullmatch(t)]
        if not names and strict:
            raise BridgeError(f"option 'subscribePattern' {opts.pattern.pattern!r} matches no "
                              f"topic (topics: {', '.join(sorted(topics)) or 'none'})")
    return sorted((t, p) for t in set(names) for p in range(topics[t]))


def resolve(catalog: Catalog, spec: OffsetSpec, tps: list[TopicPartition], *, starting: bool,
            no_match_latest: bool = False) -> PartitionOffsets:
    """Concrete offsets for ``spec`` on the partitions ``tps``."""
    if not tps:
        return {}
    if spec.kind == "earliest":
        return catalog.earliest(tps)
    if spec.kind == "latest":
        return catalog.latest(tps)
    name = "startingOffsets" if starting else "endingOffsets"
    if spec.kind == "timestamp":
        times = {tp: spec.value for tp in tps}
        name += " (timestamp)"
    elif spec.kind == "timestamps":
        _same_partitions(spec.value, tps, name + "ByTimestamp")
        times = dict(spec.value)
    else:
        _same_partitions(spec.value, tps, name)
        wanted = dict(spec.value)
        earliest = catalog.earliest([tp for tp, v in wanted.items() if v == EARLIEST])
        latest = catalog.latest([tp for tp, v in wanted.items() if v == LATEST])
        resolved = {**wanted, **earliest, **latest}
        return {tp: resolved[tp] for tp in wanted}
    found = catalog.offsets_for_times(times)
    out = {}
    latest_needed = [tp for tp, off in found.items() if off < 0]
    latest = catalog.latest(latest_needed) if latest_needed else {}
    for tp, off in found.items():
        if off >= 0:
            out[tp] = off
        elif starting and not no_match_latest:
            raise BridgeError(f"no offset of {tp[0]}-{tp[1]} has a timestamp at or after "
                              f"{times[tp]} ({name}); set startingOffsetsByTimestampStrategy "
                              "to latest to start at the end instead")
        else:
            out[tp] = latest[tp]
    return out


def _same_partitions(given: dict[TopicPartition, int], tps: list[TopicPartition],
                     name: str) -> None:
    if set(given) != set(tps):
        def names(keys: object) -> str:
            return ", ".join(f"{t}-{p}" for t, p in sorted(keys)) or "none"  # type: ignore[call-overload]
        raise BridgeError(f"option '{name}' must give every assigned partition (-2 for "
                          f"earliest, -1 for latest): it gives {names(given)}, the query reads "
                          f"{names(tps)}")


def batch_ranges(catalog: Catalog, opts: SourceOptions) -> list[OffsetRange]:
    """The offset ranges of a batch query, fixed now."""
    tps = assigned_partitions(catalog, opts, strict=True)
    start = resolve(catalog, opts.starting, tps, starting=True,
                    no_match_latest=opts.no_match_latest)
    end = resolve(catalog, opts.ending, tps, starting=False)
    earliest = catalog.earliest(tps)
    latest = catalog.latest(tps)
    ranges = []
    for tp in tps:
        s, e = start[tp], end[tp]
        if e > latest[tp]:
            raise BridgeError(f"endingOffsets for {tp[0]}-{tp[1]} is {e}, past the end of the "
                              f"partition (its latest offset is {latest[tp]})")
        if s > latest[tp]:
            raise BridgeError(f"startingOffsets for {tp[0]}-{tp[1]} is {s}, past the end of "
                              f"the partition (its latest offset is {latest[tp]})")
        if s < earliest[tp]:
            report_data_loss(opts.fail_on_data_loss,
                             f"startingOffsets for {tp[0]}-{tp[1]} is {s}, but the partition "
                             f"starts at offset {earliest[tp]} (offsets {s} to "
                             f"{earliest[tp] - 1} were deleted)")
            s = earliest[tp]
        ranges.append(OffsetRange(tp[0], tp[1], s, max(s, e)))
    return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None) -> list[OffsetRange]:
    """Empty ranges dropped; ranges over ``max_records`` cut into even pieces; then Kafka's
    ``minPartitions`` rule (``KafkaOffsetRangeCalculator.getRanges``)."""
    ranges = [r for r in ranges if r.size > 0]
    if max_records:
        pieces = []
        for r in ranges:
            parts = max(1, -(-r.size // max_records))
            pieces += _divide(r, parts)
        ranges = pieces
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)

    def part_count(size: int, whole: int, parts: int) -> int:
        return max(_round_half_up(size / whole * parts), 1)

    small = [r for r in ranges if part_count(r.size, total, min_partitions) == 1]
    unsplit = {(r.topic, r.partition) for r in small}  # by partition, as Kafka keys them
    split_total = total - sum(r.size for r in small)
    split_min = max(min_partitions - len(small), 1)
    out = []
    for r in ranges:
        if (r.topic, r.partition) in unsplit:
            out.append(r)
        else:
            out += _divide(r, part_count(r.size, split_total, split_min))
    return [r for r in out if r.size > 0]


def _round_half_up(x: float) -> int:
    """Scala's ``math.round`` of a double (half up), not Python's banker's rounding."""
    return math.floor(x + 0.5)


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    out, remaining, start = [], r.size, r.start
    for part in range(parts):
        this = remaining // (parts - part)  # the last part takes the rounding
        remaining -= this
        end = min(start + this, r.end)
        out.append(OffsetRange(r.topic, r.partition, start, end))
        start = end
    return out


def report_data_loss(fail: bool, message: str) -> None:
    if fail:
        raise DataLossError(message)
    log.warning("shmq: %s; skipping them (failOnDataLoss=false)", message)


# -- streaming -----------------------------------------------------------------------------


def to_json(offsets: PartitionOffsets) -> dict[str, dict[str, int]]:
    """Kafka's offset JSON shape, ``{"topic": {"0": 42}}``, in a stable order (Spark compares
    offsets as JSON text)."""
    out: dict[str, dict[str, int]] = {}
    for (t, p) in sorted(offsets):
        out.setdefault(t, {})[str(p)] = int(offsets[(t, p)])
    return out


def from_json(data: dict) -> PartitionOffsets:
    try:
        return {(t, int(p)): int(v) for t, ps in data.items() for p, v in ps.items()}
    except (AttributeError, TypeError, ValueError):
        raise BridgeError(f"not a Kafka source offset: {data!r} (expected "
                          '{"topic": {"0": 42}})') from None


def rate_limit(limit: int, start: PartitionOffsets, until: PartitionOffsets,
               earliest_of_new: PartitionOffsets) -> PartitionOffsets:
    """``maxOffsetsPerTrigger``: Kafka's proportional split of ``limit`` offsets over the
    partitions with new data (``KafkaMicroBatchStream.rateLimit``), small ones not starved."""
    sizes = {}
    for tp, end in until.items():
        begin = start.get(tp, earliest_of_new.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(until)
    out = {}
    for tp, end in until.items():
        if tp not in sizes:
            out[tp] = end
            continue
        begin = start.get(tp, earliest_of_new.get(tp, 0))
        prorate = limit * (sizes[tp] / total)
        prorate_long = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, begin + int(prorate_long))
    return out


def stream_ranges(catalog: Catalog, start: PartitionOffsets, end: PartitionOffsets,
                  opts: SourceOptions) -> list[OffsetRange]:
    """One micro-batch's ranges (``getOffsetRangesFromResolvedOffsets``): partitions new since
    ``start`` begin at their earliest offset; vanished ones and offsets that went backwards are
    data loss."""
    new = [tp for tp in end if tp not in start]
    new_start = catalog.earliest(new) if new else {}
    for tp, off in sorted(new_start.items()):
        if off != 0:
            report_data_loss(opts.fail_on_data_loss,
                             f"added partition {tp[0]}-{tp[1]} starts at offset {off}, not 0: "
                             "some records may have been missed")
    gone = sorted(tp for tp in start if tp not in end)
    if gone:
        report_data_loss(opts.fail_on_data_loss,
                         f"partitions {', '.join(f'{t}-{p}' for t, p in gone)} are gone: some "
                         "records may have been missed")
    ranges = []
    for tp in sorted(end):
        s = start.get(tp, new_start.get(tp))
        if s is None:
            continue
        e = end[tp]
        if e < s:
            report_data_loss(opts.fail_on_data_loss,
                             f"the offset of {tp[0]}-{tp[1]} went back from {s} to {e}: some "
                             "records may have been missed")
        ranges.append(OffsetRange(tp[0], tp[1], s, e))
    return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)
