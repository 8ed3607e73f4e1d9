"""Run every storage benchmark with its default knobs and print one combined table.

    python perf/run_storage.py [--only crc32c,append,decode,recovery,lookup] [--repeat N]
                               [--clock run|wall|cpu] [--dir /tmp]

Each benchmark prints its own table (with per-row details) as it finishes; the combined table
and the PASS/FAIL verdicts come last.  Exits 0 whatever the verdicts (they are printed, not
enforced); exits 1 only if a benchmark crashed.  ``make bench`` calls this script.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import _common as c
import bench_append
import bench_crc32c
import bench_decode
import bench_lookup
import bench_recovery

BENCHES = {
    "crc32c": (bench_crc32c, "CRC-32C"),
    "append": (bench_append, "Append (page cache)"),
    "decode": (bench_decode, "Decode to tuples / Arrow"),
    "recovery": (bench_recovery, "Recovery after a crash"),
    "lookup": (bench_lookup, "Offset lookup, 10,000 vs 10 segments"),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset to run")
    p.add_argument("--repeat", type=int, default=None, help="override every benchmark's --repeat")
    p.add_argument("--clock", choices=sorted(c.CLOCKS), default="run")
    p.add_argument("--dir", default=None, help="parent of the temp dirs (default: the temp dir)")
    args = p.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [n for n in chosen if n not in BENCHES]
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHES)}")

    c.set_clock(args.clock)
    c.print_environment("shmq storage benchmarks (perf/run_storage.py)")
    all_rows: list[c.Row] = []
    crashed = []
    started = time.perf_counter()
    for name in chosen:
        module, title = BENCHES[name]
        bench_args = ["--clock", args.clock]
        if args.repeat is not None:
            bench_args += ["--repeat", str(args.repeat)]
        if args.dir is not None and "--dir" in module.parser().format_help():
            bench_args += ["--dir", args.dir]
        ns = module.parser().parse_args(bench_args)
        t0 = time.perf_counter()
        try:
            rows = module.run(ns)
        except Exception:  # report and go on with the others
            traceback.print_exc()
            crashed.append(name)
            continue
        print(f"--- {title} ({time.perf_counter() - t0:.0f} s) ---")
        c.print_table(rows)
        all_rows.extend(rows)
        sys.stdout.flush()

    print(f"=== all storage benchmarks ({time.perf_counter() - started:.0f} s) ===")
    for row in all_rows:
        row.note = ""  # details were printed above
    c.print_table(all_rows)
    c.print_verdicts(all_rows)
    if crashed:
        print(f"CRASHED: {', '.join(crashed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
