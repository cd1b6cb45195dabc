"""A kernel that calls a function nobody defines (a misspelt builtin) is a KernelBuildError naming
it on every backend: the CPU emulator's C compiler only warns (implicit declaration), and the
library then failed to load with cffi's bare OSError ("cannot load library /tmp/hal-cpu-....so:
undefined symbol: hal_global_id")."""

from __future__ import annotations

import uuid

import pytest

import hal
from hal.kernels import KernelBuildError, compile


def test_a_misspelt_builtin_is_a_build_error_naming_it(kdev: hal.Device) -> None:
    name = f"k_{uuid.uuid4().hex[:8]}"  # never in the compile cache
    src = f"HAL_KERNEL void {name}(HAL_GLOBAL float* y) {{ y[hal_global_id(0)] = 1.0f; }}"
    with pytest.raises(KernelBuildError) as info:
        compile(src, kdev)
    assert "hal_global_id" in str(info.value), info.value
    assert info.value.device is not None
