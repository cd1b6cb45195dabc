"""hal.comm.init() under the real launchers, as docs/comm.md shows them ("Launchers").

The ``bash`` block of that section is run line by line (``hal run``, ``torchrun --standalone``,
``mpiexec`` of the MPICH wheel), with the example script of the checkout; each rank must print
its correct all_reduce sum. Open MPI runs only where it is installed. A port clash on
MASTER_PORT is a hal.CommError naming the address and the process listening there.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

_spec = importlib.util.spec_from_file_location(
    "hal_torch_support", ROOT / "tests" / "torch" / "support.py"
)
assert _spec is not None and _spec.loader is not None
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)


def doc_commands() -> list[str]:
    """The commands of the first ``bash`` block of docs/comm.md's "Launchers" section."""
    text = (ROOT / "docs" / "comm.md").read_text()
    section = text.split("### Launchers", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def resolve(cmd: str) -> list[str]:
    """argv of a docs line: launchers and ``python`` from this venv, example paths made absolute."""
    argv = shlex.split(cmd)
    tools = {"python": sys.executable}
    for i, a in enumerate(argv):
        if a in tools:
            argv[i] = tools[a]
        elif i == 0:
            exe = BIN / a
            argv[i] = str(exe) if exe.exists() else (shutil.which(a) or a)
        elif a.startswith("examples/"):
            argv[i] = str(ROOT / a)
    return argv


COMMANDS = doc_commands()


def test_docs_show_each_launcher() -> None:
    assert [c.split()[0] for c in COMMANDS] == ["hal", "torchrun", "mpiexec"], COMMANDS


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.split()[0] for c in COMMANDS])
def test_docs_launcher_command_runs(cmd: str) -> None:
    launcher = {"hal": "hal", "torchrun": "torchrun", "mpiexec": "mpi"}[cmd.split()[0]]
    if launcher == "torchrun":
        support.need_torchrun()
    if launcher == "mpi" and importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py/mpiexec not installed (pip install 'hal-sdk[mpi]')")
    argv = resolve(cmd)
    if not Path(argv[0]).exists() and shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    proc = subprocess.run(
        argv,
        env=support.child_env(HAL_COMM_TIMEOUT_MS="60000"),
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    )
    lines = sorted(
        re.findall(
            r"^rank (\d)/(\d) launcher=(\w+) transport=(\w+): .* (OK|WRONG)$", proc.stdout, re.M
        )
    )
    assert lines == [(str(r), "2", launcher, "shm", "OK") for r in range(2)], proc.stdout


def test_open_mpi_mpiexec() -> None:
    """Open MPI's mpirun (where Open MPI and an mpi4py built against it are installed).

    The same setup as ``hal bench comm --baseline openmpi``: Debian's ``mpirun.openmpi`` and
    mpi4py built against Open MPI in its own venv, first on the ranks' ``PYTHONPATH`` (the main
    environment's mpi4py is MPICH's wheel).
    """
    from hal.cli.bench._comm import openmpi_launch

    launch = openmpi_launch()
    if isinstance(launch, str):
        pytest.skip(launch.replace("\n", " "))
    prefix, env = launch
    proc = subprocess.run(
        [*prefix, "-n", "2", sys.executable, str(ROOT / "examples" / "comm_hello.py")],
        env=support.child_env(**{**env, "HAL_COMM_TIMEOUT_MS": "60000"}),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" OK") == 2 and "launcher=mpi" in proc.stdout, proc.stdout


LISTENER = (
    "import socket, sys\ns = socket.create_server(('127.0.0.1', 0))\n"
    "print(s.getsockname()[1], flush=True)\nsys.stdin.read()\n"
)


def test_port_clash_names_the_address_and_the_listener() -> None:
    """RANK/MASTER_PORT set by hand to a port another process listens on: CommError naming both."""
    holder = subprocess.Popen(
        [sys.executable, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        proc = subprocess.run(
            [sys.executable, "-c", "import hal.comm; hal.comm.init()"],
            env=support.child_env(
                RANK="0",
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                HAL_COMM_TIMEOUT_MS="5000",
            ),
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        holder.kill()
        holder.communicate()
    assert proc.returncode != 0
    errors = [x for x in proc.stderr.splitlines() if "CommError: " in x]
    assert errors, proc.stderr
    last = errors[-1]
    assert f"127.0.0.1:{port}" in last and "in use" in last, last
    assert f"pid {holder.pid} " in last, last  # names the process listening there


def test_hand_set_variables_still_use_hals_own_server() -> None:
    """Without TORCHELASTIC_* the torchrun-style variables mean hal's gather server (no torch needed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import hal.comm; c = hal.comm.init(); "
        "print(type(c._bootstrap).__name__, hal.comm.detect_launcher()[1]['store'], c.size); c.close()"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),
            env=support.child_env(
                RANK=str(r),
                WORLD_SIZE="2",
                LOCAL_RANK=str(r),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                HAL_COMM_TIMEOUT_MS="30000",
            ),
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert out.split() == ["TcpBootstrap", "hal", "2"], out


def test_torchrun_environment_without_torch_is_a_clear_error() -> None:
    """TORCHELASTIC_* set but torch not importable: a CommError saying what to install, no port bound."""
    code = (
        "import sys; sys.modules['torch'] = None\nimport hal, hal.comm\ntry:\n    hal.comm.init()\n"
        "except hal.CommError as e:\n    print('CommError', e)\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=support.child_env(
            RANK="0",
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TORCHELASTIC_RUN_ID="test",
            TORCHELASTIC_RESTART_COUNT="0",
        ),
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.startswith("CommError")
        and "torchrun" in proc.stdout
        and "hal-sdk[torch]" in proc.stdout
    ), proc.stdout
