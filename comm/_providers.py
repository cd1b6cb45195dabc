"""Collective providers: dedicated engines (MPI's own collectives, NCCL) that take whole collectives.

hal.comm's algorithms (ring, trees ... over a transport) are the portable path, ``generic``.
A provider, registered through the ``hal_register_collective_providers`` hook, runs a whole
collective with a library's own implementation for the devices and launchers it serves. At
:func:`hal.comm.init` every rank says which providers it can use and why not; the first
provider (in registration order: ``nccl``, ``mpi``, then plugins') that every rank can use
serves the communicator, unless ``HAL_COMM_PROVIDER=generic|nccl|mpi|<plugin's>`` forces one
(a forced provider some rank cannot use is a :class:`hal.CommError` saying why, per rank).
Each call then goes to the provider when it takes the call (its collectives, dtypes, ops, and
no ``HAL_COMM_ALGO`` override for that collective); a call it declines falls back to the
generic algorithms, logged once per reason as a warning on logger ``hal.comm``. ``work.plan.provider``
and the timeline slice (``provider``) say which ran.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

import hal
from hal.comm._algorithms import split
from hal.comm._plan import Plan
from hal.spi import setting

__all__ = [
    "GENERIC",
    "CollectiveProvider",
    "MpiProvider",
    "NcclProvider",
    "ProviderRegistry",
    "choose",
    "providers",
]

_log = logging.getLogger("hal.comm")
GENERIC = "generic"
#: Collectives a provider may take (point-to-point calls always run hal's own phases).
PROVIDER_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "barrier",
)
_REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")


class CollectiveProvider:
    """Base class of a collective provider (register a subclass with ``registry.add``).

    Class attributes: ``name`` (what ``HAL_COMM_PROVIDER`` and ``work.plan.provider`` say),
    ``collectives`` (those it can take), ``serves`` (which devices and launchers, in words,
    for ``hal doctor`` and the docs), ``alpha_s``/``beta_s_per_byte`` (its latency and inverse
    bandwidth for the cost model and ``hal simulate``).
    """

    name: ClassVar[str] = ""
    collectives: ClassVar[frozenset[str]] = frozenset()
    serves: ClassVar[str] = ""
    #: True when two ranks may not share a device (NCCL: "duplicate GPU"); checked across ranks
    one_rank_per_device: ClassVar[bool] = False
    alpha_s: ClassVar[float] = 20e-6
    beta_s_per_byte: ClassVar[float] = 1 / 5e9

    @classmethod
    def unavailable(
        cls, *, device: hal.Device, launcher: str, size: int, transport: str | None
    ) -> str | None:
        """Return why this rank cannot use the provider (plain words), or None. Local, cheap, no I/O."""
        raise NotImplementedError

    def __init__(self, *, rank: int, size: int, device: hal.Device, bootstrap: Any) -> None:
        """Connect the provider (collective: every rank constructs it; ``bootstrap.allgather`` is usable)."""
        self.rank, self.size, self.device = rank, size, device

    def declines(self, collective: str, dtype: str, op: str) -> str | None:
        """Return why this call goes to the generic algorithms instead, or None to take it."""
        if collective not in self.collectives:
            return f"{self.name} does not provide {collective}"
        return None

    def run(self, call: Any, ctx: Any) -> hal.Array | None:
        """Run ``call`` (a validated :class:`hal.comm._engine.Call`) whole; return the array to average (op avg).

        Called on the engine's thread after the caller's earlier work on its stream is complete.
        Must end within ``ctx.timeout_s`` (a :class:`hal.CommError` naming the call otherwise)
        and stop when ``ctx.aborted`` is set.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release the provider's resources. Idempotent."""

    # Optional: ``agree(signature: bytes, call, ctx) -> list[bytes]`` returns every rank's call
    # signature (index = rank) through the provider's own library; without it the engine
    # exchanges the signatures over the transport before :meth:`run`.


class ProviderRegistry:
    """Collects provider classes from the ``hal_register_collective_providers`` hooks."""

    def __init__(self) -> None:
        self._classes: dict[str, type[CollectiveProvider]] = {}
        #: the plugin that registered each provider
        self.owners: dict[str, str] = {}
        self._plugin = ""

    def add(self, provider_cls: type[CollectiveProvider]) -> None:
        """Register ``provider_cls`` (a subclass of :class:`CollectiveProvider` with a unique ``name``)."""
        if not (isinstance(provider_cls, type) and issubclass(provider_cls, CollectiveProvider)):
            raise TypeError(
                f"provider_cls={provider_cls!r} is not a subclass of hal.comm.spi.CollectiveProvider"
            )
        name = provider_cls.name
        if not isinstance(name, str) or not name.isidentifier() or name == GENERIC:
            raise ValueError(
                f"{provider_cls.__qualname__}.name={name!r} must be an identifier other than 'generic'"
            )
        if name in self._classes and self._classes[name] is not provider_cls:
            raise ValueError(
                f"collective provider {name!r} is already registered by {self._classes[name].__module__}"
            )
        self._classes[name] = provider_cls
        self.owners.setdefault(name, self._plugin)

    def get(self, name: str) -> type[CollectiveProvider]:
        """Return the provider class called ``name``."""
        try:
            return self._classes[name]
        except KeyError:
            raise ValueError(
                f"collective provider {name!r} is not registered; known: {', '.join([GENERIC, *self.names])}"
            ) from None

    @property
    def names(self) -> list[str]:
        """Registered provider names, in registration (preference) order."""
        return list(self._classes)

    def availability(
        self, *, device: hal.Device, launcher: str, size: int, transport: str | None
    ) -> dict[str, str | None]:
        """Return ``{name: why this rank cannot use it, or None}`` for every provider."""
        out: dict[str, str | None] = {}
        for name, cls in self._classes.items():
            try:
                out[name] = cls.unavailable(
                    device=device, launcher=launcher, size=size, transport=transport
                )
            except Exception as exc:  # noqa: BLE001 - a provider's probe must not break init
                out[name] = f"its availability check raised {type(exc).__name__}: {exc}"
        return out


_registry: ProviderRegistry | None = None
_registry_lock = threading.Lock()


def providers() -> ProviderRegistry:
    """Return the provider registry, filled by every plugin's ``hal_register_collective_providers`` hook."""
    global _registry
    with _registry_lock:
        if _registry is None:
            from hal.comm._builtin import plugin_system

            system = plugin_system()
            reg = ProviderRegistry()
            system.call_plugin_hook(
                "hal_register_collective_providers",
                registry=reg,
                on_plugin=lambda n: setattr(reg, "_plugin", n),
            )
            # hal's own providers come first whenever the plugins were registered
            # (pluggy's order follows registration, and ours registers lazily)
            first = [n for n in reg.names if reg.owners.get(n) == "hal.comm.builtin"]
            reg._classes = {
                n: reg._classes[n] for n in [*first, *(n for n in reg.names if n not in first)]
            }
            _registry = reg
        return _registry


def _forget_providers() -> None:
    global _registry
    with _registry_lock:
        _registry = None


hal.runtime().register_cache("hal.comm.providers", _forget_providers)


def forced(
    env: Mapping[str, str] | None = None,
    *,
    value: str | None = None,
    label: str = "HAL_COMM_PROVIDER",
) -> str | None:
    """Return the provider asked for: ``value`` (``CommOptions.provider``), else ``HAL_COMM_PROVIDER``.

    None when neither is set: the first provider every rank can use.

    Raises:
        ValueError: it names no registered provider (nor ``generic``); the message lists them.
    """
    name = "HAL_COMM_PROVIDER" if value is None else label
    raw = str(value if value is not None else setting("HAL_COMM_PROVIDER", env) or "")
    raw = raw.strip().lower()
    if not raw:
        return None
    if raw != GENERIC and raw not in providers().names:
        raise hal.ConfigError(
            name,
            raw,
            ", ".join([GENERIC, *providers().names]),
            "is not a collective provider",
        )
    return raw


def choose(
    force: str | None,
    tables: Sequence[Mapping[str, str | None]],
    names: Sequence[str],
    placements: Sequence[tuple[str, str]] | None = None,
    exclusive: Sequence[str] = (),
) -> tuple[str, str]:
    """Return ``(provider, why)`` from every rank's :meth:`ProviderRegistry.availability`.

    ``placements`` are the ranks' (host, device); a provider named in ``exclusive`` (its
    ``one_rank_per_device``) cannot serve ranks that share a device.

    Raises:
        hal.CommError: ``force`` names a provider some rank cannot use (each such rank and its reason).
    """
    shared: dict[int, str] = {}
    if placements is not None:
        first: dict[tuple[str, str], int] = {}
        for r, where in enumerate(placements):
            if where in first:
                shared[r] = (
                    f"it shares {where[1]} on host {where[0]} with rank {first[where]} (one rank per device)"
                )
            else:
                first[where] = r

    def reasons(name: str) -> list[tuple[int, str]]:
        out = []
        for r, t in enumerate(tables):
            why = t.get(name, "not registered on this rank")
            if not why and name in exclusive and r in shared:
                why = shared[r]
            if why:
                out.append((r, str(why)))
        return out

    if force == GENERIC:
        return GENERIC, "HAL_COMM_PROVIDER=generic"
    if force is not None:
        bad = reasons(force)
        if bad:
            raise hal.CommError(
                f"HAL_COMM_PROVIDER={force} cannot serve this communicator: "
                + "; ".join(f"rank {r}: {why}" for r, why in bad)
                + " -- unset HAL_COMM_PROVIDER (or set it to generic) to use hal's own algorithms",
                op="init",
                ranks=tuple(r for r, _ in bad),
            )
        return force, "HAL_COMM_PROVIDER"
    skipped = []
    for name in names:
        bad = reasons(name)
        if not bad:
            return name, "every rank can use it"
        r, why = bad[0]
        skipped.append(f"{name}: rank {r}: {why}")
    return GENERIC, "; ".join(skipped) or "no provider registered"


_fallbacks: set[tuple[str, str]] = set()
_fallback_lock = threading.Lock()


def note_fallback(provider: str, collective: str, why: str) -> None:
    """Log (once per provider, collective and reason) that a call fell back to the generic algorithms."""
    key = (f"{provider}:{collective}", why)
    with _fallback_lock:
        if key in _fallbacks:
            return
        _fallbacks.add(key)
    _log.warning(
        "%s fell back from collective provider %s to the generic algorithms: %s",
        collective,
        provider,
        why,
    )


def provider_plan(
    plan: Plan,
    provider: CollectiveProvider,
    collective: str,
    dtype: str,
    op: str,
    override: str | None,
) -> Plan:
    """Return ``plan`` for a call on a communicator that ``provider`` serves: the provider's, or a fallback.

    A call the provider declines keeps the generic plan with ``fallback`` saying why (logged
    once per reason); an ``HAL_COMM_ALGO`` override of the collective asks for hal's own
    algorithm and is not logged as a fallback.
    """
    if collective in ("send", "recv"):
        return plan
    if override is not None:
        return dataclasses.replace(plan, fallback=f"HAL_COMM_ALGO asks {collective}:{override}")
    why = provider.declines(collective, dtype, op)
    if why is not None:
        note_fallback(provider.name, collective, why)
        return dataclasses.replace(plan, fallback=why)
    from hal.comm._plan import predict_provider

    t = predict_provider(
        collective, plan.nbytes, plan.ranks, provider.alpha_s, provider.beta_s_per_byte
    )
    return dataclasses.replace(
        plan,
        algorithm=provider.name,
        provider=provider.name,
        path="provider",
        chunk_bytes=0,
        predicted_us=t * 1e6,
        chosen_by=f"provider {provider.name}",
    )


# -- MPI ----------------------------------------------------------------------------------
_HOST_DL = (1, 3)  # kDLCPU, kDLCUDAHost


def _host(arr: hal.Array) -> np.ndarray[Any, Any]:
    """A writable NumPy view of ``arr``'s host memory (DLPack, zero-copy)."""
    return np.from_dlpack(arr).reshape(-1)


def _wait(req: Any, call: Any, ctx: Any, rank: int, who: str) -> None:
    """Poll ``req`` until done, the timeout, or an abort (a CommError naming the call)."""
    start = time.monotonic()
    spin = 0
    # MPI progresses a non-blocking collective only inside Test() (no progress thread): poll,
    # yielding the core, for the first 5 ms, then sleep between polls (a sleep lasts about 1 ms
    # here and adds itself to every message round of the collective once the last rank arrives)
    while not req.Test():
        if ctx.aborted is not None and ctx.aborted.is_set():
            raise hal.CommError(
                f"{call.collective} (seq {call.plan.seq}) aborted on rank {rank}",
                op=call.collective,
            )
        if time.monotonic() - start > ctx.timeout_s:
            raise hal.CommError(
                f"{call.collective} (seq {call.plan.seq}) through {who} did not complete within {ctx.timeout_s:g} s "
                f"on rank {rank} (HAL_COMM_TIMEOUT_MS): every rank agreed to it, so a rank stopped or the "
                "library is stuck",
                op=call.collective,
                ranks=(rank,),
            )
        spin += 1
        if time.monotonic() - start < 5e-3:
            os.sched_yield()
        else:
            time.sleep(1e-4)


class MpiProvider(CollectiveProvider):
    """MPI's own collectives (``MPI_Iallreduce`` ...) through mpi4py, on host-memory devices under mpiexec."""

    name = "mpi"
    collectives = frozenset(PROVIDER_COLLECTIVES)
    serves = "devices whose memory is host memory (DLPack kDLCPU: the CPU emulator), ranks started by mpiexec"
    # measured here (MPICH 5.0.2 wheel, mpiexec -n 2, mpi4py Allreduce of float32): 8 B in 4.8 us,
    # 16 MiB in 12.4 ms (= n(β+γ) with γ = GAMMA_S_PER_BYTE)
    alpha_s = 5e-6
    beta_s_per_byte = 1 / 4e9

    @classmethod
    def unavailable(
        cls, *, device: hal.Device, launcher: str, size: int, transport: str | None
    ) -> str | None:
        """Refuse without mpi4py, outside mpiexec, or on devices whose memory the host cannot address."""
        if launcher != "mpi":
            return f"the ranks were not started by mpiexec (launcher {launcher})"
        try:
            from mpi4py import MPI
        except ImportError as exc:
            return f"mpi4py is not importable ({exc}); pip install 'hal-sdk[mpi]'"
        if MPI.COMM_WORLD.Get_size() != size:
            return f"MPI.COMM_WORLD has {MPI.COMM_WORLD.Get_size()} ranks, the communicator {size}"
        if not device.capabilities.dlpack:
            return f"{device} does not export its memory through DLPack, so MPI cannot address it"
        with device.alloc(64) as buf:
            kind = buf.view(np.uint8, 64).__dlpack_device__()[0]
        if kind not in _HOST_DL:
            return f"{device} memory is not host memory (DLPack device type {kind})"
        return None

    def __init__(self, *, rank: int, size: int, device: hal.Device, bootstrap: Any) -> None:
        super().__init__(rank=rank, size=size, device=device, bootstrap=bootstrap)
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD.Dup()
        if self._comm.Get_rank() != rank:
            self._comm.Free()
            raise hal.CommError(
                f"MPI rank {self._comm.Get_rank()} differs from the communicator rank {rank}",
                op="init",
            )
        self._ops = {
            "sum": MPI.SUM,
            "avg": MPI.SUM,
            "prod": MPI.PROD,
            "max": MPI.MAX,
            "min": MPI.MIN,
        }
        self._closed = False

    def declines(self, collective: str, dtype: str, op: str) -> str | None:
        """Decline reductions of dtypes MPI has no arithmetic for (float16, bfloat16)."""
        why = super().declines(collective, dtype, op)
        if why is None and collective in _REDUCTIONS:
            if dtype in ("float16", "bfloat16"):
                return f"MPI has no {dtype} arithmetic for {op}"
            if op not in self._ops:
                return f"MPI has no reduction op {op!r}"
        return why

    def agree(self, signature: bytes, call: Any, ctx: Any) -> list[bytes]:
        """Exchange the call signatures of every rank with one ``MPI_Iallgather`` (the engine compares them).

        Optional for a provider: without ``agree`` the engine exchanges them over the transport.
        """
        mine = np.frombuffer(signature, dtype=np.uint8)
        out = np.empty((self.size, mine.size), dtype=np.uint8)
        _wait(
            self._comm.Iallgather(mine, out),
            call,
            ctx,
            self.rank,
            "MPI_Iallgather of the call signatures",
        )
        return [row.tobytes() for row in out]

    def run(self, call: Any, ctx: Any) -> hal.Array | None:
        """Run ``call`` with the matching non-blocking MPI collective on host views of its arrays."""
        MPI, c, coll = self._mpi, self._comm, call.collective
        out: hal.Array | None = None
        if coll == "barrier":
            req = c.Ibarrier()
        elif coll == "all_reduce":
            r = _host(call.recv)
            if call.recv is call.send:
                req = c.Iallreduce(MPI.IN_PLACE, r, self._ops[call.op])
            else:
                req = c.Iallreduce(_host(call.send), r, self._ops[call.op])
            out = call.recv
        elif coll == "all_gather":  # bytes: any dtype
            r = _host(call.recv).view(np.uint8)
            if call.send is None:
                req = c.Iallgather(MPI.IN_PLACE, r)
            else:
                req = c.Iallgather(_host(call.send).view(np.uint8), r)
        elif coll == "reduce_scatter":
            s = _host(call.send)
            counts = [n for _, n in split(s.size, self.size)]
            start = sum(counts[: self.rank])
            tmp = (
                np.empty(counts[self.rank], dtype=s.dtype)
                if call.recv is None
                else _host(call.recv)
            )
            req = c.Ireduce_scatter(s, tmp, counts, self._ops[call.op])
            _wait(req, call, ctx, self.rank, "MPI_Ireduce_scatter")
            if call.recv is None:
                s[start : start + counts[self.rank]] = tmp
                from hal.comm._ops import sub

                return sub(call.send, start, counts[self.rank])
            return call.recv
        elif coll == "broadcast":
            buf = call.send if call.recv is None else call.recv
            b = _host(buf).view(np.uint8)
            if call.recv is not None and self.rank == call.root:
                b[:] = _host(call.send).view(np.uint8)
            req = c.Ibcast(b, root=call.root)
        elif coll == "reduce":
            op = self._ops[call.op]
            if self.rank == call.root:
                r = _host(call.send if call.recv is None else call.recv)
                if call.recv is None:
                    req = c.Ireduce(MPI.IN_PLACE, r, op, root=call.root)
                else:
                    req = c.Ireduce(_host(call.send), r, op, root=call.root)
                out = call.send if call.recv is None else call.recv
            else:
                req = c.Ireduce(_host(call.send), None, op, root=call.root)
        elif coll == "all_to_all":
            s = _host(call.send).view(np.uint8)
            if call.recv is None:
                snapshot = s.copy()
                req = c.Ialltoall(snapshot, s)
            else:
                req = c.Ialltoall(s, _host(call.recv).view(np.uint8))
        else:  # pragma: no cover - declines() keeps the rest away
            raise hal.CommError(f"the mpi provider does not run {coll}", op=coll)
        _wait(req, call, ctx, self.rank, f"MPI's {coll}")
        return out

    def close(self) -> None:
        """Free the duplicated communicator. Idempotent."""
        if not self._closed:
            self._closed = True
            self._comm.Free()


# -- NCCL ---------------------------------------------------------------------------------
_NCCL_WHY: list[str] = []  # the first import's reason (CuPy warns only on the first import)


def _nccl_module() -> tuple[Any, str | None]:
    """Return ``(cupy.cuda.nccl, None)`` or ``(None, why not)``."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from cupy.cuda import nccl  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError as exc:
        return (
            None,
            f"CuPy's NCCL bindings are not importable ({exc}); pip install cupy-cuda12x (or 13x)",
        )
    if getattr(nccl, "available", False) and hasattr(nccl, "NcclCommunicator"):
        return nccl, None
    if not _NCCL_WHY:
        said, hint = "", "pip install nvidia-nccl-cu12 (or -cu13, matching CuPy)"
        for w in caught:
            for line in str(w.message).splitlines():
                text = line.strip()
                if text.startswith("Reason:"):
                    said = text[len("Reason:") :].strip()
                elif text.startswith("$ pip install"):
                    hint = text[2:]
        _NCCL_WHY.append("CuPy cannot load libnccl" + (f" ({said})" if said else "") + f"; {hint}")
    return None, _NCCL_WHY[0]


class NcclProvider(CollectiveProvider):
    """NCCL's collectives through CuPy's bindings (``cupy.cuda.nccl``) on CUDA devices, one per rank."""

    name = "nccl"
    collectives = frozenset(PROVIDER_COLLECTIVES)
    one_rank_per_device = True
    serves = "CUDA devices (the cuda backend), one per rank, with CuPy and libnccl installed; any launcher"
    # nominal (not measured here: no GPU): NCCL's latency within a node and NVLink-class bandwidth
    alpha_s = 10e-6
    beta_s_per_byte = 1 / 100e9

    _DTYPES: ClassVar[dict[str, str]] = {
        "int8": "NCCL_INT8",
        "uint8": "NCCL_UINT8",
        "int32": "NCCL_INT32",
        "int64": "NCCL_INT64",
        "float16": "NCCL_FLOAT16",
        "float32": "NCCL_FLOAT32",
        "float64": "NCCL_FLOAT64",
        "bfloat16": "NCCL_BFLOAT16",
    }
    _OPS: ClassVar[dict[str, str]] = {
        "sum": "NCCL_SUM",
        "prod": "NCCL_PROD",
        "max": "NCCL_MAX",
        "min": "NCCL_MIN",
        "avg": "NCCL_AVG",
    }

    @classmethod
    def unavailable(
        cls, *, device: hal.Device, launcher: str, size: int, transport: str | None
    ) -> str | None:
        """Refuse on devices of other backends, without CuPy or libnccl, or without a CUDA driver."""
        if device.backend != "cuda":
            return f"{device} is not a CUDA device (NCCL serves the cuda backend)"
        nccl, why = _nccl_module()
        if nccl is None:
            return why
        try:
            import cupy  # type: ignore[import-not-found,import-untyped,unused-ignore]

            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001 - no driver, no device
            return f"CuPy sees no CUDA device ({type(exc).__name__}: {exc})"
        if device.index >= count:
            return f"{device} is not among CuPy's {count} CUDA device(s)"
        return None

    def __init__(self, *, rank: int, size: int, device: hal.Device, bootstrap: Any) -> None:
        super().__init__(rank=rank, size=size, device=device, bootstrap=bootstrap)
        import cupy

        nccl, why = _nccl_module()
        if nccl is None:  # pragma: no cover - unavailable() said so first
            raise hal.CommError(f"nccl: {why}", op="init")
        self._nccl, self._cupy = nccl, cupy
        self._dtypes = {k: getattr(nccl, v) for k, v in self._DTYPES.items() if hasattr(nccl, v)}
        self._ops = {k: getattr(nccl, v) for k, v in self._OPS.items() if hasattr(nccl, v)}
        uid = nccl.get_unique_id() if rank == 0 else None
        uid = bootstrap.allgather(uid)[0]
        with cupy.cuda.Device(device.index):
            self._comm = nccl.NcclCommunicator(size, uid, rank)
            self._stream = cupy.cuda.Stream(non_blocking=True)
        self._closed = False

    def declines(self, collective: str, dtype: str, op: str) -> str | None:
        """Decline dtypes and ops NCCL lacks."""
        why = super().declines(collective, dtype, op)
        if why is None and dtype and dtype not in self._dtypes:
            return f"NCCL (as CuPy binds it) has no {dtype} type"
        if why is None and collective in _REDUCTIONS and op not in self._ops:
            return f"NCCL (as CuPy binds it) has no reduction op {op!r}"
        return why

    def _ptr(self, arr: hal.Array) -> int:
        return int(self._cupy.from_dlpack(arr).data.ptr)

    def run(
        self, call: Any, ctx: Any
    ) -> hal.Array | None:  # pragma: no cover - needs a GPU (tests marked gpu)
        """Run ``call`` with NCCL on a CuPy stream; wait for it within the timeout."""
        nccl, c, coll = self._nccl, self._comm, call.collective
        dt = self._dtypes.get(call.dtype, nccl.NCCL_UINT8)
        st = self._stream.ptr
        op = self._ops.get(call.op, nccl.NCCL_SUM)
        with self._cupy.cuda.Device(self.device.index):
            if coll == "barrier":
                buf = self._cupy.zeros(1, dtype=self._cupy.float32)
                c.allReduce(buf.data.ptr, buf.data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, st)
            elif coll == "all_reduce":
                c.allReduce(self._ptr(call.send), self._ptr(call.recv), call.count, dt, op, st)
            elif coll == "all_gather":
                src = (
                    call.send if call.send is not None else _slot(call.recv, self.rank, call.count)
                )
                c.allGather(self._ptr(src), self._ptr(call.recv), call.count, dt, st)
            elif coll == "reduce_scatter":
                counts = [n for _, n in split(call.count, self.size)]
                if len(set(counts)) > 1:
                    raise hal.CommError(
                        "nccl reduce_scatter needs a count divisible by the ranks", op=coll
                    )
                dst = call.recv if call.recv is not None else _slot(call.send, self.rank, counts[0])
                c.reduceScatter(self._ptr(call.send), self._ptr(dst), counts[0], dt, op, st)
            elif coll == "broadcast":
                buf = call.send if call.recv is None else call.recv
                c.broadcast(self._ptr(call.send), self._ptr(buf), call.count, dt, call.root, st)
            elif coll == "reduce":
                dst = call.send if call.recv is None else call.recv
                c.reduce(self._ptr(call.send), self._ptr(dst), call.count, dt, op, call.root, st)
            elif coll == "all_to_all":
                block = call.count  # elements per rank
                dst_ptr = self._ptr(call.recv if call.recv is not None else call.send)
                src = self._cupy.from_dlpack(call.send)
                if (
                    call.recv is None
                ):  # in place: send from a snapshot (on NCCL's stream: ordered before it)
                    with self._stream:
                        src = src.copy()
                item = src.dtype.itemsize
                nccl.groupStart()
                for p in range(self.size):
                    c.send(src.data.ptr + p * block * item, block, dt, p, st)
                    c.recv(dst_ptr + p * block * item, block, dt, p, st)
                nccl.groupEnd()
            event = self._cupy.cuda.Event()
            event.record(self._stream)
            start = time.monotonic()
            while not event.done:
                if time.monotonic() - start > ctx.timeout_s or (
                    ctx.aborted is not None and ctx.aborted.is_set()
                ):
                    c.abort()
                    raise hal.CommError(
                        f"{coll} (seq {call.plan.seq}) through NCCL did not complete within {ctx.timeout_s:g} s on "
                        f"rank {self.rank}",
                        op=coll,
                        ranks=(self.rank,),
                    )
                time.sleep(1e-5)
        return None  # NCCL_AVG averages itself

    def close(self) -> None:
        """Destroy the NCCL communicator. Idempotent."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self._comm.destroy()


def _slot(arr: hal.Array, i: int, n: int) -> hal.Array:
    from hal.comm._ops import sub

    return sub(arr, i * n, n)
