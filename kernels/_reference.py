"""NumPy float64 references of every op (the accuracy report and the host route use them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["reference"]

_erfc = np.frompyfunc(math.erfc, 1, 1)


def _f64(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(a, dtype=np.float64)


def _gelu(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with np.errstate(invalid="ignore"):
        # erfc form: no cancellation in 1 + erf(x / sqrt 2) for negative x
        return 0.5 * x * np.asarray(_erfc(-x / math.sqrt(2.0)), dtype=np.float64)


def _softmax(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(x, axis=-1, keepdims=True)
        m = np.where(np.isneginf(m), 0.0, m)
        e = np.exp(x - m)
        return e / np.sum(e, axis=-1, keepdims=True)


def _layernorm(x: np.ndarray[Any, Any], w: Any, b: Any, eps: float) -> np.ndarray[Any, Any]:
    with np.errstate(invalid="ignore", over="ignore"):
        mean = np.mean(x, axis=-1, keepdims=True)
        var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)
        y = (x - mean) / np.sqrt(var + eps)
        if w is not None:
            y = y * _f64(w)
        if b is not None:
            y = y + _f64(b)
        return y


def _rmsnorm(x: np.ndarray[Any, Any], w: Any, eps: float) -> np.ndarray[Any, Any]:
    with np.errstate(invalid="ignore", over="ignore"):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return y if w is None else y * _f64(w)


def reference(
    op: str, inputs: Sequence[np.ndarray[Any, Any]], params: dict[str, Any], out_dtype: Any
) -> np.ndarray[Any, Any]:
    """Return ``op`` computed by NumPy: in float64 for float ops, in the exact dtype for integers.

    Args:
        op: an op name.
        inputs: host arrays, in the op's order (for ``accumulate``: ``dst, src``).
        params: the op's parameters (``alpha``, ``axis``, ``eps``, ``op``, ``weight``, ``bias``
            as host arrays or None).
        out_dtype: the output dtype (integer ops are computed in it; floats in float64).
    """
    dt = np.dtype(out_dtype)
    if dt.kind in "iu" and op in ("accumulate", "cast", "scale"):
        a = inputs[0]
        if op == "cast":
            return a.astype(dt)
        if op == "scale":
            with np.errstate(invalid="ignore", over="ignore"):
                return np.trunc(params["alpha"] * a.astype(np.float64)).astype(dt)
        fn = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[
            params["op"]
        ]
        return np.asarray(fn(a, inputs[1]), dtype=dt)
    xs = [_f64(a) for a in inputs]
    with np.errstate(all="ignore"):
        if op in ("add", "sub", "mul", "div"):
            fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]
            return fn(xs[0], xs[1])
        if op == "axpy":
            return params["alpha"] * xs[0] + xs[1]
        if op == "scale":
            return params["alpha"] * xs[0]
        if op == "cast":
            return xs[0]
        if op == "relu":
            return np.where(np.isnan(xs[0]), xs[0], np.maximum(xs[0], 0.0))
        if op == "gelu":
            return _gelu(xs[0])
        if op == "exp":
            return np.exp(xs[0])
        if op == "accumulate":
            fn = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[
                params["op"]
            ]
            return fn(xs[0], xs[1])
        if op in ("sum", "max", "min", "prod"):
            axis = params.get("axis")
            if op == "sum":
                return np.asarray(np.sum(xs[0], axis=axis))
            if op == "prod":
                return np.asarray(np.prod(xs[0], axis=axis))
            if op == "max":
                return np.asarray(np.max(xs[0], axis=axis))
            return np.asarray(np.min(xs[0], axis=axis))
        if op == "dot":
            return np.asarray(np.dot(xs[0], xs[1]))
        if op == "matmul":
            return xs[0] @ xs[1]
        if op == "softmax":
            return _softmax(xs[0])
        if op == "layernorm":
            return _layernorm(xs[0], params.get("weight"), params.get("bias"), params["eps"])
        if op == "rmsnorm":
            return _rmsnorm(xs[0], params.get("weight"), params["eps"])
        from hal.kernels._custom import CUSTOM

        custom = CUSTOM.get(op)
        if custom is not None:  # an op added with hal.kernels.spi.define_op
            return np.asarray(custom.reference(*xs), dtype=np.float64)
    raise ValueError(f"op={op!r} has no reference")
