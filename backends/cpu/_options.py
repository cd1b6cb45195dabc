"""Settings of the CPU emulator as one frozen options object, read from the environment."""

from __future__ import annotations

import dataclasses
from typing import final

from hal.spi import Options, env_field

__all__ = ["CpuOptions"]


@final
@dataclasses.dataclass(frozen=True)
class CpuOptions(Options):
    """The CPU emulator's settings (read when the backend loads; docs/backends/cpu.md).

    ``CpuOptions.from_env()`` is what the backend uses; each field names its variable.

    Attributes:
        devices: number of devices (``HAL_CPU_DEVICES``, default 2).
        memory: capacity of each device in bytes (``HAL_CPU_MEMORY``, default 4G).
        ipc: device memory in memfds, shareable between processes (``HAL_CPU_IPC``).
        arena: device memory of 64 KiB and more in one shared memfd arena (``HAL_CPU_ARENA``,
            default on).
        native: streams on the native runtime (``HAL_CPU_NATIVE``, default on).
        jitter: seed of random delays, None: none (``HAL_CPU_JITTER``).
        kernel_threads: OpenMP threads of a kernel, or ``"auto"`` (``HAL_CPU_KERNEL_THREADS``).
        cc: the C compiler of kernels (``HAL_CPU_CC``; default ``cc``, then ``gcc``).
        speed: speed factor per device, comma-separated (``HAL_CPU_SPEED``).
        config: injected faults per device, JSON text or a file (``HAL_CPU_CONFIG``).
    """

    devices: int | None = env_field("HAL_CPU_DEVICES")
    memory: int | None = env_field("HAL_CPU_MEMORY")
    ipc: bool | None = env_field("HAL_CPU_IPC")
    arena: bool | None = env_field("HAL_CPU_ARENA")
    native: bool | None = env_field("HAL_CPU_NATIVE")
    jitter: int | None = env_field("HAL_CPU_JITTER")
    kernel_threads: int | str | None = env_field("HAL_CPU_KERNEL_THREADS")
    cc: str | None = env_field("HAL_CPU_CC")
    speed: str | None = env_field("HAL_CPU_SPEED")
    config: str | None = env_field("HAL_CPU_CONFIG")
