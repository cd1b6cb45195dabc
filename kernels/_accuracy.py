"""Accuracy of every op, dtype and implementation against the float64 NumPy reference.

Inputs are seeded and include edge cases: zeros, subnormals, large magnitudes, and a
NaN/Inf case that checks propagation (the result must have NaN and ±Inf exactly where the
reference, rounded to the dtype, has them).

Tolerances are PyTorch's defaults of ``torch.testing.assert_close`` per dtype
(float16: rtol 1e-3, atol 1e-5; float32: rtol 1.3e-6, atol 1e-5; float64: rtol 1e-7,
atol 1e-7; integers: exact). An element passes when ``|got - ref| <= atol + rtol * mag``:
``mag`` is ``|ref|`` for elementwise ops; for ops that sum terms (sum, dot, matmul) it is
the same op applied to absolute values (``sum|x|``, ``|a| @ |b|``): the condition-aware
magnitude that summation error bounds use (Higham, *Accuracy and Stability of Numerical
Algorithms*, ch. 4), since ``|sum x|`` can be 0 while the rounding errors are not.
``max_rel`` and ``max_ulp`` are measured against that same magnitude, over elements where
it is a normal number (relative error against a subnormal or zero says nothing).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

import hal
from hal.kernels import _dispatch
from hal.kernels._custom import CUSTOM
from hal.kernels._ops import OP_FUNCTIONS, OPS, plan_route
from hal.kernels._ops import _dtype as _named_dtype
from hal.kernels._reference import reference

__all__ = ["TOLERANCES", "AccuracyRow", "accuracy", "accuracy_device"]

# dtype -> (rtol, atol, where it comes from)
_TORCH = "PyTorch torch.testing.assert_close default for this dtype"
TOLERANCES: dict[str, tuple[float, float, str]] = {
    "float16": (1e-3, 1e-5, _TORCH),
    "float32": (1.3e-6, 1e-5, _TORCH),
    "float64": (1e-7, 1e-7, _TORCH),
    "bfloat16": (1.6e-2, 1e-5, _TORCH),
    "int8": (0.0, 0.0, "exact (integer arithmetic wraps like NumPy)"),
    "uint8": (0.0, 0.0, "exact (integer arithmetic wraps like NumPy)"),
    "int32": (0.0, 0.0, "exact (integer arithmetic wraps like NumPy)"),
    "int64": (0.0, 0.0, "exact (integer arithmetic wraps like NumPy)"),
}
_SUMMING = {"sum", "dot", "matmul"}


@dataclasses.dataclass
class AccuracyRow:
    """One (op, dtype, implementation) line of the accuracy report."""

    backend: str
    device: str
    op: str
    dtype: str
    implementation: str
    max_abs: float
    max_rel: float
    max_ulp: float
    rtol: float
    atol: float
    tolerance_source: str
    nan_inf: str
    passed: bool
    cases: int
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict (``pass`` instead of ``passed``)."""
        d = dataclasses.asdict(self)
        d["pass"] = d.pop("passed")
        for k in ("max_abs", "max_rel", "max_ulp"):
            if not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


def _finfo(dt: np.dtype[Any]) -> Any:
    """``numpy.finfo``, or ``ml_dtypes.finfo`` for bfloat16 (NumPy does not know it)."""
    if dt.name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(dt)
    return np.finfo(dt)


def _is_float(dt: np.dtype[Any]) -> bool:
    return dt.kind == "f" or dt.name == "bfloat16"


def _finfo_edges(dt: np.dtype[Any]) -> np.ndarray[Any, Any]:
    fi = _finfo(dt)
    tiny = float(fi.smallest_subnormal) if hasattr(fi, "smallest_subnormal") else float(fi.tiny) / 4
    big = float(fi.max) / 8
    vals = [
        0.0,
        -0.0,
        tiny,
        -tiny,
        tiny * 3,
        float(fi.tiny),
        -float(fi.tiny),
        big,
        -big,
        1.0,
        -1.0,
        0.5,
    ]
    return np.array(vals, dtype=dt)


def _data(
    rng: np.random.Generator,
    dt: np.dtype[Any],
    shape: tuple[int, ...],
    case: str,
    low: float = -4.0,
    high: float = 4.0,
) -> np.ndarray[Any, Any]:
    if dt.kind in "iu":
        info = np.iinfo(dt)
        x = rng.integers(-1000, 1000, size=shape).astype(dt)  # wraps into int8/uint8
        if case == "edge":
            flat = x.reshape(-1)
            flat[:4] = np.array([0, info.max, info.min, -1]).astype(dt)
        return x
    if case == "nonneg":  # a float -> unsigned cast: negative values are undefined in C
        low = 0.0
    x = rng.uniform(low, high, size=shape).astype(dt)
    if case == "edge":
        flat = x.reshape(-1)
        e = _finfo_edges(dt)
        idx = rng.choice(flat.size, size=min(flat.size, e.size), replace=False)
        flat[idx] = e[: idx.size]
    elif case == "nan_inf":
        flat = x.reshape(-1)
        special = np.array([np.nan, np.inf, -np.inf], dtype=dt)
        idx = rng.choice(flat.size, size=min(flat.size, 3), replace=False)
        flat[idx] = special[: idx.size]
    return x


def _inputs(
    op: str, dt: np.dtype[Any], rng: np.random.Generator, case: str
) -> tuple[list[np.ndarray[Any, Any]], dict[str, Any]]:
    """Return host inputs and params (host arrays for weight/bias) for one case."""
    params: dict[str, Any] = {}
    custom = CUSTOM.get(op)
    if custom is not None:  # an op added with hal.kernels.spi.define_op
        low, high = custom.input_range
        return [_data(rng, dt, (4099,), case, low, high) for _ in range(custom.arity)], params
    if op in ("add", "sub", "mul", "div", "axpy"):
        xs = [_data(rng, dt, (4099,), case), _data(rng, dt, (4099,), case)]
        if op == "axpy":
            params["alpha"] = 0.75
        return xs, params
    if op in ("relu", "gelu", "exp"):
        return [_data(rng, dt, (4099,), case, -8.0, 8.0)], params
    if op == "scale":
        return [_data(rng, dt, (4099,), case)], {"alpha": 0.75}
    if op == "cast":
        return [
            _data(
                rng, dt, (4099,), case if case in ("random", "nonneg") else "random", -100.0, 100.0
            )
        ], params
    if op == "accumulate":
        return [_data(rng, dt, (4099,), case), _data(rng, dt, (4099,), case)], params
    if op in ("sum", "max", "min"):
        return [_data(rng, dt, (37, 129), case)], params
    if op == "prod":
        return [_data(rng, dt, (37, 129), case, 0.9, 1.1)], params
    if op == "dot":
        return [_data(rng, dt, (4099,), case, -1, 1), _data(rng, dt, (4099,), case, -1, 1)], params
    if op == "matmul":
        a = _data(rng, dt, (33, 70), case, -1, 1)
        b = _data(rng, dt, (70, 29), "random", -1, 1)
        return [a, b], params
    x = _data(rng, dt, (24, 130), case, -6, 6)
    if op == "softmax":
        return [x], params
    params["weight"] = rng.uniform(0.5, 1.5, size=(130,)).astype(dt)
    params["eps"] = 1e-5
    if op == "layernorm":
        params["bias"] = rng.uniform(-0.5, 0.5, size=(130,)).astype(dt)
    else:
        params["eps"] = 1e-6
    return [x], params


def _magnitude(
    op: str, xs: list[np.ndarray[Any, Any]], params: dict[str, Any], ref: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    with np.errstate(all="ignore"):
        if op in _SUMMING:
            ab = [np.abs(np.asarray(x, dtype=np.float64)) for x in xs]
            if op == "matmul":
                return ab[0] @ ab[1]
            if op == "dot":
                return np.asarray(np.dot(ab[0], ab[1]))
            return np.asarray(np.sum(ab[0], axis=params.get("axis")))
        return np.abs(ref)


def _compare(
    op: str,
    dt: np.dtype[Any],
    got: np.ndarray[Any, Any],
    ref64: np.ndarray[Any, Any],
    mag: np.ndarray[Any, Any],
) -> tuple[float, float, float, bool, bool]:
    """Return max abs, max rel, max ulp, within tolerance, NaN/Inf positions ok."""
    rtol, atol, _ = TOLERANCES[dt.name]
    if dt.kind in "iu":
        ok = bool(np.array_equal(got, ref64))
        diff = (
            np.abs(got.astype(np.float64) - ref64.astype(np.float64)) if got.size else np.zeros(1)
        )
        m = float(diff.max()) if diff.size else 0.0
        return m, m, m, ok, True
    with np.errstate(all="ignore"):
        expect = ref64.astype(dt)  # rounding to the dtype decides where Inf is expected
        g = got.astype(np.float64)
        e64 = np.asarray(ref64, dtype=np.float64)
        special = ~np.isfinite(expect)
        nan_ok = bool(np.array_equal(np.isnan(got), np.isnan(expect)))
        inf_ok = bool(
            np.array_equal(np.isposinf(got), np.isposinf(expect))
            and np.array_equal(np.isneginf(got), np.isneginf(expect))
        )
        fin = ~special & np.isfinite(got)
        if not np.any(fin):
            return 0.0, 0.0, 0.0, nan_ok and inf_ok, nan_ok and inf_ok
        diff = np.abs(g[fin] - e64[fin])
        scale = np.broadcast_to(np.asarray(mag, dtype=np.float64), e64.shape)[fin]
        normal = scale >= float(_finfo(dt).tiny)  # rel/ULP only where the scale is a normal number
        rel = diff[normal] / scale[normal] if np.any(normal) else np.zeros(1)
        ulp = (
            diff[normal] / np.spacing(scale[normal].astype(dt)).astype(np.float64)
            if np.any(normal)
            else np.zeros(1)
        )
        bound = atol + rtol * scale
        within = bool(np.all(diff <= bound))
        # a finite expectation must not come back as NaN/Inf
        within = within and bool(np.all(np.isfinite(got[~special])))
        return float(diff.max()), float(np.max(rel)), float(np.max(ulp)), within, nan_ok and inf_ok


def _run_op(
    op: str,
    device: hal.Device,
    stream: hal.Stream,
    xs: list[np.ndarray[Any, Any]],
    params: dict[str, Any],
    out_dtype: Any,
) -> np.ndarray[Any, Any]:
    arrs = [hal.asarray(x, device=device) for x in xs]
    kw: dict[str, Any] = {"stream": stream}
    fn: Callable[..., Any] = OP_FUNCTIONS[op]
    for k in ("weight", "bias"):
        if params.get(k) is not None:
            kw[k] = hal.asarray(params[k], device=device)
    if "eps" in params:
        kw["eps"] = params["eps"]
    if op == "axpy":
        res = fn(params["alpha"], arrs[0], arrs[1], **kw)
    elif op == "scale":
        res = fn(arrs[0], params["alpha"], **kw)
    elif op == "cast":
        res = fn(arrs[0], out_dtype, **kw)
    elif op == "accumulate":
        fn(arrs[0], arrs[1], op=params["op"], **kw)
        res = arrs[0]
    elif op in ("sum", "max", "min", "prod"):
        res = fn(arrs[0], params.get("axis"), **kw)
    else:
        res = fn(*arrs, **kw)
    return np.asarray(res.to_host(stream=stream))


def _cases(op: str, dt: np.dtype[Any]) -> list[tuple[str, dict[str, Any], Any]]:
    """Return (input case, extra params, out dtype) triples for one op and dtype."""
    base = ["random", "edge"] + (["nan_inf"] if _is_float(dt) and op not in ("cast",) else [])
    out: list[tuple[str, dict[str, Any], Any]] = []
    if op == "accumulate":
        for case in base:
            for red in ("sum", "prod", "max", "min"):
                out.append((case, {"op": red}, dt))
    elif op in ("sum", "max", "min", "prod"):
        for case in base:
            for axis in (None, 0, 1):
                out.append((case, {"axis": axis}, dt))
    elif op == "cast":
        for target in OPS["cast"].dtypes:
            out.append(
                ("nonneg" if target == "uint8" else "random", {}, _named_dtype(target, "accuracy"))
            )
    else:
        out = [(case, {}, dt) for case in base]
    return out


def accuracy(
    backend: str | None = None, *, seed: int = 0, ops: list[str] | None = None
) -> list[AccuracyRow]:
    """Measure every op × dtype × implementation available on each backend (or ``backend``).

    Args:
        backend: one backend name; default every available backend (its first device).
        seed: seeds the inputs.
        ops: restrict to these op names.
    """
    from hal.kernels._plan import plan_devices

    rows: list[AccuracyRow] = []
    for dev in plan_devices(backend):
        rows.extend(accuracy_device(dev, seed=seed, ops=ops))
    return rows


def accuracy_device(
    device: hal.Device, *, seed: int = 0, ops: list[str] | None = None
) -> list[AccuracyRow]:
    """Measure every op × dtype on ``device``: the route dispatch picks, and generic beside dedicated."""
    for op in ops or []:
        if op not in OPS:
            raise ValueError(f"op={op!r} is not a hal.kernels op")
    rows: list[AccuracyRow] = []
    stream = device.create_stream()
    try:
        for op in ops or list(OPS):
            for dname in OPS[op].dtypes:
                route, _name = plan_route(op, device, dname)
                routes = [route]
                if route == "dedicated" and plan_route_generic(device, dname):
                    routes.append("generic")
                for impl in routes:
                    rows.append(
                        _measure(op, _named_dtype(dname, "accuracy"), device, stream, impl, seed)
                    )
    finally:
        stream.close()
    return rows


def plan_route_generic(device: hal.Device, dtype: str) -> bool:
    """Return True if the generic kernels can run ``dtype`` on ``device``."""
    from hal.kernels._ops import _generic_possible

    return _generic_possible(device, {dtype})


def _measure(
    op: str, dt: np.dtype[Any], dev: hal.Device, stream: hal.Stream, impl: str, seed: int
) -> AccuracyRow:
    rtol, atol, source = TOLERANCES[dt.name]
    custom = CUSTOM.get(op)
    if custom is not None and dt.name in custom.tolerances:
        rtol, atol = custom.tolerances[dt.name]
        source = f"set by hal.kernels.spi.define_op({op!r})"
    row = AccuracyRow(
        dev.backend, str(dev), op, dt.name, impl, 0.0, 0.0, 0.0, rtol, atol, source, "ok", True, 0
    )
    rng = np.random.default_rng(seed)
    used: set[str] = set()
    try:
        with _dispatch.route(impl), _dispatch.trace() as records:
            for case, extra, out_dt in _cases(op, dt):
                xs, params = _inputs(op, dt, rng, case)
                params.update(extra)
                got = _run_op(op, dev, stream, xs, params, out_dt)
                ref_inputs = list(xs)
                ref_params = dict(params)
                ref = np.asarray(reference(op, ref_inputs, ref_params, out_dt))
                mag = _magnitude(op, xs, params, ref)
                odt = np.dtype(out_dt)
                a, r, u, ok, special_ok = _compare(op, odt, got, ref, mag)
                if odt.name != dt.name:  # cast: judge by the target's tolerance
                    rt, at, _ = TOLERANCES[odt.name]
                    row.rtol, row.atol = max(row.rtol, rt), max(row.atol, at)
                row.max_abs = max(row.max_abs, a)
                row.max_rel = max(row.max_rel, r)
                row.max_ulp = max(row.max_ulp, u)
                row.cases += 1
                if not special_ok:
                    row.nan_inf = f"mismatch ({case})"
                row.passed = row.passed and ok and special_ok
            used.update(r.implementation for r in records if r.device == str(dev))
    except Exception as exc:
        row.passed = False
        row.error = f"{type(exc).__name__}: {exc}"
    if used:
        row.implementation = "+".join(i for i in _dispatch.IMPLEMENTATIONS if i in used)
    return row
