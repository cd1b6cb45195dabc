/* The CPU emulator's native stream runtime (HAL_CPU_NATIVE=1, the default where a C compiler is found).
 *
 * Each stream is a FIFO of operations served by one pthread that runs them without the GIL:
 * copies (memmove), memsets, event records (a monotonic timestamp), waits for marks of any
 * stream (cross-stream waits), waits for host signals, compiled kernels (through a per-kernel
 * trampoline `void k__hal_launch(const char *block)` taking a copied argument block) and
 * hand-offs to a Python thread for Python callables (fire a mark, wait for another): no Python
 * code ever runs on these threads.
 *
 * Short operations on an idle stream may run on the submitting thread ("inline"): completing
 * early is a valid outcome of an asynchronous operation and it saves the thread hand-off.
 * Jitter (HAL_CPU_JITTER) sleeps a seeded random 0..2 ms before each operation on the worker
 * and disables inline execution, like the Python worker.
 *
 * Built by backends/cpu/_native.py with the host C compiler into a cffi extension module (or a
 * plain library for cffi's ABI mode); calls release the GIL. Only the functions declared in
 * _native.CDEF are the interface.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct hal_mark {
    int64_t refs; /* atomic */
    int done;     /* guarded by mu; read racily by hal_rt_mark_done (monotonic 0 -> 1) */
    double time;  /* CLOCK_MONOTONIC seconds at fire */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} hal_mark;

enum { OP_COPY = 1, OP_MEMSET, OP_RECORD, OP_WAIT, OP_HOSTWAIT, OP_KERNEL, OP_HANDOFF, OP_STOP };

typedef struct hal_op {
    struct hal_op *next;
    int kind;
    int value;
    void *dst;
    const void *src;
    size_t n;
    hal_mark *mark;
    hal_mark *done; /* OP_HANDOFF: fire mark, then wait for done */
    void (*fn)(const char *);
    char block[]; /* kernel argument block */
} hal_op;

typedef struct hal_stream {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* the worker waits for work */
    pthread_cond_t done; /* host threads wait for completions */
    hal_op *head, *tail;
    uint64_t submitted, completed;
    int inline_busy, host_waiting, waiters, closed, detached, exited;
    int jitter;
    uint64_t rng;
    pthread_t thread;
} hal_stream;


static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double hal_rt_now(void) { return now_s(); }

/* -- marks (events and host signals) -------------------------------------------------------- */
hal_mark *hal_rt_mark_new(void) {
    hal_mark *m = (hal_mark *)calloc(1, sizeof(hal_mark));
    if (!m) return NULL;
    m->refs = 1;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    return m;
}

static void mark_ref(hal_mark *m) { __atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED); }

void hal_rt_mark_release(hal_mark *m) {
    if (m && __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        pthread_mutex_destroy(&m->mu);
        pthread_cond_destroy(&m->cv);
        free(m);
    }
}

void hal_rt_mark_fire(hal_mark *m) {
    pthread_mutex_lock(&m->mu);
    if (!m->done) {
        m->time = now_s();
        __atomic_store_n(&m->done, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&m->cv);
    }
    pthread_mutex_unlock(&m->mu);
}

int hal_rt_mark_done(hal_mark *m) { return __atomic_load_n(&m->done, __ATOMIC_ACQUIRE); }

double hal_rt_mark_time(hal_mark *m) {
    pthread_mutex_lock(&m->mu);
    double t = m->time;
    pthread_mutex_unlock(&m->mu);
    return t;
}

void hal_rt_mark_wait(hal_mark *m) {
    if (__atomic_load_n(&m->done, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&m->mu);
    while (!m->done) pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
}

/* -- the worker ----------------------------------------------------------------------------- */
static uint64_t next_rand(hal_stream *s) { /* xorshift64* */
    uint64_t x = s->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* memmove, except that a copy of 2 KiB .. 1 MiB whose destination lies 1..63 bytes past its
 * source modulo 4 KiB (and does not overlap it) goes in 2 KiB memcpy pieces: glibc's memmove
 * takes `rep movsb` at these sizes, which on x86 runs 10-25x slower at such distances ("4K
 * aliasing": 32 us instead of 2 us for 64 KiB here; pieces of 2 KiB take a vector loop). */
static void copy_bytes(void *dst, const void *src, size_t n) {
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src, dist = (d - s) & 4095u;
    if (n >= 2048 && n < ((size_t)1 << 20) && dist != 0 && dist < 64 && (d + n <= s || s + n <= d)) {
        for (size_t o = 0; o < n; o += 2048) {
            memcpy((char *)dst + o, (const char *)src + o, n - o < 2048 ? n - o : 2048);
        }
        return;
    }
    memmove(dst, src, n);
}

static void run_op(hal_stream *s, hal_op *op) {
    switch (op->kind) {
    case OP_COPY:
        copy_bytes(op->dst, op->src, op->n);
        break;
    case OP_MEMSET:
        memset(op->dst, op->value, op->n);
        break;
    case OP_RECORD:
        hal_rt_mark_fire(op->mark);
        break;
    case OP_WAIT:
        hal_rt_mark_wait(op->mark);
        break;
    case OP_HOSTWAIT:
        pthread_mutex_lock(&s->mu);
        s->host_waiting++;
        if (s->waiters) pthread_cond_broadcast(&s->done);
        pthread_mutex_unlock(&s->mu);
        hal_rt_mark_wait(op->mark);
        pthread_mutex_lock(&s->mu);
        s->host_waiting--;
        pthread_mutex_unlock(&s->mu);
        break;
    case OP_KERNEL:
        op->fn(op->block);
        break;
    case OP_HANDOFF: /* a Python thread waits for mark, runs the callable, fires done */
        hal_rt_mark_fire(op->mark);
        hal_rt_mark_wait(op->done);
        hal_rt_mark_release(op->done);
        break;
    default:
        break;
    }
    if (op->mark) hal_rt_mark_release(op->mark);
}

static void *worker_main(void *arg) {
    hal_stream *s = (hal_stream *)arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head || s->inline_busy) pthread_cond_wait(&s->wake, &s->mu);
        hal_op *op = s->head;
        if (op->kind == OP_STOP) {
            s->head = op->next;
            if (!s->head) s->tail = NULL;
            free(op);
            __atomic_add_fetch(&s->completed, 1, __ATOMIC_RELEASE);
            s->exited = 1;
            if (s->waiters) pthread_cond_broadcast(&s->done);
            pthread_mutex_unlock(&s->mu);
            return NULL; /* the stream struct stays (a few bytes): late submits see `closed` */
        }
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        if (s->jitter) usleep((useconds_t)(next_rand(s) % 2000u));
        run_op(s, op);
        free(op);
        pthread_mutex_lock(&s->mu);
        __atomic_add_fetch(&s->completed, 1, __ATOMIC_RELEASE);
        if (s->waiters) pthread_cond_broadcast(&s->done);
    }
}

hal_stream *hal_rt_stream_new(int jitter, uint64_t seed) {
    hal_stream *s = (hal_stream *)calloc(1, sizeof(hal_stream));
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->done, NULL);
    s->jitter = jitter;
    s->rng = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    if (!s->rng) s->rng = 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 8 << 20); /* Python callbacks (NumPy, BLAS) run on it too */
    int rc = pthread_create(&s->thread, &attr, worker_main, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->wake);
        pthread_cond_destroy(&s->done);
        free(s);
        return NULL;
    }
    return s;
}

/* Claim the idle stream for an inline operation (lock held by the caller). */
static int claim_inline(hal_stream *s, int inl) {
    if (inl && !s->jitter && !s->inline_busy && s->completed == s->submitted) {
        __atomic_add_fetch(&s->submitted, 1, __ATOMIC_RELAXED);
        s->inline_busy = 1;
        return 1;
    }
    return 0;
}

static void finish_inline(hal_stream *s) {
    pthread_mutex_lock(&s->mu);
    s->inline_busy = 0;
    __atomic_add_fetch(&s->completed, 1, __ATOMIC_RELEASE);
    if (s->waiters) pthread_cond_broadcast(&s->done);
    if (s->head) pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

/* Append op (lock held); return its sequence number (> 0). */
static int64_t push(hal_stream *s, hal_op *op) {
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    __atomic_add_fetch(&s->submitted, 1, __ATOMIC_RELAXED);
    pthread_cond_signal(&s->wake);
    return (int64_t)s->submitted;
}

/* Return codes of the submit functions: 0 ran inline (done), > 0 queued (the operation's
 * sequence number: done once hal_rt_completed reaches it), -1 stream closed, -2 out of memory. */
static int64_t submit(hal_stream *s, hal_op *op, int inl) {
    pthread_mutex_lock(&s->mu);
    if (s->closed) {
        pthread_mutex_unlock(&s->mu);
        if (op) {
            if (op->mark) hal_rt_mark_release(op->mark);
            free(op);
        }
        return -1;
    }
    if (claim_inline(s, inl)) {
        pthread_mutex_unlock(&s->mu);
        run_op(s, op);
        free(op);
        finish_inline(s);
        return 0;
    }
    int64_t seq = push(s, op);
    pthread_mutex_unlock(&s->mu);
    return seq;
}

static hal_op *new_op(int kind, size_t extra) {
    hal_op *op = (hal_op *)malloc(sizeof(hal_op) + extra);
    if (!op) return NULL;
    memset(op, 0, sizeof(hal_op));
    op->kind = kind;
    return op;
}

int64_t hal_rt_copy(hal_stream *s, uintptr_t dst, uintptr_t src, size_t n, int inl) {
    /* the common case, a copy on an idle stream, runs without allocating */
    pthread_mutex_lock(&s->mu);
    if (!s->closed && claim_inline(s, inl)) {
        pthread_mutex_unlock(&s->mu);
        copy_bytes((void *)dst, (const void *)src, n);
        finish_inline(s);
        return 0;
    }
    pthread_mutex_unlock(&s->mu);
    hal_op *op = new_op(OP_COPY, 0);
    if (!op) return -2;
    op->dst = (void *)dst;
    op->src = (const void *)src;
    op->n = n;
    return submit(s, op, 0);
}

int64_t hal_rt_copy_h2d(hal_stream *s, uintptr_t dst, const char *src, size_t n, int inl) {
    return hal_rt_copy(s, dst, (uintptr_t)src, n, inl);
}

int64_t hal_rt_copy_d2h(hal_stream *s, char *dst, uintptr_t src, size_t n, int inl) {
    return hal_rt_copy(s, (uintptr_t)dst, src, n, inl);
}

int64_t hal_rt_memset(hal_stream *s, uintptr_t dst, int value, size_t n, int inl) {
    pthread_mutex_lock(&s->mu);
    if (!s->closed && claim_inline(s, inl)) {
        pthread_mutex_unlock(&s->mu);
        memset((void *)dst, value, n);
        finish_inline(s);
        return 0;
    }
    pthread_mutex_unlock(&s->mu);
    hal_op *op = new_op(OP_MEMSET, 0);
    if (!op) return -2;
    op->dst = (void *)dst;
    op->value = value;
    op->n = n;
    return submit(s, op, 0);
}

/* Queue an operation of `kind` on mark m (a record, a wait, a host wait), holding a reference. */
static int64_t mark_op(hal_stream *s, hal_mark *m, int kind, int inl) {
    hal_op *op = new_op(kind, 0);
    if (!op) return -2;
    mark_ref(m);
    op->mark = m;
    return submit(s, op, inl);
}

int64_t hal_rt_record(hal_stream *s, hal_mark *m) { return mark_op(s, m, OP_RECORD, 1); }

int64_t hal_rt_wait(hal_stream *s, hal_mark *m) {
    return mark_op(s, m, OP_WAIT, 0); /* never inline: a wait blocks */
}

int64_t hal_rt_wait_host(hal_stream *s, hal_mark *m) { return mark_op(s, m, OP_HOSTWAIT, 0); }

int64_t hal_rt_kernel(hal_stream *s, uintptr_t fn, const char *block, size_t size, int inl) {
    void (*f)(const char *) = (void (*)(const char *))fn;
    pthread_mutex_lock(&s->mu);
    if (!s->closed && claim_inline(s, inl)) {
        pthread_mutex_unlock(&s->mu);
        f(block);
        finish_inline(s);
        return 0;
    }
    pthread_mutex_unlock(&s->mu);
    hal_op *op = new_op(OP_KERNEL, size);
    if (!op) return -2;
    op->fn = f;
    memcpy(op->block, block, size);
    return submit(s, op, 0);
}

/* Queue a hand-off: when the stream reaches it, fire `ready` and wait until `done` fires (the
 * Python thread running the callable fires it). */
int64_t hal_rt_handoff(hal_stream *s, hal_mark *ready, hal_mark *done) {
    hal_op *op = new_op(OP_HANDOFF, 0);
    if (!op) return -2;
    mark_ref(ready);
    mark_ref(done);
    op->mark = ready;
    op->done = done;
    int64_t seq = submit(s, op, 0);
    if (seq == -1) hal_rt_mark_release(done); /* refused: submit released `ready` only */
    return seq;
}

/* Claim the idle stream for an inline Python operation: 1 claimed (call hal_rt_end_inline after
 * it ran), 0 not idle (queue it with hal_rt_handoff), -1 closed. */
int hal_rt_begin_inline(hal_stream *s) {
    pthread_mutex_lock(&s->mu);
    int rc = s->closed ? -1 : claim_inline(s, 1);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void hal_rt_end_inline(hal_stream *s) { finish_inline(s); }

/* -- host side ------------------------------------------------------------------------------ */
void hal_rt_synchronize(hal_stream *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->submitted;
    s->waiters++;
    while (s->completed < target) pthread_cond_wait(&s->done, &s->mu);
    s->waiters--;
    pthread_mutex_unlock(&s->mu);
}

void hal_rt_settle(hal_stream *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->submitted;
    s->waiters++;
    while (s->completed < target && s->host_waiting == 0) pthread_cond_wait(&s->done, &s->mu);
    s->waiters--;
    pthread_mutex_unlock(&s->mu);
}

int hal_rt_idle(hal_stream *s) {
    pthread_mutex_lock(&s->mu);
    int idle = s->completed == s->submitted;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

uint64_t hal_rt_completed(hal_stream *s) {
    return __atomic_load_n(&s->completed, __ATOMIC_ACQUIRE);
}

int hal_rt_alive(hal_stream *s) {
    pthread_mutex_lock(&s->mu);
    int alive = !s->exited;
    pthread_mutex_unlock(&s->mu);
    return alive;
}

/* Finish the queued work and stop the worker. With join=1 wait for it and free the stream;
 * with join=0 (called from the worker itself) the worker frees the stream when it exits. */
void hal_rt_stream_close(hal_stream *s, int join) {
    hal_op *stop = new_op(OP_STOP, 0);
    pthread_mutex_lock(&s->mu);
    if (s->closed) {
        pthread_mutex_unlock(&s->mu);
        free(stop);
        return;
    }
    s->closed = 1;
    if (!join) s->detached = 1;
    pthread_t th = s->thread;
    push(s, stop);
    pthread_mutex_unlock(&s->mu);
    if (join) {
        pthread_join(th, NULL);
    } else {
        pthread_detach(th);
    }
}

/* Whether the calling thread is the stream's worker. */
int hal_rt_on_worker(hal_stream *s) { return pthread_equal(pthread_self(), s->thread); }

/* -- CPython fast entries (the extension module only) ---------------------------------------
 *
 * cffi calls release and retake the GIL and save errno around every call, and a host buffer
 * needs an ffi.from_buffer object first: together more than a small copy itself. In the
 * extension module (API mode) these four METH_FASTCALL builtins do the common small cases
 * without either, holding the GIL (so only copies of at most FAST_MAX bytes):
 *
 *   h2d(stream, dst_address, src_buffer, n) -> bool
 *   d2h(stream, dst_buffer, src_address, n) -> bool
 *   d2d(stream, dst_address, src_address, n) -> bool
 *   sync(stream) -> None
 *
 * `stream` is the hal_stream's address as an int. A copy runs inline, under the stream's lock,
 * only when the stream is open, idle (everything submitted completed), not running an inline
 * operation and without jitter, the buffer is C-contiguous (writable for d2h) and holds n bytes;
 * it then counts as one submitted and completed operation and returns True. Otherwise it does
 * nothing and returns False: the caller takes the cffi path (queued behind pending work, or
 * raising its usual errors). sync returns at once when the stream is idle, else waits with the
 * GIL released, as hal_rt_synchronize. bind_sync(worker) returns a NativeWorker's synchronize()
 * as a builtin: sync, then worker._after_sync() only where the worker holds pins or a failure.
 * hal_rt_pyfast returns the address of the tuple (h2d, d2h, d2d, sync, bind_sync, FAST_MAX)
 * (created once, never freed), or 0 in the plain library (ABI mode). */
#ifdef PY_VERSION_HEX
#define FAST_MAX ((Py_ssize_t)64 << 10)

static int fast_copy(hal_stream *s, void *dst, const void *src, size_t n) {
    int done = 0;
    pthread_mutex_lock(&s->mu);
    if (!s->closed && !s->jitter && !s->inline_busy && s->completed == s->submitted) {
        copy_bytes(dst, src, n); /* the stream is idle and we hold its lock: nothing runs beside */
        __atomic_add_fetch(&s->submitted, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&s->completed, 1, __ATOMIC_RELEASE);
        if (s->waiters) pthread_cond_broadcast(&s->done);
        done = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return done;
}

static int fast_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, hal_stream **s, Py_ssize_t *n) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", want, nargs);
        return -1;
    }
    *s = (hal_stream *)PyLong_AsVoidPtr(args[0]);
    if (*s == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "stream is NULL");
        return -1;
    }
    if (want == 4) {
        *n = PyLong_AsSsize_t(args[3]);
        if (*n == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* h2d and d2h: (stream, dst, src, n) with the device side an address and the host side a buffer
 * (h2d: src, read; d2h: dst, written). False, having done nothing, when the copy is not for this
 * path: n out of range, a buffer that is too short, read-only or strided (the cffi path says why). */
static PyObject *fast_host_copy(PyObject *const *args, Py_ssize_t nargs, int to_host) {
    hal_stream *s;
    Py_ssize_t n;
    if (fast_args(args, nargs, 4, &s, &n) < 0) return NULL;
    void *dev = PyLong_AsVoidPtr(args[to_host ? 2 : 1]);
    if (dev == NULL && PyErr_Occurred()) return NULL;
    if (n <= 0 || n > FAST_MAX) Py_RETURN_FALSE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[to_host ? 1 : 2], &view, to_host ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    int done = view.len >= n && (to_host ? fast_copy(s, view.buf, dev, (size_t)n)
                                         : fast_copy(s, dev, view.buf, (size_t)n));
    PyBuffer_Release(&view);
    return PyBool_FromLong(done);
}

static PyObject *fast_h2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return fast_host_copy(args, nargs, 0);
}

static PyObject *fast_d2h(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return fast_host_copy(args, nargs, 1);
}

static PyObject *fast_d2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    hal_stream *s;
    Py_ssize_t n;
    (void)self;
    if (fast_args(args, nargs, 4, &s, &n) < 0) return NULL;
    void *dst = PyLong_AsVoidPtr(args[1]);
    if (dst == NULL && PyErr_Occurred()) return NULL;
    void *src = PyLong_AsVoidPtr(args[2]);
    if (src == NULL && PyErr_Occurred()) return NULL;
    if (n <= 0 || n > FAST_MAX) Py_RETURN_FALSE;
    return PyBool_FromLong(fast_copy(s, dst, src, (size_t)n));
}

static void fast_wait(hal_stream *s) {
    /* submitted first: once completed reaches it, everything submitted before this call is done */
    uint64_t target = __atomic_load_n(&s->submitted, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&s->completed, __ATOMIC_ACQUIRE) < target) {
        Py_BEGIN_ALLOW_THREADS
        hal_rt_synchronize(s);
        Py_END_ALLOW_THREADS
    }
}

static PyObject *fast_sync(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    hal_stream *s;
    (void)self;
    if (fast_args(args, nargs, 1, &s, NULL) < 0) return NULL;
    fast_wait(s);
    Py_RETURN_NONE;
}

/* A NativeWorker's synchronize() as a builtin bound to the worker: the wait of sync on the stream
 * at worker.address, then, only when the worker holds pins of queued work or a failure,
 * worker._after_sync() (unpins, raises). */
static PyObject *fast_bound_sync(PyObject *worker, PyObject *unused) {
    static PyObject *names[4]; /* interned once under the GIL */
    static const char *const spelled[4] = {"address", "_pins", "_error", "_after_sync"};
    (void)unused;
    for (int i = 0; i < 4; i++) {
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(spelled[i])) == NULL) return NULL;
    }
    PyObject *address = PyObject_GetAttr(worker, names[0]);
    if (address == NULL) return NULL;
    hal_stream *s = (hal_stream *)PyLong_AsVoidPtr(address);
    Py_DECREF(address);
    if (s == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "stream is NULL");
        return NULL;
    }
    fast_wait(s);
    PyObject *pins = PyObject_GetAttr(worker, names[1]);
    if (pins == NULL) return NULL;
    int busy = PyObject_IsTrue(pins);
    Py_DECREF(pins);
    if (busy < 0) return NULL;
    if (!busy) {
        PyObject *error = PyObject_GetAttr(worker, names[2]);
        if (error == NULL) return NULL;
        busy = error != Py_None;
        Py_DECREF(error);
        if (!busy) Py_RETURN_NONE;
    }
    return PyObject_CallMethodNoArgs(worker, names[3]);
}

static PyMethodDef bound_sync_def = {"synchronize", fast_bound_sync, METH_NOARGS, "synchronize() -> None"};

static PyObject *fast_bind_sync(PyObject *self, PyObject *worker) {
    (void)self;
    return PyCFunction_New(&bound_sync_def, worker);
}

static PyMethodDef fast_defs[] = {
    {"h2d", (PyCFunction)(void (*)(void))fast_h2d, METH_FASTCALL, "h2d(stream, dst, src, n) -> bool"},
    {"d2h", (PyCFunction)(void (*)(void))fast_d2h, METH_FASTCALL, "d2h(stream, dst, src, n) -> bool"},
    {"d2d", (PyCFunction)(void (*)(void))fast_d2d, METH_FASTCALL, "d2d(stream, dst, src, n) -> bool"},
    {"sync", (PyCFunction)(void (*)(void))fast_sync, METH_FASTCALL, "sync(stream) -> None"},
    {"bind_sync", fast_bind_sync, METH_O, "bind_sync(worker) -> worker.synchronize as a builtin"},
};

static PyObject *fast_tuple; /* created once under the GIL, never freed */

uintptr_t hal_rt_pyfast(void) {
    PyGILState_STATE g = PyGILState_Ensure(); /* cffi released the GIL around this call */
    if (fast_tuple == NULL) {
        size_t count = sizeof(fast_defs) / sizeof(fast_defs[0]);
        PyObject *t = PyTuple_New((Py_ssize_t)count + 1);
        for (size_t i = 0; t != NULL && i <= count; i++) {
            PyObject *f = i < count ? PyCFunction_New(&fast_defs[i], NULL) : PyLong_FromSsize_t(FAST_MAX);
            if (f == NULL) {
                Py_CLEAR(t);
                break;
            }
            PyTuple_SET_ITEM(t, (Py_ssize_t)i, f);
        }
        if (t == NULL) PyErr_Clear();
        fast_tuple = t;
    }
    uintptr_t out = (uintptr_t)fast_tuple;
    PyGILState_Release(g);
    return out;
}
#else
uintptr_t hal_rt_pyfast(void) { return 0; }
#endif
