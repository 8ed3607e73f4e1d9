"""``--plot FILE.png`` of ``producer-perf-test`` and ``consumer-perf-test``: throughput and
latency over the run, drawn with matplotlib (the ``plot`` extra) once the run is over.

Records are counted into 100 ms bins as they are acknowledged (producer: librdkafka's
``Message.latency()``, produce() to acknowledgement) or consumed (consumer: the end-to-end
latency, consume time minus the record's timestamp); the plot shows records/s and MB/s per bin
(rebinned to at most ~300 points), and the mean and max latency per bin.
"""

from __future__ import annotations

import time

BIN_S = 0.1


class Timeline:
    def __init__(self) -> None:
        self.start = time.monotonic()
        self.count: list[int] = []
        self.nbytes: list[int] = []
        self.lat_sum: list[float] = []
        self.lat_n: list[int] = []
        self.lat_max: list[float] = []

    def add(self, now: float, size: int, latency_ms: float | None) -> None:
        i = int((now - self.start) / BIN_S)
        if i < 0:
            i = 0
        grow = i + 1 - len(self.count)
        if grow > 0:
            self.count.extend([0] * grow)
            self.nbytes.extend([0] * grow)
            self.lat_sum.extend([0.0] * grow)
            self.lat_n.extend([0] * grow)
            self.lat_max.extend([0.0] * grow)
        self.count[i] += 1
        self.nbytes[i] += size
        if latency_ms is not None:
            self.lat_sum[i] += latency_ms
            self.lat_n[i] += 1
            if latency_ms > self.lat_max[i]:
                self.lat_max[i] = latency_ms


def check_plot_path(path: str) -> None:
    """Fail before the run, not after it: matplotlib installed, a .png name, a writable dir."""
    import os

    if not path.lower().endswith(".png"):
        raise ValueError(f"--plot wants a .png file name, got {path!r}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ValueError(f"--plot: cannot write into {parent}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'shmq[plot]'") from None


def plot(timeline: Timeline, path: str, title: str, latency_label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(timeline.count)
    group = max(1, -(-n // 300))       # bins per point
    xs: list[float] = []
    rate: list[float] = []
    mbs: list[float] = []
    mean: list[float | None] = []
    peak: list[float | None] = []
    for g in range(0, n, group):
        sl = slice(g, min(n, g + group))
        width = (sl.stop - sl.start) * BIN_S
        xs.append((sl.start + sl.stop) / 2 * BIN_S)
        rate.append(sum(timeline.count[sl]) / width)
        mbs.append(sum(timeline.nbytes[sl]) / width / (1024 * 1024))
        k = sum(timeline.lat_n[sl])
        mean.append(sum(timeline.lat_sum[sl]) / k if k else None)
        peak.append(max(timeline.lat_max[sl]) if k else None)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    top.plot(xs, rate, color="#2563eb", label="records/s")
    top.set_ylabel("records/s")
    top.set_title(title)
    right = top.twinx()
    right.plot(xs, mbs, color="#16a34a", alpha=0.6, label="MB/s")
    right.set_ylabel("MB/s")
    top.grid(alpha=0.3)
    bottom.plot(xs, [m if m is not None else float("nan") for m in mean], color="#2563eb",
                label="mean")
    bottom.plot(xs, [m if m is not None else float("nan") for m in peak], color="#dc2626",
                alpha=0.6, label="max")
    bottom.set_ylabel(latency_label)
    bottom.set_xlabel("seconds since start")
    bottom.legend(loc="upper right")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


