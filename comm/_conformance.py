"""COMM-*: the conformance section of hal.comm (collectives across every device of a backend).

Each check builds an in-process communicator over the backend's devices (``backend`` scope,
two devices at least) and compares with NumPy. Registered through the
``hal_register_conformance`` hook of hal.comm's built-in plugin (comm/_builtin.py), as a
vendor's section is; being below the conformance layer it does not import it: the suite
declares the collected checks (:func:`declare_requirements`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import hal
from hal.plugins import DeferredRequirements

if TYPE_CHECKING:
    from hal.conformance.spi import Target

__all__ = ["declare_requirements"]

# This section sits in hal.comm, below the conformance layer, and never imports it: its checks
# are collected here and declared by the suite, which calls :func:`declare_requirements` with
# :mod:`hal.conformance.spi` after importing this module (registered by the
# ``hal_register_conformance`` hook of hal.comm's built-in plugin).
_section = DeferredRequirements()
requirement = _section.requirement
declare_requirements = _section.declare


def _setup(t: Target) -> tuple[Any, list[hal.Stream]]:
    import hal.comm

    comm = hal.comm.create(t.all_devices, timeout_ms=60_000)
    t._stack.callback(comm.close)
    return comm, [t.stream(d) for d in t.all_devices]


def _dtypes(t: Target) -> list[str]:
    return ["float32", "int32", "int64"] + (
        ["float64"] if all(d.capabilities.fp64 for d in t.all_devices) else []
    )


def _inputs(
    t: Target, n: int, dtype: str, lo: int = -20, hi: int = 20
) -> list[np.ndarray[Any, Any]]:
    return [t.rng.integers(lo, hi, n).astype(dtype) for _ in t.all_devices]


def _put(t: Target, xs: list[np.ndarray[Any, Any]]) -> list[hal.Array]:
    return [t.keep(hal.asarray(x, device=d)) for x, d in zip(xs, t.all_devices, strict=True)]


@requirement(
    "COMM-ALLREDUCE",
    "all_reduce over every device of the backend gives NumPy's sum, prod, max, min and avg, in "
    "place and out of place, for sizes that do not divide by the device count.",
    scope="backend",
    min_devices=2,
)
def _all_reduce(t: Target) -> None:
    comm, ss = _setup(t)
    p = len(t.all_devices)
    for dtype in _dtypes(t):
        for op in ("sum", "prod", "max", "min", "avg"):
            n = 2 * p + 1
            ins = _inputs(t, n, dtype, *((1, 3) if op == "prod" else (-20, 20)))
            fn = {
                "sum": np.add,
                "avg": np.add,
                "prod": np.multiply,
                "max": np.maximum,
                "min": np.minimum,
            }[op]
            want = ins[0].copy()
            for other in ins[1:]:
                fn(want, other, out=want)
            if op == "avg":
                want = (
                    (want / p).astype(dtype)
                    if want.dtype.kind == "f"
                    else np.trunc(want / p).astype(dtype)
                )
            xs = _put(t, ins)
            ys = _put(t, [np.zeros(n, dtype) for _ in ins])
            comm.all_reduce(xs, ys, op=op, streams=ss).wait()
            comm.all_reduce(xs, op=op, streams=ss).wait()
            for d, x, y in zip(t.all_devices, xs, ys, strict=True):
                for kind, result in (("out-of-place", y), ("in-place", x)):
                    got = result.to_host()
                    t.expect(
                        np.allclose(got, want, rtol=1e-6),
                        f"all_reduce {op} {dtype} {kind} on {d}: {got[:4]} != {want[:4]}",
                    )


@requirement(
    "COMM-COLLECTIVES",
    "all_gather, reduce_scatter, broadcast, reduce and all_to_all over every device match NumPy.",
    scope="backend",
    min_devices=2,
)
def _collectives(t: Target) -> None:
    comm, ss = _setup(t)
    p, n = len(t.all_devices), 5
    ins = _inputs(t, n * p, "float32")
    total: np.ndarray[Any, Any] = np.asarray(np.sum(ins, axis=0, dtype=np.float32))
    xs = _put(t, ins)
    g = _put(t, [np.zeros(n * p * p, np.float32) for _ in range(p)])
    comm.all_gather(xs, g, streams=ss).wait()
    rs = _put(t, [np.zeros(n, np.float32) for _ in range(p)])
    comm.reduce_scatter(xs, rs, streams=ss).wait()
    a2a = _put(t, [np.zeros(n * p, np.float32) for _ in range(p)])
    comm.all_to_all(xs, a2a, streams=ss).wait()
    red = _put(t, [np.zeros(n * p, np.float32) for _ in range(p)])
    comm.reduce(xs, red, root=p - 1, streams=ss).wait()
    comm.broadcast(xs, root=1, streams=ss).wait()
    for r, d in enumerate(t.all_devices):
        t.expect(np.array_equal(g[r].to_host(), np.concatenate(ins)), f"all_gather wrong on {d}")
        t.expect(
            np.array_equal(rs[r].to_host(), total[r * n : (r + 1) * n]),
            f"reduce_scatter wrong on {d}",
        )
        want = np.concatenate([ins[k][r * n : (r + 1) * n] for k in range(p)])
        t.expect(np.array_equal(a2a[r].to_host(), want), f"all_to_all wrong on {d}")
        t.expect(np.array_equal(xs[r].to_host(), ins[1]), f"broadcast from device 1 wrong on {d}")
    t.expect(np.array_equal(red[p - 1].to_host(), total), "reduce to the last device is wrong")


@requirement(
    "COMM-ZERO-SIZE",
    "Collectives of zero elements complete on every device.",
    scope="backend",
    min_devices=2,
)
def _zero(t: Target) -> None:
    comm, ss = _setup(t)
    xs = _put(t, [np.zeros(0, np.float32) for _ in t.all_devices])
    comm.all_reduce(xs, streams=ss).wait()
    comm.broadcast(xs, root=0, streams=ss).wait()
    comm.all_gather(None, xs, streams=ss).wait()


@requirement(
    "COMM-PATH",
    "The plan of a collective says 'peer' when every pair of devices has a peer path, 'staged' otherwise.",
    scope="backend",
    min_devices=2,
)
def _path(t: Target) -> None:
    comm, ss = _setup(t)
    devs = t.all_devices
    xs = _put(t, [np.ones(3, np.float32) for _ in devs])
    work = comm.all_reduce(xs, streams=ss)
    work.wait()
    for d, plan in zip(devs, work.plan, strict=True):
        want = "peer" if all(d.can_access_peer(o) for o in devs if o != d) else "staged"
        t.expect(plan.path == want, f"plan path on {d} is {plan.path!r}, expected {want!r}")
    t.attach("plan", work.plan[0].to_dict())


@requirement(
    "COMM-ARGS",
    "Bad collective arguments (op, dtype, sizes, streams of other devices) raise before any device memory changes.",
    scope="backend",
    min_devices=2,
)
def _args(t: Target) -> None:
    comm, ss = _setup(t)
    ins = _inputs(t, 4, "float32")
    xs = _put(t, ins)
    bad: list[tuple[str, Any]] = [
        ("op='mean'", lambda: comm.all_reduce(xs, op="mean", streams=ss)),
        ("streams reversed", lambda: comm.all_reduce(xs, streams=ss[::-1])),
        ("root out of range", lambda: comm.broadcast(xs, root=len(xs), streams=ss)),
        (
            "complex64",
            lambda: comm.all_reduce(_put(t, [np.zeros(4, np.complex64) for _ in xs]), streams=ss),
        ),
    ]
    for what, call in bad:
        try:
            call()
        except (ValueError, TypeError, hal.HalError):
            pass
        else:
            raise t.fail(f"{what} was accepted")
    for d, x, want in zip(t.all_devices, xs, ins, strict=True):
        t.expect(np.array_equal(x.to_host(), want), f"a rejected call changed memory on {d}")
