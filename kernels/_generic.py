"""Generic op implementations, written once in the portable kernel language.

Elementwise kernels are launched over exactly ``n`` work items, so they carry no bounds check
(``if (i < n)`` made the axpy 1.9-2.4x slower on PoCL: it defeats its work-group vectorizer);
``n`` stays a parameter for their signature. Every source below is compiled per device and dtype
with ``T`` (storage type), ``CT``
(elementwise compute type) and ``ACC`` (accumulator type) defined. Reductions run in two
passes: each work item reduces a contiguous chunk with 8 independent accumulators into a
partial, then one work item combines the partials (no barriers or local memory needed).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

import hal
from hal.kernels._dispatch import OpCall
from hal.kernels._program import Program, compile, dialect_of

__all__ = ["GENERIC", "SOURCES", "generic_kernels", "program_for"]

# dtype -> (T, CT, ACC)
_TYPES = {
    "float16": ("hal_f16", "hal_f32", "hal_f32"),
    "float32": ("hal_f32", "hal_f32", "hal_f64"),
    "float64": ("hal_f64", "hal_f64", "hal_f64"),
    "int8": ("hal_i8", "hal_i32", "hal_i64"),
    "uint8": ("hal_u8", "hal_u32", "hal_u64"),
    "int32": ("hal_i32", "hal_i32", "hal_i64"),
    "int64": ("hal_i64", "hal_i64", "hal_i64"),
}
# name -> combine(a, v); max/min propagate NaN like NumPy's maximum/minimum
_REDUCERS = {
    "sum": "((a) + (v))",
    "prod": "((a) * (v))",
    "max": "((((v) > (a)) || ((v) != (v))) ? (v) : (a))",
    "min": "((((v) < (a)) || ((v) != (v))) ? (v) : (a))",
}

_ELEMENTWISE = r"""
HAL_KERNEL void add(HAL_GLOBAL T* out, HAL_GLOBAL const T* a, HAL_GLOBAL const T* b, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    out[i] = (T)((CT)a[i] + (CT)b[i]);
}
HAL_KERNEL void sub(HAL_GLOBAL T* out, HAL_GLOBAL const T* a, HAL_GLOBAL const T* b, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    out[i] = (T)((CT)a[i] - (CT)b[i]);
}
HAL_KERNEL void mul(HAL_GLOBAL T* out, HAL_GLOBAL const T* a, HAL_GLOBAL const T* b, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    out[i] = (T)((CT)a[i] * (CT)b[i]);
}
HAL_KERNEL void div_(HAL_GLOBAL T* out, HAL_GLOBAL const T* a, HAL_GLOBAL const T* b, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    out[i] = (T)((CT)a[i] / (CT)b[i]);
}
HAL_KERNEL void axpy(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, HAL_GLOBAL const T* y, hal_f64 alpha, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    out[i] = (T)((CT)alpha * (CT)x[i] + (CT)y[i]);
}
HAL_KERNEL void relu(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    { CT v = (CT)x[i]; out[i] = (T)((v != v) ? v : (v > (CT)0 ? v : (CT)0)); }
}
HAL_KERNEL void gelu(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    {
        CT v = (CT)x[i];
        out[i] = (T)((CT)0.5 * v * erfc(-v * (CT)0.70710678118654752440));
    }
}
HAL_KERNEL void exp_(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    out[i] = (T)exp((CT)x[i]);
}
"""

_ANYTYPE = r"""
HAL_KERNEL void scale(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_f64 alpha, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    out[i] = (T)(alpha * (hal_f64)x[i]);
}
""" + "".join(
    f"""
HAL_KERNEL void accumulate_{name}(HAL_GLOBAL T* dst, HAL_GLOBAL const T* src, hal_i64 n) {{
    hal_i64 i = HAL_GLOBAL_ID(0);
    {{ CT a = (CT)dst[i], v = (CT)src[i]; dst[i] = (T){expr}; }}
}}
"""
    for name, expr in _REDUCERS.items()
)


def _reduce_source() -> str:
    parts = []
    for name, expr in [*_REDUCERS.items(), ("dot", "((a) + (v))")]:
        red = expr.replace("(a)", "(A)").replace("(v)", "(V)")
        if name == "dot":
            load, args, params = (
                "(ACC)x[k] * (ACC)y[k]",
                "HAL_GLOBAL const T* x, HAL_GLOBAL const T* y",
                "x, y",
            )
        else:
            load, args, params = "(ACC)x[k]", "HAL_GLOBAL const T* x", "x"
        ident = "ACC_IDENT_" + ("sum" if name == "dot" else name).upper()
        R = f"RED_{name.upper()}"
        load_j = load.replace("[k]", "[k + j]")
        parts.append(
            f"""
#define {R}(A, V) {red}
/* reduce elements [k, e) with 8 independent accumulators (vectorizes on CPUs) */
HAL_DEVICE ACC {name}_chunk({args}, hal_i64 k, hal_i64 e) {{
    ACC a[8];
    for (int j = 0; j < 8; ++j) a[j] = {ident};
    for (; k + 8 <= e; k += 8) {{
        HAL_SIMD for (int j = 0; j < 8; ++j) a[j] = {R}(a[j], {load_j});
    }}
    for (; k < e; ++k) a[0] = {R}(a[0], {load});
    for (int j = 0; j < 4; ++j) a[j] = {R}(a[j], a[j + 4]);
    a[0] = {R}(a[0], a[2]); a[1] = {R}(a[1], a[3]);
    return {R}(a[0], a[1]);
}}
HAL_KERNEL void {name}_partial(HAL_GLOBAL ACC* part, {args}, hal_i64 n, hal_i64 chunk) {{
    hal_i64 g = HAL_GLOBAL_ID(0);
    hal_i64 b = g * chunk, e = (b + chunk < n) ? b + chunk : n;
    part[g] = {name}_chunk({params}, b, e);
}}
HAL_KERNEL void {name}_final(HAL_GLOBAL T* out, HAL_GLOBAL const ACC* part, hal_i64 g) {{
    ACC a = {ident};
    for (hal_i64 k = 0; k < g; ++k) a = {R}(a, part[k]);
    out[0] = (T)a;
}}
HAL_KERNEL void {name}_full(HAL_GLOBAL T* out, {args}, hal_i64 n, hal_i64 chunk) {{
    ACC total = {ident};
    for (hal_i64 b = 0; b < n; b += chunk) {{
        total = {R}(total, {name}_chunk({params}, b, (b + chunk < n) ? b + chunk : n));
    }}
    out[0] = (T)total;
}}
"""
        )
        if name != "dot":
            parts.append(
                f"""
HAL_KERNEL void {name}_axis(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_i64 K, hal_i64 inner) {{
    hal_i64 i = HAL_GLOBAL_ID(0), o = HAL_GLOBAL_ID(1);
    HAL_GLOBAL const T* p = x + o * K * inner + i;
    ACC a0 = {ident}, a1 = a0, a2 = a0, a3 = a0;
    hal_i64 k = 0;
    for (; k + 4 <= K; k += 4) {{
        a0 = RED_{name.upper()}(a0, (ACC)p[k * inner]);
        a1 = RED_{name.upper()}(a1, (ACC)p[(k + 1) * inner]);
        a2 = RED_{name.upper()}(a2, (ACC)p[(k + 2) * inner]);
        a3 = RED_{name.upper()}(a3, (ACC)p[(k + 3) * inner]);
    }}
    for (; k < K; ++k) a0 = RED_{name.upper()}(a0, (ACC)p[k * inner]);
    a0 = RED_{name.upper()}(a0, a1); a2 = RED_{name.upper()}(a2, a3);
    out[o * inner + i] = (T)RED_{name.upper()}(a0, a2);
}}
"""
            )
    return (
        "#define ACC_IDENT_SUM ((ACC)0)\n#define ACC_IDENT_PROD ((ACC)1)\n"
        "#define ACC_IDENT_MAX ((ACC)(-HAL_INF))\n#define ACC_IDENT_MIN ((ACC)HAL_INF)\n"
        + "".join(parts)
    )


_ROWS = r"""
HAL_KERNEL void softmax(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_i64 cols) {
    hal_i64 r = HAL_GLOBAL_ID(0);
    HAL_GLOBAL const T* row = x + r * cols;
    HAL_GLOBAL T* dst = out + r * cols;
    CT m = (CT)(-HAL_INF);
    ACC s = 0;
    for (hal_i64 k = 0; k < cols; ++k) { CT v = (CT)row[k]; m = (v > m || v != v) ? v : m; }
    if (m == (CT)(-HAL_INF)) m = 0;
    /* exp in the compute type (float for float16/32), the sum in the accumulator type */
    for (hal_i64 k = 0; k < cols; ++k) s += (ACC)exp((CT)row[k] - m);
    CT inv = (CT)((ACC)1 / s);
    for (hal_i64 k = 0; k < cols; ++k) dst[k] = (T)(exp((CT)row[k] - m) * inv);
}
HAL_KERNEL void layernorm(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, HAL_GLOBAL const T* w,
                          HAL_GLOBAL const T* b, hal_i64 cols, hal_f64 eps, hal_i32 has_w, hal_i32 has_b) {
    hal_i64 r = HAL_GLOBAL_ID(0);
    HAL_GLOBAL const T* row = x + r * cols;
    HAL_GLOBAL T* dst = out + r * cols;
    ACC mean = 0, var = 0;
    for (hal_i64 k = 0; k < cols; ++k) mean += (ACC)row[k];
    mean /= (ACC)cols;
    for (hal_i64 k = 0; k < cols; ++k) { ACC d = (ACC)row[k] - mean; var += d * d; }
    var /= (ACC)cols;
    ACC rstd = (ACC)1 / sqrt(var + (ACC)eps);
    for (hal_i64 k = 0; k < cols; ++k) {
        ACC v = ((ACC)row[k] - mean) * rstd;
        if (has_w) v *= (ACC)w[k];
        if (has_b) v += (ACC)b[k];
        dst[k] = (T)v;
    }
}
HAL_KERNEL void rmsnorm(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, HAL_GLOBAL const T* w,
                        hal_i64 cols, hal_f64 eps, hal_i32 has_w) {
    hal_i64 r = HAL_GLOBAL_ID(0);
    HAL_GLOBAL const T* row = x + r * cols;
    HAL_GLOBAL T* dst = out + r * cols;
    ACC ss = 0;
    for (hal_i64 k = 0; k < cols; ++k) { ACC v = (ACC)row[k]; ss += v * v; }
    ACC rrms = (ACC)1 / sqrt(ss / (ACC)cols + (ACC)eps);
    for (hal_i64 k = 0; k < cols; ++k) {
        ACC v = (ACC)row[k] * rrms;
        if (has_w) v *= (ACC)w[k];
        dst[k] = (T)v;
    }
}
HAL_KERNEL void matmul(HAL_GLOBAL T* c, HAL_GLOBAL const T* a, HAL_GLOBAL const T* b,
                       hal_i64 M, hal_i64 N, hal_i64 K) {
    hal_i64 j = HAL_GLOBAL_ID(0), i = HAL_GLOBAL_ID(1);
    ACC s = 0;
    for (hal_i64 k = 0; k < K; ++k) s += (ACC)a[i * K + k] * (ACC)b[k * N + j];
    c[i * N + j] = (T)s;
}
"""

_CAST = r"""
HAL_KERNEL void cast(HAL_GLOBAL U* out, HAL_GLOBAL const T* x, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    out[i] = (U)x[i];
}
"""

SOURCES: dict[str, str] = {
    "elementwise": _ELEMENTWISE,
    "anytype": _ANYTYPE,
    "reduce": _reduce_source(),
    "rows": _ROWS,
    "cast": _CAST,
}

_lock = threading.Lock()
_cache: dict[tuple[hal.Device, str, np.dtype[Any], np.dtype[Any] | None], Program] = {}
hal.runtime().register_cache("hal.kernels.generic_programs", _cache.clear)


def program_for(
    device: hal.Device, group: str, dtype: np.dtype[Any], out_dtype: np.dtype[Any] | None = None
) -> Program:
    """Return the compiled generic ``group`` for ``dtype`` on ``device`` (compiled once per process)."""
    key = (device, group, dtype, out_dtype)
    prog = _cache.get(key)
    if prog is not None:
        return prog
    t, ct, acc = _TYPES[dtype.name]
    defines = {"T": t, "CT": ct, "ACC": acc}
    if out_dtype is not None:
        defines["U"] = _TYPES[out_dtype.name][0]
    prog = compile(SOURCES[group], device, defines=defines)
    with _lock:
        _cache[key] = prog
    return prog


# -- objects kept alive until the stream is past the work that uses them --------------------
_pending: list[tuple[hal.Event, list[Any], bool]] = []
_pending_lock = threading.Lock()
_SWEEP_EVERY = 8  # with objects pending, look at their events every this many op calls
_sweep_calls = [0]


def _sweep() -> None:
    """Close (or drop) the objects whose event has completed; called before each op call.

    While objects are pending, only every ``_SWEEP_EVERY``-th call looks at their events (a
    lock and an event query each): an op call on a stream that lags behind the host would
    otherwise query the same incomplete event at every launch.
    """
    if not _pending:  # the hot path: no lock
        return
    _sweep_calls[0] += 1  # unlocked: a lost increment only moves the next look by a call
    if _sweep_calls[0] % _SWEEP_EVERY:
        return
    with _pending_lock:
        if not _pending:
            return
        keep = []
        for ev, objs, close in _pending:
            if ev.query():
                if close:
                    for o in objs:
                        if hasattr(o, "close"):
                            o.close()
                ev.close()
            else:
                keep.append((ev, objs, close))
        _pending[:] = keep


def _release_after(stream: hal.Stream, objs: list[Any], *, close: bool = True) -> None:
    """Keep ``objs`` until ``stream`` has run the work enqueued so far, then close them (or just drop them)."""
    ev = stream.device.create_event()
    ev.record(stream)
    with _pending_lock:
        _pending.append((ev, objs, close))


_KEEP_BATCH = 64
#: ``id(stream) -> (weakref to the stream, batch)``: a plain dict (a WeakKeyDictionary made a
#: weak reference per lookup); the weak reference's callback drops a collected stream's batch
_keep: dict[int, tuple[weakref.ref[hal.Stream], list[Any]]] = {}
_keep_lock = threading.Lock()


def _forget_stream(ref: weakref.ref[hal.Stream]) -> None:
    # runs inside the garbage collector, perhaps while this thread holds _keep_lock: no lock
    for k, (r, _) in list(_keep.items()):
        if r is ref:
            _keep.pop(k, None)


def keep_alive(stream: hal.Stream, objs: tuple[Any, ...]) -> None:
    """Hold references to an op's arrays until ``stream`` is past the op.

    ``hk.sub(hk.matmul(a, b, stream=s), c, stream=s)`` drops the matmul's output as soon as
    ``sub`` returns; without this, the garbage collector would free its buffer while both
    ops still wait on the stream. References are batched: a batch is dropped when the stream
    is found idle, or handed to an event every ``_KEEP_BATCH`` ops.
    """
    with _keep_lock:
        entry = _keep.get(id(stream))
        if entry is None or entry[0]() is not stream:
            entry = _keep[id(stream)] = (weakref.ref(stream, _forget_stream), [])
        batch = entry[1]
        if len(batch) & 7 == 7 and stream.query():  # look every 8 ops: a query takes a lock
            batch.clear()
        batch.append(objs)
        full = len(batch) >= _KEEP_BATCH
        if full:
            _keep[id(stream)] = (entry[0], [])
    if full:
        _release_after(stream, batch, close=False)


_scratch_bufs: weakref.WeakKeyDictionary[hal.Stream, hal.Buffer] = weakref.WeakKeyDictionary()
_scratch_lock = threading.Lock()


def _scratch(stream: hal.Stream, nbytes: int) -> hal.Buffer:
    """Return a scratch buffer of at least ``nbytes`` owned by ``stream``.

    Reusing it is safe without events: work on one stream runs in order, so the next op's
    first pass starts after this op's last pass. A grown buffer replaces the old one only
    after the stream is past it.
    """
    with _scratch_lock:
        buf = _scratch_bufs.get(stream)
        if buf is not None and not buf.closed and buf.nbytes >= nbytes:
            return buf
        new = stream.device.alloc(max(nbytes, 4096))
        _scratch_bufs[stream] = new
    if buf is not None:
        _release_after(stream, [buf])
    return new


def _is_cpu_like(device: hal.Device) -> bool:
    return dialect_of(device) == "c"


# -- implementations ----------------------------------------------------------------------
_KERNEL_NAMES = {"div": "div_", "exp": "exp_"}
_labels: dict[tuple[str, str], str] = {}


def _label(p: Program, name: str) -> str:
    """Return ``"<program hash>:<kernel>"`` (built once per program and kernel, not per launch)."""
    key = (p.key, name)
    label = _labels.get(key)
    if label is None:
        label = _labels[key] = f"{p.hash}:{name}"
    return label


def _elementwise(call: OpCall) -> str:
    op = call.op
    p = program_for(call.stream.device, "elementwise", call.dtype)
    name = _KERNEL_NAMES.get(op, op)
    out = call.out
    n = out.size
    if op == "axpy":
        inputs = call.inputs
        args: list[Any] = [out, inputs[0], inputs[1], float(call.params["alpha"]), n]
    else:
        args = [out, *call.inputs, n]
    p.launch(name, n, args, stream=call.stream, work=n * 8 if op == "gelu" or op == "exp" else n)
    return _label(p, name)


def _anytype(call: OpCall) -> str:
    p = program_for(call.device, "anytype", call.dtype)
    n = call.out.size
    if call.op == "scale":
        p.launch(
            "scale",
            n,
            [call.out, call.inputs[0], float(call.params["alpha"]), n],
            stream=call.stream,
        )
        return f"{p.hash}:scale"
    name = f"accumulate_{call.params['op']}"
    p.launch(name, n, [call.out, call.inputs[0], n], stream=call.stream)
    return f"{p.hash}:{name}"


def _cast(call: OpCall) -> str:
    p = program_for(call.device, "cast", call.dtype, call.out.dtype)
    n = call.out.size
    p.launch("cast", n, [call.out, call.inputs[0], n], stream=call.stream)
    return f"{p.hash}:cast"


_SINGLE_LAUNCH_MAX = 1 << 22


def _full_reduce(call: OpCall, name: str, arrays: list[hal.Array], n: int) -> str:
    p = program_for(call.device, "reduce", call.dtype)
    acc_dtype = (
        np.dtype(np.int64)
        if call.dtype.kind in "iu"
        else np.dtype(np.float64 if call.dtype != np.float16 else np.float32)
    )
    if _is_cpu_like(call.device) and n <= _SINGLE_LAUNCH_MAX:
        # one work item walks the chunks: one launch instead of two (the launch, not the
        # arithmetic, dominates below a few million elements on the CPU emulator)
        p.launch(f"{name}_full", 1, [call.out, *arrays, n, 8192], stream=call.stream, work=n)
        return f"{p.hash}:{name}_full"
    chunk = 8192 if _is_cpu_like(call.device) else 64
    groups = max(1, -(-n // chunk))
    partial = _scratch(call.stream, groups * acc_dtype.itemsize).view(acc_dtype, groups)
    p.launch(f"{name}_partial", groups, [partial, *arrays, n, chunk], stream=call.stream, work=n)
    p.launch(f"{name}_final", 1, [call.out, partial, groups], stream=call.stream)
    return f"{p.hash}:{name}_partial+{name}_final"


def _reduction(call: OpCall) -> str:
    x = call.inputs[0]
    axis = call.params.get("axis")
    if axis is None:
        return _full_reduce(call, call.op, [x], x.size)
    p = program_for(call.device, "reduce", call.dtype)
    shape = x.shape
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    k = shape[axis]
    p.launch(
        f"{call.op}_axis", (inner, outer), [call.out, x, k, inner], stream=call.stream, work=x.size
    )
    return f"{p.hash}:{call.op}_axis"


def _dot(call: OpCall) -> str:
    return _full_reduce(call, "dot", list(call.inputs), call.inputs[0].size)


def _rows(call: OpCall) -> str:
    p = program_for(call.device, "rows", call.dtype)
    x = call.inputs[0]
    cols = x.shape[-1] if x.ndim else 1
    rows = x.size // cols if cols else 0
    work = x.size * 4
    if call.op == "softmax":
        p.launch("softmax", rows, [call.out, x, cols], stream=call.stream, work=work)
    elif call.op == "layernorm":
        w, b = call.params.get("weight"), call.params.get("bias")
        p.launch(
            "layernorm",
            rows,
            [
                call.out,
                x,
                x if w is None else w,
                x if b is None else b,
                cols,
                float(call.params["eps"]),
                int(w is not None),
                int(b is not None),
            ],
            stream=call.stream,
            work=work,
        )
    else:
        w = call.params.get("weight")
        p.launch(
            "rmsnorm",
            rows,
            [
                call.out,
                x,
                x if w is None else w,
                cols,
                float(call.params["eps"]),
                int(w is not None),
            ],
            stream=call.stream,
            work=work,
        )
    return f"{p.hash}:{call.op}"


def _matmul(call: OpCall) -> str:
    p = program_for(call.device, "rows", call.dtype)
    a, b = call.inputs
    m, k = a.shape
    n = b.shape[1]
    p.launch("matmul", (n, m), [call.out, a, b, m, n, k], stream=call.stream, work=m * n * k)
    return f"{p.hash}:matmul"


GENERIC = {
    "add": _elementwise,
    "sub": _elementwise,
    "mul": _elementwise,
    "div": _elementwise,
    "axpy": _elementwise,
    "relu": _elementwise,
    "gelu": _elementwise,
    "exp": _elementwise,
    "scale": _anytype,
    "accumulate": _anytype,
    "cast": _cast,
    "sum": _reduction,
    "max": _reduction,
    "min": _reduction,
    "prod": _reduction,
    "dot": _dot,
    "matmul": _matmul,
    "softmax": _rows,
    "layernorm": _rows,
    "rmsnorm": _rows,
}


def generic_kernels() -> dict[str, str]:
    """Return the portable source of each generic group (for docs and ``hal kernels translate``)."""
    return dict(SOURCES)
