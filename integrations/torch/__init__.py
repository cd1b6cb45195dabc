"""hal.torch: the ``"hal"`` backend of ``torch.distributed`` (collectives run on :mod:`hal.comm`).

Importing this module registers the backend::

    import torch.distributed as dist
    import hal.torch  # noqa: F401  (registers "hal")

    dist.init_process_group("hal")          # under torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    model = torch.nn.parallel.DistributedDataParallel(model)   # reductions run on hal.comm

The ranks meet through the store torch hands the backend (under torchrun: torchrun's own
TCPStore); each process's rank runs on the CPU emulator's device ``LOCAL_RANK % count``;
the transport is chosen as for :func:`hal.comm.init` (shared memory on one host, TCP across
hosts, ``HAL_COMM_TRANSPORT`` to force one). See docs/torch.md.

torch is an optional dependency (``pip install 'hal-sdk[torch]'``); hal's core never imports it.
"""

from __future__ import annotations

try:
    import torch.distributed as _dist
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise ImportError(f"hal.torch needs PyTorch: pip install 'hal-sdk[torch]' ({_exc})") from _exc

from hal.torch._process_group import ProcessGroupHal, create_process_group

__all__ = ["BACKEND", "ProcessGroupHal", "communicator"]

#: The backend name to pass to ``torch.distributed.init_process_group``.
BACKEND = "hal"

if not _dist.is_available():  # pragma: no cover - torch built without distributed
    raise ImportError(
        "hal.torch needs torch.distributed (this torch build has no distributed support)"
    )

if BACKEND not in _dist.Backend.backend_list:
    _dist.Backend.register_backend(
        BACKEND, create_process_group, extended_api=True, devices=["cpu"]
    )


def communicator(group: _dist.ProcessGroup | None = None) -> object:
    """Return the :class:`hal.comm.Communicator` behind a ``"hal"`` process group (default: the world).

    Raises:
        ValueError: the group does not run on the ``"hal"`` backend.
    """
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupHal):
        raise ValueError(f"group {pg!r} does not run on the 'hal' backend")
    return pg.communicator
