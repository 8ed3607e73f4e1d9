/* Seqlock over one 64-byte state-table slot, with GCC/Clang __atomic builtins.
 *
 * Slot layout (native byte order: every party is on the same host), offsets in bytes:
 *   0 seq u64 | 8 leader i32 | 12 epoch i32 | 16 log_start i64 | 24 hw i64 | 32 lso i64
 *   40 leo i64 | 48 segments_gen u32 | 52 flags u32 | 56 waiters u32 | 60 reserved (zero)
 *
 * Waiting: a reader that wants more than the slot says sets ``waiters`` (seq_cst exchange),
 * re-reads seq and sleeps in FUTEX_WAIT on seq's low 32 bits while they still hold the value it
 * saw.  The writer, after publishing, looks at ``waiters`` (after a seq_cst fence) and only when
 * it is set clears it and calls FUTEX_WAKE: no system call per write while nobody waits.  One of
 * the two always sees the other's store (store -> fence -> load on both sides), so a wake-up is
 * never lost; a reader that died asleep costs its slot one spurious wake, then the flag is clear.
 *
 * One writer per slot.  Every field is accessed with a (relaxed) atomic load or store, so a
 * reader racing a writer is not a C data race (Boehm, "Can seqlocks get along with programming
 * language memory models?", MSPC 2012); on x86-64 and aarch64 these are plain aligned moves.
 * The caller guarantees the slot is 8-byte aligned (the mapping is page aligned and slots are
 * 64 bytes).
 */
#ifndef SHMQ_SEQLOCK_H
#define SHMQ_SEQLOCK_H
#include <stdint.h>
#include <limits.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>
#include <sched.h>
#include <sys/syscall.h>
#include <linux/futex.h>

typedef struct {
    uint64_t seq;
    int32_t leader;
    int32_t epoch;
    int64_t log_start;
    int64_t hw;
    int64_t lso;
    int64_t leo;
    uint32_t segments_gen;
    uint32_t flags;
    uint32_t waiters;
    uint32_t reserved;
} shmq_slot_t;

_Static_assert(sizeof(shmq_slot_t) == 64, "state-table slot must be 64 bytes");

/* The field values without seq: what a reader copies out. */
typedef struct {
    int32_t leader;
    int32_t epoch;
    int64_t log_start;
    int64_t hw;
    int64_t lso;
    int64_t leo;
    uint32_t segments_gen;
    uint32_t flags;
} shmq_slot_values_t;

static inline void shmq_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* The 32 bits of seq that change on every write (its low half), as a futex word. */
static inline uint32_t *shmq_slot_futex_word(shmq_slot_t *s) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t *)&s->seq + 1;
#else
    return (uint32_t *)&s->seq;
#endif
}

/* Writer.  A seq that is already odd on entry was left by a writer that died mid-update: keep it
 * odd (readers are already retrying) and finish the update, which makes it even again. */
static inline void shmq_slot_write(unsigned char *base, const shmq_slot_values_t *v) {
    shmq_slot_t *s = (shmq_slot_t *)base;
    uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
    if ((seq & 1) == 0) {
        seq += 1;
        __atomic_store_n(&s->seq, seq, __ATOMIC_RELEASE);
    }
    /* Orders the odd seq before every field store below (a release fence orders earlier
     * accesses before later stores). */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&s->leader, v->leader, __ATOMIC_RELAXED);
    __atomic_store_n(&s->epoch, v->epoch, __ATOMIC_RELAXED);
    __atomic_store_n(&s->log_start, v->log_start, __ATOMIC_RELAXED);
    __atomic_store_n(&s->hw, v->hw, __ATOMIC_RELAXED);
    __atomic_store_n(&s->lso, v->lso, __ATOMIC_RELAXED);
    __atomic_store_n(&s->leo, v->leo, __ATOMIC_RELAXED);
    __atomic_store_n(&s->segments_gen, v->segments_gen, __ATOMIC_RELAXED);
    __atomic_store_n(&s->flags, v->flags, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    /* Release: every field store above is visible before the even seq. */
    __atomic_store_n(&s->seq, seq + 1, __ATOMIC_RELEASE);
    /* Store-load order between the even seq and the waiters flag (see the top of the file). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->waiters, __ATOMIC_RELAXED)
            && __atomic_exchange_n(&s->waiters, 0, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, shmq_slot_futex_word(s), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline int64_t shmq_monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Look at the slot's seq for up to ``spin_ns`` (no flag set, so the writer makes no system
 * call), yielding the CPU between looks: data that follows within that time is seen without
 * the futex round trip and the wake-up of a halted CPU.  1 when seq is no longer ``seen``. */
static inline int shmq_slot_spin(shmq_slot_t *s, uint64_t seen, int64_t spin_ns) {
    int64_t until = shmq_monotonic_ns() + spin_ns;
    while (1) {
        if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != seen)
            return 1;
        /* Not a pause loop: the CPU goes to whatever else waits for it here (the writer,
         * its producer), and sched_yield returns at once when nothing does.  A pause loop
         * kept the CPU for the scheduler's slice (milliseconds) on a box with fewer idle
         * CPUs than spinners, and the writer's wake-ups waited that long. */
        sched_yield();
        if (shmq_monotonic_ns() >= until)
            return 0;
    }
}

/* Set the slot's waiters flag and sleep on its futex while seq is ``seen``, at most
 * ``timeout_ns`` (< 0: no limit).  1 when seq changed or may have (a wake-up), 0 on timeout,
 * 2 when a signal interrupted the sleep. */
static inline int shmq_slot_sleep(shmq_slot_t *s, uint64_t seen, int64_t timeout_ns) {
    struct timespec ts, *tp = NULL;
    __atomic_exchange_n(&s->waiters, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->seq, __ATOMIC_SEQ_CST) != seen)
        return 1;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000;
        ts.tv_nsec = timeout_ns % 1000000000;
        tp = &ts;
    }
    if (syscall(SYS_futex, shmq_slot_futex_word(s), FUTEX_WAIT, (uint32_t)seen, tp, NULL,
                0) == -1) {
        if (errno == ETIMEDOUT)
            return 0;
        if (errno == EINTR)
            return 2;
    }
    return 1;
}

/* Sleep until the slot's seq is no longer ``seen`` or ``timeout_ns`` passed (< 0: no limit),
 * after a spin of up to ``spin_ns`` (``shmq_slot_spin``; it counts against the timeout).
 * Returns 1 when seq changed (or may have: a wake-up or a signal), 0 on timeout.  Spurious
 * returns are allowed: the caller re-reads the slot. */
static inline int shmq_slot_wait(unsigned char *base, uint64_t seen, int64_t timeout_ns,
                                 int64_t spin_ns) {
    shmq_slot_t *s = (shmq_slot_t *)base;
    if (timeout_ns >= 0 && spin_ns > timeout_ns)
        spin_ns = timeout_ns;  /* the spin counts against the timeout: never past it */
    if (spin_ns > 0) {
        if (shmq_slot_spin(s, seen, spin_ns))
            return 1;
        if (timeout_ns >= 0) {
            timeout_ns -= spin_ns;
            if (timeout_ns <= 0)
                return 0;
        }
    }
    return shmq_slot_sleep(s, seen, timeout_ns) != 0;
}

/* Reader.  Returns 1 and fills *out with a consistent snapshot, or 0 after max_spins attempts
 * that each saw an odd seq or a seq that changed under the read. */
static inline int shmq_slot_read(const unsigned char *base, shmq_slot_values_t *out,
                                 long max_spins) {
    const shmq_slot_t *s = (const shmq_slot_t *)base;
    uint64_t s1, s2;
    long spins;
    for (spins = 0; spins < max_spins; spins++) {
        s1 = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
        if (s1 & 1) {
            shmq_cpu_relax();
            continue;
        }
        out->leader = __atomic_load_n(&s->leader, __ATOMIC_RELAXED);
        out->epoch = __atomic_load_n(&s->epoch, __ATOMIC_RELAXED);
        out->log_start = __atomic_load_n(&s->log_start, __ATOMIC_RELAXED);
        out->hw = __atomic_load_n(&s->hw, __ATOMIC_RELAXED);
        out->lso = __atomic_load_n(&s->lso, __ATOMIC_RELAXED);
        out->leo = __atomic_load_n(&s->leo, __ATOMIC_RELAXED);
        out->segments_gen = __atomic_load_n(&s->segments_gen, __ATOMIC_RELAXED);
        out->flags = __atomic_load_n(&s->flags, __ATOMIC_RELAXED);
        /* Acquire: the field loads above complete before seq is loaded again. */
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        s2 = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
        if (s1 == s2)
            return 1;
        shmq_cpu_relax();
    }
    return 0;
}

/* Short time slices while a thread sleeps (``shmq.ipc.sched`` in C: no Python frame and no
 * ctypes call per wait).  ``sched_getattr`` finds the thread's policy, nice value and slice;
 * ``sched_setattr`` asks for ``ns`` slices with the same policy and nice (its reset-on-fork flag
 * kept); the restore puts the slice it found back.  Only SCHED_OTHER and SCHED_BATCH threads are
 * changed; a kernel that refuses changes nothing. */
typedef struct {
    uint32_t size;
    uint32_t policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime;
    uint64_t deadline;
    uint64_t period;
    uint32_t util_min;
    uint32_t util_max;
} shmq_sched_attr_t;

_Static_assert(sizeof(shmq_sched_attr_t) == 56, "sched_attr (SCHED_ATTR_SIZE_VER1) is 56 bytes");

static inline int shmq_sched_set(uint32_t policy, uint64_t flags, int32_t nice, uint64_t ns) {
#if defined(SYS_sched_setattr)
    shmq_sched_attr_t want = {0};
    want.size = sizeof want;
    want.policy = policy;
    want.flags = flags & 1;  /* SCHED_FLAG_RESET_ON_FORK: the thread's own, kept */
    want.nice = nice;
    want.runtime = ns;
    return syscall(SYS_sched_setattr, 0, &want, 0) == 0;
#else
    (void)policy; (void)flags; (void)nice; (void)ns;
    return 0;
#endif
}

/* 1 when the thread now has ``ns`` slices and *saved holds what to put back. */
static inline int shmq_slice_swap(shmq_sched_attr_t *saved, uint64_t ns) {
#if defined(SYS_sched_getattr)
    if (ns == 0 || syscall(SYS_sched_getattr, 0, saved, sizeof *saved, 0) != 0)
        return 0;
    if ((saved->policy != 0 && saved->policy != 3) || saved->runtime == ns)
        return 0;  /* not SCHED_OTHER / SCHED_BATCH, or has that slice already */
    return shmq_sched_set(saved->policy, saved->flags, saved->nice, ns);
#else
    (void)saved; (void)ns;
    return 0;
#endif
}

static inline void shmq_slice_restore(const shmq_sched_attr_t *saved) {
    shmq_sched_set(saved->policy, saved->flags, saved->nice, saved->runtime);
}

/* A local reader's wait, whole: until the slot's bound (``lso`` when ``committed``, else ``hw``)
 * passes ``offset``, ``offset`` falls below ``log_start``, the slot has no leader, or the clock
 * (CLOCK_MONOTONIC, ns) reaches ``deadline_ns``.  Each round reads the slot (seqlock), and when
 * it must wait, looks at seq for ``spin_ns`` (yielding between looks) and then sleeps on the
 * futex; the thread has ``slice_ns`` slices (0: untouched) from its first sleep until the
 * function returns, so a wait that the spin ends makes no scheduler call at all.
 * Returns 1 with *out the last snapshot; 0 when the slot stayed odd for ``max_spins`` reads (a
 * writer preempted or dead mid-update: the caller decides); 2 when a signal interrupted the
 * sleep (the caller runs its handlers, then may call again).  *began: when the wait began
 * waiting (the first round that found the bound not passed; left alone when it is >= 0 on
 * entry: a wait called again after a signal); -1 while it has not. */
static inline int shmq_slot_wait_bound(unsigned char *base, int64_t offset, int committed,
                                       int64_t deadline_ns, int64_t spin_ns, int64_t slice_ns,
                                       long max_spins, shmq_slot_values_t *out,
                                       int64_t *began) {
    shmq_slot_t *s = (shmq_slot_t *)base;
    shmq_sched_attr_t saved;
    int swapped = -1;  /* -1: not tried yet, 0: no change, 1: restore at the end */
    int r;
    int64_t now, left, spin;
    uint64_t seen;
    while (1) {
        seen = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
        if (!shmq_slot_read(base, out, max_spins)) {
            r = 0;
            break;
        }
        now = shmq_monotonic_ns();
        r = 1;
        if ((committed ? out->lso : out->hw) > offset || offset < out->log_start
                || out->leader < 0 || now >= deadline_ns)
            break;
        if (*began < 0)
            *began = now;
        left = deadline_ns - now;
        spin = spin_ns < left ? spin_ns : left;
        if (spin > 0) {
            if (shmq_slot_spin(s, seen, spin))
                continue;
            left = deadline_ns - shmq_monotonic_ns();
            if (left <= 0)
                continue;  /* the next round sees the deadline */
        }
        if (swapped < 0)
            swapped = shmq_slice_swap(&saved, (uint64_t)slice_ns);
        if (shmq_slot_sleep(s, seen, left) == 2) {
            r = 2;
            break;
        }
    }
    if (swapped == 1)
        shmq_slice_restore(&saved);
    return r;
}

/* The seq word alone (acquire), for tests and diagnostics. */
static inline uint64_t shmq_slot_seq(const unsigned char *base) {
    return __atomic_load_n(&((const shmq_slot_t *)base)->seq, __ATOMIC_ACQUIRE);
}

#endif
