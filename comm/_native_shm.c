/* hal.comm's native progress engine for the shared-memory transport (comm/_shm.py).
 *
 * One call, hal_shm_exchange, runs one exchange of a collective (one step of its plan: the
 * sends and receives of a ring step, a butterfly step ...) to the end without Python: it
 * copies pieces into the rings of the peers, publishes them, and copies out or reduces the
 * pieces the peers published, polling the rings, spinning a little, then sleeping on a futex
 * (the doorbell of this rank) until a peer rings it. It returns to Python when the exchange is
 * complete, or after check_ns without progress (Python then checks the peers' liveness, the
 * abort flag and the timeout, and calls again: the state lives in the op records).
 *
 * Ring layout (the same as comm/_shm.py's _Ring): head (int64) at 0, tail (int64) at 64,
 * piece sizes (int64 per slot) from 128, slots from data_off. Doorbell (segment header):
 * a uint32 counter at 0, a uint32 count of sleepers at 64, the cpu the rank last ran on at 128,
 * a uint32 set while the rank runs a C call at 192 and the time it last left one (int64) at 200.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

typedef struct {
    uint64_t ring;   /* address of the ring */
    uint64_t data;   /* the message: read by a send, written by a receive */
    uint64_t base;   /* receive with op: data = base op piece (0: data = data op piece) */
    uint64_t bell;   /* the peer's doorbell */
    int64_t nbytes;
    int64_t done;
    int32_t peer;    /* a send to peer -1: a local copy base <- data that runs beside the step */
    int32_t op;      /* -1 copy, 0 sum, 1 prod, 2 max, 3 min */
    int32_t dtype;   /* 0 f32, 1 f64, 2 i32, 3 i64, 4 i8, 5 u8 */
    int32_t after;   /* receive: start once every send of the exchange is out */
    int64_t posted;  /* send by reference (cma): bytes whose descriptors are published */
    int64_t ack0;    /* send by reference: the ring's ack count when it started */
    int64_t refmin;  /* send: by reference from this size (0: the context's cma_bytes; -1: never) */
    int64_t rpid;    /* receive of a shared message (below): the sender's pid */
    uint64_t raddr;  /* ... and the message's address there */
    int64_t cells;   /* ... bytes taken from the sender's cells so far */
    int64_t shared;  /* ... 1 while it runs */
} hal_xop;

typedef struct {
    uint64_t bell;   /* this rank's doorbell */
    int64_t slots;
    int64_t data_off;
    int64_t slot_bytes;
    int64_t chunk;
    int64_t spin_ns;
    int64_t check_ns;
    int64_t moved;   /* out: pieces moved by the last call */
    int64_t bad_op;  /* out: index of the receive whose piece had the wrong size */
    int64_t bad_got; /* out: its size */
    int64_t bad_peer; /* out: the rank that sent it (hal_shm_prog) */
    int64_t cma_bytes; /* send messages of at least this size by reference (0: never) */
    int64_t ack_off;   /* offset in a ring of the count of by-reference pieces read */
    int64_t pid;       /* this process */
    int64_t err;       /* out: errno of a failed cross-memory read (return -3) */
    int64_t ref_whole; /* send a message by reference in one descriptor (1), or per piece (0) */
    int64_t cell_bytes; /* shared messages: the sender's cell size (0: off) */
    int64_t claim_off;  /* offset in a ring of the claim word of a shared message */
    int64_t ref_piece;  /* shared messages: bytes the receiver reads by reference at a time */
    int64_t yield_ns;   /* after spin_ns, poll with sched_yield while a peer is awake, up to this */
    int64_t write_ok;   /* shared messages: the sender may write cells straight into a copying
                         * receiver's destination (process_vm_writev; 0 after a failed write;
                         * 2: tests, writes after a call's first fail) */
    int64_t wrote;      /* out: bytes this rank wrote so, in all */
} hal_xctx;

#define HEAD(r) ((int64_t *)(r))
#define TAIL(r) ((int64_t *)((r) + 64))
#define SIZES(r) ((int64_t *)((r) + 128))
#define ACKS(c, r) ((int64_t *)((r) + (c)->ack_off))
#define CLAIM(c, r) ((uint64_t *)((r) + (c)->claim_off))

/* A shared message: a message sent by reference in one descriptor that both ends move at once.
 * The receiver frees the descriptor's slot and opens the message's claim word in the ring
 * (front and back, in units of CLAIM_UNIT bytes, 32 bits each): the sender, whenever it has a
 * free slot and nothing else to do, claims the next cell from the front (a compare-and-swap
 * that moves front) and copies it into the slot (the receiver copies it out of the cache: two
 * memcpys, 2-4x faster here than process_vm_readv), while the receiver reads pieces from the
 * back by reference (claims that move back) whenever no cell is ready. The claims never overlap,
 * so a reduction applies every byte once. The receiver is done when front meets back and every
 * cell claimed has arrived; it acks the message as a whole descriptor. Only a native receiver
 * opens the word (the Python path reads the descriptor alone); the sender closes it (0) before
 * it posts the next descriptor. Whichever end is scheduled does the work: a rank that waits for
 * nothing else (a broadcast's root, a rank done with its own receives) helps its peer. */
/* The receiver of a copy (a broadcast, an all_gather: no reduction) also publishes, on the claim
 * word's line, its pid and the destination's address before it opens the word: then the sender
 * writes the cells it claims straight into the destination (process_vm_writev, one copy on the
 * sender's core, where a cell took one on each) and counts their bytes in WRITTEN, which the
 * receiver adds to the cells it took. Both cores then move the message through cross-memory
 * attach at once, a half each where the receiver alone read it all (16 MiB inside one run:
 * 3.9-4.5 ms read by one end, 2.1-2.3 ms with the other end writing half). A message whose
 * sender wrote cells gets no cells through the slots (the receiver places cells at the front);
 * a write that fails gives its claim back and stops the writes (write_ok 0). */
#define DEST_PID(c, r) ((int64_t *)((r) + (c)->claim_off + 8))
#define DEST_ADDR(c, r) ((uint64_t *)((r) + (c)->claim_off + 16))
#define WRITTEN(c, r) ((int64_t *)((r) + (c)->claim_off + 24))
#define CLAIM_UNIT 256
#define CL_FRONT(w) ((int64_t)((w) & 0xffffffffULL))
#define CL_BACK(w) ((int64_t)((w) >> 32))
#define CL_WORD(f, b) ((uint64_t)(f) | ((uint64_t)(b) << 32))
#define CL_POS(u, n) ((u) * CLAIM_UNIT < (n) ? (u) * CLAIM_UNIT : (n))
#define CL_MAX_BYTES ((int64_t)0xffffffffLL * CLAIM_UNIT)

/* A piece sent by reference (Linux cross-memory attach): instead of the bytes, the slot holds
 * the sender's pid and the piece's address, and its size is the negated piece size. The
 * receiver reads the piece straight from the sender's memory (process_vm_readv: one copy, not
 * two), frees the slot, and counts it in the ring's ack word; the sender's op completes when
 * every piece is counted (its buffer stays untouched until then). A receiver takes either
 * kind of piece, so only the sender decides (messages of at least cma_bytes, or of the op's
 * refmin, in exchanges without a receive that waits for the sends). Through the slots a piece
 * costs two memcpys that run in parallel on the two ends (in and out of the shared cache) and
 * is reduced straight out of the slot; by reference it costs one process_vm_readv (4-9 GB/s
 * here, it pins the sender's pages one by one) and, for a reduction, a pass over a bounce
 * buffer: so Python sets a larger refmin for the messages a receiver reduces. */
typedef struct {
    int64_t pid;
    uint64_t addr;
} hal_ref;

static __thread char *bounce;
static __thread int64_t bounce_n;

/* Peers' shared host regions mapped here (hal.spi.HostRegion: the CPU emulator's arena): size
 * bytes at rbase in process pid are at lbase in this one. A cross-memory move that lies within
 * one is a memcpy (512 KiB: 15 us against process_vm_readv's 51 us here, which pins the pages
 * one by one). Python adds and drops entries (hal_shm_map_peer) while other communicators' calls
 * may read the table: an entry is published by its pid, stored last (release) and cleared first,
 * and is never moved; Python keeps a mapping while any communicator has that peer. */
#define MAX_PEER_MAPS 256
typedef struct {
    int64_t pid; /* 0: a free entry */
    uint64_t rbase, rsize;
    char *lbase;
    int64_t writable;
} peer_map;
static peer_map peer_maps[MAX_PEER_MAPS];
static int n_peer_maps;      /* entries below this may be in use */
static int64_t mapped_bytes; /* moved through a mapping (hal.comm's native_counts: "mapped") */

/* Map (lbase non-NULL) or forget (NULL) process pid's region at rbase: 0, or -1 (table full). */
int hal_shm_map_peer(int64_t pid, uint64_t rbase, uint64_t rsize, char *lbase, int64_t writable) {
    int n = __atomic_load_n(&n_peer_maps, __ATOMIC_ACQUIRE), free_at = -1;
    for (int i = 0; i < n; i++) {
        int64_t p = __atomic_load_n(&peer_maps[i].pid, __ATOMIC_ACQUIRE);
        if (p == pid && peer_maps[i].rbase == rbase) {
            __atomic_store_n(&peer_maps[i].pid, 0, __ATOMIC_RELEASE);
            if (!lbase) return 0;
            free_at = i;
            break;
        }
        if (!p && free_at < 0) free_at = i;
    }
    if (!lbase) return 0;
    if (free_at < 0) {
        if (n == MAX_PEER_MAPS) return -1;
        free_at = n;
    }
    peer_map *m = &peer_maps[free_at];
    m->rbase = rbase;
    m->rsize = rsize;
    m->lbase = lbase;
    m->writable = writable;
    __atomic_store_n(&m->pid, pid, __ATOMIC_RELEASE);
    if (free_at == n) __atomic_store_n(&n_peer_maps, n + 1, __ATOMIC_RELEASE);
    return 0;
}

int64_t hal_shm_mapped_bytes(void) { return __atomic_load_n(&mapped_bytes, __ATOMIC_RELAXED); }

static void copy_nt(char *d, const char *s, int64_t n);

static char *peer_mapped(int write, int64_t pid, uint64_t addr, int64_t n) {
    int k = __atomic_load_n(&n_peer_maps, __ATOMIC_ACQUIRE);
    for (int i = 0; i < k; i++) {
        const peer_map *m = &peer_maps[i];
        if (__atomic_load_n(&m->pid, __ATOMIC_ACQUIRE) == pid && addr >= m->rbase &&
            addr - m->rbase <= m->rsize && (uint64_t)n <= m->rsize - (addr - m->rbase) &&
            (!write || m->writable))
            return m->lbase + (addr - m->rbase);
    }
    return NULL;
}

/* Move n bytes between local and addr in process pid (cross-memory attach, or a memcpy where
 * pid's memory there is mapped here; with nt, a part of a message of NT_BYTES or more: with
 * non-temporal stores, as a large local copy, see copy_nt): read them into local, or write
 * local there; 0, or the errno of the call that failed. Measured (2 ranks, hal bench comm, 16 MiB
 * all_gather, 3 runs each way alternated, us): memcpy 2,137-2,309 out of place and 1,365-1,705
 * in place, non-temporal 1,679-1,887 and 1,001-1,044 (MPICH 2,342-2,831 and 1,297-1,505). */
static int cma(int write, int64_t pid, char *local, uint64_t addr, int64_t n, int nt) {
    char *mapped = peer_mapped(write, pid, addr, n);
    if (mapped) {
        char *d = write ? mapped : local;
        const char *s = write ? local : mapped;
        if (nt)
            copy_nt(d, s, n);
        else
            memcpy(d, s, (size_t)n);
        __atomic_fetch_add(&mapped_bytes, n, __ATOMIC_RELAXED);
        return 0;
    }
    int64_t off = 0;
    while (off < n) {
        struct iovec l = {local + off, (size_t)(n - off)};
        struct iovec r = {(void *)(uintptr_t)(addr + (uint64_t)off), (size_t)(n - off)};
        ssize_t got = write ? process_vm_writev((pid_t)pid, &l, 1, &r, 1, 0)
                            : process_vm_readv((pid_t)pid, &l, 1, &r, 1, 0);
        if (got <= 0) return got < 0 ? errno : EIO;
        off += got;
    }
    return 0;
}

static int read_ref(hal_xctx *c, const hal_ref *ref, char *dst, int64_t n, int nt) {
    int err = cma(0, ref->pid, dst, ref->addr, n, nt);
    if (err) c->err = err;
    return err ? -1 : 0;
}

/* A local copy beside a step (peer -1) of at least NT_BYTES in all (not per piece) is made with
 * non-temporal stores: no read of the destination's lines for ownership, and the destination
 * does not push the messages the peers read, or the slots, out of the cache. The step never
 * reads that destination (hal.comm._shm's _copies_beside and _copy_into_step: the peers read
 * the source), and a copy this large hardly stays in the cache anyway (with its message and
 * the output, an all_gather's working set nears or passes this machine's 32 MiB L3; glibc's
 * memcpy, sized by the host's 256 MiB L3 that this VM reports, never streams). Measured here (2
 * processes at once, 8 MiB each, best of 40, load average 5): memcpy 1,195-1,473 us,
 * non-temporal 483-995 us; inside one run (median us, memcpy -> non-temporal): a 2-rank
 * all_gather of 8 MiB (4 MiB copies) 2,009 -> 1,537 and 1,764 -> 1,446, of 16 MiB on 4 ranks
 * 9,177 -> 8,777 and 9,144 -> 8,914, a 4 MiB broadcast's root 546 -> 524 and 679 -> 632; 2 MiB
 * copies (a 4 MiB all_gather) no faster (2,022 -> 2,042, 652 -> 639). */
#define NT_BYTES ((int64_t)4 << 20)

static void copy_nt(char *d, const char *s, int64_t n) {
#if defined(__AVX__)
    typedef __m256i vec;
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VSTREAM(p, v) _mm256_stream_si256((__m256i *)(p), (v))
#elif defined(__SSE2__)
    typedef __m128i vec;
#define VLOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define VSTREAM(p, v) _mm_stream_si128((__m128i *)(p), (v))
#endif
#if defined(__SSE2__)
    const int64_t w = (int64_t)sizeof(vec);
    int64_t head = (int64_t)((w - ((uintptr_t)d & (uintptr_t)(w - 1))) & (uintptr_t)(w - 1));
    if (head > n) head = n;
    memcpy(d, s, (size_t)head);
    int64_t i = head;
    for (; i + 4 * w <= n; i += 4 * w) {
        vec a = VLOAD(s + i), b = VLOAD(s + i + w), x = VLOAD(s + i + 2 * w), y = VLOAD(s + i + 3 * w);
        VSTREAM(d + i, a);
        VSTREAM(d + i + w, b);
        VSTREAM(d + i + 2 * w, x);
        VSTREAM(d + i + 3 * w, y);
    }
    _mm_sfence();
    memcpy(d + i, s + i, (size_t)(n - i));
#undef VLOAD
#undef VSTREAM
#else
    memcpy(d, s, (size_t)n);
#endif
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

void hal_shm_ring(uint64_t bell) {
    uint32_t *b = (uint32_t *)bell;
    __atomic_fetch_add(b, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(b + 16, __ATOMIC_SEQ_CST) != 0)
        syscall(SYS_futex, b, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void sleep_on(uint32_t *b, uint32_t seen, int64_t ns) {
    if (ns <= 0) return;
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    __atomic_fetch_add(b + 16, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, b, FUTEX_WAIT, seen, &ts, NULL, 0);
    __atomic_fetch_sub(b + 16, 1, __ATOMIC_SEQ_CST);
}

/* Where a rank runs: each rank publishes the cpu it last ran on (plus 1; 0: not yet) in its
 * doorbell page whenever it enters a call or waits. A rank that would poll for a peer that last
 * ran on its own cpu does not busy-poll: that peer is not running (one cpu runs one of them)
 * and may wait for this very cpu, so polling would only hold the cpu it needs for the whole poll
 * (measured with both ranks on one core: 20 us of polling added 20-60 us to each 1 MiB call).
 * It yields the cpu while that peer is awake (below), else it sleeps at once.
 * Two ranks on 2 cores of a busy machine share one now and then; the word costs a getcpu (vDSO)
 * per poll and is written only when the cpu changed. */
#define CPU_WORD(bell) ((uint32_t *)(uintptr_t)(bell) + 32)

static inline uint32_t publish_cpu(uint32_t *bell) {
    uint32_t cpu = (uint32_t)sched_getcpu() + 1;
    if (__atomic_load_n(CPU_WORD(bell), __ATOMIC_RELAXED) != cpu)
        __atomic_store_n(CPU_WORD(bell), cpu, __ATOMIC_RELAXED);
    return cpu;
}

static inline int ran_on(uint64_t peer_bell, uint32_t cpu) {
    return peer_bell && __atomic_load_n(CPU_WORD(peer_bell), __ATOMIC_RELAXED) == cpu;
}

/* Whether a peer of the unfinished ops sends[0..ns) and recvs[0..nr) last ran on cpu. */
static int ops_on(const hal_xop *s, int ns, const hal_xop *r, int nr, uint32_t cpu) {
    for (int i = 0; i < ns; i++)
        if (s[i].done < s[i].nbytes && ran_on(s[i].bell, cpu)) return 1;
    for (int i = 0; i < nr; i++)
        if (r[i].done < r[i].nbytes && ran_on(r[i].bell, cpu)) return 1;
    return 0;
}

/* Whether a peer is awake: a rank that waits longer than its poll (spin_ns) keeps polling, with
 * a sched_yield between the checks, for up to yield_ns while a peer it waits for is awake, and
 * only then sleeps on its futex. Waking a sleeper costs 100 us to 2 ms on a loaded 2-core machine
 * (and ranks that wake each other tend to end up on one core); a rank that yields stays runnable,
 * gives its core to anyone who needs it, and never needs a wake-up. A peer is awake while it runs
 * a C call of this engine and does not sleep on its own futex, or when it left one less than
 * yield_ns ago (between two calls of a loop, in Python). Each rank sets the in-call word when it
 * enters a call and clears it, with the time, when it returns. */
#define CALL_WORD(bell) ((uint32_t *)(uintptr_t)(bell) + 48)
#define LEFT_WORD(bell) ((int64_t *)((uintptr_t)(bell) + 200))

static inline void enter_call(uint32_t *bell) { __atomic_store_n(CALL_WORD(bell), 1, __ATOMIC_RELAXED); }

static inline int leave_call(uint32_t *bell, int rc) {
    __atomic_store_n(LEFT_WORD(bell), now_ns(), __ATOMIC_RELAXED);
    __atomic_store_n(CALL_WORD(bell), 0, __ATOMIC_RELEASE);
    return rc;
}

static inline int awake(uint64_t peer_bell, int64_t now, int64_t within) {
    if (!peer_bell || __atomic_load_n((uint32_t *)(uintptr_t)peer_bell + 16, __ATOMIC_RELAXED)) return 0;
    if (__atomic_load_n(CALL_WORD(peer_bell), __ATOMIC_RELAXED)) return 1;
    return now - __atomic_load_n(LEFT_WORD(peer_bell), __ATOMIC_RELAXED) < within;
}

/* Whether a peer of the unfinished ops sends[0..ns) and recvs[0..nr) is awake. */
static int ops_awake(const hal_xop *s, int ns, const hal_xop *r, int nr, int64_t now, int64_t within) {
    for (int i = 0; i < ns; i++)
        if (s[i].peer >= 0 && s[i].done < s[i].nbytes && awake(s[i].bell, now, within)) return 1;
    for (int i = 0; i < nr; i++)
        if (r[i].done < r[i].nbytes && awake(r[i].bell, now, within)) return 1;
    return 0;
}

/* Wait until this rank's doorbell differs from seen (spin spin_ns, then sleep), at most
 * timeout_ns; return its value. */
uint32_t hal_shm_wait(uint64_t bell, uint32_t seen, int64_t spin_ns, int64_t timeout_ns) {
    uint32_t *b = (uint32_t *)bell;
    int64_t t0 = now_ns();
    for (;;) {
        uint32_t v = __atomic_load_n(b, __ATOMIC_ACQUIRE);
        if (v != seen) return v;
        int64_t t = now_ns() - t0;
        if (t >= timeout_ns) return v;
        if (t < spin_ns) {
            relax();
            continue;
        }
        sleep_on(b, seen, timeout_ns - t);
    }
}

uint32_t hal_shm_bell(uint64_t bell) { return __atomic_load_n((uint32_t *)bell, __ATOMIC_ACQUIRE); }

#define MAXF(x, y) (((x) != (x) || (x) >= (y)) ? (x) : (y))
#define MINF(x, y) (((x) != (x) || (x) <= (y)) ? (x) : (y))
#define MAXI(x, y) ((x) >= (y) ? (x) : (y))
#define MINI(x, y) ((x) <= (y) ? (x) : (y))

#define REDUCER(T, NAME, MAX, MIN)                                                      \
    static void NAME(T *d, const T *a, const T *__restrict b, int64_t n, int op) {      \
        int64_t i;                                                                      \
        switch (op) {                                                                   \
        case 0:                                                                         \
            for (i = 0; i < n; i++) d[i] = (T)(a[i] + b[i]);                            \
            break;                                                                      \
        case 1:                                                                         \
            for (i = 0; i < n; i++) d[i] = (T)(a[i] * b[i]);                            \
            break;                                                                      \
        case 2:                                                                         \
            for (i = 0; i < n; i++) {                                                   \
                T x = a[i], y = b[i];                                                   \
                d[i] = MAX(x, y);                                                       \
            }                                                                           \
            break;                                                                      \
        default:                                                                        \
            for (i = 0; i < n; i++) {                                                   \
                T x = a[i], y = b[i];                                                   \
                d[i] = MIN(x, y);                                                       \
            }                                                                           \
        }                                                                               \
    }

REDUCER(float, red_f32, MAXF, MINF)
REDUCER(double, red_f64, MAXF, MINF)
REDUCER(int32_t, red_i32, MAXI, MINI)
REDUCER(int64_t, red_i64, MAXI, MINI)
REDUCER(int8_t, red_i8, MAXI, MINI)
REDUCER(uint8_t, red_u8, MAXI, MINI)

static void deliver_at(hal_xop *o, int64_t at, const char *piece, int64_t n) {
    char *dst = (char *)o->data + at;
    if (o->op < 0) {
        memcpy(dst, piece, n);
        return;
    }
    const char *a = o->base ? (const char *)o->base + at : dst;
    switch (o->dtype) {
    case 0: red_f32((float *)dst, (const float *)a, (const float *)piece, n / 4, o->op); break;
    case 1: red_f64((double *)dst, (const double *)a, (const double *)piece, n / 8, o->op); break;
    case 2: red_i32((int32_t *)dst, (const int32_t *)a, (const int32_t *)piece, n / 4, o->op); break;
    case 3: red_i64((int64_t *)dst, (const int64_t *)a, (const int64_t *)piece, n / 8, o->op); break;
    case 4: red_i8((int8_t *)dst, (const int8_t *)a, (const int8_t *)piece, n, o->op); break;
    default: red_u8((uint8_t *)dst, (const uint8_t *)a, (const uint8_t *)piece, n, o->op); break;
    }
}

static void deliver(hal_xop *o, const char *piece, int64_t n) { deliver_at(o, o->done, piece, n); }

/* Receive a piece sent by reference into o (copy: straight into the destination; reduce:
 * straight out of the peer's memory where it is mapped here, else through a per-thread bounce
 * buffer). Reducing out of the mapping, not a bounce copy of it: 64 MiB all_reduce on 2 ranks
 * (hal bench comm, 3 runs each way alternated) 10.3-10.8 ms against 11.2-12.7 out of place,
 * 8.4-9.0 against 9.4-9.7 in place. */
static int deliver_ref_at(hal_xctx *c, hal_xop *o, int64_t at, const hal_ref *ref, int64_t n) {
    if (o->op < 0) return read_ref(c, ref, (char *)o->data + at, n, o->nbytes >= NT_BYTES);
    const char *mapped = peer_mapped(0, ref->pid, ref->addr, n);
    if (mapped) { /* reduced straight out of the peer's memory mapped here */
        deliver_at(o, at, mapped, n);
        __atomic_fetch_add(&mapped_bytes, n, __ATOMIC_RELAXED);
        return 0;
    }
    if (bounce_n < n) {
        free(bounce);
        bounce = malloc((size_t)n);
        bounce_n = bounce ? n : 0;
        if (!bounce) {
            c->err = ENOMEM;
            return -1;
        }
    }
    if (read_ref(c, ref, bounce, n, 0) < 0) return -1;
    deliver_at(o, at, bounce, n);
    return 0;
}

static int deliver_ref(hal_xctx *c, hal_xop *o, const hal_ref *ref, int64_t n) {
    return deliver_ref_at(c, o, o->done, ref, n);
}

/* Claim the next ku units from the front of the claim word w: 1 with the claimed units in
 * [*f, *nf), 0 when front has met back. */
static int claim_front(uint64_t *w, int64_t ku, int64_t *f, int64_t *nf) {
    for (;;) {
        uint64_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
        int64_t front = CL_FRONT(v), b = CL_BACK(v);
        if (front >= b) return 0;
        int64_t next = front + ku < b ? front + ku : b;
        if (__atomic_compare_exchange_n(w, &v, CL_WORD(next, b), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *f = front;
            *nf = next;
            return 1;
        }
    }
}

/* The sender of a shared message: copy cells from the front into free slots (or write them into
 * a copying receiver's destination) while the receiver leaves some unclaimed, at most most of
 * them; returns the cells sent. */
static int64_t push_cells(hal_xctx *c, hal_xop *o, char *ring, int64_t *head, int64_t most) {
    const int64_t slots = c->slots;
    int64_t cell = c->cell_bytes < c->slot_bytes ? c->cell_bytes : c->slot_bytes;
    int64_t ku = cell / CLAIM_UNIT, sent = 0;
    if (ku <= 0) return 0;
    uint64_t *w = CLAIM(c, ring);
    int64_t dpid = __atomic_load_n(DEST_PID(c, ring), __ATOMIC_ACQUIRE);
    if (c->write_ok && dpid > 0) { /* write the cells into the receiver's destination */
        uint64_t daddr = __atomic_load_n(DEST_ADDR(c, ring), __ATOMIC_ACQUIRE);
        int64_t f, nf;
        while (sent < most && claim_front(w, ku, &f, &nf)) {
            int64_t at = CL_POS(f, o->nbytes), n = CL_POS(nf, o->nbytes) - at;
            /* write_ok 2 (tests): every write after this call's first goes to an address that is
             * not mapped, so the kernel fails it (EFAULT) and the claim goes back */
            uint64_t to = c->write_ok == 2 && sent > 0 ? (uint64_t)8 : daddr + (uint64_t)at;
            if (cma(1, dpid, (char *)o->data + at, to, n, o->nbytes >= NT_BYTES)) { /* give the claim back (only the
                * sender moves front): the receiver reads it; no more writes */
                c->write_ok = 0;
                for (;;) {
                    uint64_t u = __atomic_load_n(w, __ATOMIC_ACQUIRE);
                    if (__atomic_compare_exchange_n(w, &u, CL_WORD(f, CL_BACK(u)), 0, __ATOMIC_ACQ_REL,
                                                    __ATOMIC_ACQUIRE))
                        break;
                }
                hal_shm_ring(o->bell);
                break;
            }
            __atomic_fetch_add(WRITTEN(c, ring), n, __ATOMIC_RELEASE);
            c->wrote += n;
            sent++;
            hal_shm_ring(o->bell);
        }
        return sent;
    }
    if (__atomic_load_n(WRITTEN(c, ring), __ATOMIC_ACQUIRE) > 0) return 0; /* written: no cells */
    int64_t f, nf;
    while (sent < most && *head - __atomic_load_n(TAIL(ring), __ATOMIC_ACQUIRE) < slots &&
           claim_front(w, ku, &f, &nf)) {
        int64_t at = CL_POS(f, o->nbytes), n = CL_POS(nf, o->nbytes) - at;
        int64_t slot = *head % slots;
        memcpy(ring + c->data_off + slot * c->slot_bytes, (const char *)o->data + at, n);
        SIZES(ring)[slot] = n;
        (*head)++;
        __atomic_store_n(HEAD(ring), *head, __ATOMIC_RELEASE);
        sent++;
        hal_shm_ring(o->bell);
    }
    return sent;
}

/* The receiver of a shared message: take the cells that arrived, else read a piece from the
 * back by reference; 1 when the message is complete, 0 when it waits for cells, -3 on a failed
 * read, -1 on a piece that is not a cell of it (bad_got). *moved counts what it moved. */
static int recv_shared(hal_xctx *c, hal_xop *o, char *ring, int64_t *tail, int64_t *moved) {
    const int64_t slots = c->slots;
    uint64_t *w = CLAIM(c, ring);
    int64_t pu = c->ref_piece / CLAIM_UNIT;
    if (pu <= 0) pu = 1;
    for (;;) {
        int took = 0;
        while (__atomic_load_n(HEAD(ring), __ATOMIC_ACQUIRE) > *tail) {
            int64_t slot = *tail % slots, n = SIZES(ring)[slot];
            if (n <= 0 || n > c->slot_bytes || o->cells + n > o->nbytes) {
                c->bad_got = n; /* not a cell of this message: the ranks disagree */
                return -1;
            }
            deliver_at(o, o->cells, ring + c->data_off + slot * c->slot_bytes, n);
            o->cells += n;
            (*tail)++;
            __atomic_store_n(TAIL(ring), *tail, __ATOMIC_RELEASE);
            hal_shm_ring(o->bell);
            (*moved)++;
            took = 1;
        }
        uint64_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
        int64_t f = CL_FRONT(v), b = CL_BACK(v);
        if (f < b) {
            if (took) continue; /* cells first: they come out of the cache */
            int64_t nb = b - pu > f ? b - pu : f;
            if (!__atomic_compare_exchange_n(w, &v, CL_WORD(f, nb), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                continue;
            int64_t at = CL_POS(nb, o->nbytes), n = CL_POS(b, o->nbytes) - at;
            hal_ref ref = {o->rpid, o->raddr + (uint64_t)at};
            if (deliver_ref_at(c, o, at, &ref, n) < 0) return -3;
            o->done += n;
            (*moved)++;
            continue;
        }
        int64_t wr = __atomic_load_n(WRITTEN(c, ring), __ATOMIC_ACQUIRE);
        if (o->cells + wr < CL_POS(f, o->nbytes)) return 0; /* claimed cells still to come */
        o->done += o->cells + wr;
        return 1;
    }
}

static int seen_peer(const int32_t *busy, int nbusy, int32_t peer) {
    for (int i = 0; i < nbusy; i++)
        if (busy[i] == peer) return 1;
    return 0;
}

/* Whether send o goes by reference (in a step whose receives do not wait for its sends). */
static int ref_send(const hal_xctx *c, const hal_xop *o) {
    return o->refmin >= 0 && o->nbytes >= (o->refmin ? o->refmin : c->cma_bytes);
}

/* Publish the descriptors of send o (by reference) while its ring has free slots; returns them. */
static int64_t post_refs(hal_xctx *c, hal_xop *o, char *ring, int64_t *head) {
    const int64_t slots = c->slots, chunk = c->chunk;
    int64_t moved = 0;
    if (o->posted == 0) {
        o->ack0 = __atomic_load_n(ACKS(c, ring), __ATOMIC_ACQUIRE);
        if (c->claim_off > 0) __atomic_store_n(CLAIM(c, ring), 0, __ATOMIC_RELEASE);
    }
    while (o->posted < o->nbytes) {
        int64_t tail = __atomic_load_n(TAIL(ring), __ATOMIC_ACQUIRE);
        if (*head - tail >= slots) break;
        int64_t n = o->nbytes - o->posted; /* the whole message (or its rest): one read */
        if (c->ref_whole <= 0 && n > chunk) n = chunk;
        int64_t slot = *head % slots;
        hal_ref *ref = (hal_ref *)(ring + c->data_off + slot * c->slot_bytes);
        ref->pid = c->pid;
        ref->addr = o->data + o->posted;
        SIZES(ring)[slot] = -n;
        (*head)++;
        __atomic_store_n(HEAD(ring), *head, __ATOMIC_RELEASE);
        o->posted += n;
        moved++;
        hal_shm_ring(o->bell);
    }
    return moved;
}

/* Copy the pieces of send o into its ring while it has free slots; returns them. */
static int64_t send_pieces(hal_xctx *c, hal_xop *o, char *ring, int64_t *head) {
    const int64_t slots = c->slots, chunk = c->chunk;
    int64_t moved = 0;
    while (o->done < o->nbytes) {
        int64_t tail = __atomic_load_n(TAIL(ring), __ATOMIC_ACQUIRE);
        if (*head - tail >= slots) break;
        int64_t n = o->nbytes - o->done;
        if (n > chunk) n = chunk;
        int64_t slot = *head % slots;
        memcpy(ring + c->data_off + slot * c->slot_bytes, (const char *)o->data + o->done, n);
        SIZES(ring)[slot] = n;
        (*head)++;
        __atomic_store_n(HEAD(ring), *head, __ATOMIC_RELEASE);
        o->done += n;
        moved++;
        hal_shm_ring(o->bell); /* the peer may reduce this piece while the next is copied */
    }
    return moved;
}

/* One pass over every op; returns the pieces moved, or -1 on a size mismatch. */
static int64_t pass(hal_xctx *c, hal_xop *s, int ns, hal_xop *r, int nr, int *left) {
    int32_t busy[64];
    int nbusy = 0, pending = 0;
    int64_t moved = 0;
    const int64_t slots = c->slots, chunk = c->chunk;
    int by_ref = c->cma_bytes > 0, helping = 0, copying = 0;
    for (int i = 0; i < nr && by_ref; i++)
        if (r[i].after) by_ref = 0; /* a receive waits for the sends: they must not wait for it */
    for (int i = 0; i < ns; i++) {
        hal_xop *o = &s[i];
        if (o->done >= o->nbytes) continue;
        if (o->peer < 0) { /* a local copy beside the step: base <- data, a piece per pass */
            int64_t n = o->nbytes - o->done < chunk ? o->nbytes - o->done : chunk;
            char *to = (char *)o->base + o->done;
            const char *from = (const char *)o->data + o->done;
            if (o->nbytes >= NT_BYTES)
                copy_nt(to, from, n);
            else
                memcpy(to, from, (size_t)n);
            o->done += n;
            moved++;
            if (o->done < o->nbytes) {
                pending++;
                copying = 1;
            }
            continue;
        }
        if (seen_peer(busy, nbusy, o->peer)) {
            pending++;
            continue;
        }
        if (nbusy < 64) busy[nbusy++] = o->peer;
        char *ring = (char *)o->ring;
        int64_t head = __atomic_load_n(HEAD(ring), __ATOMIC_RELAXED);
        if (by_ref && ref_send(c, o)) {
            moved += post_refs(c, o, ring, &head);
            int64_t acked = (__atomic_load_n(ACKS(c, ring), __ATOMIC_ACQUIRE) - o->ack0) * chunk;
            if (acked > o->posted) acked = o->posted;
            if (acked > o->done) {
                o->done = acked;
                moved++;
            }
            if (o->done < o->nbytes && c->claim_off > 0 && c->cell_bytes > 0 && o->posted == o->nbytes)
                helping = 1; /* the receiver may open it: help after this rank's own receives */
            if (o->done < o->nbytes) pending++;
            continue;
        }
        moved += send_pieces(c, o, ring, &head);
        if (o->done < o->nbytes) pending++;
    }
    int sends_out = pending == 0;
    nbusy = 0;
    for (int i = 0; i < nr; i++) {
        hal_xop *o = &r[i];
        if (o->done >= o->nbytes) continue;
        if (seen_peer(busy, nbusy, o->peer) || (o->after && !sends_out)) {
            pending++;
            continue;
        }
        if (nbusy < 64) busy[nbusy++] = o->peer;
        char *ring = (char *)o->ring;
        int64_t tail = __atomic_load_n(TAIL(ring), __ATOMIC_RELAXED);
        while (o->done < o->nbytes) {
            if (o->shared) {
                int rc = recv_shared(c, o, ring, &tail, &moved);
                if (rc < 0) {
                    c->bad_op = i;
                    c->bad_peer = o->peer;
                    return rc;
                }
                if (rc == 0) break;
                o->shared = 0;
                __atomic_fetch_add(ACKS(c, ring), (o->nbytes + chunk - 1) / chunk, __ATOMIC_RELEASE);
                moved++;
                hal_shm_ring(o->bell);
                continue;
            }
            int64_t head = __atomic_load_n(HEAD(ring), __ATOMIC_ACQUIRE);
            if (head <= tail) break;
            int64_t n = o->nbytes - o->done;
            if (n > chunk) n = chunk;
            int64_t slot = tail % slots;
            int64_t got = SIZES(ring)[slot];
            if (got < 0 && got == -o->nbytes && o->done == 0 && c->claim_off > 0 && c->cell_bytes > 0 &&
                o->nbytes >= 2 * c->cell_bytes && o->nbytes <= CL_MAX_BYTES) {
                /* a whole message by reference: share it with the sender (recv_shared) */
                const hal_ref *ref = (const hal_ref *)(ring + c->data_off + slot * c->slot_bytes);
                o->rpid = ref->pid;
                o->raddr = ref->addr;
                o->cells = 0;
                o->shared = 1;
                tail++;
                __atomic_store_n(TAIL(ring), tail, __ATOMIC_RELEASE);
                __atomic_store_n(WRITTEN(c, ring), 0, __ATOMIC_RELAXED);
                __atomic_store_n(DEST_ADDR(c, ring), o->op < 0 ? o->data : 0, __ATOMIC_RELAXED);
                __atomic_store_n(DEST_PID(c, ring), o->op < 0 ? c->pid : 0, __ATOMIC_RELAXED);
                __atomic_store_n(CLAIM(c, ring), CL_WORD(0, (o->nbytes + CLAIM_UNIT - 1) / CLAIM_UNIT),
                                 __ATOMIC_RELEASE);
                hal_shm_ring(o->bell);
                moved++;
                continue;
            }
            if (got < 0 && c->ack_off > 0 && (got == -n || got == o->done - o->nbytes)) {
                /* by reference: one piece, or the rest of the message in one descriptor (read
                 * whole into the destination, or reduced in pieces of chunk through the bounce
                 * buffer, with no round trip per piece); one ack per piece of chunk */
                hal_ref ref = *(const hal_ref *)(ring + c->data_off + slot * c->slot_bytes);
                int64_t len = -got, step = o->op < 0 ? len : chunk;
                for (int64_t off = 0; off < len; off += step) {
                    int64_t k = len - off < step ? len - off : step;
                    hal_ref at = {ref.pid, ref.addr + (uint64_t)off};
                    if (deliver_ref(c, o, &at, k) < 0) {
                        c->bad_op = i;
                        c->bad_peer = o->peer;
                        return -3;
                    }
                    o->done += k;
                }
                tail++;
                __atomic_store_n(TAIL(ring), tail, __ATOMIC_RELEASE);
                __atomic_fetch_add(ACKS(c, ring), (len + chunk - 1) / chunk, __ATOMIC_RELEASE);
                moved++;
                hal_shm_ring(o->bell);
                continue;
            }
            if (got != n) {
                c->bad_op = i;
                c->bad_got = got;
                c->bad_peer = o->peer;
                return -1;
            }
            deliver(o, ring + c->data_off + slot * c->slot_bytes, n);
            tail++;
            __atomic_store_n(TAIL(ring), tail, __ATOMIC_RELEASE);
            o->done += n;
            moved++;
            hal_shm_ring(o->bell);
        }
        if (o->done < o->nbytes) pending++;
    }
    /* Help the receivers of this rank's shared messages only now, when its own receives are done
     * or wait for their peers, and with at most a ring of cells per pass: a rank that both sends
     * and receives (all_gather, a ring step) reads its own message while its peer reads ours,
     * instead of feeding the peer's receive cell by cell while its own waits (a receiver that
     * keeps up with the cells would keep the sender in push_cells until the whole message was
     * claimed: the two messages moved one after the other). */
    for (int i = 0; i < ns && helping && !copying; i++) { /* its own copy first */
        hal_xop *o = &s[i];
        if (o->peer < 0 || o->done >= o->nbytes || o->posted != o->nbytes || o->refmin < 0 ||
            o->nbytes < (o->refmin ? o->refmin : c->cma_bytes))
            continue;
        char *ring = (char *)o->ring;
        int64_t head = __atomic_load_n(HEAD(ring), __ATOMIC_RELAXED);
        moved += push_cells(c, o, ring, &head, slots);
    }
    *left = pending;
    return moved;
}

/* Run the exchange: 0 when complete, 1 after check_ns without progress (call again), -1 on a
 * piece of the wrong size (bad_op, bad_got). c->moved counts the pieces this call moved. */
int hal_shm_exchange(hal_xctx *c, hal_xop *sends, int nsend, hal_xop *recvs, int nrecv) {
    uint32_t *bell = (uint32_t *)c->bell;
    int64_t idle_since = 0;
    c->moved = 0;
    publish_cpu(bell);
    enter_call(bell);
    for (;;) {
        uint32_t seen = __atomic_load_n(bell, __ATOMIC_ACQUIRE);
        int left = 0;
        int64_t moved = pass(c, sends, nsend, recvs, nrecv, &left);
        if (moved < 0) return leave_call(bell, (int)moved);
        c->moved += moved;
        if (left == 0) return leave_call(bell, 0);
        int64_t t = now_ns();
        if (moved || idle_since == 0) {
            idle_since = t;
            continue;
        }
        int64_t idle = t - idle_since;
        if (idle >= c->check_ns) return leave_call(bell, 1);
        /* poll a little (a peer that answers at once), then poll with sched_yield while a peer
         * is awake, then sleep; never busy-poll for a peer that last ran on this cpu */
        if (idle < c->yield_ns || idle < c->spin_ns) {
            int on = ops_on(sends, nsend, recvs, nrecv, publish_cpu(bell));
            if (!on && idle < c->spin_ns) {
                relax();
                continue;
            }
            if (idle < c->yield_ns && ops_awake(sends, nsend, recvs, nrecv, t, c->yield_ns)) {
                sched_yield();
                continue;
            }
        }
        sleep_on(bell, seen, c->check_ns - idle);
    }
}

/* -- whole small collectives -------------------------------------------------------------
 * hal_shm_run executes a list of one-piece actions in order: SEND (copy into the peer's ring),
 * RECV_SIG (the peer's call signature: compared with ours byte for byte), RECV (copy or
 * reduce into the destination), COPY (local memcpy: out of place). Python compiles a whole
 * call's plan (its algorithm's steps, one piece per message) into the list, so one C call runs
 * the collective. Each pair has at most two pieces in flight (signature, data), and rings have
 * at least two slots, so a SEND never waits for a peer that waits for us. Returns 0 when done,
 * 1 after check_ns without progress (*pos keeps the next action), -1 on a piece of the wrong
 * size (bad_op = the action, bad_got), -2 on a signature that differs (bad_op = the action,
 * its bytes copied to stash).
 *
 * -- whole pipelined collectives ----------------------------------------------------------
 * hal_shm_prog runs the same list with one more kind, STEP: a whole plan step of any size (the
 * sends and receives of one ring step, butterfly step or tree level, cut into pieces of
 * c->chunk and pipelined through the slots exactly as hal_shm_exchange does), its op records
 * xops[src .. src+peer) sends and the op receives after them. Python records the steps a call's
 * algorithm makes (hal.comm._algorithms, the same code as the Python path, in the same order,
 * with the signatures interleaved as there), so a large collective on any number of ranks is
 * one C call per rank: no Python between the steps or the pieces. A send record of peer -1 is
 * a local copy that Python moved into the step before it (out of place, a copy that neither
 * reads what the step receives nor writes what it moves): it runs a piece per pass while the
 * peers move the step's messages. POST (same fields as the STEP after it, but nbytes) publishes
 * the descriptors of that step's sends by reference before the step checks its peers'
 * signatures, as the Python path places a step's sends first: a peer arriving later reads them
 * at once instead of waiting for this rank to wake up and post them; with nbytes 1 it also
 * copies the pieces of its sends through the slots that fit in the free slots. The peer still
 * reads our signature first (it went into the ring before). hal_shm_again zeroes the op
 * records before a compiled program runs again. bad_peer names the sender of a bad piece. */
typedef struct {
    int32_t kind; /* 0 SEND, 1 RECV_SIG, 2 RECV, 3 COPY, 4 STEP, 5 POST (a STEP's sends, early) */
    int32_t peer;
    uint64_t ptr; /* SEND: source; RECV: destination; RECV_SIG: our signature; COPY: destination */
    uint64_t src; /* COPY: source */
    int64_t nbytes;
    int32_t op;
    int32_t dtype;
} hal_act;

static int act_once(hal_xctx *c, hal_act *a, const uint64_t *outs, const uint64_t *ins,
                    const uint64_t *bells, char *stash, hal_xop *xops) {
    const int64_t slots = c->slots;
    if (a->kind == 5) { /* POST: a step's sends before its signature checks */
        hal_xop *s = xops + a->src, *r = s + a->peer;
        int32_t busy[64];
        int nbusy = 0, by_ref = c->cma_bytes > 0;
        for (int i = 0; i < a->op && by_ref; i++)
            if (r[i].after) by_ref = 0;
        for (int i = 0; i < a->peer; i++) {
            hal_xop *o = &s[i];
            if (o->peer < 0 || o->done >= o->nbytes || seen_peer(busy, nbusy, o->peer)) continue;
            if (nbusy < 64) busy[nbusy++] = o->peer; /* one message per peer at a time, as in pass */
            char *ring = (char *)o->ring;
            int64_t head = __atomic_load_n(HEAD(ring), __ATOMIC_RELAXED);
            if (by_ref && ref_send(c, o))
                c->moved += post_refs(c, o, ring, &head);
            else if (a->nbytes) /* through the slots: the pieces that fit (as pass sends them) */
                c->moved += send_pieces(c, o, ring, &head);
        }
        return 1;
    }
    if (a->kind == 4) { /* a whole plan step: xops[src .. src+peer) sends, then op receives */
        hal_xop *s = xops + a->src;
        int left = 0;
        int64_t moved = pass(c, s, a->peer, s + a->peer, a->op, &left);
        if (moved < 0) return (int)moved;
        c->moved += moved;
        if (left == 0) return 1;
        return moved ? 2 : 0;
    }
    if (a->kind == 3) {
        memcpy((char *)a->ptr, (const char *)a->src, a->nbytes);
        return 1;
    }
    if (a->kind == 0) {
        char *ring = (char *)outs[a->peer];
        int64_t head = __atomic_load_n(HEAD(ring), __ATOMIC_RELAXED);
        if (head - __atomic_load_n(TAIL(ring), __ATOMIC_ACQUIRE) >= slots) return 0;
        int64_t slot = head % slots;
        memcpy(ring + c->data_off + slot * c->slot_bytes, (const char *)a->ptr, a->nbytes);
        SIZES(ring)[slot] = a->nbytes;
        __atomic_store_n(HEAD(ring), head + 1, __ATOMIC_RELEASE);
        hal_shm_ring(bells[a->peer]);
        return 1;
    }
    char *ring = (char *)ins[a->peer];
    int64_t tail = __atomic_load_n(TAIL(ring), __ATOMIC_RELAXED);
    if (__atomic_load_n(HEAD(ring), __ATOMIC_ACQUIRE) <= tail) return 0;
    int64_t slot = tail % slots;
    const char *piece = ring + c->data_off + slot * c->slot_bytes;
    int64_t got = SIZES(ring)[slot];
    int rc = 1, ack = 0;
    if (a->kind == 1) {
        if (got != a->nbytes || memcmp(piece, (const char *)a->ptr, a->nbytes) != 0) {
            int64_t n = got < 4096 ? got : 4096;
            memcpy(stash, piece, n);
            c->bad_got = got;
            rc = -2;
        }
    } else if (got < 0 && got == -a->nbytes && a->op < 0 && c->ack_off > 0) {
        /* one piece by reference (every receiver takes either kind of piece; only the sender
         * decides): read it straight into the destination */
        hal_ref ref = *(const hal_ref *)piece;
        if (read_ref(c, &ref, (char *)a->ptr, a->nbytes, a->nbytes >= NT_BYTES) < 0) return -3; /* c->err; slot stays */
        ack = 1;
    } else if (got != a->nbytes) {
        c->bad_got = got;
        return -1; /* the slot stays: the ranks disagree on the sizes */
    } else {
        hal_xop o = {0};
        o.data = a->ptr;
        o.op = a->op;
        o.dtype = a->dtype;
        deliver(&o, piece, a->nbytes);
    }
    __atomic_store_n(TAIL(ring), tail + 1, __ATOMIC_RELEASE);
    if (ack) __atomic_fetch_add(ACKS(c, ring), 1, __ATOMIC_RELEASE); /* one piece (of c->chunk) */
    hal_shm_ring(bells[a->peer]);
    return rc;
}

/* Whether a peer that action a waits for last ran on cpu (a step: the peers of its unfinished
 * sends and receives; a local copy or POST waits for nobody). */
static int act_on(const hal_act *a, const uint64_t *bells, const hal_xop *xops, uint32_t cpu) {
    if (a->kind == 4) return ops_on(xops + a->src, a->peer, xops + a->src + a->peer, a->op, cpu);
    if (a->kind > 2) return 0;
    return ran_on(bells[a->peer], cpu);
}

/* Whether a peer that action a waits for is awake (as act_on). */
static int act_awake(const hal_act *a, const uint64_t *bells, const hal_xop *xops, int64_t now,
                     int64_t within) {
    if (a->kind == 4)
        return ops_awake(xops + a->src, a->peer, xops + a->src + a->peer, a->op, now, within);
    if (a->kind > 2) return 0;
    return awake(bells[a->peer], now, within);
}

int hal_shm_prog(hal_xctx *c, hal_act *acts, int nact, int64_t *pos, const uint64_t *outs,
                 const uint64_t *ins, const uint64_t *bells, char *stash, hal_xop *xops) {
    uint32_t *bell = (uint32_t *)c->bell;
    int64_t idle_since = 0;
    c->moved = 0;
    publish_cpu(bell);
    enter_call(bell);
    while (*pos < nact) {
        uint32_t seen = __atomic_load_n(bell, __ATOMIC_ACQUIRE);
        int rc = act_once(c, &acts[*pos], outs, ins, bells, stash, xops);
        if (rc < 0) {
            if (acts[*pos].kind != 4) c->bad_peer = acts[*pos].peer;
            c->bad_op = *pos;
            return leave_call(bell, rc);
        }
        if (rc == 2) { /* a step moved pieces and waits for more */
            idle_since = 0;
            continue;
        }
        if (rc > 0) {
            if (acts[*pos].kind < 4) c->moved++;
            (*pos)++;
            idle_since = 0;
            continue;
        }
        int64_t t = now_ns();
        if (idle_since == 0) {
            idle_since = t;
            continue;
        }
        int64_t idle = t - idle_since;
        if (idle >= c->check_ns) return leave_call(bell, 1);
        /* poll a little (a peer that answers at once), then poll with sched_yield while a peer
         * is awake, then sleep; never busy-poll for a peer that last ran on this cpu */
        if (idle < c->yield_ns || idle < c->spin_ns) {
            int on = act_on(&acts[*pos], bells, xops, publish_cpu(bell));
            if (!on && idle < c->spin_ns) {
                relax();
                continue;
            }
            if (idle < c->yield_ns && act_awake(&acts[*pos], bells, xops, t, c->yield_ns)) {
                sched_yield();
                continue;
            }
        }
        sleep_on(bell, seen, c->check_ns - idle);
    }
    return leave_call(bell, 0);
}

int hal_shm_run(hal_xctx *c, hal_act *acts, int nact, int64_t *pos, const uint64_t *outs,
                const uint64_t *ins, const uint64_t *bells, char *stash) {
    return hal_shm_prog(c, acts, nact, pos, outs, ins, bells, stash, NULL);
}

/* Rewind the op records of a compiled program (nothing moved yet) before it runs again. */
static void rewind_ops(hal_xop *xops, int n) {
    for (int i = 0; i < n; i++) xops[i].done = xops[i].posted = xops[i].cells = xops[i].shared = 0;
}

/* A call prepared to run again (hal_shm_again): a program's actions, op records, piece size and
 * where the sequence number of its signature goes (NULL: no signature), and the context. */
typedef struct {
    hal_xctx *c;
    hal_act *acts;
    hal_xop *xops;  /* NULL: one-piece actions (hal_shm_run) */
    int64_t *pos;
    const uint64_t *outs;
    const uint64_t *ins;
    const uint64_t *bells;
    char *stash;
    int64_t *seq;
    int64_t nact;
    int64_t nx;
    int64_t chunk;  /* the piece size set in the context (0: left as it is) */
} hal_again;

/* Start the prepared call g as call number seq: one C call for what the repeated call did in
 * several (write seq into the signature, set the piece size, rewind the op records, run from
 * the first action). Returns hal_shm_prog's status; *g->pos says where it stopped. */
int hal_shm_again(hal_again *g, int64_t seq) {
    if (g->seq) *g->seq = seq;
    if (g->chunk) g->c->chunk = g->chunk;
    if (g->xops) rewind_ops(g->xops, (int)g->nx);
    *g->pos = 0;
    return hal_shm_prog(g->c, g->acts, (int)g->nact, g->pos, g->outs, g->ins, g->bells, g->stash,
                        g->xops);
}

/* Read 8 bytes at addr in process pid: 0, or the errno (can this rank read its peers?). */
int hal_shm_cma_probe(int64_t pid, uint64_t addr) {
    int64_t word = 0;
    return cma(0, pid, (char *)&word, addr, sizeof word, 0);
}

/* For the Python path: read a piece sent by reference into dst (0, or -1 with c->err), and
 * count it read in the ring's ack word at ack. */
int hal_shm_read_ref(hal_xctx *c, int64_t pid, uint64_t addr, char *dst, int64_t n) {
    hal_ref ref = {pid, addr};
    return read_ref(c, &ref, dst, n, 0);
}

void hal_shm_ack(uint64_t ack) { __atomic_fetch_add((int64_t *)ack, 1, __ATOMIC_RELEASE); }
