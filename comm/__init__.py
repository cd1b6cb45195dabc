"""hal.comm: collectives written once over the public HAL and hal.kernels reductions.

One process, many devices::

    comm = hal.comm.create(hal.devices("cpu"))
    comm.all_reduce(arrays, op="sum", streams=streams).wait()

Many processes (``hal run -n 2 script.py``, torchrun or mpiexec)::

    comm = hal.comm.init()
    comm.all_reduce(array, op="sum", stream=stream).wait()

See docs/comm.md.
"""

from hal.comm._communicator import Communicator, DeviceCommunicator, P2POp
from hal.comm._config import ALGORITHMS
from hal.comm._engine import Work
from hal.comm._init import create, detect_launcher, init, transports
from hal.comm._ops import DTYPES, REDUCE_OPS
from hal.comm._plan import Plan
from hal.comm._providers import CollectiveProvider, ProviderRegistry, providers
from hal.comm._topo import Topology, TopologyError
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
    "ALGORITHMS",
    "DTYPES",
    "REDUCE_OPS",
    "CallContext",
    "CollectiveProvider",
    "Communicator",
    "DeviceCommunicator",
    "P2POp",
    "Plan",
    "ProviderRegistry",
    "Recv",
    "Send",
    "StagedTransport",
    "Topology",
    "TopologyError",
    "Transport",
    "TransportRegistry",
    "Work",
    "World",
    "create",
    "detect_launcher",
    "init",
    "providers",
    "transports",
]
