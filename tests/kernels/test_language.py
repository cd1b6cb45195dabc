"""The portable kernel language: parsing and translation into each dialect."""

from __future__ import annotations

import pytest

import hal.kernels.spi
from hal.kernels import translate
from hal.kernels.spi import parse_kernels

AXPY = """
// a comment mentioning HAL_KERNEL void fake(int x) {
HAL_KERNEL void axpy(HAL_GLOBAL T* y,
                     HAL_GLOBAL const T* x, hal_f64 alpha, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    if (i < n) y[i] = (T)(alpha * x[i] + y[i]);
}
"""


def test_parse_signature_resolves_defines() -> None:
    (sig,) = parse_kernels(AXPY, {"T": "hal_f32"})
    assert sig.name == "axpy"
    assert [(p.name, p.dtype, p.pointer, p.const) for p in sig.params] == [
        ("y", "float32", True, False),
        ("x", "float32", True, True),
        ("alpha", "float64", False, False),
        ("n", "int64", False, False),
    ]


@pytest.mark.parametrize(
    ("dialect", "needles"),
    [
        (
            "c",
            [
                "void axpy(const int64_t* __hal_gs, int32_t __hal_threads",
                "#pragma omp parallel",
                "#define T hal_f32",
            ],
        ),
        ("opencl", ["__kernel void axpy(__global float* y__base, long y__off", "get_global_id(0)"]),
        ("cuda", ['extern "C" __global__ void axpy(', "blockIdx.x * blockDim.x + threadIdx.x"]),
    ],
)
def test_translate_per_dialect(dialect: str, needles: list[str]) -> None:
    code = translate(AXPY, dialect, defines={"T": "hal_f32"})
    for needle in needles:
        assert needle in code
    assert "axpy__hal_item" in code


def test_translate_keeps_line_numbers() -> None:
    code = translate(AXPY, "c", defines={"T": "hal_f32"})
    body = code.split("#line 1\n", 1)[1].splitlines()
    src = AXPY.splitlines()
    assert body[4] == src[4]  # the line with HAL_GLOBAL_ID is still line 5


def test_translate_backend_name_maps_to_dialect() -> None:
    assert translate(AXPY, "cpu", defines={"T": "hal_f32"}) == translate(
        AXPY, "c", defines={"T": "hal_f32"}
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("int main(void) { return 0; }", "defines no kernel"),
        ("HAL_KERNEL void k(HAL_GLOBAL float** p) {}", "only T\\* pointers"),
        ("HAL_KERNEL void k(float* p) {}", "must be declared HAL_GLOBAL"),
        ("HAL_KERNEL void k(HAL_GLOBAL mytype* p) {}", "has type 'mytype'"),
        ("HAL_KERNEL void k(hal_f16 a) {}", "cannot be hal_f16"),
        ("HAL_KERNEL void k(int a) {}\nHAL_KERNEL void k(int b) {}", "defined twice"),
    ],
)
def test_language_errors_name_the_problem(source: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        translate(source, "c")


def test_bad_dialect_and_defines() -> None:
    with pytest.raises(ValueError, match="'fortran'"):
        translate(AXPY, "fortran")
    with pytest.raises(ValueError, match="define name"):
        translate(AXPY, "c", defines={"not an id": "1"})


def test_generic_sources_translate_for_every_dialect() -> None:
    from hal.kernels._generic import SOURCES

    for source in SOURCES.values():
        for dialect in hal.kernels.spi.DIALECTS:
            assert "__hal_item" in translate(
                source,
                dialect,
                defines={"T": "hal_f32", "CT": "hal_f32", "ACC": "hal_f64", "U": "hal_f64"},
            )
