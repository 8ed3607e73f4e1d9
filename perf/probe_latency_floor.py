"""The machine's floor under bench_shm's 10,000 records/s latency row (issue 14).

    .venv/bin/python perf/probe_latency_floor.py [--rate 10000] [--seconds 3] [--repeat 3]
                                                 [--work-us 0,0,0]

Three processes relay records the way a ring produce reaches a waiting local reader, with
nothing else: a paced producer (``clock_nanosleep``, timer slack 1 ns) stores each record's
send time in shared memory, advances its count and wakes a "worker" asleep on a futex; the
worker passes the count on and wakes a "reader" asleep on another futex; the reader takes the
clock for every record up to that count (a stage woken late takes all that wait, as a ring).  Each hop is one futex wake of a
sleeping process, as in the real path (eventfd and epoll for the worker there, a futex for the
reader), but with no Python, no event loop, no append, no decode.  ``--work-us P,W,R`` makes each
stage burn that much CPU after its hop (producer and worker per record, reader per wake-up) (the real path's CPU a record at 10,000/s was
~33 / 40 / 25 us on 2026-11-25), so the floor can be seen with and without the real load.

Prints p50 / p99 / p99.9 / max of send -> reader per run.  The program is C, written to a
temporary directory, compiled with ``cc -O2`` and removed with it; every process ends with the
run (bounded by ``--seconds``).  Nothing here touches the broker.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

C_SOURCE = r"""
#define _GNU_SOURCE
#include <linux/futex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* a: records sent (the producer's count), b: records passed on by the worker; stamps[i]:
 * record i's send time.  A stage that wakes late takes every record waiting (as a ring). */
typedef struct { uint32_t a, b; volatile int stop; int64_t stamps[]; } shared_t;

static int64_t now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static void burn(int64_t ns) { int64_t until = now_ns() + ns; while (now_ns() < until) ; }
static void publish(uint32_t *word, uint32_t value) {
    __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
}
/* the word's value once it differs from seen; seen itself after 200 ms */
static uint32_t wait_word(uint32_t *word, uint32_t seen) {
    struct timespec ts = {0, 200000000};
    uint32_t v;
    while ((v = __atomic_load_n(word, __ATOMIC_SEQ_CST)) == seen) {
        if (syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0) == -1
                && __atomic_load_n(word, __ATOMIC_SEQ_CST) == seen)
            return seen;
    }
    return v;
}
static int cmp(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y; return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    int rate = atoi(argv[1]); double seconds = atof(argv[2]);
    int64_t work_p = atoll(argv[3]) * 1000, work_w = atoll(argv[4]) * 1000,
            work_r = atoll(argv[5]) * 1000;
    long n = (long)(rate * seconds);
    shared_t *s = mmap(NULL, sizeof(shared_t) + sizeof(int64_t) * n, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int64_t *lat = malloc(sizeof(int64_t) * n);
    pid_t worker = fork();
    if (worker == 0) {
        uint32_t seen = 0;
        while (!s->stop) {
            uint32_t v = wait_word(&s->a, seen);
            if (v == seen) continue;
            publish(&s->b, v);
            if (work_w) burn(work_w * (int64_t)(v - seen));
            seen = v;
        }
        _exit(0);
    }
    pid_t producer = fork();
    if (producer == 0) {
        prctl(PR_SET_TIMERSLACK, 1);
        int64_t gap = 1000000000LL / rate, next = now_ns() + 100000000;
        for (long i = 0; i < n; i++) {
            struct timespec ts = {next / 1000000000, next % 1000000000};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            s->stamps[i] = now_ns();
            publish(&s->a, (uint32_t)(i + 1));
            if (work_p) burn(work_p);
            next += gap;
        }
        _exit(0);
    }
    uint32_t seen = 0;
    while (seen < (uint32_t)n) {
        uint32_t v = wait_word(&s->b, seen);
        if (v == seen) break;
        int64_t t = now_ns();
        for (uint32_t j = seen; j < v; j++)
            lat[j] = t - s->stamps[j];
        if (work_r) burn(work_r);  /* a read, whatever it brings */
        seen = v;
    }
    long got = seen;
    s->stop = 1;
    publish(&s->a, s->a + 1);
    waitpid(producer, NULL, 0);
    waitpid(worker, NULL, 0);
    qsort(lat, got, sizeof(int64_t), cmp);
    if (!got) { printf("0 0 0 0 0\n"); return 1; }
    printf("%ld %.1f %.1f %.1f %.1f\n", got, lat[got / 2] / 1e3, lat[got * 99 / 100] / 1e3,
           lat[got * 999 / 1000] / 1e3, lat[got - 1] / 1e3);
    return 0;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work-us", default="0,0,0", help="CPU burnt per record by producer, "
                    "worker, reader after their hop (default: 0,0,0)")
    args = ap.parse_args()
    work = [str(int(float(x))) for x in args.work_us.split(",")]
    if len(work) != 3:
        ap.error("--work-us takes three numbers")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("needs a C compiler (cc)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="shmq-floor-") as tmp:
        src, exe = os.path.join(tmp, "floor.c"), os.path.join(tmp, "floor")
        with open(src, "w") as f:
            f.write(C_SOURCE)
        subprocess.run([cc, "-O2", "-o", exe, src], check=True)
        p99s = []
        print(f"rate {args.rate:,}/s, {args.seconds} s a run, work us {','.join(work)} "
              f"(producer, worker, reader)")
        print(f"{'run':>4} {'n':>9} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'max us':>9}")
        for i in range(args.repeat):
            out = subprocess.run([exe, str(args.rate), str(args.seconds), *work],
                                 capture_output=True, text=True, timeout=args.seconds + 30)
            n, p50, p99, p999, mx = out.stdout.split()
            p99s.append(float(p99))
            print(f"{i + 1:>4} {int(n):>9,} {float(p50):>8.1f} {float(p99):>8.1f} "
                  f"{float(p999):>9.1f} {float(mx):>9.1f}")
        print(f"p99 median {statistics.median(p99s):.1f} us "
              f"(min {min(p99s):.1f}, max {max(p99s):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
