"""New elementwise ops defined outside hal.kernels: reference, generic kernel, tolerances.

:func:`define_op` adds an op to the library as the built-in ones are made: a NumPy
reference (the host route and the accuracy table's truth), a generic kernel written as one
expression of the portable kernel language (compiled for every backend that declares
``kernels``), optional per-dtype tolerances, and, like every op, dedicated implementations
that backends register with ``registry.add(name, backend, impl)`` (``hal_register_kernels``)
or :func:`hal.kernels.spi.register`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

import hal
from hal.kernels import _ops
from hal.kernels._dispatch import OpCall

__all__ = ["CUSTOM", "CustomOp", "define_op"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class CustomOp:
    """What :func:`define_op` recorded for one op (read by the accuracy table)."""

    name: str
    arity: int
    reference: Callable[..., Any]
    expression: str
    tolerances: Mapping[str, tuple[float, float]]
    input_range: tuple[float, float]


#: name -> definition, for every op added with :func:`define_op`
CUSTOM: dict[str, CustomOp] = {}


def _source(name: str, arity: int, expression: str) -> str:
    params = ", ".join(f"HAL_GLOBAL const T* in{k}" for k in range(arity))
    loads = " ".join(f"CT {v} = (CT)in{k}[i];" for k, v in enumerate("xy"[:arity]))
    return (
        f"HAL_KERNEL void {name}(HAL_GLOBAL T* out, {params}, hal_i64 n) {{\n"
        "    hal_i64 i = HAL_GLOBAL_ID(0);\n"
        f"    {{ {loads} out[i] = (T)({expression}); }}\n"
        "}\n"
    )


def define_op(
    name: str,
    *,
    summary: str,
    reference: Callable[..., Any],
    expression: str,
    arity: int = 1,
    dtypes: Sequence[str] = _ops.FLOAT_DTYPES,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    input_range: tuple[float, float] = (-8.0, 8.0),
) -> Callable[..., hal.Array]:
    """Add the elementwise op ``name`` to hal.kernels and return its function.

    The function is called like the built-in ops: ``fn(x[, y], *, out=None, stream)``; it is
    also registered among the ops (``hal.kernels.spi.OPS[name]``), appears in ``hal kernels plan`` and the accuracy
    table (``KERN-ACCURACY``), and dedicated implementations can be registered for it.

    Args:
        name: the op name (lower case, digits, ``_``; not an existing op).
        summary: one line for plans and docs (``"out = x * x"``).
        reference: NumPy function of the inputs (float64 arrays) returning the exact result:
            the host route and the accuracy table's truth.
        expression: the generic kernel, one expression of the portable kernel language over
            ``x`` (and ``y`` when ``arity`` is 2) of type ``CT`` (``hal_f32`` for float16 and
            float32, ``hal_f64`` for float64), e.g. ``"x * x + (CT)1"``.
        arity: 1 or 2 inputs of the same shape and dtype.
        dtypes: the float dtypes the op takes (default float16, bfloat16, float32, float64).
        tolerances: ``{dtype: (rtol, atol)}`` replacing the default (PyTorch's) tolerances.
        input_range: the range of the random inputs of the accuracy table.

    Raises:
        ValueError: a bad or taken name, arity, dtype, tolerance or an empty expression.
        TypeError: ``reference`` is not callable.
    """
    from hal.kernels import _generic

    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{name=} must be lower case letters, digits and '_'")
    if name in _ops.OPS:
        raise ValueError(f"op {name!r} already exists")
    if arity not in (1, 2):
        raise ValueError(f"{arity=} must be 1 or 2")
    if not callable(reference):
        raise TypeError(f"reference={reference!r} is not callable")
    if not isinstance(expression, str) or not expression.strip() or "\n" in expression:
        raise ValueError(f"{expression=} must be one non-empty line")
    dts = tuple(d if isinstance(d, str) else np.dtype(d).name for d in dtypes)
    bad = [d for d in dts if d not in _ops.FLOAT_DTYPES]
    if not dts or bad:
        raise ValueError(
            f"dtypes={list(dtypes)!r}: custom ops take float dtypes {list(_ops.FLOAT_DTYPES)}"
        )
    tols = dict(tolerances or {})
    for d, pair in tols.items():
        if d not in dts or len(pair) != 2 or min(pair) < 0:
            raise ValueError(
                f"tolerances[{d!r}]={pair!r} must be (rtol >= 0, atol >= 0) for a dtype of the op"
            )
    group = f"op:{name}"
    _generic.SOURCES[group] = _source(name, arity, expression)

    def generic(call: OpCall) -> str:
        p = _generic.program_for(call.device, group, call.dtype)
        n = call.out.size
        p.launch(name, n, [call.out, *call.inputs, n], stream=call.stream, work=n)
        return f"{p.hash}:{name}"

    if arity == 1:

        def fn(x: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream) -> hal.Array:
            return _ops._unary(name, x, out, stream)
    else:

        def fn(  # type: ignore[misc]
            x: hal.Array, y: hal.Array, *, out: hal.Array | None = None, stream: hal.Stream
        ) -> hal.Array:
            return _ops._binary(name, x, y, out, stream)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{summary} (an op added with hal.kernels.spi.define_op)."
    CUSTOM[name] = CustomOp(name, arity, reference, expression, tols, input_range)
    _generic.GENERIC[name] = generic
    _ops.OP_FUNCTIONS[name] = fn
    _ops.OPS[name] = _ops.OpSpec(name, dts, "elementwise", summary)
    return fn
