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
#   conformance  hal conformance --backend cuda --report, if that command exists
# Then a summary (also in OUTDIR/summary.txt). Exit status: 0 if every step passed.
# Everything runs outside the checkout (the checkout's partial hal/ folder must not shadow the
# installed package). Total: a few minutes; each step's timeout is also cut to what is left of
# a budget of GPU_CHECK_BUDGET seconds (default 420), so the run ends within about 7 minutes.
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
BUDGET="${GPU_CHECK_BUDGET:-420}"

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
run_step test-cuda 90 env HAL_BACKENDS=cuda,cpu "${PYTEST[@]}" --junitxml "$OUT/junit-test-cuda.xml" \
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
