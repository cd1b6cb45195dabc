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

from hal.comm._builtin import plugin_system
from hal.comm._ops import DTYPES, REDUCE_OPS
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
