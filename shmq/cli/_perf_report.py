"""What ``producer-perf-test`` and ``consumer-perf-test`` share: the progress bar shown on a
terminal, and ``--print-metrics``.

The bar is rich's, imported only when stdout is a terminal (rich costs ~50 ms to import, and a
pipe must get Kafka's lines and nothing else).  While it is shown, report lines go through its
console so they scroll above the bar; ``transient=True`` removes the bar at the end, leaving
exactly the lines Kafka prints.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any


class Reporter:
    """Prints report lines, and keeps a progress bar under them on a terminal."""

    def __init__(self) -> None:
        self._progress: Any = None
        self._task: Any = None

    def line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.out(text, highlight=False)
        else:
            print(text, flush=True)

    def advance(self, completed: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=completed)

    @contextlib.contextmanager
    def progress_bar(self, label: str, total: int) -> Iterator[None]:
        """A rich bar counting up to ``total`` while the block runs, if stdout is a terminal."""
        try:
            terminal = sys.stdout.isatty()
        except (AttributeError, ValueError):
            terminal = False
        progress = None
        if terminal:
            try:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )

                progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(), transient=True)
            except ImportError:  # rich missing: no bar, same lines
                progress = None
        if progress is None:
            yield
            return
        with progress:
            self._task = progress.add_task(label, total=total)
            self._progress = progress
            try:
                yield
            finally:
                self._progress = None


def print_metrics(stats_json: str | None, client_id: str, kind: str) -> None:
    """``ToolsUtils.printMetrics`` over librdkafka's statistics: the top-level numbers, named
    ``<kind>-metrics:<name>:{client-id=...}``, in Kafka's ``Metric Name : Value`` table."""
    if not stats_json:
        print("(no statistics received from librdkafka)")
        return
    data = json.loads(stats_json)
    rows = {f"{kind}-metrics:{key}:{{client-id={client_id}}}": float(value)
            for key, value in sorted(data.items())
            if isinstance(value, (int, float)) and not isinstance(value, bool)}
    width = max([len("Metric Name"), *(len(k) for k in rows)])
    print(f"\n{'Metric Name':<{width}}   Value")
    for name, value in rows.items():
        print(f"{name:<{width}} : {value:.3f}")
