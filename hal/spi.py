"""The backend SPI, public for vendors: subclass these to write a backend.

See docs/write-a-backend.md. Everything here is re-exported from private modules.
"""

from hal._capabilities import Capabilities
from hal._spi import (
    BackendImpl,
    BufferArg,
    DeviceImpl,
    EventImpl,
    KernelBuildError,
    KernelParam,
    KernelSignature,
    MemoryImpl,
    ProgramImpl,
    StreamImpl,
    impl_of,
)
from hal._version import API_VERSION

__all__ = [
    "API_VERSION",
    "BackendImpl",
    "BufferArg",
    "Capabilities",
    "DeviceImpl",
    "EventImpl",
    "KernelBuildError",
    "KernelParam",
    "KernelSignature",
    "MemoryImpl",
    "ProgramImpl",
    "StreamImpl",
    "impl_of",
]
