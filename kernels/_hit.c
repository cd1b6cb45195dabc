/* The launch cache's hit in C (hal.kernels._fast, HAL_KERNELS_NATIVE).
 *
 * fast1/fast2 here are the Python functions of kernels/_fast.py written out in C: the same
 * checks in the same order, on the same objects (the per-stream _State, its entries dict, the
 * _Entry), the same effects (the run, the keep-alive batch, COUNTS, the fallback summary,
 * the records of hal.kernels.trace() and the debug log, through _fast._after). A call the C
 * code does not serve itself (the op allocates its output, an object unlike the one expected)
 * goes to the Python function, which decides as before; a miss returns None (the full path).
 *
 * Objects are read through the slots of their classes (the offsets of their member
 * descriptors, looked up by name once in setup(): hal.Array.signature/spi_buffer/spi_offset,
 * hal.Buffer.spi_memory, the slots of _State and _Entry), one pointer read each.
 *
 * An entry whose run is a backend's prepared launch (_fast._bound: the entry's `direct`)
 * is run without the Python closure: hal.spi.stream_impl(stream), then the launch with each
 * array's memory and offset (out first), the call's scalars when it takes them, its tail.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#ifdef Py_GIL_DISABLED
#error "the hit keeps state between calls under the GIL: not for free-threaded builds"
#endif

static PyObject *g_states, *g_hot, *g_counts, *g_fallbacks, *g_internal, *g_inside, *g_open_tracers,
    *g_tracers, *g_env, *g_strict_given, *g_strict, *g_tracer, *g_lazy, *g_late, *g_stream_impl,
    *g_maintain, *g_after, *g_logcache, *g_debug, *g_py1, *g_py2;
static PyTypeObject *g_array;
static PyObject *s_depth, *s_pending, *s_sweep, *s_envkey;
static Py_ssize_t a_sig, a_buf, a_off, b_mem;
static Py_ssize_t st_entries, st_batch, st_ref, st_lastkey, st_laste;
/* id(stream) of the last call, and that stream's address: no int made per call */
static PyObject *g_sid;
static void *g_sid_of;
static Py_ssize_t e_epoch, e_fallback, e_keep, e_rec, e_run, e_direct, e_dsc, e_dtail;
static int g_ready;
static PyObject *g_zero;
static Py_ssize_t g_keep_check; /* _fast._KEEP_CHECK */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int member_offset(PyObject *cls, const char *name, Py_ssize_t *out) {
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (d == NULL)
        return -1;
    int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
             ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
    if (ok)
        *out = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a slot", cls, name);
        return -1;
    }
    return 0;
}

static PyObject *cfg_get(PyObject *cfg, const char *name) {
    PyObject *v = PyDict_GetItemString(cfg, name);
    if (v == NULL)
        PyErr_Format(PyExc_KeyError, "setup: %s missing", name);
    else
        Py_INCREF(v);
    return v;
}

static PyObject *setup(PyObject *self, PyObject *cfg) {
    (void)self;
    if (!PyDict_Check(cfg)) {
        PyErr_SetString(PyExc_TypeError, "setup(config): a dict");
        return NULL;
    }
#define GET(var, name)                                                                             \
    if ((var = cfg_get(cfg, name)) == NULL)                                                        \
        return NULL;
    GET(g_states, "states")
    GET(g_hot, "hot")
    GET(g_counts, "counts")
    GET(g_fallbacks, "fallbacks")
    GET(g_internal, "internal")
    GET(g_inside, "inside")
    GET(g_open_tracers, "open_tracers")
    GET(g_tracers, "tracers")
    GET(g_env, "env")
    GET(g_strict_given, "strict_given")
    GET(g_strict, "strict")
    GET(g_tracer, "tracer")
    GET(g_lazy, "lazy")
    GET(g_late, "late")
    GET(g_stream_impl, "stream_impl")
    GET(g_maintain, "maintain")
    GET(g_after, "after")
    GET(g_logcache, "logcache")
    GET(g_debug, "debug")
    GET(g_py1, "fast1")
    GET(g_py2, "fast2")
    PyObject *array, *buffer, *state, *entry;
    GET(array, "Array")
    GET(buffer, "Buffer")
    GET(state, "State")
    GET(entry, "Entry")
#undef GET
    if (!PyDict_CheckExact(g_states) || !PyList_Check(g_hot) || !PyList_Check(g_counts) ||
        !PyDict_Check(g_fallbacks) || !PyList_Check(g_open_tracers) || !PyList_Check(g_tracers) ||
        !(g_env == Py_None || PyDict_Check(g_env)) || !PyList_Check(g_strict_given) || !PyList_Check(g_inside) ||
        !PyDict_Check(g_lazy) || !PyDict_Check(g_logcache) || !PyType_Check(array) ||
        PyList_GET_SIZE(g_hot) < 1 || PyList_GET_SIZE(g_counts) < 1 ||
        PyList_GET_SIZE(g_strict_given) < 1 || PyList_GET_SIZE(g_inside) < 1) {
        PyErr_SetString(PyExc_TypeError, "setup: unexpected object kinds");
        return NULL;
    }
    PyObject *kc = PyDict_GetItemString(cfg, "keep_check");
    g_keep_check = kc == NULL ? -1 : PyLong_AsSsize_t(kc);
    if (g_keep_check < 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "setup: keep_check must be an int >= 1");
        return NULL;
    }
    g_array = (PyTypeObject *)array;
    if (member_offset(array, "signature", &a_sig) || member_offset(array, "spi_buffer", &a_buf) ||
        member_offset(array, "spi_offset", &a_off) || member_offset(buffer, "spi_memory", &b_mem) ||
        member_offset(state, "entries", &st_entries) || member_offset(state, "batch", &st_batch) ||
        member_offset(state, "ref", &st_ref) || member_offset(state, "lastkey", &st_lastkey) ||
        member_offset(state, "laste", &st_laste) || member_offset(entry, "epoch", &e_epoch) ||
        member_offset(entry, "fallback", &e_fallback) || member_offset(entry, "keep", &e_keep) ||
        member_offset(entry, "rec", &e_rec) || member_offset(entry, "run", &e_run) ||
        member_offset(entry, "direct", &e_direct) || member_offset(entry, "dsc", &e_dsc) ||
        member_offset(entry, "dtail", &e_dtail))
        return NULL;
    g_zero = PyLong_FromLong(0); /* CPython's small int: INSIDE[0] is this object when 0 */
    s_depth = PyUnicode_InternFromString("depth");
    s_pending = PyUnicode_InternFromString("pending");
    s_sweep = PyUnicode_InternFromString("sweep");
    s_envkey = PyBytes_FromString("HAL_KERNELS_STRICT");
    if (s_depth == NULL || s_pending == NULL || s_sweep == NULL || s_envkey == NULL)
        return NULL;
    g_ready = 1;
    Py_RETURN_NONE;
}

/* the weak reference's object is `obj` (the state is this stream's, not a reused id's) */
static int ref_is(PyObject *ref, PyObject *obj) {
    if (ref == NULL || !PyWeakref_Check(ref))
        return 0;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *got;
    if (PyWeakref_GetRef(ref, &got) < 0) {
        PyErr_Clear();
        return 0;
    }
    Py_XDECREF(got);
    return got == obj;
#else
    return PyWeakref_GetObject(ref) == obj;
#endif
}

static int add_one(PyObject *dict_or_list, PyObject *key) {
    /* COUNTS[0] += 1 (key NULL) or fallbacks[key] += 1 (a Counter: missing is 0) */
    PyObject *old;
    if (key == NULL)
        old = PyList_GET_ITEM(dict_or_list, 0);
    else {
        old = PyDict_GetItemWithError(dict_or_list, key);
        if (old == NULL && PyErr_Occurred())
            return -1;
    }
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL)
        return -1;
    PyObject *nv = old == NULL ? one : PyNumber_Add(old, one);
    if (nv != one)
        Py_DECREF(one);
    if (nv == NULL)
        return -1;
    if (key == NULL)
        return PyList_SetItem(dict_or_list, 0, nv); /* steals nv */
    int r = PyDict_SetItem(dict_or_list, key, nv);
    Py_DECREF(nv);
    return r;
}

/* The hit of `nin` inputs (1 or 2). Returns a new reference: `out`, Py_None (take the full
 * path) or NULL (an exception raised by the run, as the Python function raises it). */
static PyObject *hit(PyObject *op, PyObject *extra, PyObject *stream, PyObject **ins, int nin,
                     PyObject *out, PyObject *sc, PyObject *py, PyObject *const *args,
                     Py_ssize_t nargs) {
    if (!g_ready || out == Py_None) /* the op allocates its output: the Python function */
        return PyObject_Vectorcall(py, args, nargs, NULL);
    if (g_sid_of != (void *)stream || g_sid == NULL) {
        PyObject *sid = PyLong_FromVoidPtr(stream);
        if (sid == NULL)
            return NULL;
        Py_XSETREF(g_sid, sid);
        g_sid_of = (void *)stream;
    }
    PyObject *st = PyDict_GetItemWithError(g_states, g_sid); /* borrowed */
    if (st == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    for (int i = 0; i < nin; i++)
        if (Py_TYPE(ins[i]) != g_array)
            Py_RETURN_NONE;
    if (Py_TYPE(out) != g_array)
        Py_RETURN_NONE;
    PyObject *res = NULL, *fb = NULL, *e = NULL;
    Py_INCREF(st); /* held from here on: a lookup may run Python code (__eq__ of a key) */
    PyObject *osig = SLOT(out, a_sig), *entries = SLOT(st, st_entries);
    if (osig == NULL || entries == NULL || !PyDict_Check(entries))
        goto python;
    /* the state's last lookup: the same facts (op and extra the same objects, equal signatures,
     * the same aliasing) find the same entry while laste is set (learn() clears it) */
    PyObject *lk = SLOT(st, st_lastkey), *le = SLOT(st, st_laste);
    if (le != NULL && le != Py_None && lk != NULL && PyTuple_CheckExact(lk) &&
        PyTuple_GET_SIZE(lk) == (nin == 1 ? 5 : 7) && PyTuple_GET_ITEM(lk, 0) == op &&
        PyTuple_GET_ITEM(lk, 1) == extra) {
        int same = 1;
        for (int i = 0; same && i <= nin; i++) {
            PyObject *sig = SLOT(i < nin ? ins[i] : out, a_sig), *was = PyTuple_GET_ITEM(lk, 2 + i);
            if (sig == NULL)
                same = 0;
            else if (sig != was) {
                same = PyObject_RichCompareBool(sig, was, Py_EQ);
                if (same < 0)
                    goto done;
            }
        }
        for (int i = 0; same && i < nin; i++)
            same = PyTuple_GET_ITEM(lk, 3 + nin + i) == (ins[i] == out ? Py_True : Py_False);
        if (same && SLOT(st, st_laste) == le) {
            e = Py_NewRef(le);
            goto found;
        }
    }
    PyObject *key = PyTuple_New(nin == 1 ? 5 : 7);
    if (key == NULL)
        goto done;
    Py_INCREF(op);
    PyTuple_SET_ITEM(key, 0, op);
    Py_INCREF(extra);
    PyTuple_SET_ITEM(key, 1, extra);
    for (int i = 0; i < nin; i++) {
        PyObject *sig = SLOT(ins[i], a_sig);
        if (sig == NULL) {
            Py_DECREF(key);
            goto python;
        }
        Py_INCREF(sig);
        PyTuple_SET_ITEM(key, 2 + i, sig);
    }
    Py_INCREF(osig);
    PyTuple_SET_ITEM(key, 2 + nin, osig);
    for (int i = 0; i < nin; i++) {
        PyObject *same = ins[i] == out ? Py_True : Py_False;
        Py_INCREF(same);
        PyTuple_SET_ITEM(key, 3 + nin + i, same);
    }
    Py_INCREF(entries);
    e = PyDict_GetItemWithError(entries, key);
    Py_XINCREF(e);
    Py_DECREF(entries);
    if (e == NULL) {
        Py_DECREF(key);
        if (!PyErr_Occurred())
            res = Py_NewRef(Py_None);
        goto done;
    }
    if (SLOT(st, st_entries) == entries) { /* remember it (laste last: set means both are) */
        Py_XSETREF(SLOT(st, st_laste), Py_NewRef(Py_None));
        Py_XSETREF(SLOT(st, st_lastkey), key);
        Py_XSETREF(SLOT(st, st_laste), Py_NewRef(e));
    } else
        Py_DECREF(key);
found:;
    PyObject *epoch = SLOT(e, e_epoch), *hot = PyList_GET_ITEM(g_hot, 0);
    if (epoch == NULL)
        goto python;
    if (epoch != hot) {
        int eq = PyObject_RichCompareBool(epoch, hot, Py_EQ);
        if (eq < 0)
            goto done;
        if (!eq)
            goto miss;
    }
    if (!ref_is(SLOT(st, st_ref), stream))
        goto miss;
    /* every buffer open; the output shares no buffer with an input unless it is that input */
    PyObject *ob = SLOT(out, a_buf);
    if (ob == NULL || SLOT(ob, b_mem) == NULL)
        goto python;
    for (int i = 0; i < nin; i++) {
        PyObject *b = SLOT(ins[i], a_buf);
        if (b == NULL || SLOT(b, b_mem) == NULL)
            goto python;
        if (SLOT(b, b_mem) == Py_None)
            goto miss;
    }
    if (SLOT(ob, b_mem) == Py_None)
        goto miss;
    for (int i = 0; i < nin; i++)
        if (SLOT(ins[i], a_buf) == ob && ins[i] != out)
            goto miss;
    if (PyList_GET_SIZE(g_open_tracers)) {
        PyObject *t = PyObject_CallNoArgs(g_tracer);
        if (t == NULL)
            goto done;
        Py_DECREF(t);
        if (t != Py_None)
            goto miss;
    }
    fb = SLOT(e, e_fallback);
    if (fb == NULL)
        goto python;
    Py_INCREF(fb);
    if (fb != Py_None && PyList_GET_ITEM(g_inside, 0) != g_zero) { /* an internal() block open */
        PyObject *depth = PyObject_GetAttr(g_internal, s_depth);
        if (depth == NULL)
            goto done;
        int inside = PyObject_IsTrue(depth);
        Py_DECREF(depth);
        if (inside < 0)
            goto done;
        if (inside) { /* a library's own call (hal.comm): strict mode allows it, not counted */
            Py_DECREF(fb);
            fb = Py_None;
            Py_INCREF(fb);
        }
    }
    if (fb != Py_None) {
        int ask = g_env == Py_None || PyList_GET_ITEM(g_strict_given, 0) == Py_True;
        if (!ask) {
            ask = PyDict_Contains(g_env, s_envkey);
            if (ask < 0)
                goto done;
        }
        if (ask) {
            PyObject *s = PyObject_CallNoArgs(g_strict);
            if (s == NULL)
                goto done;
            int refuse = PyObject_IsTrue(s);
            Py_DECREF(s);
            if (refuse < 0)
                goto done;
            if (refuse) {
                res = Py_NewRef(Py_None);
                goto done;
            }
        }
    }
    /* the sweep of arrays kept alive by generic launches */
    if (PyDict_GET_SIZE(g_lazy) == 0) {
        PyObject *r = PyObject_CallNoArgs(g_late);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    {
        PyObject *pending = PyDict_GetItemWithError(g_lazy, s_pending);
        if (pending == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, s_pending);
            goto done;
        }
        int any = PyObject_IsTrue(pending);
        if (any < 0)
            goto done;
        if (any) {
            PyObject *sweep = PyDict_GetItemWithError(g_lazy, s_sweep);
            if (sweep == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetObject(PyExc_KeyError, s_sweep);
                goto done;
            }
            PyObject *r = PyObject_CallNoArgs(sweep);
            if (r == NULL)
                goto done;
            Py_DECREF(r);
        }
    }
    /* the run */
    PyObject *direct = SLOT(e, e_direct);
    int ran = 0;
    if (direct != NULL && direct != Py_None) {
        PyObject *dsc = SLOT(e, e_dsc), *dtail = SLOT(e, e_dtail);
        Py_ssize_t nsc = dsc == Py_True && PyTuple_Check(sc) ? PyTuple_GET_SIZE(sc) : 0;
        Py_ssize_t ntail = dtail != NULL && PyTuple_Check(dtail) ? PyTuple_GET_SIZE(dtail) : -1;
        PyObject *mem[3];
        int open = ntail >= 0 && nsc + ntail <= 8;
        for (int i = 0; open && i <= nin; i++) { /* read again: the sweep ran Python code */
            PyObject *a = i == 0 ? out : ins[i - 1];
            mem[i] = SLOT(SLOT(a, a_buf), b_mem);
            open = mem[i] != NULL && mem[i] != Py_None && SLOT(a, a_off) != NULL;
        }
        if (open) { /* else the Python run: Program.launch raises the usual error */
            PyObject *cargs[16];
            Py_ssize_t n = 0;
            for (int i = 0; i <= nin; i++) {
                PyObject *a = i == 0 ? out : ins[i - 1];
                cargs[n++] = Py_NewRef(mem[i]);
                cargs[n++] = Py_NewRef(SLOT(a, a_off));
            }
            for (Py_ssize_t i = 0; i < nsc; i++)
                cargs[n++] = Py_NewRef(PyTuple_GET_ITEM(sc, i));
            for (Py_ssize_t i = 0; i < ntail; i++)
                cargs[n++] = Py_NewRef(PyTuple_GET_ITEM(dtail, i));
            Py_INCREF(direct);
            PyObject *r = PyObject_Vectorcall(g_stream_impl, &stream, 1, NULL);
            if (r != NULL) {
                Py_DECREF(r);
                r = PyObject_Vectorcall(direct, cargs, n, NULL);
            }
            Py_DECREF(direct);
            for (Py_ssize_t i = 0; i < n; i++)
                Py_DECREF(cargs[i]);
            if (r == NULL)
                goto done;
            Py_DECREF(r);
            ran = 1;
        }
    }
    if (!ran) {
        PyObject *run = SLOT(e, e_run);
        PyObject *tins = nin == 1 ? PyTuple_Pack(1, ins[0]) : PyTuple_Pack(2, ins[0], ins[1]);
        if (run == NULL || tins == NULL) {
            Py_XDECREF(tins);
            if (run == NULL)
                PyErr_SetString(PyExc_AttributeError, "run");
            goto done;
        }
        Py_INCREF(run);
        PyObject *rargs[4] = {stream, tins, out, sc};
        PyObject *r = PyObject_Vectorcall(run, rargs, 4, NULL);
        Py_DECREF(run);
        Py_DECREF(tins);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    /* keep the arrays alive until the stream is past the call (not where the backend does) */
    PyObject *keep = SLOT(e, e_keep);
    int k = keep == NULL ? 1 : PyObject_IsTrue(keep);
    if (k < 0)
        goto done;
    if (k) {
        PyObject *batch = SLOT(st, st_batch);
        if (batch == NULL || !PyList_Check(batch)) {
            PyErr_SetString(PyExc_TypeError, "the keep-alive batch is not a list");
            goto done;
        }
        Py_INCREF(batch);
        PyObject *item = nin == 1 ? PyTuple_Pack(2, ins[0], out) : PyTuple_Pack(3, ins[0], ins[1], out);
        int bad = item == NULL || PyList_Append(batch, item) < 0;
        Py_XDECREF(item);
        Py_ssize_t len = PyList_GET_SIZE(batch);
        Py_DECREF(batch);
        if (bad)
            goto done;
        if (len >= g_keep_check) {
            PyObject *margs[2] = {st, stream};
            PyObject *r = PyObject_Vectorcall(g_maintain, margs, 2, NULL);
            if (r == NULL)
                goto done;
            Py_DECREF(r);
        }
    }
    if (add_one(g_counts, NULL) < 0)
        goto done;
    if (fb != Py_None && add_one(g_fallbacks, fb) < 0)
        goto done;
    /* the debug log (unless the logger's cache says it is off) and hal.kernels.trace() */
    PyObject *dbg = PyDict_GetItemWithError(g_logcache, g_debug);
    if (dbg == NULL && PyErr_Occurred())
        goto done;
    if (dbg != Py_False || PyList_GET_SIZE(g_tracers)) {
        PyObject *rec = SLOT(e, e_rec);
        if (rec == NULL) {
            PyErr_SetString(PyExc_AttributeError, "rec");
            goto done;
        }
        PyObject *r = PyObject_CallOneArg(g_after, rec);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    res = Py_NewRef(out);
    goto done;
miss: /* the full path decides */
    res = Py_NewRef(Py_None);
    goto done;
python: /* an object unlike the one expected: the Python function decides as before */
    res = PyObject_Vectorcall(py, args, nargs, NULL);
done:
    Py_XDECREF(fb);
    Py_XDECREF(e);
    Py_DECREF(st);
    return res;
}

static PyObject *fast1(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "fast1 takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *ins[1] = {args[3]};
    return hit(args[0], args[1], args[2], ins, 1, args[4], args[5], g_py1, args, nargs);
}

static PyObject *fast2(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "fast2 takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *ins[2] = {args[3], args[4]};
    return hit(args[0], args[1], args[2], ins, 2, args[5], args[6], g_py2, args, nargs);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_O, "setup(config): the Python objects the hits read"},
    {"fast1", (PyCFunction)(void (*)(void))fast1, METH_FASTCALL,
     "fast1(op, extra, stream, x, out, sc): _fast.fast1 in C"},
    {"fast2", (PyCFunction)(void (*)(void))fast2, METH_FASTCALL,
     "fast2(op, extra, stream, x, y, out, sc): _fast.fast2 in C"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hal_kernels_hit",
                                    "hal.kernels' launch-cache hit in C", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hal_kernels_hit(void) { return PyModule_Create(&module); }
