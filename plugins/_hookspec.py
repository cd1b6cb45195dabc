"""Hook specifications of hal-sdk. Every hook is named ``hal_*`` and takes keyword arguments only.

Lifecycle: hooks are called once per plugin, right after its entry point is loaded (lazily,
at the first call that needs backends: ``hal.list_backends()``, ``hal.devices()``, ``hal info``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from hal.plugins._registry import BackendRegistry

hookspec = pluggy.HookspecMarker("hal")
hookimpl = pluggy.HookimplMarker("hal")


@hookspec
def hal_register_backends(registry: BackendRegistry) -> None:
    """Register backend classes with ``registry.add(MyBackend)``.

    Implemented by: every backend plugin (built-in ``cpu``/``opencl``/``cuda`` and vendors').
    Called: once per plugin when hal loads plugins. Must not touch the vendor SDK beyond
    importing it lazily: probing happens in the backend's ``__init__``.
    """


@hookspec
def hal_register_kernels(registry: Any) -> None:
    """Register dedicated op implementations with ``registry.add(op, backend, impl, dtypes=...)``.

    ``registry`` is a :class:`hal.kernels.spi.KernelRegistry`. Implemented by: backend plugins
    (and vendor plugins) that ship faster implementations than hal.kernels' generic ones.
    Called: once per plugin, the first time hal.kernels dispatches an op or builds a plan.
    A plugin whose hook raises is skipped with a logged reason; its ops run the generic route.
    """


@hookspec
def hal_register_transports(registry: Any) -> None:
    """Register communication transports with ``registry.add(MyTransport)``.

    ``registry`` is a :class:`hal.comm.spi.TransportRegistry`; a transport class derives from
    :class:`hal.comm.spi.Transport` and has a unique ``name`` (``"shm"``, ``"tcp"``, ``"mpi"`` ...).
    Implemented by: hal.comm's built-in transports and vendor plugins (e.g. an RDMA transport).
    Called: once per plugin, the first time hal.comm builds a communicator. A plugin whose hook
    raises is skipped with a logged reason; the other transports stay usable.
    """


@hookspec
def hal_register_collective_providers(registry: Any) -> None:
    """Register collective providers with ``registry.add(MyProvider)``.

    ``registry`` is a :class:`hal.comm.spi.ProviderRegistry`; a provider derives from
    :class:`hal.comm.spi.CollectiveProvider`, has a unique ``name`` (what ``HAL_COMM_PROVIDER``
    selects) and takes whole collectives for the devices and launchers it serves (hal's own:
    ``nccl`` through CuPy on CUDA devices, ``mpi`` through mpi4py under mpiexec).
    Implemented by: hal.comm (built-ins) and plugins shipping a dedicated communication library.
    Called: once per plugin, the first time hal.comm builds a communicator from the environment.
    A plugin whose hook raises is skipped with a logged reason; the generic algorithms stay.
    """


@hookspec
def hal_register_conformance(registry: Any) -> None:
    """Register conformance sections with ``registry.add("package.module")``.

    ``registry`` is a :class:`hal.conformance.spi.SectionRegistry`; a section module declares
    requirements with ``hal.conformance.spi.requirement`` (and its area with ``add_area``) when
    imported. Implemented by: plugins that certify more than the HAL core (hal's own
    ``COMM-*``/``KERN-*`` sections come in this way too). Called: once per plugin, the first
    time the conformance catalogue is built.
    """


@hookspec
def hal_register_baselines(registry: Any) -> None:
    """Register a backend's raw-library copy baseline for ``hal bench memory``.

    ``registry.add("mybackend", baseline)``: ``baseline(direction, nbytes, repeat) -> seconds``
    (directions ``h2d``, ``d2h``, ``d2d``, ``peer``), or a ``"module:function"`` string imported
    only when the benchmark runs. Implemented by: backend plugins (the built-in ones too).
    Called: once per plugin, by ``hal bench memory``.
    """
