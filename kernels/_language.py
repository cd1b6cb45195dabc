"""The portable kernel language: C with HAL macros, translated into each backend's dialect.

A kernel is a C function marked ``HAL_KERNEL`` that runs once per work item of a 1- to
3-dimensional global range::

    HAL_KERNEL void axpy(HAL_GLOBAL T* y, HAL_GLOBAL const T* x, hal_f64 alpha, hal_i64 n) {
        hal_i64 i = HAL_GLOBAL_ID(0);
        if (i < n) y[i] = (T)(alpha * x[i] + y[i]);
    }

:func:`translate` rewrites every kernel into an *item function* (the body, with the global
id and size as parameters) plus a dialect-specific entry point: a loop over the global
range for ``c`` (OpenMP across cores), ``__kernel`` for ``opencl``, ``extern "C"
__global__`` for ``cuda``. See docs/kernels.md for the language and its limits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hal.spi import KernelParam, KernelSignature

__all__ = ["DIALECTS", "TYPES", "parse_kernels", "translate"]

DIALECTS = ("c", "opencl", "cuda")

# portable type name -> (numpy dtype, C, OpenCL C, CUDA C++)
TYPES: dict[str, tuple[str, str, str, str]] = {
    "hal_f16": ("float16", "_Float16", "half", "hal_f16"),
    "hal_f32": ("float32", "float", "float", "float"),
    "hal_f64": ("float64", "double", "double", "double"),
    "hal_i8": ("int8", "int8_t", "char", "signed char"),
    "hal_u8": ("uint8", "uint8_t", "uchar", "unsigned char"),
    "hal_i32": ("int32", "int32_t", "int", "int"),
    "hal_u32": ("uint32", "uint32_t", "uint", "unsigned int"),
    "hal_i64": ("int64", "int64_t", "long", "long long"),
    "hal_u64": ("uint64", "uint64_t", "ulong", "unsigned long long"),
    "float": ("float32", "float", "float", "float"),
    "double": ("float64", "double", "double", "double"),
    "int": ("int32", "int32_t", "int", "int"),
}
_DIALECT_COL = {"c": 1, "opencl": 2, "cuda": 3}

_QUALIFIERS = {"HAL_GLOBAL", "const", "HAL_RESTRICT", "restrict", "__restrict__", "volatile"}
_KERNEL_RE = re.compile(r"\bHAL_KERNEL\s+void\s+([A-Za-z_]\w*)\s*\(([^()]*)\)\s*\{")
_IDENT = re.compile(r"[A-Za-z_]\w*")

_C_PRELUDE = r"""/* hal.kernels: portable kernel language -> C (CPU emulator) */
#include <stdint.h>
#include <tgmath.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#define HAL_DIALECT_C 1
#define HAL_GLOBAL
#define HAL_RESTRICT __restrict__
#define HAL_DEVICE static inline
#define HAL_ITEM static inline __attribute__((always_inline))
#define HAL_SIMD _Pragma("omp simd")
/* kernels with their own loops: vectorize inside the item, not across items (strided) */
#define HAL_ITEM_LOOP static __attribute__((noinline))
#define HAL_INF ((float)INFINITY)
#define HAL_NAN ((float)NAN)
#define HAL_GLOBAL_ID(d) __hal_gid##d
#define HAL_GLOBAL_SIZE(d) __hal_gsz##d
typedef _Float16 hal_f16; typedef float hal_f32; typedef double hal_f64;
typedef int8_t hal_i8; typedef uint8_t hal_u8; typedef int32_t hal_i32; typedef uint32_t hal_u32;
typedef int64_t hal_i64; typedef uint64_t hal_u64;
"""

_OPENCL_PRELUDE = r"""/* hal.kernels: portable kernel language -> OpenCL C */
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#ifdef cl_khr_fp16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
typedef half hal_f16;
#endif
#define HAL_DIALECT_OPENCL 1
#define HAL_GLOBAL __global
#define HAL_RESTRICT restrict
#define HAL_DEVICE static inline
#define HAL_ITEM static inline
#define HAL_ITEM_LOOP static inline
#define HAL_SIMD
#define HAL_INF INFINITY
#define HAL_NAN NAN
#define HAL_GLOBAL_ID(d) __hal_gid##d
#define HAL_GLOBAL_SIZE(d) __hal_gsz##d
typedef float hal_f32; typedef double hal_f64;
typedef char hal_i8; typedef uchar hal_u8; typedef int hal_i32; typedef uint hal_u32;
typedef long hal_i64; typedef ulong hal_u64;
"""

_CUDA_PRELUDE = r"""/* hal.kernels: portable kernel language -> CUDA C++ (NVRTC) */
struct __align__(2) hal_f16 {  /* 16-bit storage, converted with cvt (no CUDA headers needed) */
    unsigned short bits;
    __device__ hal_f16() {}
    template <typename V> __device__ hal_f16(V v) {
        float f = (float)v;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f));
    }
    __device__ operator float() const {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
        return f;
    }
};
#define HAL_DIALECT_CUDA 1
#define HAL_GLOBAL
#define HAL_RESTRICT __restrict__
#define HAL_DEVICE static __device__ __forceinline__
#define HAL_ITEM static __device__ __forceinline__
#define HAL_ITEM_LOOP static __device__ __forceinline__
#define HAL_SIMD
#define HAL_INF (__int_as_float(0x7f800000))
#define HAL_NAN (__int_as_float(0x7fffffff))
#define HAL_GLOBAL_ID(d) __hal_gid##d
#define HAL_GLOBAL_SIZE(d) __hal_gsz##d
typedef float hal_f32; typedef double hal_f64;
typedef signed char hal_i8; typedef unsigned char hal_u8; typedef int hal_i32; typedef unsigned int hal_u32;
typedef long long hal_i64; typedef unsigned long long hal_u64;
"""

_PRELUDES = {"c": _C_PRELUDE, "opencl": _OPENCL_PRELUDE, "cuda": _CUDA_PRELUDE}
_GID_PARAMS = {
    "c": "int64_t",
    "opencl": "long",
    "cuda": "long long",
}


def _strip_comments(source: str) -> str:
    """Blank out comments (keeping offsets and line numbers)."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, source, flags=re.S)


def _resolve(name: str, defines: Mapping[str, str]) -> str:
    seen = set()
    while name in defines and name not in seen:
        seen.add(name)
        name = defines[name].strip()
    return name


def _parse_param(text: str, defines: Mapping[str, str], kernel: str) -> KernelParam:
    tokens = _IDENT.findall(text)
    stars = text.count("*")
    if not tokens:
        raise ValueError(f"kernel {kernel!r}: cannot parse parameter {text.strip()!r}")
    if stars > 1:
        raise ValueError(
            f"kernel {kernel!r}: parameter {text.strip()!r}: only T* pointers are supported"
        )
    name = tokens[-1]
    rest = [t for t in tokens[:-1] if t not in _QUALIFIERS]
    if len(rest) != 1:
        raise ValueError(
            f"kernel {kernel!r}: parameter {text.strip()!r} must be 'TYPE name' or "
            "'HAL_GLOBAL [const] TYPE* name' with a one-word type (use hal_f32, hal_i64 ...)"
        )
    ptype = _resolve(rest[0], defines)
    if ptype not in TYPES:
        raise ValueError(
            f"kernel {kernel!r}: parameter {name!r} has type {rest[0]!r} (= {ptype!r}); "
            f"supported: {', '.join(sorted(TYPES))}"
        )
    pointer = stars == 1
    if pointer and "HAL_GLOBAL" not in tokens:
        raise ValueError(
            f"kernel {kernel!r}: pointer parameter {name!r} must be declared HAL_GLOBAL"
        )
    if not pointer and ptype == "hal_f16":
        raise ValueError(
            f"kernel {kernel!r}: scalar parameter {name!r} cannot be hal_f16 (pass hal_f32)"
        )
    dtype, ctype = TYPES[ptype][0], TYPES[ptype][1]
    return KernelParam(
        name=name, ctype=ctype, pointer=pointer, const="const" in tokens, dtype=dtype
    )


def parse_kernels(source: str, defines: Mapping[str, str] | None = None) -> list[KernelSignature]:
    """Return the ``HAL_KERNEL`` entry points of a portable ``source``, in order.

    Raises:
        ValueError: no kernel, a duplicate name, or a parameter the language does not support.
    """
    defs = dict(defines or {})
    out: list[KernelSignature] = []
    for m in _KERNEL_RE.finditer(_strip_comments(source)):
        name, params_text = m.group(1), m.group(2).strip()
        params: list[KernelParam] = []
        if params_text and params_text != "void":
            params = [_parse_param(p, defs, name) for p in params_text.split(",")]
        if any(s.name == name for s in out):
            raise ValueError(f"kernel {name!r} is defined twice")
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise ValueError(f"kernel {name!r} repeats a parameter name")
        out.append(KernelSignature(name=name, params=tuple(params)))
    if not out:
        raise ValueError(
            "source defines no kernel: mark entry points 'HAL_KERNEL void name(...) {'"
        )
    return out


_LOOP = re.compile(r"\b(for|while|do)\b")


def _has_loop(clean: str, body_start: int) -> bool:
    """Return True if the kernel body starting after ``{`` at ``body_start`` contains a loop."""
    depth, i = 1, body_start
    while i < len(clean) and depth:
        c = clean[i]
        depth += (c == "{") - (c == "}")
        i += 1
    return bool(_LOOP.search(clean, body_start, i))


def _check_defines(defines: Mapping[str, str]) -> None:
    for k, v in defines.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"define name {k!r} must be an identifier")
        if not isinstance(v, str) or "\n" in v:
            raise ValueError(f"define {k}={v!r} must be a one-line string")


def translate(source: str, dialect: str, *, defines: Mapping[str, str] | None = None) -> str:
    """Return the exact code a backend of ``dialect`` (``c``, ``opencl``, ``cuda``) compiles.

    Args:
        source: portable kernel source.
        dialect: target language.
        defines: ``#define NAME VALUE`` lines put before the source (e.g. ``{"T": "hal_f32"}``).

    Raises:
        ValueError: unknown dialect, bad defines, or a kernel the language does not support.
    """
    if dialect not in _PRELUDES:
        raise ValueError(f"dialect={dialect!r} is not one of {', '.join(DIALECTS)}")
    if not isinstance(source, str):
        raise TypeError(f"source={source!r} must be a string")
    defs = dict(defines or {})
    _check_defines(defs)
    sigs = parse_kernels(source, defs)
    gt = _GID_PARAMS[dialect]
    gid_decl = ", ".join(f"{gt} __hal_gid{d}" for d in range(3))
    gsz_decl = ", ".join(f"{gt} __hal_gsz{d}" for d in range(3))

    clean = _strip_comments(source)
    pieces: list[str] = []
    last = 0
    for m in _KERNEL_RE.finditer(clean):
        name, params_text = m.group(1), m.group(2).strip()
        params = (
            ""
            if params_text in ("", "void")
            else ", " + " ".join(source[m.start(2) : m.end(2)].split())
        )
        pieces.append(source[last : m.start()])
        keep_lines = "\n" * source.count("\n", m.start(), m.end())
        qual = "HAL_ITEM_LOOP" if _has_loop(clean, m.end()) else "HAL_ITEM"
        pieces.append(
            f"{qual} void {name}__hal_item({gid_decl}, {gsz_decl}{params}) {{{keep_lines}"
        )
        last = m.end()
    pieces.append(source[last:])
    body = "".join(pieces)

    lines = [_PRELUDES[dialect]]
    lines += [f"#define {k} {v}" for k, v in defs.items()]
    lines.append("#line 1")
    lines.append(body.rstrip() + "\n")
    lines.append("/* ---- entry points generated by hal.kernels ---- */")
    for sig in sigs:
        lines.append(_ENTRY[dialect](sig))
    return "\n".join(lines)


_BY_DTYPE = {dt: {"c": c, "opencl": ocl, "cuda": cu} for dt, c, ocl, cu in TYPES.values()}


def _spell(p: KernelParam, dialect: str) -> str:
    """Return the parameter's element/scalar type as ``dialect`` spells it."""
    return _BY_DTYPE[p.dtype][dialect]


def _ptr_type(p: KernelParam, dialect: str) -> str:
    space = "__global " if dialect == "opencl" else ""
    return f"{space}{'const ' if p.const else ''}{_spell(p, dialect)}*"


def _entry_c(sig: KernelSignature) -> str:
    decl = ", ".join(f"{_ptr_type(p, 'c') if p.pointer else p.ctype} {p.name}" for p in sig.params)
    call = ", ".join(p.name for p in sig.params)
    extra_decl = (", " + decl) if decl else ""
    extra_call = (", " + call) if call else ""
    n = sig.name
    return f"""static void {n}__hal_range(int64_t __hal_b, int64_t __hal_e,
        int64_t __hal_g0, int64_t __hal_g1, int64_t __hal_g2{extra_decl}) {{
    int64_t __hal_plane = __hal_g0 * __hal_g1, __hal_z = __hal_b / __hal_plane;
    int64_t __hal_y = (__hal_b % __hal_plane) / __hal_g0, __hal_x = __hal_b % __hal_g0, __hal_left = __hal_e - __hal_b;
    while (__hal_left > 0) {{
        int64_t __hal_xe = (__hal_x + __hal_left < __hal_g0) ? __hal_x + __hal_left : __hal_g0;
        for (int64_t __hal_i = __hal_x; __hal_i < __hal_xe; ++__hal_i)
            {n}__hal_item(__hal_i, __hal_y, __hal_z, __hal_g0, __hal_g1, __hal_g2{extra_call});
        __hal_left -= __hal_xe - __hal_x; __hal_x = 0;
        if (++__hal_y == __hal_g1) {{ __hal_y = 0; ++__hal_z; }}
    }}
}}
void {n}(const int64_t* __hal_gs, int32_t __hal_threads{extra_decl}) {{
    int64_t __hal_total = __hal_gs[0] * __hal_gs[1] * __hal_gs[2];
#ifdef _OPENMP
    if (__hal_threads > 1 && __hal_total > 1) {{
        #pragma omp parallel num_threads(__hal_threads)
        {{
            int64_t __hal_t = omp_get_thread_num(), __hal_m = omp_get_num_threads();
            {n}__hal_range(__hal_total * __hal_t / __hal_m, __hal_total * (__hal_t + 1) / __hal_m,
                __hal_gs[0], __hal_gs[1], __hal_gs[2]{extra_call});
        }}
        return;
    }}
#endif
    {n}__hal_range(0, __hal_total, __hal_gs[0], __hal_gs[1], __hal_gs[2]{extra_call});
}}
"""


def _entry_opencl(sig: KernelSignature) -> str:
    decl: list[str] = []
    call: list[str] = []
    for p in sig.params:
        if p.pointer:
            t = _ptr_type(p, "opencl")
            cchar = "__global const char*" if p.const else "__global char*"
            decl.append(f"{t} {p.name}__base, long {p.name}__off")
            call.append(f"({t})(({cchar}){p.name}__base + {p.name}__off)")
        else:
            decl.append(f"{_spell(p, 'opencl')} {p.name}")
            call.append(p.name)
    gid = ", ".join(f"(long)get_global_id({d})" for d in range(3))
    gsz = ", ".join(f"(long)get_global_size({d})" for d in range(3))
    extra = (", " + ", ".join(call)) if call else ""
    return (
        f"__kernel void {sig.name}({', '.join(decl) or 'void'}) {{\n"
        f"    {sig.name}__hal_item({gid}, {gsz}{extra});\n}}\n"
    )


def _entry_cuda(sig: KernelSignature) -> str:
    decl = ["long long __hal_g0", "long long __hal_g1", "long long __hal_g2"]
    for p in sig.params:
        decl.append(f"{_ptr_type(p, 'cuda') if p.pointer else _spell(p, 'cuda')} {p.name}")
    extra = "".join(", " + p.name for p in sig.params)
    dims = "xyz"
    ids = [f"(long long)blockIdx.{c} * blockDim.{c} + threadIdx.{c}" for c in dims]
    return (
        f'extern "C" __global__ void {sig.name}({", ".join(decl)}) {{\n'
        f"    long long i0 = {ids[0]}, i1 = {ids[1]}, i2 = {ids[2]};\n"
        "    if (i0 >= __hal_g0 || i1 >= __hal_g1 || i2 >= __hal_g2) return;\n"
        f"    {sig.name}__hal_item(i0, i1, i2, __hal_g0, __hal_g1, __hal_g2{extra});\n}}\n"
    )


_ENTRY = {"c": _entry_c, "opencl": _entry_opencl, "cuda": _entry_cuda}
