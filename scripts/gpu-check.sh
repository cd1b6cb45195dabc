#!/usr/bin/env bash
# gpu-check.sh OUTDIR — check the cuda backend on a machine with an NVIDIA GPU and CuPy.
#
# For a machine with no network (e.g. the workplace's nvidia-h200 device machine): nothing is
# downloaded. Steps, each under its own timeout, each logged to OUTDIR, none stopping the rest:
#   env        nvidia-smi, python, numpy/pluggy/pytest/cupy versions, CuPy sees the GPU?
#   install    pip install --no-deps --no-build-isolation --no-index --target WORK/site CHECKOUT
#              (fallback: a PYTHONPATH tree assembled from the checkout, with entry points)
#   info       hal info --json                                   -> info.json, info.txt
#   test-cuda  pytest tests/backends/test_cuda.py (HAL_BACKENDS=cuda,cpu) -> junit + log
#   test-hal   pytest tests/hal, the shared suite, on cuda and cpu  -> junit + log
#   bench      hal bench memory --backend cuda --json (raw-CuPy baseline beside hal; alloc+free per
#              call with hal's pool, without it and with CuPy's pool; pageable vs hal.alloc_host copies)
#   bench-nostaging  the same for >= 1 MiB with HAL_CUDA_STAGING=0 (pageable h2d straight to the driver)
#   pinned     hal.copy from/to pinned host memory vs raw CuPy on pinned memory -> pinned.json
#   test-kernels pytest tests/kernels on cuda (portable kernels, ops, accuracy)   -> junit + log
#   kernels    hal kernels plan + accuracy --backend cuda                   -> kernels-accuracy.json
#   bench-kernels  hal bench kernels --backend cuda --json                  -> bench-kernels.json
#   features   this round's features on the GPU, with numbers -> features.json: from_dlpack of CuPy
#              memory (adopt, zero-copy), from_dlpack(copy=True) and __dlpack__(copy=True) of device
#              memory (stay on the device), IPC export/import across two processes (import time,
#              exporter closing first), Stream.wait_host (native? release latency), alloc_host
#              (pinned?), health() counters, float16/bfloat16 accumulate routes
#   conformance  hal conformance --backend cuda --report, if that command exists (certified or not:
#              a declared capability that fails is not certified; DLPACK-* need adopt and copy=True)
#   bench-comm hal bench comm -n 2 on cuda (all_reduce, 1K..16M), if cheap enough for the budget
#   nccl       hal doctor; the gpu-marked NCCL provider test; hal bench comm --provider nccl and
#              --provider generic (a rank per GPU, at most 2) -> bench-comm-nccl.json, bench-comm-generic.json
# Then a summary (also in OUTDIR/summary.txt). Exit status: 0 if every step passed.
# Everything runs outside the checkout (the checkout's partial hal/ folder must not shadow the
# installed package). Total: a few minutes; each step's timeout is also cut to what is left of
# a budget of GPU_CHECK_BUDGET seconds (default 480), so the run ends within about 8 minutes.
#
# Python: $PYTHON, default python3 (on nvidia-h200: Python 3.12 at /opt/torch/.venv with
# cupy-cuda13x 14.2.0, numpy, pluggy, packaging, pytest, pytest-timeout, hypothesis, torch).
# hal-sdk needs numpy, pluggy and packaging (and pytest + pytest-timeout for the tests).
#
# If CuPy (or another package) is missing there, carry wheels (the device tool sends the
# working tree, at most 64 MiB, and can carry ignored folders). Here, in the repo root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl cupy-cuda13x==14.2.0 cuda-pathfinder
# and run with carry [".whl"]. This script installs .whl/*.whl (if the folder exists) with
# --target into WORK/wheels and puts it on PYTHONPATH before anything else. Check the size
# first (du -sh .whl): the cupy-cuda13x wheel is large and may not fit in 64 MiB, in which case
# the GPU check cannot run on that machine without CuPy.
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUT="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
PY="$(command -v "$PYTHON" || true)"
if [ -z "$PY" ]; then
    echo "gpu-check: no $PYTHON on PATH (set PYTHON=...)" >&2
    exit 2
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/hal-gpu-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 2

export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export PY ROOT OUT WORK
unset HAL_BACKENDS HAL_DISABLE_BACKENDS HAL_STRICT_PLUGINS HAL_CUDA_DEVICES HAL_CUDA_STAGING
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0
START=$(date +%s)
# Every step's timeout is cut to what is left of this budget, so the whole run ends in time.
BUDGET="${GPU_CHECK_BUDGET:-480}"

note() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }

# run_step NAME TIMEOUT CMD...: run CMD with a timeout, log to OUT/NAME.log, record the result.
run_step() {
    local name="$1" limit="$2"
    shift 2
    local t0 rc left
    t0=$(date +%s)
    left=$((BUDGET - (t0 - START)))
    if [ "$left" -lt 15 ]; then
        FAILED=$((FAILED + 1))
        note "$(printf '%-16s %-18s %4ss  %s' "$name" "NOT RUN" 0 "the ${BUDGET}s budget is spent")"
        return 1
    fi
    [ "$limit" -le "$left" ] || limit="$left"
    printf '\n=== %s (timeout %ss, %s)\n' "$name" "$limit" "$(date -u +%H:%M:%S)"
    if declare -F "$1" > /dev/null; then
        # a shell function: run it in a child bash that has every function of this script
        timeout --kill-after=10 "$limit" bash -c "$(declare -f); set -o pipefail; $*" > "$OUT/$name.log" 2>&1
    else
        timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    fi
    rc=$?
    tail -n 15 "$OUT/$name.log"
    local verdict="ok"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        verdict="TIMEOUT"
    elif [ "$rc" -ne 0 ]; then
        verdict="FAILED (exit $rc)"
    fi
    [ "$verdict" = "ok" ] || FAILED=$((FAILED + 1))
    note "$(printf '%-16s %-18s %4ss  %s' "$name" "$verdict" "$(($(date +%s) - t0))" "$name.log")"
    return "$rc"
}

# --- carried wheels (optional) ------------------------------------------------------------
if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
    run_step wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$WORK/wheels" "$ROOT"/.whl/*.whl
    export PYTHONPATH="$WORK/wheels${PYTHONPATH:+:$PYTHONPATH}"
fi

# --- environment ---------------------------------------------------------------------------
env_report() {
    echo "date: $(date -u)"
    echo "checkout: $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
        --format=csv 2>&1 || true
    "$PY" - <<'PY'
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("numpy", "pluggy", "packaging", "pytest", "pytest_timeout", "cupy", "torch"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '?')}")
    except Exception as exc:  # report and go on
        print(f"{name}: MISSING ({type(exc).__name__}: {exc})")
try:
    import cupy
    from cupy_backends.cuda.api import runtime as rt
    n = rt.getDeviceCount()
    print(f"cupy sees {n} device(s); runtime {rt.runtimeGetVersion()}, driver {rt.driverGetVersion()}")
    for i in range(n):
        p = rt.getDeviceProperties(i)
        print(f"  {i}: {p['name'].decode()} cc {p['major']}.{p['minor']} {p['totalGlobalMem'] / 2**30:.1f} GiB")
except ImportError as exc:
    sys.exit(f"CuPy is not importable ({exc}): carry wheels (see the header of scripts/gpu-check.sh)")
except Exception as exc:
    sys.exit(f"CuPy cannot use a GPU: {type(exc).__name__}: {exc}")
PY
}
run_step env 45 env_report

# --- install the checkout ------------------------------------------------------------------
fallback_tree() {
    # Assemble WORK/site by hand: hal/ plus the folders setup.cfg maps into it, and a
    # dist-info with the entry points, so hal finds its plugins as in a real install.
    "$PY" - "$ROOT" "$WORK/site" <<'PY'
import configparser, pathlib, re, shutil, sys
root, site = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
cfg = configparser.ConfigParser()
cfg.read(root / "setup.cfg")
shutil.rmtree(site, ignore_errors=True)
site.mkdir(parents=True)
mapping = {}
for line in cfg["options"]["package_dir"].strip().splitlines():
    pkg, _, folder = (x.strip() for x in line.partition("="))
    mapping[pkg] = folder
shutil.copytree(root / mapping["hal"], site / "hal")
for pkg, folder in mapping.items():
    if pkg != "hal":
        shutil.copytree(root / folder, site / pkg.replace(".", "/"))
version = re.search(r'__version__\s*=\s*"([^"]+)"', (root / "hal" / "_version.py").read_text()).group(1)
info = site / f"hal_sdk-{version}.dist-info"
info.mkdir()
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hal-sdk\nVersion: {version}\n")
eps = cfg["options.entry_points"]
text = "".join(f"[{group}]\n{eps[group].strip()}\n\n" for group in eps)
(info / "entry_points.txt").write_text(text)
print(f"assembled {site} (hal-sdk {version}) without pip")
PY
}
install_hal() {
    rm -rf "$WORK/site"
    if "$PY" -m pip install --no-deps --no-build-isolation --no-index --no-cache-dir \
        --target "$WORK/site" "$ROOT"; then
        echo "installed with pip --target $WORK/site"
    else
        echo "pip could not install the checkout: falling back to a PYTHONPATH tree"
        fallback_tree
    fi
    PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
        "import hal, hal.backends.cuda, sys; print('hal', hal.__version__, 'from', hal.__file__); \
sys.exit('cupy imported by the plugin import' if 'cupy' in sys.modules else 0)"
}
run_step install 90 install_hal
export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"

# --- hal info --------------------------------------------------------------------------------
info_step() {
    "$PY" -m hal info --json > "$OUT/info.json" || return 1
    "$PY" -m hal info > "$OUT/info.txt" || return 1
    cat "$OUT/info.txt"
    "$PY" - "$OUT/info.json" <<'PY'
import json, sys
info = {b["name"]: b for b in json.load(open(sys.argv[1]))["backends"]}
cuda = info.get("cuda")
if cuda is None or cuda["status"] != "available":
    sys.exit(f"cuda is not available: {cuda and cuda['status']}: {cuda and cuda['reason']}")
print(f"cuda available: {len(cuda['devices'])} device(s), versions {cuda['versions']}")
PY
}
run_step info 45 info_step

# --- tests ------------------------------------------------------------------------------------
PYTEST=("$PY" -m pytest -p no:cacheprovider -rs --rootdir "$ROOT")
run_step test-cuda 120 env HAL_BACKENDS=cuda,cpu "${PYTEST[@]}" --junitxml "$OUT/junit-test-cuda.xml" \
    "$ROOT/tests/backends/test_cuda.py"
run_step test-hal 150 env HAL_BACKENDS=cuda,cpu "${PYTEST[@]}" --junitxml "$OUT/junit-test-hal.xml" \
    "$ROOT/tests/hal"

# --- benchmarks -------------------------------------------------------------------------------
bench_step() {  # bench_step FILE [ARGS...]: hal bench memory --backend cuda --json ARGS > OUT/FILE
    local file="$1"
    shift
    "$PY" -m hal bench memory --backend cuda --json "$@" > "$OUT/$file"
}
bench_nostaging() {  # pageable host->device straight to the driver, for comparison
    HAL_CUDA_STAGING=0 bench_step bench-memory-nostaging.json --min 1M
}
if "$PY" -m hal bench memory --help > /dev/null 2>&1; then
    run_step bench 90 bench_step bench-memory.json
    run_step bench-nostaging 45 bench_nostaging
else
    note "bench            SKIPPED            'hal bench memory' does not exist in this checkout"
fi

pinned_bench() {
    "$PY" - "$OUT/pinned.json" <<'PY'
"""hal.copy with pinned host memory vs raw CuPy with pinned host memory (same method as the bench)."""
import ctypes, json, statistics, sys, time
import numpy as np
import cupy
import hal
from hal.backends.cuda._baseline import transfer_seconds

dev = hal.device("cuda:0")
stream = dev.create_stream()
rows = []
for nbytes in (1 << 20, 16 << 20, 256 << 20):
    mem = cupy.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(memoryview((ctypes.c_ubyte * nbytes).from_address(int(mem.ptr))), dtype=np.uint8)
    host[:] = 7
    buf = dev.alloc(nbytes)
    for direction in ("h2d", "d2h"):
        dst, src = (buf, host) if direction == "h2d" else (host, buf)
        def once():
            hal.copy(dst, src, stream=stream)
            stream.synchronize()
        for _ in range(2):
            once()
        samples = []
        for _ in range(10):
            t0 = time.perf_counter(); once(); samples.append(time.perf_counter() - t0)
        hal_s = statistics.median(samples)
        raw_s = transfer_seconds(direction, nbytes, 10, host="pinned")
        rows.append({"direction": direction, "nbytes": nbytes, "hal_s": hal_s, "raw_s": raw_s,
                     "hal_GBps": nbytes / hal_s / 1e9, "raw_GBps": nbytes / raw_s / 1e9, "ratio": hal_s / raw_s})
        print(f"{direction} {nbytes >> 20:>4} MiB pinned: hal {nbytes / hal_s / 1e9:7.2f} GB/s  "
              f"raw {nbytes / raw_s / 1e9:7.2f} GB/s  ratio {hal_s / raw_s:.3f}")
    buf.close()
json.dump({"benchmark": "pinned host copies, hal vs raw CuPy", "results": rows}, open(sys.argv[1], "w"), indent=2)
PY
}
run_step pinned 45 pinned_bench

features_step() {
    HAL_BACKENDS=cuda,cpu HAL_KERNELS_SUMMARY=0 "$PY" - "$OUT/features.json" <<'PY'
"""This round's features on a real GPU: each row ok/error with a number where one means something."""
import json, os, subprocess, sys, threading, time, traceback
import numpy as np
import cupy
import hal
from hal.spi import impl_of

dev = hal.device("cuda:0")
ordinal = dev.properties()["cuda_ordinal"]
rows = []

def feature(name):
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            extra = fn() or {}
            rows.append({"feature": name, "ok": True, **extra})
        except Exception as exc:  # record and go on
            rows.append({"feature": name, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                         "trace": traceback.format_exc(limit=4)})
        rows[-1]["seconds"] = round(time.perf_counter() - t0, 4)
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "trace"}), flush=True)
        return fn
    return wrap

@feature("capabilities")
def _():
    c = dev.capabilities
    return {"ipc": c.ipc, "host_signal": c.host_signal, "dlpack": c.dlpack, "absent": dict(c.absent_reasons)}

@feature("from_dlpack adopt (cupy, zero-copy)")
def _():
    with cupy.cuda.Device(ordinal):
        x = cupy.arange(1 << 20, dtype=cupy.float32)
    t0 = time.perf_counter()
    arr = hal.from_dlpack(x)
    took = time.perf_counter() - t0
    assert impl_of(arr.buffer).ptr == x.data.ptr, "not zero-copy"
    assert float(arr.to_host()[12345]) == 12345.0
    arr.close()
    return {"adopt_us": round(took * 1e6, 1)}

@feature("from_dlpack copy=True (device to device)")
def _():
    with cupy.cuda.Device(ordinal):
        x = cupy.arange(1 << 20, dtype=cupy.int32)
    arr = hal.from_dlpack(x, copy=True)
    assert arr.device == dev and impl_of(arr.buffer).ptr != x.data.ptr
    x[:] = 0
    assert int(arr.to_host()[777]) == 777
    arr.close()

@feature("__dlpack__ copy=True stays on the device")
def _():
    arr = hal.asarray(np.arange(4096, dtype=np.float32), device=dev)
    class C:
        def __dlpack__(self, **kw): return arr.__dlpack__(copy=True, **kw)
        def __dlpack_device__(self): return arr.__dlpack_device__()
    v = cupy.from_dlpack(C())
    assert v.data.ptr != impl_of(arr.buffer).ptr and v.device.id == ordinal
    assert float(v[100]) == 100.0
    arr.close()

CHILD = """
import sys, time, numpy as np, hal
dev = hal.device("cuda:0")
t0 = time.perf_counter()
buf = dev.import_handle(bytes.fromhex(sys.argv[1]))
took = time.perf_counter() - t0
print(int(buf.view(np.uint32).to_host()[5]), round(took * 1e3, 3), flush=True)
sys.stdin.readline()
print(int(buf.view(np.uint32).to_host()[6]), flush=True)
buf.close()
"""

@feature("ipc export/import across processes (exporter closes first)")
def _():
    buf = hal.asarray(np.arange(1 << 16, dtype=np.uint32), device=dev).buffer
    t0 = time.perf_counter()
    handle = buf.export_handle()
    export_ms = (time.perf_counter() - t0) * 1e3
    p = subprocess.Popen([sys.executable, "-c", CHILD, handle.hex()], text=True, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, HAL_BACKENDS="cuda"))
    first = p.stdout.readline().split()
    assert first and first[0] == "5", (first, p.stderr.read() if not first else "")
    buf.close()
    p.stdin.write("closed\n"); p.stdin.flush()
    after = p.stdout.readline().strip()
    p.communicate(timeout=60)
    assert after == "6" and p.returncode == 0, (after, p.returncode)
    return {"export_ms": round(export_ms, 3), "import_ms": float(first[1])}

@feature("wait_host (native signal release latency)")
def _():
    s = dev.create_stream()
    lat = []
    for _ in range(20):
        sig = s.wait_host()
        t0 = time.perf_counter()
        sig.set()
        s.synchronize()
        lat.append(time.perf_counter() - t0)
    s.close()
    return {"native": bool(sig.native), "set_to_sync_us_median": round(sorted(lat)[10] * 1e6, 1)}

@feature("alloc_host pinned")
def _():
    from hal.backends.cuda._device import is_pinned
    h = hal.alloc_host(64 << 20, device=dev)
    return {"pinned": is_pinned(int(h.ctypes.data))}

@feature("health")
def _():
    return {"health": impl_of(dev).health()}

for dt_name in ("float16", "bfloat16"):
    @feature(f"accumulate {dt_name}")
    def _(dt_name=dt_name):
        import ml_dtypes
        import hal.kernels as hk
        from hal.kernels._dispatch import trace
        dt = np.dtype(ml_dtypes.bfloat16) if dt_name == "bfloat16" else np.dtype(dt_name)
        a = np.linspace(-3, 3, 1 << 16).astype(np.float32).astype(dt)
        d, s_ = hal.asarray(a, device=dev), hal.asarray(a[::-1].copy(), device=dev)
        st = dev.create_stream()
        with trace() as rec:
            hk.accumulate(d, s_, op="sum", stream=st)
        st.synchronize()
        want = (a.astype(np.float32) + a[::-1].astype(np.float32)).astype(dt)
        exact = bool((d.to_host().view(np.uint16) == want.view(np.uint16)).all())
        assert exact, "result differs from float32-then-round"
        return {"implementation": rec[0].implementation}

json.dump({"device": dev.name, "rows": rows}, open(sys.argv[1], "w"), indent=2)
sys.exit(0 if all(r["ok"] for r in rows) else 1)
PY
}
run_step features 90 features_step

summarize_bench() {
    "$PY" - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("bench-memory.json", "bench-memory-nostaging.json"):
    path = out / name
    if not path.exists():
        continue
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        print(f"{name}: not JSON ({exc})")
        continue
    for section in doc.get("backends", []):
        print(f"{name}: backend {section['backend']} {section['status']} {section.get('reason', '')}")
        for r in section.get("results", []):
            if r.get("nbytes", 0) < (1 << 20):
                continue
            fmt = lambda v: "   -  " if v is None else f"{v:7.2f}"
            print(f"  {r['direction']:>4} {r['nbytes'] >> 20:>4} MiB {str(r.get('path')):>6}: hal {fmt(r.get('hal_GBps'))} GB/s"
                  f"  raw {fmt(r.get('raw_GBps'))} GB/s  ratio {fmt(r.get('ratio'))}"
                  f"  {r.get('hal_error') or r.get('raw_error') or r.get('skipped') or ''}")
        print(f"  target: {section.get('target')}")
PY
}

# --- conformance (when the command exists) ------------------------------------------------
if "$PY" -m hal conformance --help > "$OUT/conformance-help.txt" 2>&1; then
    if grep -Eq -- '--report[ =][A-Z]' "$OUT/conformance-help.txt"; then
        run_step conformance 90 "$PY" -m hal conformance --backend cuda --report "$OUT/conformance-report"
    else
        run_step conformance 90 "$PY" -m hal conformance --backend cuda --report
    fi
else
    note "conformance      SKIPPED            'hal conformance' does not exist in this checkout"
fi

# --- kernels (hal.kernels on cuda: same portable source as cpu, plan, accuracy) ----------------
kernels_step() {
    export HAL_KERNELS_SUMMARY=0
    "$PY" -m hal kernels plan --backend cuda || return 1
    "$PY" -m hal kernels accuracy --backend cuda --json > "$OUT/kernels-accuracy.json"
    local rc=$?
    "$PY" - "$OUT/kernels-accuracy.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
bad = [r for r in doc["rows"] if not r["pass"]]
print(f"accuracy: {len(doc['rows']) - len(bad)}/{len(doc['rows'])} rows pass")
for r in bad:
    print("  FAIL", r["op"], r["dtype"], r["implementation"], r.get("error") or r)
PY
    return $rc
}
bench_kernels_step() {
    HAL_KERNELS_SUMMARY=0 "$PY" -m hal bench kernels --backend cuda --batches 2 --json > "$OUT/bench-kernels.json" \
        && "$PY" -c "import json,sys; [print(r['op'], r['size'], r['implementation'], round(r['hal_ms'], 3), 'ms; numpy', round(r['numpy_ms'], 3), 'ms') for r in json.load(open(sys.argv[1]))['results']]" "$OUT/bench-kernels.json"
}
if "$PY" -m hal kernels --help > /dev/null 2>&1; then
    run_step test-kernels 120 env HAL_BACKENDS=cuda,cpu HAL_KERNELS_SUMMARY=0 "${PYTEST[@]}" \
        --junitxml "$OUT/junit-test-kernels.xml" -k "cuda or same_source" "$ROOT/tests/kernels"
    run_step kernels 90 kernels_step
    run_step bench-kernels 60 bench_kernels_step
else
    note "kernels          SKIPPED            'hal kernels' does not exist in this checkout"
fi

# --- hal bench comm (two ranks sharing cuda:0; small sizes only, to stay in the budget) ----------
if "$PY" -m hal bench comm --help > /dev/null 2>&1; then
    run_step bench-comm 60 env HAL_BACKENDS=cuda "$PY" -m hal bench comm -n 2 --op all_reduce --min 1K \
        --max 16M --json
    cp "$OUT/bench-comm.log" "$OUT/bench-comm.json" 2>/dev/null || true
fi

# --- NCCL collective provider (a rank per GPU, at most 2: NCCL refuses two ranks on one GPU) ----
nccl_step() {
    local n
    n="$("$PY" -c 'import cupy; print(min(2, cupy.cuda.runtime.getDeviceCount()))' 2>/dev/null || echo 1)"
    HAL_BACKENDS=cuda "$PY" -m hal doctor || true   # the versions, and whether nccl is usable (or why not)
    env HAL_BACKENDS=cuda,cpu "${PYTEST[@]}" --junitxml "$OUT/junit-test-nccl.xml" -m gpu \
        "$ROOT/tests/comm/test_providers.py" || return 1
    local p
    for p in nccl generic; do  # hal bench comm with NCCL vs hal's own algorithms, same ranks
        HAL_BACKENDS=cuda "$PY" -m hal bench comm -n "$n" --provider "$p" --op all_reduce --min 1K --max 16M \
            --json > "$OUT/bench-comm-$p.json" || return 1
    done
}
if "$PY" -m hal doctor --help > /dev/null 2>&1; then
    run_step nccl 90 nccl_step
fi

# --- summary -----------------------------------------------------------------------------------
{
    echo
    echo "=== bench (>= 1 MiB; full JSON in bench-memory*.json)"
    summarize_bench
    echo
    echo "=== pytest outcomes"
    grep -hE '^(=+ .*(passed|failed|error|skipped).* =+|FAILED|ERROR)' "$OUT"/test-*.log 2>/dev/null | head -n 40
} | tee -a "$SUMMARY"
note ""
note "gpu-check: $FAILED step(s) failed; $(($(date +%s) - START)) s; logs and JSON in $OUT"
[ "$FAILED" -eq 0 ]
