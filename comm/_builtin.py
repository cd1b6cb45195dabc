"""hal.comm's built-in plugin: its transports, collective providers and ``COMM-*`` conformance
section, registered through the same hooks as a vendor's."""

from __future__ import annotations

from typing import Any

from hal.plugins import hookimpl

__all__ = [
    "hal_register_collective_providers",
    "hal_register_conformance",
    "hal_register_transports",
    "plugin_system",
]


def plugin_system() -> Any:
    """Return hal's plugin system with hal.comm's built-in plugin registered (once) beside the plugins.

    Whoever calls one of the hooks hal.comm implements (the transports, the providers, the
    conformance suite's ``hal_register_conformance``) calls it on this system.
    """
    import sys

    import hal.plugins

    system = hal.plugins.get_system()
    me = sys.modules[__name__]
    if not system.manager.is_registered(me):
        system.manager.register(me, name="hal.comm.builtin")
    return system


@hookimpl
def hal_register_transports(registry: Any) -> None:
    """Register the shared-memory, TCP, MPI and UCX transports (UCX registers without ucxx; it says why at use)."""
    from hal.comm._mpi import MpiTransport
    from hal.comm._shm import ShmTransport
    from hal.comm._tcp import TcpTransport
    from hal.comm._ucx import UcxTransport

    registry.add(ShmTransport)
    registry.add(TcpTransport)
    registry.add(MpiTransport)
    registry.add(UcxTransport)


@hookimpl
def hal_register_collective_providers(registry: Any) -> None:
    """Register the NCCL and MPI collective providers (NCCL first: preferred where both serve)."""
    from hal.comm._providers import MpiProvider, NcclProvider

    registry.add(NcclProvider)
    registry.add(MpiProvider)


@hookimpl
def hal_register_conformance(registry: Any) -> None:
    """Register the ``COMM-*`` conformance section (collectives over every device of a backend)."""
    registry.add("hal.comm._conformance")
