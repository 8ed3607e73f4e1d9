"""Multi-process seqlock stress: one writer process in a tight loop, one reader process.

Every value the writer publishes is derived from one counter, so a torn read (fields from two
different writes) is visible; every successful read must be whole, n must never go backwards,
and the reader must make progress while the writer runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shmq.ipc import UNKNOWN, StateTable

try:
    from shmq._fast import seqlock as compiled
except ImportError:  # not built
    compiled = None

CHILD = os.path.join(os.path.dirname(__file__), "_seqlock_stress_child.py")
CONTROL, SLOT, NEIGHBOUR = 0, 1, 2  # the slots the child script uses


def run_pair(
    table: StateTable, impl: str, seconds: float, reader: str = "reader"
) -> tuple[dict, dict]:
    """Start writer and reader, let both map the table, release them together, and stop the
    writer once the reader is done."""
    args = [impl, table.name, str(seconds)]
    procs = [
        subprocess.Popen(
            [sys.executable, CHILD, role, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role in ("writer", reader)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        writer, reader = procs
        out, err = reader.communicate(timeout=60 + seconds)
        assert reader.returncode == 0, err
        table.write(CONTROL, *UNKNOWN._replace(flags=1))  # stop
        wout, werr = writer.communicate(timeout=60)
        assert writer.returncode == 0, werr
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return json.loads(wout), json.loads(out)


@pytest.mark.parametrize(
    ("impl", "seconds"),
    [
        pytest.param(
            "compiled",
            1.0,
            marks=pytest.mark.skipif(compiled is None, reason="shmq._fast.seqlock is not built"),
        ),
        pytest.param("reference", 0.5),
    ],
)
def test_no_torn_reads_and_readers_progress(impl: str, seconds: float) -> None:
    with StateTable.create(3) as table:
        writer, reader = run_pair(table, impl, seconds)
        print(impl, writer, reader)
        assert writer["writes"] > 10_000
        assert reader["torn"] == 0, reader["first_torn"]
        assert reader["backwards"] == 0
        assert reader["ok"] >= 10_000  # readers make progress while the writer hammers the slot
        assert reader["distinct"] >= 1_000  # ... and see the writer's progress, not one value
        assert reader["gave_up"] <= reader["ok"] // 20
        # The writer's last value is what everybody reads now; the neighbours were not touched.
        assert table.read(SLOT) is not None and table.read(SLOT).log_start == writer["writes"]
        assert table.seq(SLOT) == 2 + 2 * writer["writes"]
        assert table.read(NEIGHBOUR) == UNKNOWN


@pytest.mark.parametrize(
    "impl",
    [
        pytest.param(
            "compiled",
            marks=pytest.mark.skipif(compiled is None, reason="shmq._fast.seqlock is not built"),
        ),
        "reference",
    ],
)
def test_the_seq_word_never_goes_backwards(impl: str) -> None:
    """The seq word is stored and loaded whole.  When the reference packed it with ``struct``
    (which zeroes the bytes, then writes them), a reader spinning on it saw 0 mid-update; twice
    in one read, that passes the seq check with torn fields (1 torn read in ~166,000 above)."""
    with StateTable.create(3) as table:
        writer, watcher = run_pair(table, impl, 0.5, reader="seq")
        print(impl, writer, watcher)
        assert watcher["backwards"] == 0, watcher["first_backwards"]
        assert watcher["distinct"] >= 1_000  # it saw the writer's progress, not one value
        assert table.seq(SLOT) == 2 + 2 * writer["writes"]


def test_the_check_sees_torn_reads_without_the_seqlock() -> None:
    """Control: the same reader without the seqlock does see torn snapshots (measured: ~5 % of
    reads), so zero torn reads above means something."""
    with StateTable.create(3) as table:
        _, naive = run_pair(table, "compiled" if compiled else "reference", 0.5, reader="naive")
        assert naive["torn"] > 0, naive
