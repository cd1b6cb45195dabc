"""Build and load the native progress engine of the shared-memory transport (``_native_shm.c``).

The C source is compiled once by the host C compiler (``HAL_CPU_CC``, else ``cc``, else
``gcc``) into a shared library by ``hal.spi.native`` (cffi's ABI mode), kept in hal's verified
compile cache (hal.spi.compile_cache: the key covers the source, flags, compiler and CPU; an entry
is checked before it is loaded) and loaded from a private temporary copy. Calls release the GIL.
When there is no cffi or no compiler, or ``HAL_COMM_NATIVE=0``, :func:`load` returns the reason
and hal.comm keeps its Python path.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import shutil
import threading
from pathlib import Path

from hal.spi import native, setting

__all__ = ["CDEF", "DTYPE_CODES", "OP_CODES", "NativeLib", "load", "unavailable_reason"]

_log = logging.getLogger("hal.comm")
_SOURCE = Path(__file__).with_name("_native_shm.c")
_CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fwrapv", "-fPIC", "-shared", "-std=gnu11")

#: The C declarations cffi binds (the structures and entry points of ``_native_shm.c``).
CDEF = """
typedef struct {
    uint64_t ring; uint64_t data; uint64_t base; uint64_t bell;
    int64_t nbytes; int64_t done;
    int32_t peer; int32_t op; int32_t dtype; int32_t after;
    int64_t posted; int64_t ack0; int64_t refmin;
    int64_t rpid; uint64_t raddr; int64_t cells; int64_t shared;
} hal_xop;
typedef struct {
    uint64_t bell; int64_t slots; int64_t data_off; int64_t slot_bytes; int64_t chunk;
    int64_t spin_ns; int64_t check_ns; int64_t moved; int64_t bad_op; int64_t bad_got;
    int64_t bad_peer; int64_t cma_bytes; int64_t ack_off; int64_t pid; int64_t err;
    int64_t ref_whole; int64_t cell_bytes; int64_t claim_off; int64_t ref_piece;
    int64_t yield_ns; int64_t write_ok; int64_t wrote;
} hal_xctx;
int hal_shm_exchange(hal_xctx *c, hal_xop *sends, int nsend, hal_xop *recvs, int nrecv);
void hal_shm_ring(uint64_t bell);
uint32_t hal_shm_wait(uint64_t bell, uint32_t seen, int64_t spin_ns, int64_t timeout_ns);
uint32_t hal_shm_bell(uint64_t bell);
typedef struct {
    int32_t kind; int32_t peer; uint64_t ptr; uint64_t src; int64_t nbytes; int32_t op; int32_t dtype;
} hal_act;
int hal_shm_run(hal_xctx *c, hal_act *acts, int nact, int64_t *pos, const uint64_t *outs,
                const uint64_t *ins, const uint64_t *bells, char *stash);
int hal_shm_prog(hal_xctx *c, hal_act *acts, int nact, int64_t *pos, const uint64_t *outs,
                 const uint64_t *ins, const uint64_t *bells, char *stash, hal_xop *xops);
typedef struct {
    hal_xctx *c; hal_act *acts; hal_xop *xops; int64_t *pos; const uint64_t *outs;
    const uint64_t *ins; const uint64_t *bells; char *stash; int64_t *seq;
    int64_t nact; int64_t nx; int64_t chunk;
} hal_again;
int hal_shm_again(hal_again *g, int64_t seq);
int hal_shm_map_peer(int64_t pid, uint64_t rbase, uint64_t rsize, char *lbase, int64_t writable);
int64_t hal_shm_mapped_bytes(void);
int hal_shm_cma_probe(int64_t pid, uint64_t addr);
int hal_shm_read_ref(hal_xctx *c, int64_t pid, uint64_t addr, char *dst, int64_t n);
void hal_shm_ack(uint64_t ack);
"""
#: Reduction op codes of the C reducers (``avg`` reduces as ``sum``; the scale comes after).
OP_CODES = {"sum": 0, "avg": 0, "prod": 1, "max": 2, "min": 3}
#: Element types the C reducers handle (others run the exchange on the Python path).
DTYPE_CODES = {"float32": 0, "float64": 1, "int32": 2, "int64": 3, "int8": 4, "uint8": 5}


#: The loaded library (``hal.spi.native.NativeLib``, ABI mode): ``ffi`` and ``lib`` (cffi), kept
#: for the life of the process.
NativeLib = native.NativeLib

_lock = threading.Lock()
_loaded: NativeLib | None = None
_reason: str | None = None


def _compiler() -> str | None:
    env = setting("HAL_CPU_CC") or ""
    for cand in ([env] if env else []) + ["cc", "gcc"]:
        path = shutil.which(cand)
        if path:
            return path
    return None


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.split(":", 1)[0].strip() == "flags":
                    return hashlib.sha256(line.encode()).hexdigest()[:12]
    except OSError:
        pass
    return platform.processor()


def _load() -> NativeLib:
    import cffi

    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (install gcc or set HAL_CPU_CC)")
    binary = native.build(
        _SOURCE,
        name="hal_comm_native_shm",
        mode="abi",
        backend="hal.comm-native",
        device=f"{platform.machine()} flags:{_cpu_flags()}",
        what="hal.comm native shm engine",
        compiler={"compiler": native.compiler_version(cc), "cffi": cffi.__version__},
        cflags=_CFLAGS,
        cc=cc,
        ffi=cffi.FFI,
    )
    return native.load(binary, name="hal_comm_native_shm", mode="abi", ffi=cffi.FFI, cdef=CDEF)


def unavailable_reason() -> str | None:
    """Return why the native engine is off in this process (``HAL_COMM_NATIVE=0``, no compiler ...), or None."""
    if not setting("HAL_COMM_NATIVE"):
        return "HAL_COMM_NATIVE=0"
    load()
    return _reason


def load() -> NativeLib | None:
    """Return the native engine (compiled or taken from the cache on first use), or None (reason logged once)."""
    global _loaded, _reason
    if _loaded is not None or _reason is not None:
        return _loaded
    with _lock:
        if _loaded is None and _reason is None:
            try:
                _loaded = _load()
            except Exception as exc:  # noqa: BLE001 - any failure means the Python path
                _reason = (
                    f"{type(exc).__name__}: {exc}"
                    if not isinstance(exc, RuntimeError)
                    else str(exc)
                )
                _log.warning(
                    "hal.comm: native shm engine unavailable, using the Python path: %s", _reason
                )
    return _loaded
