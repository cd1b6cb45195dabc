"""The extension API of hal.comm: what a transport or collective-provider plugin author needs.

hal.comm's user API (communicators, ``init``/``create``, work handles, plans) is
:mod:`hal.comm`; this module is for packages that plug into it through hooks:

- a **transport** moves bytes between the ranks of a communicator: subclass
  :class:`StagedTransport` (four piece calls; hal.comm pipelines, times out and names ranks)
  or :class:`Transport` (whole messages), and register it with
  ``hal_register_transports(registry)`` (``registry.add(MyTransport)``, a
  :class:`TransportRegistry`). It sees the :class:`World` at set-up and, per call, a list of
  :class:`Send` / :class:`Recv` steps with a :class:`CallContext`.
- a **collective provider** runs whole collectives on a dedicated library: subclass
  :class:`CollectiveProvider` and register it with
  ``hal_register_collective_providers(registry)`` (a :class:`ProviderRegistry`).

hal's own transports (``shm``, ``tcp``, ``mpi``) and providers (``nccl``, ``mpi``) come in
through the same hooks, from hal.comm's built-in plugin (:func:`plugin_system`). See
docs/comm.md, "Transports" and "Collective providers".
"""

from typing import TYPE_CHECKING, Any

from hal.comm._builtin import plugin_system
from hal.comm._ops import REDUCE_OPS
from hal.comm._providers import CollectiveProvider, ProviderRegistry
from hal.comm._transport import (
    CallContext,
    Recv,
    Send,
    StagedTransport,
    Transport,
    TransportRegistry,
    World,
)

if TYPE_CHECKING:
    from hal.comm._ops import DTYPES as DTYPES


def __getattr__(name: str) -> Any:
    """``DTYPES`` on first use: it imports ml_dtypes (for bfloat16), ~1.3 s of CPU."""
    if name == "DTYPES":
        from hal.comm import _ops

        globals()[name] = _ops.DTYPES
        return _ops.DTYPES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DTYPES",
    "REDUCE_OPS",
    "CallContext",
    "CollectiveProvider",
    "ProviderRegistry",
    "Recv",
    "Send",
    "StagedTransport",
    "Transport",
    "TransportRegistry",
    "World",
    "plugin_system",
]
