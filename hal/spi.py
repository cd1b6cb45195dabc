"""The backend SPI, public for vendors: subclass these to write a backend.

See docs/write-a-backend.md. Everything here is re-exported from private modules.
"""

from hal._capabilities import Capabilities
from hal._errors import ConfigError
from hal._settings import (
    SETTINGS,
    MemoryOptions,
    Options,
    PluginOptions,
    Setting,
    env_field,
    parse_bool,
    parse_choice,
    parse_float,
    parse_int,
    parse_list,
    parse_port,
    parse_size,
    parse_str,
    setting,
    setting_at_import,
)
from hal._spi import (
    BackendImpl,
    BufferArg,
    DeviceImpl,
    EventImpl,
    HostSignalImpl,
    KernelBuildError,
    KernelParam,
    KernelSignature,
    MemoryAccount,
    MemoryImpl,
    ProgramImpl,
    StreamImpl,
    impl_of,
)
from hal._version import API_VERSION

__all__ = [
    "API_VERSION",
    "SETTINGS",
    "BackendImpl",
    "BufferArg",
    "Capabilities",
    "ConfigError",
    "DeviceImpl",
    "EventImpl",
    "HostSignalImpl",
    "KernelBuildError",
    "KernelParam",
    "KernelSignature",
    "MemoryAccount",
    "MemoryImpl",
    "MemoryOptions",
    "Options",
    "PluginOptions",
    "ProgramImpl",
    "Setting",
    "StreamImpl",
    "env_field",
    "impl_of",
    "parse_bool",
    "parse_choice",
    "parse_float",
    "parse_int",
    "parse_list",
    "parse_port",
    "parse_size",
    "parse_str",
    "setting",
    "setting_at_import",
]
