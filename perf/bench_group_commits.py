"""Group commits per second against ``offsets.topic.num.partitions``: 1 (the single unlisted
partition of earlier shmq versions) and 50 (Kafka's default, shmq's since issue 20).

    python perf/bench_group_commits.py [--groups 1,8,32] [--commits 400] [--repeat 3]
                                       [--partitions 1,50] [--dir DIR]

Each group commits one offset ``commits / groups`` times in a row, every group at once, through
the group coordinator itself (``GroupCoordinator.commit_offsets``: append to the group's
``__consumer_offsets`` partition, then wait for the fsync that covers it, as an OffsetCommit
answer does), on one event loop, in a fresh log under ``--dir`` (default: a temporary directory
beside this script, on the disk the broker's data would use).  No sockets: the rows measure what
the partition count changes, the group commit of the log.  Commits of groups in the same
partition share one fsync; groups in different partitions need one each.

Prints, per group count, commits/s for each partition count (median, min and max of ``--repeat``
runs, the counts measured back to back in each run) and the ratio to the first count.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from shmq.coordinator.coordinator import CoordinatorConfig, GroupCoordinator


async def commits_per_second(directory: Path, partitions: int, groups: int, commits: int) -> float:
    coordinator = GroupCoordinator(directory, CoordinatorConfig(offsets_partitions=partitions),
                                   {"t": 1}.get, registered_partitions=partitions)
    coordinator.load()
    coordinator.log.prepare()  # every partition exists, as in a broker that has run a while
    rounds = max(commits // groups, 1)

    async def one(group: int) -> None:
        for i in range(rounds):
            result = await coordinator.commit_offsets(f"group-{group}", -1, "", None,
                                                      [("t", [(0, i, -1, "")])], 8)
            assert result == [[0]], result

    started = time.perf_counter()
    await asyncio.gather(*(one(g) for g in range(groups)))
    elapsed = time.perf_counter() - started
    coordinator.close()
    return groups * rounds / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", default="1,8,32")
    p.add_argument("--partitions", default="1,50")
    p.add_argument("--commits", type=int, default=400, help="commits per run, over all groups")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent)
    args = p.parse_args()
    counts = [int(x) for x in args.partitions.split(",")]
    print(f"{'groups':>6} " + " ".join(f"{f'{n} partitions (commits/s)':>30}" for n in counts)
          + "   ratio")
    for groups in (int(x) for x in args.groups.split(",")):
        rates: dict[int, list[float]] = {n: [] for n in counts}
        for _ in range(args.repeat):
            for n in counts:
                home = Path(tempfile.mkdtemp(prefix="bench-group-commits-", dir=args.dir))
                try:
                    rates[n].append(asyncio.run(
                        commits_per_second(home / "controller", n, groups, args.commits)))
                finally:
                    shutil.rmtree(home)
        medians = {n: statistics.median(r) for n, r in rates.items()}
        cells = " ".join(f"{medians[n]:>12.0f} ({min(r):>6.0f}-{max(r):<6.0f})    "
                         for n, r in rates.items())
        print(f"{groups:>6} {cells} {medians[counts[-1]] / medians[counts[0]]:6.2f}x")


if __name__ == "__main__":
    main()
