"""Record decoding: batches -> Python tuples and batches -> Arrow columns.

The input is ``--batches`` uncompressed RecordBatch v2 of ``--records-per-batch`` records each
(~100 B records: 8-byte key, ``--value-bytes`` value of JSON-like text, no headers), one
contiguous buffer as a fetch response or a segment file holds them (~1,000,000 records, ~100 MB).

(a) ``decode_batches(buf)`` -> list of ``Record`` NamedTuples, every record alive at the end.
    Target >= 3 M records/s.  Anchor (informational): kafka-python's ``DefaultRecordBatch``
    iteration over the first ``--anchor-batches`` batches of the same bytes (it is ~30x slower,
    so it gets a prefix to keep the run short; rates are per record).
(b) ``batches_to_arrow(buf)`` -> ``pyarrow.RecordBatch``, steady state: median of repeats, each
    repeat's result freed before the next so pyarrow's pool reuses its memory.  Target >= 20 M
    records/s.  The very first call of the process (fresh pool memory: page faults) is an extra
    "cold" row.  Anchor (informational): pyarrow building the same four columns from the
    already-decoded tuples with ``pa.array`` (tuple decoding not counted).
    Informational: the same decoding batch by batch, each batch's records dropped at once.
(c) gzip and zstd batches (``--compressed-batches`` of them), into tuples and into Arrow
    (informational: decompression dominates).

    python perf/bench_decode.py [--repeat 7] [--batches 1000] [--records-per-batch 1000]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys

import _common as c

TUPLE_TARGET = 3e6
ARROW_TARGET = 20e6


def parser() -> argparse.ArgumentParser:
    p = c.base_parser(__doc__.splitlines()[0])
    p.set_defaults(repeat=7)
    p.add_argument("--batches", type=int, default=1000, help="uncompressed batches in the buffer")
    p.add_argument("--records-per-batch", type=int, default=1000)
    p.add_argument("--value-bytes", type=int, default=84, help="value size (key is 8 bytes)")
    p.add_argument("--anchor-batches", type=int, default=100,
                   help="batches the kafka-python anchor decodes (a prefix of the same buffer)")
    p.add_argument("--compressed-batches", type=int, default=200,
                   help="batches in the gzip / zstd buffers; 0 skips those rows")
    return p


def make_records(n: int, start: int, value_bytes: int, rng: random.Random) -> list[tuple]:
    """~100 B records: an 8-byte key and a JSON-ish value (compressible, like real payloads)."""
    events = ("click", "view", "scroll", "purchase", "login", "logout")
    out = []
    for i in range(start, start + n):
        value = (b'{"user":%d,"event":"%s","page":"/p/%d","ms":%d}' % (
            rng.randrange(1_000_000), events[rng.randrange(len(events))].encode(),
            rng.randrange(10_000), rng.randrange(100_000)))
        value = (value + b" " * value_bytes)[:value_bytes]
        out.append((b"k%07d" % (i % 10_000_000), value))
    return out


def make_buffer(batches: int, per_batch: int, value_bytes: int, codec: int) -> bytes:
    from shmq.protocol.records import encode_batch

    rng = random.Random(42)
    parts, offset = [], 0
    for _ in range(batches):
        recs = make_records(per_batch, offset, value_bytes, rng)
        parts.append(bytes(encode_batch(recs, base_offset=offset, compression_type=codec)))
        offset += per_batch
    return b"".join(parts)


def kafka_python_decode(buf: bytes) -> int:
    from kafka.record.memory_records import MemoryRecords

    n = 0
    records = MemoryRecords(buf)
    while True:
        batch = records.next_batch()
        if batch is None:
            return n
        for rec in batch:
            rec.key, rec.value  # noqa: B018  (touch the fields a consumer reads)
            n += 1


def run(args: argparse.Namespace) -> list[c.Row]:
    import pyarrow as pa

    from shmq.protocol import compression as codecs
    from shmq.protocol.records import batches_to_arrow, decode_batches

    n = args.batches * args.records_per_batch
    buf = make_buffer(args.batches, args.records_per_batch, args.value_bytes, codecs.NONE)
    rec_size = (len(buf) / n) - 61 / args.records_per_batch
    rows: list[c.Row] = []
    keep: dict = {}
    clock = c.CLOCKS[c.clock_name()]

    # (b, cold) the first Arrow decode of this process: before anything else touches pyarrow's pool
    gc.collect()
    t0 = clock()
    first = batches_to_arrow(buf)
    cold = clock() - t0
    assert first.num_rows == n
    del first

    # (b) steady state, against pa.array over tuples
    keep["src"] = tuples = decode_batches(buf)
    assert len(tuples) == n and tuples[-1].offset == n - 1
    del tuples

    def arrow() -> None:
        keep["arrow"] = batches_to_arrow(buf)

    def free_arrow() -> None:
        assert keep.pop("arrow").num_rows == n

    def pa_anchor() -> None:
        tuples = keep["src"]
        keep["pa"] = pa.RecordBatch.from_arrays([
            pa.array([r.offset for r in tuples], pa.int64()),
            pa.array([r.timestamp for r in tuples], pa.timestamp("ms")),
            pa.array([r.key for r in tuples], pa.binary()),
            pa.array([r.value for r in tuples], pa.binary()),
        ], names=["offset", "timestamp", "key", "value"])

    def free_pa() -> None:
        keep.pop("pa")

    ta = c.measure({"shmq": c.Case(arrow, teardown=free_arrow),
                    "anchor": c.Case(pa_anchor, teardown=free_pa)}, args.repeat, args.warmup)
    del keep["src"]
    gc.collect()

    # (a) tuples, against kafka-python on a prefix of the same bytes
    anchor_buf = buf
    if args.anchor_batches < args.batches:
        from shmq.protocol.records import iter_batches

        end = 0
        for i, view in enumerate(iter_batches(buf)):
            if i == args.anchor_batches:
                break
            end += view.size
        anchor_buf = buf[:end]
    anchor_n = min(args.anchor_batches, args.batches) * args.records_per_batch

    def to_tuples() -> None:
        keep["tuples"] = decode_batches(buf)

    def free_tuples() -> None:
        assert len(keep.pop("tuples")) == n

    def kp() -> None:
        assert kafka_python_decode(anchor_buf) == anchor_n

    def streamed() -> None:
        from shmq.protocol.records import iter_batches

        got = 0
        for view in iter_batches(buf):
            got += len(view.records())  # dropped at once: pymalloc reuses the same pools
        assert got == n

    tt = c.measure({"shmq": c.Case(to_tuples, teardown=free_tuples), "anchor": c.Case(kp),
                    "streamed": c.Case(streamed)}, args.repeat, args.warmup)
    rate_t = n / tt["shmq"].median
    rows.append(c.Row(
        "decode -> tuples (decode_batches)", rate_t / 1e6, "M rec/s",
        anchor_n / tt["anchor"].median / 1e6, "kafka-python", kind="value>=",
        goal=TUPLE_TARGET / 1e6,
        note=(f"{n:,} records of ~{rec_size:.0f} B in {args.batches} batches ({len(buf) / 1e6:.0f} MB), "
              f"all kept alive; anchor over the first {anchor_n:,}; "
              + c.spread_note("shmq", tt["shmq"]) + "; " + c.spread_note("anchor", tt["anchor"])),
    ))
    rows.append(c.Row(
        "decode -> tuples, batch by batch (dropped)", n / tt["streamed"].median / 1e6, "M rec/s",
        note=("iter_batches + RecordBatchView.records(), each batch's list dropped before the next: "
              "the same decoding without 1 M live objects (no fresh pages); "
              + c.spread_note("streamed", tt["streamed"])),
    ))
    rate_a = n / ta["shmq"].median
    rows.append(c.Row(
        "decode -> Arrow (batches_to_arrow)", rate_a / 1e6, "M rec/s",
        n / ta["anchor"].median / 1e6, "pa.array from tuples", kind="value>=",
        goal=ARROW_TARGET / 1e6,
        note=("steady state, results freed between repeats; anchor excludes tuple decoding; "
              + c.spread_note("shmq", ta["shmq"]) + "; " + c.spread_note("anchor", ta["anchor"])),
    ))
    rows.append(c.Row(
        "decode -> Arrow, first call (cold)", n / cold / 1e6, "M rec/s",
        note=(f"one call, the process's first use of pyarrow's {pa.default_memory_pool().backend_name} "
              f"pool ({cold * 1e3:.1f} ms, fresh pages)"),
    ))

    # (c) compressed batches
    if args.compressed_batches:
        for name, codec in (("gzip", codecs.GZIP), ("zstd", codecs.ZSTD)):
            cbuf = make_buffer(args.compressed_batches, args.records_per_batch, args.value_bytes, codec)
            cn = args.compressed_batches * args.records_per_batch

            def ctuples(cbuf: bytes = cbuf) -> None:
                keep["ct"] = decode_batches(cbuf)

            def carrow(cbuf: bytes = cbuf) -> None:
                keep["ca"] = batches_to_arrow(cbuf)

            tc = c.measure({"tuples": c.Case(ctuples, teardown=lambda: keep.pop("ct")),
                            "arrow": c.Case(carrow, teardown=lambda: keep.pop("ca"))},
                           args.repeat, args.warmup)
            ratio = cn * (rec_size) / len(cbuf)
            for kind in ("tuples", "arrow"):
                rows.append(c.Row(
                    f"decode {name} -> {'tuples' if kind == 'tuples' else 'Arrow'}",
                    cn / tc[kind].median / 1e6, "M rec/s",
                    note=(f"{cn:,} records, {len(cbuf) / 1e6:.1f} MB compressed "
                          f"(~{ratio:.1f}:1); " + c.spread_note(kind, tc[kind])),
                ))
            del cbuf
    return rows


def main(argv: list[str] | None = None) -> int:
    return c.main_for("Decode: batches -> tuples / Arrow", parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
