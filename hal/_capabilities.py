"""What a device can do, declared by its backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, final

__all__ = ["Capabilities"]


@final
@dataclasses.dataclass(frozen=True)
class Capabilities:
    """Capabilities a backend declares for one device.

    A capability that is ``False`` makes the conformance suite skip the matching
    requirements; ``absent_reasons`` carries the backend's justification for each
    absent capability (``{"p2p": "single device platform"}``), copied into the
    certificate. An absent capability without a reason is reported as such.

    Attributes:
        p2p: direct copies between devices of this backend (``copy_path == "peer"``).
        ipc: memory handles that another process can open.
        timing_events: events created with ``timing=True`` measure elapsed time.
        kernels: the backend compiles and launches portable kernels (``hal.kernels``).
        dlpack: device memory can be exported through DLPack.
        fp64: double precision arithmetic in kernels.
        fp16: half precision arithmetic in kernels.
        concurrent_streams: work on different streams may run concurrently.
        host_signal: a stream can wait for a host-side signal without blocking the host
            (``StreamImpl.wait_host``); without it ``Stream.wait_host`` blocks the next
            call that enqueues on the stream, on the host, until the signal is set.
        max_alloc_bytes: the largest single allocation, or ``None`` if only total memory limits it.
        absent_reasons: capability name -> why it is absent.
    """

    p2p: bool = False
    ipc: bool = False
    timing_events: bool = True
    kernels: bool = False
    dlpack: bool = False
    fp64: bool = True
    fp16: bool = False
    concurrent_streams: bool = True
    host_signal: bool = False
    max_alloc_bytes: int | None = None
    absent_reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def reason_absent(self, name: str) -> str | None:
        """Return the justification for capability ``name`` being absent, or ``None`` if present."""
        if not hasattr(self, name) or name == "absent_reasons":
            raise ValueError(f"{name=} is not a capability")
        if getattr(self, name):
            return None
        return self.absent_reasons.get(name, "declared absent by the backend (no reason given)")

    def to_dict(self) -> dict[str, Any]:
        """Return the capabilities as a JSON-friendly dict."""
        out = dataclasses.asdict(self)
        out["absent_reasons"] = dict(self.absent_reasons)
        return out
