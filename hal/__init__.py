"""hal-sdk: a narrow hardware abstraction layer for accelerators.

Devices, memory, streams, events and peer copies, over backends that are plugins
(CPU emulator, OpenCL, CUDA, or a vendor's). Start with :func:`hal.devices`.
"""

from typing import TYPE_CHECKING

from hal._arrays import asarray, from_dlpack
from hal._capabilities import Capabilities
from hal._copy import CopyPath, copy, copy_path, memset
from hal._device import Device, EventOptions
from hal._discovery import BackendInfo, backends, device, devices, list_backends
from hal._errors import (
    BackendUnavailableError,
    CommError,
    ConfigError,
    DeviceError,
    DeviceMismatchError,
    HalError,
    HalWarning,
    InvalidBufferError,
    OutOfMemoryError,
    PluginError,
    StreamError,
)
from hal._log import configure_from_env as _configure_logging
from hal._memory import Array, Buffer
from hal._pinned import alloc_host, empty_host
from hal._runtime import Runtime, runtime
from hal._runtime import _install_plugin_factory as _install
from hal._stream import Event, HostSignal, Stream
from hal._trace import Tracer, trace, tracer
from hal._trace import _start_from_env as _start_tracing
from hal._version import API_VERSION, __version__

if TYPE_CHECKING:
    from hal.plugins import PluginSystem


def _plugin_system() -> "PluginSystem":
    """Build the plugin system (at the first call that needs backends).

    The package is the composition root: core modules (``hal._*``) never import the plugin
    layer above them, so the runtime receives this factory from here; ``hal.plugins`` (pluggy,
    entry points) loads only when it runs.
    """
    from hal.plugins import PluginSystem

    return PluginSystem()


_install(_plugin_system)
_configure_logging()
_start_tracing()

__all__ = [
    "API_VERSION",
    "Array",
    "BackendInfo",
    "BackendUnavailableError",
    "Buffer",
    "Capabilities",
    "CommError",
    "ConfigError",
    "CopyPath",
    "Device",
    "DeviceError",
    "DeviceMismatchError",
    "Event",
    "EventOptions",
    "HalError",
    "HalWarning",
    "HostSignal",
    "InvalidBufferError",
    "OutOfMemoryError",
    "PluginError",
    "Runtime",
    "Stream",
    "StreamError",
    "Tracer",
    "__version__",
    "alloc_host",
    "asarray",
    "backends",
    "copy",
    "copy_path",
    "device",
    "devices",
    "empty_host",
    "from_dlpack",
    "list_backends",
    "memset",
    "runtime",
    "trace",
    "tracer",
]
