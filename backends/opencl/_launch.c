/* The OpenCL backend's native launch helper (hal.backends.opencl._native).
 *
 * One call per kernel launch: the arguments that changed since the launcher's last launch are
 * set (clSetKernelArg) and the kernel is enqueued (clEnqueueNDRangeKernel) with no event, under
 * the launcher's own mutex (its cl_kernel is used by no one else). The OpenCL entry points come
 * from the ICD loader PyOpenCL loaded (hal_ocl_init), so no OpenCL headers or link step are
 * needed: the few types used are declared here.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef cl_int (*set_arg_fn)(void *, cl_uint, size_t, const void *);
typedef cl_int (*enqueue_fn)(void *, void *, cl_uint, const size_t *, const size_t *,
                             const size_t *, cl_uint, const void *, void *);
typedef cl_int (*flush_fn)(void *);

static set_arg_fn p_set_arg;
static enqueue_fn p_enqueue;
static flush_fn p_flush;

#define HAL_OCL_MAX_ARGS 16
#define HAL_OCL_INTS 8
#define HAL_OCL_DOUBLES 2
/* the launch refused before anything was enqueued: an argument's memory is freed (handle 0) */
#define HAL_OCL_FREED 1
/* an argument kind: where its value comes from, and its C layout */
#define K_MEM 0 /* cl_mem from an int slot (0: freed) */
#define K_I64 1 /* int64_t from an int slot */
#define K_F64 2 /* double from a double slot */

typedef struct hal_ocl_launch {
    pthread_mutex_t lock;
    void *queue;
    void *kernel;
    uint64_t *launched; /* the stream's count of launches enqueued without an event */
    cl_uint dim;
    size_t gs[3];
    size_t ls[3];
    int has_ls;
    int flush;
    int nargs;
    int kind[HAL_OCL_MAX_ARGS];
    int slot[HAL_OCL_MAX_ARGS];
    int valid[HAL_OCL_MAX_ARGS];
    uint64_t last[HAL_OCL_MAX_ARGS]; /* the bits last set (doubles compared bitwise) */
} hal_ocl_launch;

int hal_ocl_init(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return -1;
    p_set_arg = (set_arg_fn)dlsym(h, "clSetKernelArg");
    p_enqueue = (enqueue_fn)dlsym(h, "clEnqueueNDRangeKernel");
    p_flush = (flush_fn)dlsym(h, "clFlush");
    if (p_set_arg == NULL || p_enqueue == NULL || p_flush == NULL)
        return -2;
    return 0;
}

hal_ocl_launch *hal_ocl_new(uintptr_t queue, uintptr_t kernel, uint64_t *launched, unsigned dim,
                            const size_t *gs, const size_t *ls, int flush, int nargs,
                            const int *kinds, const int *slots) {
    if (nargs > HAL_OCL_MAX_ARGS || dim < 1 || dim > 3)
        return NULL;
    hal_ocl_launch *L = calloc(1, sizeof(*L));
    if (L == NULL)
        return NULL;
    pthread_mutex_init(&L->lock, NULL);
    L->queue = (void *)queue;
    L->kernel = (void *)kernel;
    L->launched = launched;
    L->dim = dim;
    for (unsigned i = 0; i < dim; i++) {
        L->gs[i] = gs[i];
        L->ls[i] = ls == NULL ? 0 : ls[i];
    }
    L->has_ls = ls != NULL;
    L->flush = flush;
    L->nargs = nargs;
    for (int i = 0; i < nargs; i++) {
        L->kind[i] = kinds[i];
        L->slot[i] = slots[i];
    }
    return L;
}

void hal_ocl_free(hal_ocl_launch *L) {
    if (L == NULL)
        return;
    pthread_mutex_destroy(&L->lock);
    free(L);
}

int hal_ocl_run(hal_ocl_launch *L, int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4,
                int64_t i5, int64_t i6, int64_t i7, double d0, double d1) {
    const int64_t iv[HAL_OCL_INTS] = {i0, i1, i2, i3, i4, i5, i6, i7};
    const double dv[HAL_OCL_DOUBLES] = {d0, d1};
    int n = L->nargs;
    for (int i = 0; i < n; i++)
        if (L->kind[i] == K_MEM && iv[L->slot[i]] == 0)
            return HAL_OCL_FREED;
    cl_int err = 0;
    pthread_mutex_lock(&L->lock);
    for (int i = 0; i < n; i++) {
        uint64_t bits;
        if (L->kind[i] == K_F64)
            memcpy(&bits, &dv[L->slot[i]], sizeof bits);
        else
            bits = (uint64_t)iv[L->slot[i]];
        if (L->valid[i] && L->last[i] == bits)
            continue;
        if (L->kind[i] == K_MEM) {
            void *mem = (void *)(uintptr_t)bits;
            err = p_set_arg(L->kernel, (cl_uint)i, sizeof(void *), &mem);
        } else {
            err = p_set_arg(L->kernel, (cl_uint)i, 8, &bits);
        }
        if (err != 0) {
            L->valid[i] = 0;
            goto out;
        }
        L->last[i] = bits;
        L->valid[i] = 1;
    }
    err = p_enqueue(L->queue, L->kernel, L->dim, NULL, L->gs, L->has_ls ? L->ls : NULL, 0, NULL,
                    NULL);
    if (err == 0) {
        __atomic_fetch_add(L->launched, 1, __ATOMIC_RELAXED);
        if (L->flush)
            err = p_flush(L->queue);
    }
out:
    pthread_mutex_unlock(&L->lock);
    return err;
}
