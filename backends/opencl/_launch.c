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
    int npos;                        /* the launcher's positional parameters (CPython entry) */
    int pkind[HAL_OCL_MAX_ARGS * 2]; /* each one's kind: K_MEM (an object's .handle), K_I64, K_F64 */
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

/* The positional parameters of the CPython entry: K_MEM (an object whose .handle is the cl_mem),
 * K_I64 or K_F64, in order; integers fill the int slots and doubles the double slots in turn. */
int hal_ocl_params(hal_ocl_launch *L, int npos, const int *pkinds) {
    if (npos > HAL_OCL_MAX_ARGS * 2)
        return -1;
    L->npos = npos;
    for (int i = 0; i < npos; i++)
        L->pkind[i] = pkinds[i];
    return 0;
}

void hal_ocl_free(hal_ocl_launch *L) {
    if (L == NULL)
        return;
    pthread_mutex_destroy(&L->lock);
    free(L);
}

static int run_core(hal_ocl_launch *L, const int64_t *iv, const double *dv) {
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

int hal_ocl_run(hal_ocl_launch *L, int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4,
                int64_t i5, int64_t i6, int64_t i7, double d0, double d1) {
    const int64_t iv[HAL_OCL_INTS] = {i0, i1, i2, i3, i4, i5, i6, i7};
    const double dv[HAL_OCL_DOUBLES] = {d0, d1};
    return run_core(L, iv, dv);
}

/* -- the CPython entry (the extension module only) --------------------------------------------
 *
 * A cffi call releases and retakes the GIL and converts every argument, and the generated
 * Python launcher around it is a frame of its own. In the extension module (API mode) a
 * launcher is instead a METH_FASTCALL builtin bound to a tuple (launch address, fail, ...):
 * it reads each memory object's .handle and converts the numbers itself, then runs the launch
 * holding the GIL (set the changed arguments, enqueue: microseconds). A non-zero result calls
 * fail(code), which raises the hal error.
 */
#ifdef PY_VERSION_HEX
#include <structmember.h>
static PyObject *s_handle;
/* the memory class whose `handle` is a slot, and its offset: read without an attribute lookup */
static PyTypeObject *mem_type;
static Py_ssize_t mem_off;

static long long mem_handle(PyObject *m) {
    if (Py_TYPE(m) == mem_type) {
        PyObject *h = *(PyObject **)((char *)m + mem_off);
        if (h != NULL && PyLong_CheckExact(h))
            return PyLong_AsLongLong(h);
    } else if (mem_type == NULL) { /* learn the class of the first memory object seen */
        PyObject *d = PyObject_GetAttr((PyObject *)Py_TYPE(m), s_handle);
        if (d == NULL)
            PyErr_Clear();
        else {
            if (Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX) {
                mem_off = ((PyMemberDescrObject *)d)->d_member->offset;
                Py_INCREF(Py_TYPE(m));
                mem_type = Py_TYPE(m);
            }
            Py_DECREF(d);
        }
    }
    PyObject *h = PyObject_GetAttr(m, s_handle);
    if (h == NULL)
        return -1;
    long long v = PyLong_AsLongLong(h);
    Py_DECREF(h);
    return v;
}

static PyObject *fast_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    hal_ocl_launch *L = (hal_ocl_launch *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(self, 0));
    if (L == NULL)
        return NULL;
    if (nargs != L->npos) {
        PyErr_Format(PyExc_TypeError, "the launch takes %d arguments (%zd given)", L->npos, nargs);
        return NULL;
    }
    int64_t iv[HAL_OCL_INTS] = {0};
    double dv[HAL_OCL_DOUBLES] = {0};
    int ni = 0, nd = 0;
    for (Py_ssize_t k = 0; k < nargs; k++) {
        int kind = L->pkind[k];
        if (kind == K_F64) {
            double d = PyFloat_AsDouble(args[k]);
            if (d == -1.0 && PyErr_Occurred())
                return NULL;
            if (nd >= HAL_OCL_DOUBLES)
                break;
            dv[nd++] = d;
            continue;
        }
        long long v;
        if (kind == K_MEM) {
            v = mem_handle(args[k]); /* its .handle */
        } else {
            v = PyLong_AsLongLong(args[k]);
        }
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (ni >= HAL_OCL_INTS)
            break;
        iv[ni++] = (int64_t)v;
    }
    int r = run_core(L, iv, dv);
    if (r == 0)
        Py_RETURN_NONE;
    PyObject *code = PyLong_FromLong(r);
    if (code == NULL)
        return NULL;
    PyObject *res = PyObject_CallOneArg(PyTuple_GET_ITEM(self, 1), code);
    Py_DECREF(code);
    return res; /* fail raises: NULL */
}

static PyMethodDef launch_def = {"bound", (PyCFunction)(void (*)(void))fast_launch, METH_FASTCALL,
                                 "bound(*args) -> None: the prepared launch"};

static PyObject *fast_make(PyObject *self, PyObject *state) {
    (void)self;
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) < 2) {
        PyErr_SetString(PyExc_TypeError, "make(state): a tuple (launch address, fail, ...)");
        return NULL;
    }
    return PyCFunction_New(&launch_def, state);
}

static PyMethodDef make_def = {"make", fast_make, METH_O, "make(state) -> the launch builtin"};
static PyObject *fast_maker; /* created once under the GIL, never freed */

uintptr_t hal_ocl_pyfast(void) {
    PyGILState_STATE g = PyGILState_Ensure(); /* cffi released the GIL around this call */
    if (fast_maker == NULL) {
        s_handle = PyUnicode_InternFromString("handle");
        fast_maker = s_handle == NULL ? NULL : PyCFunction_New(&make_def, NULL);
        if (fast_maker == NULL)
            PyErr_Clear();
    }
    uintptr_t out = (uintptr_t)fast_maker;
    PyGILState_Release(g);
    return out;
}
#else
uintptr_t hal_ocl_pyfast(void) { return 0; }
#endif
