"""Shared helpers for the perf/ scripts: timing, the environment header, the result table.

Benchmarks are scripts run by hand (not tests).  Every script measures its anchor in the same
run, warms up before timing, reports the median of ``--repeat`` samples, and prints the
environment it ran in (commit, CPU, Python, compiled ``_fast`` or not, build type).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# numpy's OpenBLAS spins worker threads after some calls; nothing here needs BLAS threads and on
# 2 cores they steal CPU from the benchmark.  Must be set before numpy is first imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def byte_compile_shmq() -> None:
    """shmq's modules byte-compiled before a start is timed, as an installed package's are (pip
    compiles them at install): an editable install run with PYTHONDONTWRITEBYTECODE=1 (this
    box's shells) compiles every module at every start, ~0.4 s of CPU in each start."""
    import compileall

    compileall.compile_dir(REPO / "shmq", quiet=1)


# -- timing -------------------------------------------------------------------------------------


# The clock the samples use.
#   "run"  (default) wall time minus the time this thread sat runnable waiting for a CPU
#          (/proc/thread-self/schedstat, field 2).  On a shared 2-core box that removes what other
#          processes cost us, but keeps everything shmq itself waits for: page faults, write(2),
#          msync, a blocked fsync.  With an idle machine it equals "wall".
#   "wall" perf_counter.
#   "cpu"  process CPU time (user + sys, all threads); hides time blocked in I/O.
def _runqueue_wait() -> float:
    with open("/proc/thread-self/schedstat", "rb") as f:
        return int(f.read().split()[1]) / 1e9


def _run_clock() -> float:
    return time.perf_counter() - _runqueue_wait()


try:
    _runqueue_wait()
    _HAVE_SCHEDSTAT = True
except (OSError, ValueError, IndexError):
    _HAVE_SCHEDSTAT = False

CLOCKS = {"run": _run_clock if _HAVE_SCHEDSTAT else time.perf_counter,
          "wall": time.perf_counter, "cpu": time.process_time}
CLOCK_TEXT = {
    "run": ("wall time minus run-queue wait (/proc/thread-self/schedstat): excludes CPU taken by "
            "other processes, includes I/O and page-fault waits"
            if _HAVE_SCHEDSTAT else "wall time (schedstat unavailable)"),
    "wall": "wall time (perf_counter)",
    "cpu": "process CPU time, user+sys (hides time blocked in I/O)",
}
_clock_name = "run"


def set_clock(name: str) -> None:
    global _clock_name
    if name not in CLOCKS:
        raise ValueError(f"unknown clock {name!r}")
    _clock_name = name


def clock_name() -> str:
    return _clock_name


@dataclass
class Timing:
    """Samples (seconds, on the chosen clock) of one case, and the wall time of each."""

    samples: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)

    @property
    def busy(self) -> float:
        """Median chosen-clock / wall ratio (below 1: other processes took CPU from us)."""
        return statistics.median(s / w for s, w in zip(self.samples, self.wall, strict=True) if w > 0)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        return min(self.samples)

    @property
    def worst(self) -> float:
        return max(self.samples)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the samples were."""
        return (self.worst - self.best) / self.median if self.median else 0.0


@dataclass
class Case:
    """One thing to time: ``fn`` is timed, ``setup``/``teardown`` run around it untimed."""

    fn: Callable[[], object]
    setup: Callable[[], object] | None = None
    teardown: Callable[[], object] | None = None


def _once(case: Case) -> tuple[float, float]:
    if case.setup is not None:
        case.setup()
    clock = CLOCKS[_clock_name]
    w0 = time.perf_counter()
    t0 = clock()
    case.fn()
    elapsed = clock() - t0
    wall = time.perf_counter() - w0
    if case.teardown is not None:
        case.teardown()
    return elapsed, wall


def measure(cases: dict[str, Case], repeat: int, warmup: int = 1) -> dict[str, Timing]:
    """Time every case ``repeat`` times after ``warmup`` untimed runs, interleaving the cases
    (A B A B ...) so slow drift of the machine hits all of them alike."""
    for _ in range(warmup):
        for case in cases.values():
            _once(case)
    out = {name: Timing() for name in cases}
    for _ in range(repeat):
        for name, case in cases.items():
            elapsed, wall = _once(case)
            out[name].samples.append(elapsed)
            out[name].wall.append(wall)
    return out


def time_one(fn: Callable[[], object], repeat: int, warmup: int = 1, *,
             setup: Callable[[], object] | None = None,
             teardown: Callable[[], object] | None = None) -> Timing:
    return measure({"x": Case(fn, setup, teardown)}, repeat, warmup)["x"]


# -- environment --------------------------------------------------------------------------------


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu() -> str:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor() or "unknown"
    return f"{model} ({os.cpu_count()} logical CPUs)"


def _build_type() -> str:
    """How the compiled _fast modules were built, from the compiler line in their debug info."""
    from shmq import _fast

    if not _fast.HAVE_FAST:
        why = "SHMQ_PURE=1" if os.environ.get("SHMQ_PURE") else "extensions not built"
        return f"pure-Python twin ({why})"
    from shmq._fast import batch

    try:
        data = Path(batch.__file__).read_bytes()
    except OSError:
        return "compiled (unknown flags)"
    m = re.search(rb"GNU C[0-9A-Za-z+]* [0-9.]+ [^\x00]*", data)
    if not m:
        return "compiled (no compiler line in the .so)"
    producer = m.group(0).decode("ascii", "replace")
    opts = re.findall(r"-O[0-3sfastgz]*", producer)
    level = opts[-1] if opts else "-O?"
    kind = "debug" if level == "-O0" else "release"
    if "-fsanitize" in producer or b"__asan_init" in data:
        kind += "+sanitizers"
    compiler = " ".join(producer.split()[:3])
    text = f"{kind} ({compiler} {level}; SHMQ_DEBUG/SHMQ_SANITIZE builds show -O0 / sanitizers)"
    stale = _stale_extensions(Path(batch.__file__).parent)
    if stale:
        text += f"; STALE: {', '.join(stale)} newer than the built .so (rebuild: setup.py build_ext --inplace)"
    return text


def _stale_extensions(src: Path) -> list[str]:
    """Sources edited after their extension was built (the run would measure old code)."""
    headers = [p for p in src.iterdir() if p.suffix in (".h", ".pxd")]
    stale = []
    for pyx in sorted(src.glob("*.pyx")):
        built = list(src.glob(pyx.stem + ".*.so"))
        if not built:
            continue
        so_time = max(p.stat().st_mtime for p in built)
        text = pyx.read_text()
        included = [h for h in headers if f'"{h.name}"' in text or re.search(
            rf"^\s*(?:from\s+(?:[\w.]*\.)?{h.stem}\s+cimport|cimport\s+(?:[\w.]*\.)?{h.stem}\b)",
            text, re.M)]
        newer = [p.name for p in [pyx, *included] if p.stat().st_mtime > so_time]
        if pyx.name in newer:
            stale.append(pyx.name)
        elif newer:  # a header the module includes (cdef extern from "x.h" / cimport x)
            stale.append(f"{pyx.name} (via {', '.join(newer)})")
    return stale


def environment() -> list[tuple[str, str]]:
    from shmq import _fast

    crc_path = "SSE4.2" if _fast.have_hardware() else "table (no SSE4.2)"
    if _fast.have_folding():
        crc_path = "AVX-512 VPCLMULQDQ folding (>= 256 B), SSE4.2"
    return [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("commit", _commit()),
        ("cpu", _cpu()),
        ("kernel", platform.release()),
        ("python", f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})"),
        ("shmq._fast", f"HAVE_FAST={_fast.HAVE_FAST}; crc32c path: {crc_path}"),
        ("build", _build_type()),
        ("clock", f"{_clock_name}: {CLOCK_TEXT[_clock_name]}; median of --repeat samples "
                  f"after --warmup runs"),
        ("load", "loadavg {:.2f} {:.2f} {:.2f} at start".format(*os.getloadavg())),
    ]


def print_environment(title: str) -> None:
    print(title)
    print("=" * len(title))
    for key, value in environment():
        print(f"  {key:<11} {value}")
    print()


# -- results ------------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the result table.

    ``kind`` decides the verdict: "ratio>=" / "ratio<=" compare ``ratio`` with ``goal``,
    "value>=" compares ``value`` with ``goal``, "info" has no target.
    ``ratio`` is value / anchor unless given.
    """

    name: str
    value: float
    unit: str
    anchor: float | None = None
    anchor_label: str = ""
    kind: str = "info"
    goal: float | None = None
    ratio: float | None = None
    target_text: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if self.ratio is None and self.anchor:
            self.ratio = self.value / self.anchor

    @property
    def verdict(self) -> str:
        if self.kind == "info" or self.goal is None:
            return "info"
        if self.kind == "ratio>=":
            ok = self.ratio is not None and self.ratio >= self.goal
        elif self.kind == "ratio<=":
            ok = self.ratio is not None and self.ratio <= self.goal
        elif self.kind == "value>=":
            ok = self.value >= self.goal
        else:
            raise ValueError(self.kind)
        return "PASS" if ok else "FAIL"

    @property
    def target(self) -> str:
        if self.target_text:
            return self.target_text
        if self.kind == "info":
            return "-"
        if self.kind == "ratio>=":
            return f">= {self.goal:g}x anchor"
        if self.kind == "ratio<=":
            return f"<= {self.goal:g}x anchor"
        return f">= {fmt(self.goal or 0)} {self.unit}"


def fmt(x: float) -> str:
    """A number with 3 significant digits (no exponent for everyday magnitudes)."""
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 100:
        return f"{x:,.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def print_table(rows: list[Row], title: str | None = None) -> None:
    header = ("benchmark", "shmq", "anchor", "ratio", "target", "verdict")
    lines = []
    for r in rows:
        anchor = "-"
        if r.anchor is not None:
            anchor = f"{fmt(r.anchor)} {r.unit}"
            if r.anchor_label:
                anchor += f" ({r.anchor_label})"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        lines.append((r.name, f"{fmt(r.value)} {r.unit}", anchor, ratio, r.target, r.verdict))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(header)]

    def row(cells: tuple[str, ...]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    if title:
        print(title)
    print(row(header))
    print("-+-".join("-" * w for w in widths))
    for line in lines:
        print(row(line))
    notes = [(r.name, r.note) for r in rows if r.note]
    if notes:
        print()
        for name, note in notes:
            print(f"  {name}: {note}")
    print()


def print_verdicts(rows: list[Row]) -> None:
    judged = [r for r in rows if r.verdict != "info"]
    failed = [r for r in judged if r.verdict == "FAIL"]
    print(f"targets: {len(judged) - len(failed)} PASS, {len(failed)} FAIL"
          + (" -> " + "; ".join(r.name for r in failed) if failed else ""))


def spread_note(label: str, t: Timing) -> str:
    return (f"{label} n={len(t.samples)} median {t.median * 1e3:.2f} ms "
            f"[{t.best * 1e3:.2f}..{t.worst * 1e3:.2f}] (spread {t.spread:.0%}, {_clock_name}/wall {t.busy:.2f})")


# -- argparse -----------------------------------------------------------------------------------


def size_arg(text: str) -> int:
    """'512M', '64KiB', '1g', '4096' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgKMG]?)(?:i?[bB])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    mult = {"": 1, "k": KiB, "m": MiB, "g": GiB}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--repeat", type=int, default=5, help="timed samples per case (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before timing")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="run",
                   help="run: wall minus run-queue wait (robust on a shared box); wall; cpu")
    return p


def add_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=tempfile.gettempdir(),
                   help="parent of the temporary directories (same filesystem as /tmp by default)")


def human_bytes(n: int) -> str:
    """16384 -> '16 KiB', 15760000 -> '15.0 MiB'."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n // size} {unit}" if n % size == 0 else f"{n / size:.1f} {unit}"
    return f"{n} B"


def main_for(module_title: str, parser: argparse.ArgumentParser,
             run: Callable[[argparse.Namespace], list[Row]], argv: list[str] | None = None) -> int:
    args = parser.parse_args(argv)
    set_clock(args.clock)
    print_environment(module_title)
    rows = run(args)
    print_table(rows)
    print_verdicts(rows)
    return 0
