"""How ``shmq broker`` starts: what its processes import."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _broker import _remove_stale_shm
from confluent_kafka.admin import AdminClient


def _imported_modules(log: str) -> set[str]:
    """Module names from ``-X importtime`` lines: ``import time: self | cumulative | name``."""
    return {line.rsplit("|", 1)[1].strip() for line in log.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def test_broker_processes_do_not_import_hypothesis(tmp_path: Path) -> None:
    """kio registers Hypothesis strategies whenever Hypothesis is importable (~0.4 s per
    process); the broker's entry points keep it out, and the codec still works without it."""
    data_dir = tmp_path / "data"
    log_path = tmp_path / "broker.log"
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shmq", "broker", "--listeners", "127.0.0.1:0",
             "--workers", "1", "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not line.startswith("shmq broker ready"):
            line = proc.stdout.readline()
            if not line:
                break
        assert line.startswith("shmq broker ready"), log_path.read_text()[-3000:]
        bootstrap = line.split("bootstrap ", 1)[1].split(" ", 1)[0]
        md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
        assert sorted(md.brokers) == [0, 1]  # Metadata through kio, from the controller
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
            _remove_stale_shm(data_dir)
    assert code == 0
    modules = _imported_modules(log_path.read_text())
    assert "kio.index" in modules, "no import timings in the log: the test cannot see imports"
    # kio's refused ``import hypothesis.strategies`` is logged as one line of its own; an import
    # that went through logs the package and ~80 of its modules
    hyp = sorted(m for m in modules if m == "hypothesis" or m.startswith("hypothesis."))
    assert set(hyp) <= {"hypothesis.strategies"}, f"a broker process imported {hyp[:5]}"


def test_skip_hypothesis_leaves_an_imported_hypothesis_alone() -> None:
    import hypothesis

    from shmq._startup import skip_hypothesis

    skip_hypothesis()
    assert sys.modules["hypothesis"] is hypothesis
