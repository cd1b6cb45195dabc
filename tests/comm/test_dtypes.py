"""Half-precision and 8-bit collectives (issue #11, item 5), checked against a float64 reference.

float16/bfloat16 reductions accumulate in float32 and round once (docs/comm.md, "dtypes and
accuracy"): with 2 ranks the result is the float64 result correctly rounded (bit-exact); with N
ranks it is within ``1/2 ulp + (N-1) * 2**-24 * sum|x|`` of it. int8/uint8 wrap like NCCL/torch;
their ``avg`` truncates the wrapped sum divided by the rank count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hal
import hal.comm

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
HALVES = [F16, BF16]
#: mantissa bits (with the implicit one) and the smallest normal exponent of each half type
_PRECISION = {"float16": (11, -14), "bfloat16": (8, -126)}

pytestmark = pytest.mark.usefixtures("requires_cpu")


def _ulp(x: np.ndarray[Any, Any], dt: np.dtype[Any]) -> np.ndarray[Any, Any]:
    p, emin = _PRECISION[dt.name]
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0**emin)))
    return 2.0 ** (e - (p - 1))


def _reference(ins: list[np.ndarray[Any, Any]], op: str) -> np.ndarray[Any, Any]:
    xs = np.stack([x.astype(np.float64) for x in ins])
    if op in ("sum", "avg"):
        out = xs.sum(axis=0)
        return out / len(ins) if op == "avg" else out
    return {"prod": np.prod, "max": np.max, "min": np.min}[op](xs, axis=0)


@pytest.fixture
def pair() -> Iterator[tuple[hal.comm.DeviceCommunicator, list[hal.Stream]]]:
    devs = hal.devices("cpu")[:2]
    comm = hal.comm.create(devs)
    yield comm, [d.create_stream() for d in devs]
    comm.close()


def _inputs(
    dt: np.dtype[Any], ranks: int, n: int, seed: int, scale: float = 100.0
) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * scale).astype(dt) for _ in range(ranks)]


@pytest.mark.parametrize("dt", HALVES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["sum", "avg", "prod", "max", "min"])
def test_two_ranks_are_the_float64_result_rounded_once(
    pair: Any, dt: np.dtype[Any], op: str
) -> None:
    comm, ss = pair
    ins = _inputs(
        dt, 2, 4099, seed=hash((dt.name, op)) % 1000, scale=3.0 if op == "prod" else 100.0
    )
    xs = [hal.asarray(x, device=d) for x, d in zip(ins, comm.devices, strict=True)]
    outs = [hal.asarray(np.zeros_like(x), device=d) for x, d in zip(ins, comm.devices, strict=True)]
    comm.all_reduce(xs, outs, op=op, streams=ss).wait()
    want = _reference(ins, op).astype(dt)  # a two-input float64 result is exact here; one rounding
    for o, x, i in zip(outs, xs, ins, strict=True):
        assert o.dtype == dt
        np.testing.assert_array_equal(o.to_host().view(np.uint16), want.view(np.uint16))
        np.testing.assert_array_equal(
            x.to_host().view(np.uint16), i.view(np.uint16)
        )  # input untouched


@pytest.mark.parametrize("dt", HALVES, ids=lambda d: d.name)
def test_reduce_scatter_and_reduce_round_once(pair: Any, dt: np.dtype[Any]) -> None:
    comm, ss = pair
    ins = _inputs(dt, 2, 13, seed=7)
    want = _reference(ins, "sum").astype(dt)
    xs = [hal.asarray(x, device=d) for x, d in zip(ins, comm.devices, strict=True)]
    comm.reduce_scatter(xs, op="sum", streams=ss).wait()  # in place: each rank's segment of send
    np.testing.assert_array_equal(xs[0].to_host()[:7].view(np.uint16), want[:7].view(np.uint16))
    np.testing.assert_array_equal(xs[1].to_host()[7:].view(np.uint16), want[7:].view(np.uint16))
    xs = [hal.asarray(x, device=d) for x, d in zip(ins, comm.devices, strict=True)]
    comm.reduce(xs, op="avg", root=1, streams=ss).wait()
    avg = _reference(ins, "avg").astype(dt)
    np.testing.assert_array_equal(xs[1].to_host().view(np.uint16), avg.view(np.uint16))
    np.testing.assert_array_equal(
        xs[0].to_host().view(np.uint16), ins[0].view(np.uint16)
    )  # not the root


def test_four_ranks_within_the_stated_bound() -> None:
    """Two emulator and two PoCL devices (mixed backends, staged copies): N = 4."""
    if "opencl" not in [d.backend for d in hal.devices()] or len(hal.devices("opencl")) < 2:
        pytest.skip("needs two OpenCL devices (POCL_DEVICES='pthread pthread')")
    devs = hal.devices("cpu")[:2] + hal.devices("opencl")[:2]
    with hal.comm.create(devs) as comm:
        ss = [d.create_stream() for d in devs]
        for dt in HALVES:
            # cancellation on purpose: large terms that nearly cancel, and ordinary ones
            ins = _inputs(dt, 4, 1000, seed=11)
            ins[3][:500] = (
                -(ins[0][:500].astype(np.float64) + ins[1][:500] + ins[2][:500])
            ).astype(dt)
            for op in ("sum", "avg", "max", "min"):
                xs = [hal.asarray(x, device=d) for x, d in zip(ins, devs, strict=True)]
                comm.all_reduce(xs, op=op, streams=ss).wait()
                ref = _reference(ins, op)
                bound = 0.5 * _ulp(ref, dt) + 3 * 2.0**-24 * np.abs(
                    np.stack(ins).astype(np.float64)
                ).sum(axis=0)
                for x in xs:
                    err = np.abs(x.to_host().astype(np.float64) - ref)
                    assert np.all(err <= bound), (dt.name, op, float(err.max()))
                    if op in ("max", "min"):
                        np.testing.assert_array_equal(x.to_host().astype(np.float64), ref)


@pytest.mark.parametrize("dt", [np.dtype(np.int8), np.dtype(np.uint8)], ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_int8_uint8_wrap(pair: Any, dt: np.dtype[Any], op: str) -> None:
    comm, ss = pair
    info = np.iinfo(dt)
    rng = np.random.default_rng(3)
    ins = [rng.integers(info.min, info.max, 300, endpoint=True).astype(dt) for _ in range(2)]
    ins[0][:3], ins[1][:3] = (
        np.array([100, 127, 2], dt),
        np.array([100, 1, 3], dt),
    )  # 200 and 128 wrap
    xs = [hal.asarray(x, device=d) for x, d in zip(ins, comm.devices, strict=True)]
    comm.all_reduce(xs, op=op, streams=ss).wait()
    with np.errstate(over="ignore"):
        if op in ("sum", "avg"):
            want = np.add(ins[0], ins[1], dtype=dt)  # two's complement wrap
            if op == "avg":
                want = np.trunc(want.astype(np.float64) / 2).astype(dt)
        else:
            want = {"prod": np.multiply, "max": np.maximum, "min": np.minimum}[op](
                ins[0], ins[1], dtype=dt
            )
    for x in xs:
        np.testing.assert_array_equal(x.to_host(), want)
    if op == "sum" and dt == np.int8:
        assert xs[0].to_host()[:2].tolist() == [-56, -128]


def test_comm_internal_ops_are_not_user_fallbacks(pair: Any) -> None:
    """The casts and avg scale of a half-precision all_reduce run as hal.kernels.internal() ops."""
    import hal.kernels
    from hal.kernels import _dispatch

    comm, ss = pair
    before = dict(_dispatch.fallback_counts())
    xs = [hal.asarray(np.ones(8, BF16), device=d) for d in comm.devices]
    with hal.kernels.trace() as records:
        comm.all_reduce(xs, op="avg", streams=ss).wait()
    assert {"cast", "scale"} <= {r.op for r in records}  # they ran (and were recorded) ...
    assert dict(_dispatch.fallback_counts()) == before  # ... but are not the user's fallbacks
    np.testing.assert_array_equal(xs[0].to_host().astype(np.float32), np.ones(8, np.float32))


def test_unsupported_dtypes_name_rank_and_dtype(pair: Any) -> None:
    comm, ss = pair
    for dt in (np.int16, np.uint32, np.complex64, np.bool_):
        xs = [hal.asarray(np.zeros(4, dt), device=d) for d in comm.devices]
        with pytest.raises(
            TypeError, match=rf"rank 0: send\.dtype={np.dtype(dt).name} is not supported"
        ):
            comm.all_reduce(xs, streams=ss)
    assert comm.last_plan is None


_LAZY = """
import sys

import numpy as np

import hal
import hal.comm
import hal.comm.spi
import hal.kernels

devs = hal.devices("cpu")[:2]
comm = hal.comm.create(devs)
ss = [d.create_stream() for d in devs]
xs = [hal.asarray(np.ones(8, np.float16), device=d) for d in devs]
comm.all_reduce(xs, op="avg", streams=ss).wait()  # a half-precision reduction without bfloat16
assert hal.comm.spi.REDUCE_OPS == hal.comm.REDUCE_OPS
print("before", "ml_dtypes" in sys.modules)
y = hal.kernels.cast(xs[0], "bfloat16", stream=ss[0])  # a bfloat16 by name imports it
print("cast", y.dtype.name, "ml_dtypes" in sys.modules)
print("DTYPES", [dt.name for dt in hal.comm.DTYPES], hal.comm.spi.DTYPES is hal.comm.DTYPES)
comm.close()
"""


def test_ml_dtypes_is_imported_only_for_bfloat16() -> None:
    """Importing ml_dtypes costs ~1.3 s of CPU (0.7.0): hal.comm and hal.kernels import it only
    when bfloat16 is involved (a dtype named "bfloat16", DTYPES), never at import or for other dtypes."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _LAZY], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out == [
        "before False",
        "cast bfloat16 True",
        "DTYPES ['float32', 'float64', 'int32', 'int64', 'float16', 'bfloat16', 'int8', 'uint8'] True",
    ]


def test_bfloat16_by_name_and_by_dtype() -> None:
    """``check_dtype`` takes bfloat16 by name and as ``ml_dtypes.bfloat16``; it is a half dtype."""
    from hal.comm import _ops

    assert _ops.check_dtype("bfloat16") == BF16
    assert _ops.check_dtype(BF16) == BF16
    assert _ops.check_dtype(ml_dtypes.bfloat16) == BF16
    assert BF16 in hal.comm.DTYPES and BF16 in _ops.HALF_DTYPES
    with pytest.raises(
        TypeError, match=r"dtype=float8_e4m3fn is not supported by hal.comm; .*bfloat16"
    ):
        _ops.check_dtype(
            ml_dtypes.float8_e4m3fn
        )  # another ml_dtypes type: refused, naming the list
