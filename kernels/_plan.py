"""The coverage plan: which implementation each op and dtype would run on each backend."""

from __future__ import annotations

from typing import Any

import hal

__all__ = ["plan", "plan_devices"]


def plan_devices(backend: str | None = None) -> list[hal.Device]:
    """Return one device per available backend (or of ``backend`` only)."""
    if backend is not None:
        return [hal.device(backend)]
    out = []
    for info in hal.list_backends():
        if info.status == "available" and info.device_count:
            out.append(hal.device(f"{info.name}:0"))
    return out


def plan(backend: str | None = None) -> list[dict[str, Any]]:
    """Return the coverage table: one row per (backend, op, dtype).

    Each row: ``backend``, ``device``, ``op``, ``dtype``, ``implementation``
    (``dedicated``, ``generic``, ``host`` or ``unsupported``) and ``name`` (the dedicated
    implementation's name, or how the fallback runs).

    Raises:
        ValueError / hal.BackendUnavailableError: ``backend`` is unknown or unavailable.
    """
    from hal.kernels._ops import OPS, plan_route

    dtypes = sorted({d for spec in OPS.values() for d in spec.dtypes}, key=_dtype_order)
    rows = []
    for dev in plan_devices(backend):
        for op in OPS:
            for dt in dtypes:
                impl, name = plan_route(op, dev, dt)
                rows.append(
                    {
                        "backend": dev.backend,
                        "device": str(dev),
                        "op": op,
                        "dtype": dt,
                        "implementation": impl,
                        "name": name,
                    }
                )
    return rows


def _dtype_order(name: str) -> tuple[int, str]:
    order = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"]
    return (order.index(name) if name in order else len(order), name)
