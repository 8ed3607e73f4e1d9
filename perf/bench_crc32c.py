"""CRC-32C throughput: shmq._fast.crc32c against the ``crc32c`` PyPI package (the anchor).

Each sample checksums ``--total`` bytes as back-to-back calls over one cache-hot random buffer
of the row's size, so small rows include the per-call overhead (argument parsing, buffer
protocol, GIL release) of both implementations.  Target: >= 0.8x the package at 1 MiB.

    python perf/bench_crc32c.py [--repeat 7] [--total 256M] [--sizes 4K,64K,1M]
"""

from __future__ import annotations

import argparse
import os
import sys

import _common as c

TARGET_SIZE = c.MiB
TARGET_RATIO = 0.8


def parser() -> argparse.ArgumentParser:
    p = c.base_parser(__doc__.splitlines()[0])
    p.set_defaults(repeat=7)
    p.add_argument("--total", type=c.size_arg, default=256 * c.MiB,
                   help="bytes checksummed per timed sample")
    p.add_argument("--sizes", default="4K,64K,1M", help="buffer sizes, one row each")
    return p


def run(args: argparse.Namespace) -> list[c.Row]:
    import crc32c as pkg

    from shmq import _fast

    if not hasattr(pkg, "crc32c"):
        raise SystemExit("the crc32c package has no crc32c(); pip install 'crc32c>=2.4'")
    pkg_version = getattr(pkg, "__version__", "?")
    rows = []
    for size in (c.size_arg(s) for s in args.sizes.split(",")):
        buf = os.urandom(size)
        calls = max(1, args.total // size)
        if _fast.crc32c(buf) != pkg.crc32c(buf):
            raise SystemExit(f"CRC mismatch at {size} bytes: shmq and the package disagree")

        def ours(buf: bytes = buf, calls: int = calls) -> None:
            f = _fast.crc32c
            for _ in range(calls):
                f(buf)

        def theirs(buf: bytes = buf, calls: int = calls) -> None:
            f = pkg.crc32c
            for _ in range(calls):
                f(buf)

        t = c.measure({"shmq": c.Case(ours), "anchor": c.Case(theirs)}, args.repeat, args.warmup)
        done = calls * size
        gbs = done / t["shmq"].median / 1e9
        anchor = done / t["anchor"].median / 1e9
        judged = size == TARGET_SIZE
        rows.append(c.Row(
            f"crc32c {c.human_bytes(size)} buffers", gbs, "GB/s", anchor,
            f"crc32c {pkg_version}", kind="ratio>=" if judged else "info",
            goal=TARGET_RATIO if judged else None,
            note=(f"{calls} calls/sample; " + c.spread_note("shmq", t["shmq"]) + "; "
                  + c.spread_note("anchor", t["anchor"])),
        ))
    return rows


def main(argv: list[str] | None = None) -> int:
    return c.main_for("CRC-32C: shmq._fast.crc32c vs the crc32c package", parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
