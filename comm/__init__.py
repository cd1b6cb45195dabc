"""hal.comm: collectives written once over the public HAL and hal.kernels reductions.

One process, many devices::

    comm = hal.comm.create(hal.devices("cpu"))
    comm.all_reduce(arrays, op="sum", streams=streams).wait()

Many processes (``hal run -n 2 script.py``, torchrun or mpiexec)::

    comm = hal.comm.init()
    comm.all_reduce(array, op="sum", stream=stream).wait()

This module is the user API. Writing a transport or a collective provider (``Transport``,
``StagedTransport``, ``CollectiveProvider``, their registries, ``Send``/``Recv``/``CallContext``)
is the extension API, :mod:`hal.comm.spi`; the old names here work until hal-sdk 2.0, with a
warning. See docs/comm.md.
"""

from typing import TYPE_CHECKING, Any

from hal import spi as _hal_spi
from hal.comm._communicator import Communicator, DeviceCommunicator, P2POp
from hal.comm._config import ALGORITHMS
from hal.comm._engine import Work
from hal.comm._init import create, detect_launcher, init, transports
from hal.comm._ops import REDUCE_OPS
from hal.comm._options import CommOptions
from hal.comm._plan import Plan
from hal.comm._providers import providers
from hal.comm._topo import Topology, TopologyError

if TYPE_CHECKING:
    from hal.comm._ops import DTYPES as DTYPES


def _lazy(name: str) -> Any:
    """``DTYPES`` on first use: it imports ml_dtypes (for bfloat16), ~1.3 s of CPU."""
    if name == "DTYPES":
        from hal.comm import _ops

        globals()[name] = _ops.DTYPES
        return _ops.DTYPES
    raise AttributeError(f"module 'hal.comm' has no attribute {name!r}")


#: Extension names that moved to :mod:`hal.comm.spi` in hal-sdk 1.2 (removed here in 2.0).
__getattr__ = _hal_spi.moved_names(
    "hal.comm",
    "hal.comm.spi",
    {
        "CallContext",
        "CollectiveProvider",
        "ProviderRegistry",
        "Recv",
        "Send",
        "StagedTransport",
        "Transport",
        "TransportRegistry",
        "World",
    },
    fallback=_lazy,
)


__all__ = [
    "ALGORITHMS",
    "DTYPES",
    "REDUCE_OPS",
    "CommOptions",
    "Communicator",
    "DeviceCommunicator",
    "P2POp",
    "Plan",
    "Topology",
    "TopologyError",
    "Work",
    "create",
    "detect_launcher",
    "init",
    "providers",
    "transports",
]
