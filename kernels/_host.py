"""The host route: copy inputs to the host, compute the NumPy reference, copy the result back.

Used where a device has no kernel capability (or not for the dtype). Correct, synchronous
on the stream, and recorded as ``host`` in dispatch records.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import hal
from hal.kernels._dispatch import OpCall
from hal.kernels._reference import reference

__all__ = ["run_host"]


def run_host(call: OpCall) -> None:
    """Compute ``call`` on the host and write ``call.out`` (waits for the stream twice)."""
    s = call.stream
    inputs = [a.to_host(stream=s) for a in call.inputs]
    params: dict[str, Any] = {}
    for k, v in call.params.items():
        params[k] = v.to_host(stream=s) if isinstance(v, hal.Array) else v
    if call.op == "accumulate":
        inputs = [call.out.to_host(stream=s), *inputs]
    res = reference(call.op, inputs, params, call.out.dtype)
    with np.errstate(all="ignore"):
        host = np.ascontiguousarray(
            np.asarray(res).astype(call.out.dtype, copy=False).reshape(call.out.shape)
        )
    hal.copy(call.out, host, stream=s)
    s.synchronize()
