"""torchrun across two emulated hosts (network namespaces): ``--nnodes=2 --rdzv-backend=static``.

Each namespace runs one torchrun agent with one rank; node 0's agent serves the store at its
own address. hal.comm.init() and the "hal" torch backend must meet there and talk TCP between
the namespaces; DDP on "hal" must match gloo. Only addresses inside the namespaces are used.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location(
    "hal_torch_support", Path(__file__).resolve().parents[1] / "torch" / "support.py"
)
assert _spec is not None and _spec.loader is not None
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)


def test_torchrun_two_hosts_static_rendezvous(cluster: Any, tmp_path: Path) -> None:
    exe = support.need_torchrun()
    c = cluster(2)
    procs = []
    for i, ns in enumerate(c.ns):
        # hostnames are the same in every namespace: force TCP (as hal would pick across real hosts);
        # gloo (the reference) must use the namespace's veth, not the hostname's 127.0.0.1
        env = support.child_env(HAL_COMM_TRANSPORT="tcp", GLOO_SOCKET_IFNAME=c.dev[i])
        procs.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    exe,
                    "--nnodes=2",
                    "--nproc_per_node=1",
                    f"--node_rank={i}",
                    "--rdzv-backend=static",
                    f"--master-addr={c.addr[0]}",
                    "--master-port=29541",
                    support.JOB,
                    str(tmp_path),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=str(tmp_path),
            )
        )
    c.procs.extend(procs)  # the fixture kills what still runs
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=150)
        assert p.returncode == 0, f"node {i}: torchrun exited {p.returncode}\n{out}\n{err[-6000:]}"
    job = support.load_results(tmp_path, 2)
    support.check_init(job, "tcp")
    support.check_calls(job, "tcp")
    support.check_ddp(job)
