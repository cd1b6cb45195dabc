"""The op library over ``hal.Array``: validation, output allocation, dispatch.

Every op takes a keyword-only ``stream`` (its work is enqueued there and the call returns
without waiting) and validates every argument before anything is enqueued. Outputs are
allocated on the inputs' device unless ``out=`` is given, except for the two in-place ops:
:func:`axpy` writes ``y`` unless ``out=`` is given (as BLAS), :func:`accumulate` writes ``dst``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, final

import numpy as np

import hal
from hal.kernels import _dispatch, _fast
from hal.kernels._dispatch import DispatchRecord, KernelFallbackError, OpCall
from hal.kernels._program import dialect_of

__all__ = [
    "ACCUMULATE_OPS",
    "FLOAT_DTYPES",
    "OPS",
    "OpSpec",
    "accumulate",
    "add",
    "axpy",
    "cast",
    "div",
    "dot",
    "exp",
    "gelu",
    "layernorm",
    "matmul",
    "max",
    "min",
    "mul",
    "prod",
    "relu",
    "rmsnorm",
    "scale",
    "softmax",
    "sub",
    "sum",
]

FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int32", "int64")
#: Storage-only dtypes of the reduction steps (``accumulate``, ``scale``, ``cast``): half-precision
#: gradients and quantized values. bfloat16 is ``ml_dtypes.bfloat16``; it has no generic kernel
#: (the portable language has no bf16 type): dedicated or host route.
NARROW_DTYPES = ("bfloat16", "int8", "uint8")
_NAMES: dict[np.dtype[Any], str] = {
    np.dtype(n): n for n in FLOAT_DTYPES + INT_DTYPES + NARROW_DTYPES[1:]
}
# ml_dtypes is not imported here (~1.3 s of CPU, 0.7.0): a bfloat16 dtype object exists only once
# it was imported, and joins _NAMES when first met; a dtype given by name imports it (_dtype).


def dtype_name(dt: np.dtype[Any]) -> str:
    """Return ``dt.name`` (cached for the op dtypes: ``dtype.name`` is slow on the hot path)."""
    name = _NAMES.get(dt)
    if name is None:
        name = dt.name
        if name == "bfloat16":
            _NAMES[dt] = name
    return name


def _dtype(dtype: Any, where: str) -> np.dtype[Any]:
    """``np.dtype(dtype)``; the name ``"bfloat16"`` imports ml_dtypes (which registers it) first."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as exc:  # pragma: no cover - ml_dtypes is a dependency of hal-sdk
            raise TypeError(
                f"{where}: dtype='bfloat16' needs the ml_dtypes package (pip install ml_dtypes)"
            ) from exc
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{where}: dtype={dtype!r} is not a NumPy dtype") from exc


ACCUMULATE_OPS = ("sum", "prod", "max", "min")


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """An op of the library: its name, the dtypes it takes and its group."""

    name: str
    dtypes: tuple[str, ...]
    kind: str  # elementwise | reduction | linalg | rows
    summary: str


def _spec(name: str, kind: str, summary: str, dtypes: tuple[str, ...] = FLOAT_DTYPES) -> OpSpec:
    return OpSpec(name, dtypes, kind, summary)


OPS: dict[str, OpSpec] = {
    s.name: s
    for s in [
        _spec("add", "elementwise", "out = x + y"),
        _spec("sub", "elementwise", "out = x - y"),
        _spec("mul", "elementwise", "out = x * y"),
        _spec("div", "elementwise", "out = x / y"),
        _spec("axpy", "elementwise", "out = alpha * x + y (out defaults to y)"),
        _spec("scale", "elementwise", "out = alpha * x", FLOAT_DTYPES + INT_DTYPES + NARROW_DTYPES),
        _spec(
            "cast",
            "elementwise",
            "out = x converted to dtype",
            FLOAT_DTYPES + INT_DTYPES + NARROW_DTYPES,
        ),
        _spec("relu", "elementwise", "out = max(x, 0) (NaN propagates)"),
        _spec("gelu", "elementwise", "out = x * Phi(x) (erf form)"),
        _spec("exp", "elementwise", "out = exp(x)"),
        _spec(
            "accumulate",
            "elementwise",
            "dst = op(dst, src), op in sum/prod/max/min",
            FLOAT_DTYPES + INT_DTYPES + NARROW_DTYPES,
        ),
        _spec("sum", "reduction", "sum over all elements or one axis"),
        _spec("max", "reduction", "maximum (NaN propagates)"),
        _spec("min", "reduction", "minimum (NaN propagates)"),
        _spec("prod", "reduction", "product"),
        _spec("dot", "linalg", "sum(x * y) of two vectors"),
        _spec("matmul", "linalg", "(M, K) @ (K, N)"),
        _spec("softmax", "rows", "softmax along the last axis"),
        _spec("layernorm", "rows", "(x - mean) / sqrt(var + eps) * weight + bias, last axis"),
        _spec("rmsnorm", "rows", "x / sqrt(mean(x^2) + eps) * weight, last axis"),
    ]
}


# -- validation helpers --------------------------------------------------------------------
def _check_stream(stream: object) -> hal.Stream:
    if type(stream) is not hal.Stream and not isinstance(stream, hal.Stream):
        raise TypeError(f"stream={stream!r} is not a hal.Stream")
    return stream


def _check_array(value: object, name: str, stream: hal.Stream, op: str) -> hal.Array:
    if type(value) is not hal.Array and not isinstance(value, hal.Array):
        raise TypeError(f"{op}: {name}={value!r} is not a hal.Array")
    buf = value.buffer
    if buf.closed:
        raise hal.InvalidBufferError(f"{op}: {name} uses a closed buffer")
    vdev, sdev = buf.device, stream.device
    if vdev is not sdev and vdev != sdev:
        raise hal.DeviceMismatchError(
            f"{op}: {name} lives on {value.device}, the stream on {stream.device}"
        )
    return value


def _check_dtype(op: str, dtype: np.dtype[Any], name: str = "x") -> None:
    if dtype_name(dtype) not in OPS[op].dtypes:
        raise TypeError(f"{op}: {name} has dtype {dtype}; {op} takes {', '.join(OPS[op].dtypes)}")


def _out(
    op: str,
    out: object,
    stream: hal.Stream,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    inputs: tuple[hal.Array, ...] = (),
    alias_ok: bool = True,
) -> hal.Array:
    if out is None:
        nbytes = math.prod(shape) * dtype.itemsize
        return stream.device.alloc(nbytes).view(dtype, shape)
    arr = _check_array(out, "out", stream, op)
    adt = arr.dtype
    if arr.shape != shape or (adt is not dtype and adt != dtype):
        raise ValueError(
            f"{op}: out has shape {arr.shape} and dtype {arr.dtype}; expected {shape} and {dtype}"
        )
    for i, a in enumerate(inputs):
        if (
            a.buffer is arr.buffer
            and _overlap(a, arr)
            and not (alias_ok and a.offset == arr.offset and a.nbytes == arr.nbytes)
        ):
            raise ValueError(f"{op}: out overlaps input {i} (in-place is not supported for {op})")
    return arr


def _overlap(a: hal.Array, b: hal.Array) -> bool:
    return (
        a.offset < b.offset + b.nbytes
        and b.offset < a.offset + a.nbytes
        and a.nbytes > 0
        and b.nbytes > 0
    )


def _same(op: str, x: hal.Array, y: hal.Array, names: str = "x and y") -> None:
    xdt, ydt = x.dtype, y.dtype
    if x.shape != y.shape or (xdt is not ydt and xdt != ydt):
        raise ValueError(f"{op}: {names} differ: {x.shape} {x.dtype} vs {y.shape} {y.dtype}")


def _scalar(value: object, name: str, op: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: {name}={value!r} must be a real number")
    return float(value)


# -- the dispatch driver -------------------------------------------------------------------
def _generic_possible(device: hal.Device, dtypes: set[str]) -> bool:
    if not dialect_of(device):
        return False
    caps = device.capabilities
    for dt in dtypes:
        if dt == "bfloat16":  # no bf16 type in the portable language
            return False
        if dt == "float64" and not caps.fp64:
            return False
        if dt == "float16" and not caps.fp16:
            return False
    return True


def plan_route(op: str, device: hal.Device, dtype: str) -> tuple[str, str]:
    """Return ``(implementation, name)`` that ``op`` on ``dtype`` would run on ``device``."""
    if dtype not in OPS[op].dtypes:
        return "unsupported", ""
    ded = _dispatch.registry().lookup(op, device.backend, dtype, device=device)
    if ded is not None:
        return "dedicated", ded[0]
    if _generic_possible(device, {dtype}):
        return "generic", "hal.kernels generic"
    return "host", "numpy on the host"


_records: dict[tuple[str, str, str, hal.Device, str, str, str], DispatchRecord] = {}
hal.runtime().register_cache("hal.kernels.dispatch_records", _records.clear)


def _record_for(
    op: str, dt: str, backend: str, dev: hal.Device, route: str, name: str, kernel_hash: str
) -> DispatchRecord:
    """Return the (immutable, shared) record of one kind of call: built once, not per launch."""
    key = (op, dt, backend, dev, route, name, kernel_hash)
    rec = _records.get(key)
    if rec is None:
        rec = _records.setdefault(
            key, DispatchRecord(op, dt, backend, str(dev), route, name, kernel_hash)
        )
    return rec


@final
class _Route:
    """The dispatch answer for one kind of call: (op, device, dtype, output dtype).

    Valid while the registry is the same object at the same ``generation`` (every
    registration bumps it). ``static`` is False when the dedicated lookup depends on the call
    (a ``when`` predicate): then only the generic/host part is cached. ``records`` maps what
    ran (the implementation's name or the generic kernel's label) to its shared
    :class:`DispatchRecord` and the exit summary's key.
    """

    __slots__ = ("backend", "ded", "dt", "gen", "generic_ok", "records", "reg", "route", "static")

    def __init__(
        self, reg: _dispatch.KernelRegistry, op: str, dev: hal.Device, dt: str, odt: str
    ) -> None:
        self.reg = reg
        self.gen = reg.generation
        self.backend = dev.backend
        self.dt = dt
        found = reg.lookup_static(op, self.backend, dt)
        self.static = found is not False
        self.ded: tuple[str, _dispatch.Impl] | None = None if found is False else found
        self.generic_ok = _generic_possible(dev, {dt, odt})
        #: the route when no dedicated implementation takes the call
        self.route = "generic" if self.generic_ok else "host"
        self.records: dict[
            tuple[str, str], tuple[DispatchRecord, tuple[str, str, str, str] | None]
        ] = {}


_routes: dict[tuple[str, hal.Device, np.dtype[Any], np.dtype[Any]], _Route] = {}
hal.runtime().register_cache("hal.kernels.routes", _routes.clear)
_ROUTES_MAX = 4096


def _route_for(op: str, dev: hal.Device, dtype: np.dtype[Any], odtype: np.dtype[Any]) -> _Route:
    reg = _dispatch.registry()
    key = (op, dev, dtype, odtype)
    r = _routes.get(key)
    if r is None or r.reg is not reg or r.gen != reg.generation:
        if len(_routes) > _ROUTES_MAX:
            _routes.clear()
        r = _routes[key] = _Route(reg, op, dev, dtype_name(dtype), dtype_name(odtype))
    return r


def _forget_routes() -> None:
    """Drop cached routes and records (tests; a new registry or plugin set is seen anyway)."""
    _routes.clear()


_lazy: dict[str, Any] = {}


def _late_imports() -> dict[str, Any]:
    """Import the implementation modules once (not per call: an import statement costs microseconds)."""
    if not _lazy:
        from hal.kernels._generic import GENERIC, _sweep, keep_alive
        from hal.kernels._host import run_host

        _lazy.update(GENERIC=GENERIC, sweep=_sweep, keep_alive=keep_alive, run_host=run_host)
    return _lazy


_forced_route = _dispatch._forced
_deliver = _dispatch.deliver


def _run(
    call: OpCall, key: tuple[Any, ...] | None = None, names: tuple[str, ...] = ()
) -> DispatchRecord:
    lazy = _lazy or _late_imports()
    _dispatch.registry()  # the plugins' hooks have run (their registrations change the epoch)
    epoch = _dispatch.EPOCH[
        0
    ]  # read before the route: a registration during the call makes the entry stale
    op = call.op
    dev = call.stream.device
    r = _route_for(op, dev, call.dtype, call.out.dtype)
    forced = getattr(_forced_route, "value", None)
    ded = r.ded
    if not r.static:  # a predicate decides per call
        ded = r.reg.lookup(op, r.backend, r.dt, call)
    if forced is None:
        route = "dedicated" if ded is not None else r.route
        if route != "dedicated" and _dispatch.strict() and not _dispatch.is_internal():
            raise KernelFallbackError(op, r.backend, r.dt, route)
    elif forced == "dedicated" and ded is not None:
        route = "dedicated"
    elif forced == "generic" and r.generic_ok:
        route = "generic"
    elif forced == "host":
        route = "host"
    elif ded is not None:
        route = "dedicated"
    elif r.generic_ok:
        route = "generic"
    else:
        route = "host"
    lazy["sweep"]()
    if route == "dedicated":
        assert ded is not None
        label = ded[0]
        impl = ded[1]
        impl(call)
    elif route == "generic":
        impl = lazy["GENERIC"][op]
        label = impl(call)
    else:
        impl = lazy["run_host"]
        impl(call)
        label = ""
    params = call.params
    if params:
        extra = tuple(v for v in params.values() if isinstance(v, hal.Array))
        lazy["keep_alive"](call.stream, (*call.inputs, call.out, *extra))
    else:
        lazy["keep_alive"](call.stream, (*call.inputs, call.out))
    got = r.records.get((route, label))
    if got is None:
        kernel_hash = ""
        if route == "dedicated":
            name = label
        elif route == "generic":
            kernel_hash, _, kname = label.partition(":")
            name = "generic:" + kname
        else:
            name = "host:numpy"
        rec = _record_for(op, r.dt, r.backend, dev, route, name, kernel_hash)
        fallback = None if route == "dedicated" else (op, r.dt, r.backend, route)
        got = r.records[(route, label)] = (rec, fallback)
    _deliver(got[0], got[1])
    if key is not None and forced is None:
        _fast.learn(key, call, names, impl, got[0], got[1], epoch)
    return got[0]


_tracer = hal.tracer
_fast1, _fast2, _key1, _key2 = _fast.fast1, _fast.fast2, _fast.key1, _fast.key2


def _use_hits(fast1: Any, fast2: Any) -> None:
    """The launch cache's hits the op functions call (``_fast.use_native``: C or Python)."""
    global _fast1, _fast2
    _fast1, _fast2 = fast1, fast2


_fast.on_native.append(_use_hits)


def _call(
    op_name: str,
    inputs: tuple[hal.Array, ...],
    out: hal.Array,
    stream: hal.Stream,
    key: tuple[Any, ...] | None = None,
    names: tuple[str, ...] = (),
    **params: Any,
) -> OpCall:
    """Dispatch one validated call; ``key`` (the launch cache's, see :mod:`._fast`) makes it learned.

    ``names`` are the parameters that change from call to call of one kind (``alpha``).
    """
    call = OpCall(op_name, inputs, out, params, stream, inputs[0].dtype if inputs else out.dtype)
    if out.size:
        tr = _tracer()
        if tr is None:  # tracing off: nothing else to pay
            _run(call, key, names)
        else:  # the timeline marks what ran: dedicated or generic (or host)
            with tr.stream_span(
                stream, op_name, "kernel", {"dtype": dtype_name(call.dtype)}
            ) as args:
                rec = _run(call)
                args.update(implementation=rec.implementation, kernel=rec.kernel)
    return call


# -- elementwise ---------------------------------------------------------------------------
def _binary(op: str, x: object, y: object, out: object, stream: object) -> hal.Array:
    done = _fast2(op, None, stream, x, y, out, ())
    if done is not None:
        return done
    s = _check_stream(stream)
    a = _check_array(x, "x", s, op)
    b = _check_array(y, "y", s, op)
    _check_dtype(op, a.dtype)
    _same(op, a, b)
    o = _out(op, out, s, a.shape, a.dtype, (a, b))
    _call(op, (a, b), o, s, _key2(op, None, a, b, None if out is None else o))
    return o


def add(
    x: hal.Array, y: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue ``out = x + y`` (same shape and dtype); return ``out``."""
    return _binary("add", x, y, out, stream)


def sub(
    x: hal.Array, y: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue ``out = x - y``; return ``out``."""
    return _binary("sub", x, y, out, stream)


def mul(
    x: hal.Array, y: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue ``out = x * y``; return ``out``."""
    return _binary("mul", x, y, out, stream)


def div(
    x: hal.Array, y: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue ``out = x / y``; return ``out``."""
    return _binary("div", x, y, out, stream)


def axpy(
    alpha: float, x: hal.Array, y: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue ``out = alpha * x + y``; ``out`` defaults to ``y`` (in place, as BLAS); return it."""
    ta = type(alpha)
    if ta is float or ta is int:
        done = _fast2("axpy", None, stream, x, y, y if out is None else out, (alpha,))
        if done is not None:
            return done
    s = _check_stream(stream)
    al = _scalar(alpha, "alpha", "axpy")
    a = _check_array(x, "x", s, "axpy")
    b = _check_array(y, "y", s, "axpy")
    _check_dtype("axpy", a.dtype)
    _same("axpy", a, b)
    o = b if out is None else _out("axpy", out, s, a.shape, a.dtype, (a, b))
    _call("axpy", (a, b), o, s, _key2("axpy", None, a, b, o), ("alpha",), alpha=al)
    return o


def scale(
    x: hal.Array, alpha: float, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue ``out = alpha * x`` (computed in float64, rounded to x's dtype; integers truncate).

    ``scale(x, 1 / n, out=x, stream=s)`` turns a sum into an average in place.
    """
    ta = type(alpha)
    if ta is float or ta is int:
        done = _fast1("scale", None, stream, x, out, (alpha,))
        if done is not None:
            return done
    s = _check_stream(stream)
    al = _scalar(alpha, "alpha", "scale")
    a = _check_array(x, "x", s, "scale")
    _check_dtype("scale", a.dtype)
    o = _out("scale", out, s, a.shape, a.dtype, (a,))
    _call(
        "scale",
        (a,),
        o,
        s,
        _key1("scale", None, a, None if out is None else o),
        ("alpha",),
        alpha=al,
    )
    return o


def cast(
    x: hal.Array, dtype: Any, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue ``out = x`` converted to ``dtype`` (C conversion rules; NaN/out-of-range to int is undefined)."""
    hashable = isinstance(dtype, (str, type, np.dtype))
    if hashable:
        done = _fast1("cast", dtype, stream, x, out, ())
        if done is not None:
            return done
    s = _check_stream(stream)
    a = _check_array(x, "x", s, "cast")
    _check_dtype("cast", a.dtype)
    dt = _dtype(dtype, "cast")
    _check_dtype("cast", dt, "dtype")
    o = _out("cast", out, s, a.shape, dt, (a,), alias_ok=a.dtype.itemsize == dt.itemsize)
    _call(
        "cast",
        (a,),
        o,
        s,
        _key1("cast", dtype, a, None if out is None else o) if hashable else None,
    )
    return o


def _unary(op: str, x: object, out: object, stream: object) -> hal.Array:
    done = _fast1(op, None, stream, x, out, ())
    if done is not None:
        return done
    s = _check_stream(stream)
    a = _check_array(x, "x", s, op)
    _check_dtype(op, a.dtype)
    o = _out(op, out, s, a.shape, a.dtype, (a,))
    _call(op, (a,), o, s, _key1(op, None, a, None if out is None else o))
    return o


def relu(x: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream) -> hal.Array:
    """Enqueue ``out = max(x, 0)`` (NaN stays NaN); return ``out``."""
    return _unary("relu", x, out, stream)


def gelu(x: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream) -> hal.Array:
    """Enqueue ``out = 0.5 * x * erfc(-x / sqrt(2))`` (exact GELU, = x * Phi(x)); return ``out``."""
    return _unary("gelu", x, out, stream)


def exp(x: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream) -> hal.Array:
    """Enqueue ``out = exp(x)``; return ``out``."""
    return _unary("exp", x, out, stream)


def accumulate(dst: hal.Array, src: hal.Array, *, op: str, stream: hal.Stream) -> None:
    """Enqueue ``dst[i] = op(dst[i], src[i])`` for ``op`` in ``sum``, ``prod``, ``max``, ``min``.

    The reduction step of collectives (hal.comm): same shape, dtype (float16/32/64,
    bfloat16, int8, uint8, int32, int64) and device for both arrays. ``max``/``min``
    propagate NaN like NumPy; integer ``sum``/``prod`` wrap around (two's complement, like
    NCCL and torch); float16/bfloat16 compute in float32 and round once to nearest-even.
    """
    if type(op) is str and _fast1("accumulate", op, stream, src, dst, ()) is not None:
        return
    s = _check_stream(stream)
    if op not in ACCUMULATE_OPS:
        raise ValueError(f"accumulate: op={op!r} is not one of {', '.join(ACCUMULATE_OPS)}")
    d = _check_array(dst, "dst", s, "accumulate")
    a = _check_array(src, "src", s, "accumulate")
    _check_dtype("accumulate", d.dtype, "dst")
    _same("accumulate", d, a, "dst and src")
    if d.buffer is a.buffer and _overlap(d, a) and d.offset != a.offset:
        raise ValueError("accumulate: dst and src partially overlap")
    _call("accumulate", (a,), d, s, _key1("accumulate", op, a, d), op=op)


# -- reductions ----------------------------------------------------------------------------
def _axis(op: str, x: hal.Array, axis: object) -> int | None:
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis={axis!r} must be an int or None")
    ax = int(axis)
    if not -x.ndim <= ax < x.ndim:
        raise ValueError(f"{op}: axis={axis} is out of range for a {x.ndim}-d array")
    return ax % x.ndim


def _reduce(
    op: str, x: object, axis: object, out: object, stream: object, tried: bool = False
) -> hal.Array:
    keyed = axis is None or type(axis) is int
    if keyed and not tried:  # ``tried``: the op's function asked the launch cache itself
        done = _fast1(op, axis, stream, x, out, ())
        if done is not None:
            return done
    s = _check_stream(stream)
    a = _check_array(x, "x", s, op)
    _check_dtype(op, a.dtype)
    ax = _axis(op, a, axis)
    shape = () if ax is None else a.shape[:ax] + a.shape[ax + 1 :]
    count = a.size if ax is None else a.shape[ax]
    if count == 0 and op in ("max", "min"):
        raise ValueError(f"{op}: zero-size reduction has no identity")
    o = _out(op, out, s, shape, a.dtype, (a,), alias_ok=False)
    if math.prod(shape) == 0:
        return o
    if count == 0:
        _fill(o, 0 if op == "sum" else 1, s)
        return o
    _call(
        op, (a,), o, s, _key1(op, axis, a, None if out is None else o) if keyed else None, axis=ax
    )
    return o


def _fill(o: hal.Array, value: float, stream: hal.Stream) -> None:
    from hal.kernels._generic import _release_after

    host = np.full(o.shape, value, dtype=o.dtype)
    hal.copy(o, host, stream=stream)
    _release_after(stream, [host])


def sum(
    x: hal.Array, axis: int | None = None, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue the sum of ``x`` (all elements: shape ``()``; or along ``axis``); return it."""
    if axis is None or type(axis) is int:  # the launch cache first (one Python frame less)
        done = _fast1("sum", axis, stream, x, out, ())
        if done is not None:
            return done
        return _reduce("sum", x, axis, out, stream, True)
    return _reduce("sum", x, axis, out, stream)


def max(
    x: hal.Array, axis: int | None = None, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue the maximum of ``x`` (NaN propagates); return it."""
    if axis is None or type(axis) is int:  # the launch cache first (one Python frame less)
        done = _fast1("max", axis, stream, x, out, ())
        if done is not None:
            return done
        return _reduce("max", x, axis, out, stream, True)
    return _reduce("max", x, axis, out, stream)


def min(
    x: hal.Array, axis: int | None = None, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue the minimum of ``x`` (NaN propagates); return it."""
    if axis is None or type(axis) is int:  # the launch cache first (one Python frame less)
        done = _fast1("min", axis, stream, x, out, ())
        if done is not None:
            return done
        return _reduce("min", x, axis, out, stream, True)
    return _reduce("min", x, axis, out, stream)


def prod(
    x: hal.Array, axis: int | None = None, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue the product of ``x``; return it."""
    if axis is None or type(axis) is int:  # the launch cache first (one Python frame less)
        done = _fast1("prod", axis, stream, x, out, ())
        if done is not None:
            return done
        return _reduce("prod", x, axis, out, stream, True)
    return _reduce("prod", x, axis, out, stream)


def dot(
    x: hal.Array, y: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue ``sum(x * y)`` of two 1-d arrays into a shape-``()`` array; return it."""
    done = _fast2("dot", None, stream, x, y, out, ())
    if done is not None:
        return done
    s = _check_stream(stream)
    a = _check_array(x, "x", s, "dot")
    b = _check_array(y, "y", s, "dot")
    _check_dtype("dot", a.dtype)
    _same("dot", a, b)
    if a.ndim != 1:
        raise ValueError(f"dot: x must be 1-d, got shape {a.shape}")
    o = _out("dot", out, s, (), a.dtype, (a, b), alias_ok=False)
    if a.size == 0:
        _fill(o, 0, s)
        return o
    _call("dot", (a, b), o, s, _key2("dot", None, a, b, None if out is None else o))
    return o


def matmul(
    a: hal.Array, b: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue ``out = a @ b`` for 2-d ``a`` (M, K) and ``b`` (K, N); return ``out``."""
    done = _fast2("matmul", None, stream, a, b, out, ())
    if done is not None:
        return done
    s = _check_stream(stream)
    x = _check_array(a, "a", s, "matmul")
    y = _check_array(b, "b", s, "matmul")
    _check_dtype("matmul", x.dtype)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[0] or x.dtype != y.dtype:
        raise ValueError(
            f"matmul: shapes {x.shape} {x.dtype} and {y.shape} {y.dtype} do not chain as (M, K) @ (K, N)"
        )
    o = _out("matmul", out, s, (x.shape[0], y.shape[1]), x.dtype, (x, y), alias_ok=False)
    if o.size == 0:
        return o
    if x.shape[1] == 0:
        _fill(o, 0, s)
        return o
    _call("matmul", (x, y), o, s, _key2("matmul", None, x, y, None if out is None else o))
    return o


def _last_axis(op: str, axis: object, a: hal.Array) -> None:
    if a.ndim == 0:
        raise ValueError(f"{op}: x must have at least 1 dimension")
    if axis not in (-1, a.ndim - 1):
        raise ValueError(f"{op}: axis={axis!r}: only the last axis is supported")


def softmax(
    x: hal.Array, axis: int = -1, *, out: hal.Array | None = None, stream: hal.Stream
) -> hal.Array:
    """Enqueue the softmax of ``x`` along its last axis; return it."""
    keyed = type(axis) is int
    if keyed:
        done = _fast1("softmax", axis, stream, x, out, ())
        if done is not None:
            return done
    s = _check_stream(stream)
    a = _check_array(x, "x", s, "softmax")
    _check_dtype("softmax", a.dtype)
    _last_axis("softmax", axis, a)
    o = _out("softmax", out, s, a.shape, a.dtype, (a,))
    _call(
        "softmax",
        (a,),
        o,
        s,
        _key1("softmax", axis, a, None if out is None else o) if keyed else None,
    )
    return o


def _vector(op: str, name: str, v: object, a: hal.Array, s: hal.Stream) -> hal.Array | None:
    if v is None:
        return None
    arr = _check_array(v, name, s, op)
    if arr.shape != (a.shape[-1],) or arr.dtype != a.dtype:
        raise ValueError(
            f"{op}: {name} must have shape {(a.shape[-1],)} and dtype {a.dtype}, got {arr.shape} {arr.dtype}"
        )
    return arr


def layernorm(
    x: hal.Array,
    weight: hal.Array | None = None,
    bias: hal.Array | None = None,
    *,
    eps: float = 1e-5,
    out: hal.Array | None = None,
    stream: hal.Stream,
) -> hal.Array:
    """Enqueue layer normalization over the last axis (biased variance, like PyTorch); return it."""
    s = _check_stream(stream)
    a = _check_array(x, "x", s, "layernorm")
    _check_dtype("layernorm", a.dtype)
    _last_axis("layernorm", -1, a)
    w = _vector("layernorm", "weight", weight, a, s)
    b = _vector("layernorm", "bias", bias, a, s)
    e = _scalar(eps, "eps", "layernorm")
    o = _out("layernorm", out, s, a.shape, a.dtype, (a,))
    _call("layernorm", (a,), o, s, weight=w, bias=b, eps=e)
    return o


def rmsnorm(
    x: hal.Array,
    weight: hal.Array | None = None,
    *,
    eps: float = 1e-6,
    out: hal.Array | None = None,
    stream: hal.Stream,
) -> hal.Array:
    """Enqueue RMS normalization over the last axis; return it."""
    s = _check_stream(stream)
    a = _check_array(x, "x", s, "rmsnorm")
    _check_dtype("rmsnorm", a.dtype)
    _last_axis("rmsnorm", -1, a)
    w = _vector("rmsnorm", "weight", weight, a, s)
    e = _scalar(eps, "eps", "rmsnorm")
    o = _out("rmsnorm", out, s, a.shape, a.dtype, (a,))
    _call("rmsnorm", (a,), o, s, weight=w, eps=e)
    return o


OP_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "add": add,
    "sub": sub,
    "mul": mul,
    "div": div,
    "axpy": axpy,
    "scale": scale,
    "cast": cast,
    "relu": relu,
    "gelu": gelu,
    "exp": exp,
    "accumulate": accumulate,
    "sum": sum,
    "max": max,
    "min": min,
    "prod": prod,
    "dot": dot,
    "matmul": matmul,
    "softmax": softmax,
    "layernorm": layernorm,
    "rmsnorm": rmsnorm,
}
