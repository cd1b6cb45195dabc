"""hal.comm in one process: a communicator over several devices, one array per device per call."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

import hal
import hal.comm
import hal.comm.spi

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import inprocess  # noqa: E402
import matrix  # noqa: E402


def test_matrix_every_device_of_the_backend(backend_devices: list[hal.Device]) -> None:
    """Every collective x op x dtype x in/out-of-place, sizes 0, 1, 13 (not divisible by 2)."""
    if len(backend_devices) < 2:
        pytest.skip("needs two devices")
    checks, failures = inprocess.run_all(backend_devices, sizes=(0, 1, 13))
    assert not failures, "\n".join(failures[:20])
    assert checks > 500


@pytest.mark.parametrize("ndev", [3, 4])
def test_matrix_3_and_4_devices_under_jitter(python_run, ndev: int) -> None:  # type: ignore[no-untyped-def]
    """3 and 4 CPU-emulator devices with HAL_CPU_JITTER: a missing event wait would show."""
    proc = python_run(
        [str(HERE / "inprocess.py"), "--backend", "cpu", "--sizes", "0,5"],
        env={"HAL_CPU_DEVICES": str(ndev), "HAL_CPU_JITTER": "11", "HAL_BACKENDS": "cpu"},
    )
    assert proc.stdout.startswith("OK"), proc.stdout + proc.stderr


def _streams(devs: list[hal.Device]) -> list[hal.Stream]:
    return [d.create_stream() for d in devs]


def test_list_api_all_collectives(backend_devices: list[hal.Device]) -> None:
    """The list API: one array and one stream per device, one Work for all."""
    devs = backend_devices[:2]
    if len(devs) < 2:
        pytest.skip("needs two devices")
    comm = hal.comm.create(devs)
    ss = _streams(devs)
    p = len(devs)
    ins = [np.arange(7, dtype=np.float32) + 10 * i for i in range(p)]
    xs = [hal.asarray(x, device=d) for x, d in zip(ins, devs, strict=True)]
    ys = [hal.asarray(np.zeros(7, np.float32), device=d) for d in devs]
    w = comm.all_reduce(xs, ys, op="max", streams=ss)
    w.wait()
    assert w.done() and len(w.plan) == p
    for y in ys:
        np.testing.assert_array_equal(y.to_host(), np.maximum(*ins))
    g = [hal.asarray(np.zeros(7 * p, np.float32), device=d) for d in devs]
    comm.all_gather(xs, g, streams=ss).wait()
    for y in g:
        np.testing.assert_array_equal(y.to_host(), np.concatenate(ins))
    comm.broadcast(xs, root=1, streams=ss).wait()
    for x in xs:
        np.testing.assert_array_equal(x.to_host(), ins[1])
    comm.barrier().wait()
    comm.close()


def test_mixed_backends_copy_staged() -> None:
    """Devices of two backends: the plan says staged, the result is right."""
    cpu = hal.devices("cpu")
    others = [d for d in hal.devices() if d.backend != "cpu"]
    if not others:
        pytest.skip("only the cpu backend is available")
    devs = [cpu[0], others[0]]
    comm = hal.comm.create(devs)
    xs = [hal.asarray(np.full(5, i + 1, np.int32), device=d) for i, d in enumerate(devs)]
    w = comm.all_reduce(xs, op="sum", streams=_streams(devs))
    w.wait()
    assert {p.path for p in w.plan} == {"staged"}
    for x in xs:
        np.testing.assert_array_equal(x.to_host(), np.full(5, 3, np.int32))
    comm.close()


def test_peer_path_in_plan() -> None:
    devs = hal.devices("cpu")[:2]
    comm = hal.comm.create(devs)
    xs = [hal.asarray(np.ones(3, np.float64), device=d) for d in devs]
    w = comm.all_reduce(xs, streams=_streams(devs))
    w.wait()
    assert all(p.path == "peer" and p.transport == "local" for p in w.plan)
    assert comm.last_plan is not None and comm.last_plan.collective == "all_reduce"
    comm.close()


# -- bad arguments: rejected before anything moves ----------------------------------------
@pytest.fixture
def pair() -> tuple[hal.comm.DeviceCommunicator, list[hal.Array], list[hal.Stream]]:
    devs = hal.devices("cpu")[:2]
    comm = hal.comm.create(devs)
    xs = [hal.asarray(np.arange(4, dtype=np.float32) + i, device=d) for i, d in enumerate(devs)]
    yield comm, xs, _streams(devs)
    comm.close()


@pytest.mark.parametrize(
    ("kwargs", "exc", "needle"),
    [
        ({"op": "mean"}, ValueError, "op='mean'"),
        ({"op": 3}, TypeError, "op=3"),
    ],
)
def test_bad_op(pair, kwargs, exc, needle) -> None:  # type: ignore[no-untyped-def]
    comm, xs, ss = pair
    with pytest.raises(exc, match=needle):
        comm.all_reduce(xs, streams=ss, **kwargs)
    np.testing.assert_array_equal(xs[0].to_host(), np.arange(4, dtype=np.float32))


def test_bad_dtype_and_sizes(pair) -> None:  # type: ignore[no-untyped-def]
    comm, xs, ss = pair
    devs = comm.devices
    i16 = [
        hal.asarray(np.zeros(4, np.int16), device=d) for d in devs
    ]  # uint8 is reducible since #11
    with pytest.raises(TypeError, match=r"rank 0: send\.dtype=int16"):
        comm.all_reduce(i16, streams=ss)
    short = [xs[0], hal.asarray(np.zeros(3, np.float32), device=devs[1])]
    with pytest.raises(ValueError, match="differ between devices"):
        comm.all_reduce(short, streams=ss)
    wrong = [hal.asarray(np.zeros(5, np.float32), device=d) for d in devs]
    with pytest.raises(ValueError, match="recv has 5 elements"):
        comm.all_reduce(xs, wrong, streams=ss)
    with pytest.raises(ValueError, match="root=2"):
        comm.broadcast(xs, root=2, streams=ss)
    with pytest.raises(ValueError, match="list of 2 streams"):
        comm.all_reduce(xs, streams=ss[:1])
    with pytest.raises(hal.DeviceMismatchError, match="stream belongs to"):
        comm.all_reduce(xs, streams=[ss[1], ss[0]])
    with pytest.raises(hal.DeviceMismatchError):
        comm.all_reduce([xs[1], xs[0]], streams=ss)
    with pytest.raises(ValueError, match="multiple of the 2 ranks"):
        comm.all_gather(
            None, [hal.asarray(np.zeros(5, np.float32), device=d) for d in devs], streams=ss
        )
    # NumPy arrays are DLPack producers (used zero-copy since #11); a list is neither
    with pytest.raises(
        TypeError,
        match=r"rank 0: send=\[0\.0, 0\.0\] is neither a hal\.Array nor a DLPack producer",
    ):
        comm.all_reduce([[0.0, 0.0], [0.0, 0.0]], streams=ss)  # type: ignore[list-item]
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(x.to_host(), np.arange(4, dtype=np.float32) + i)
    assert comm.last_plan is None  # nothing was planned, let alone enqueued


def test_recv_of_the_wrong_size_is_named_by_each_collective(pair) -> None:  # type: ignore[no-untyped-def]
    """Every collective with a recv checks its size the same way, before anything moves."""
    comm, xs, ss = pair
    devs = comm.devices
    five = [hal.asarray(np.zeros(5, np.float32), device=d) for d in devs]
    three = [hal.asarray(np.zeros(3, np.float32), device=d) for d in devs]
    calls = {
        "all_reduce": lambda: comm.all_reduce(xs, five, streams=ss),
        "broadcast": lambda: comm.broadcast(xs, five, root=0, streams=ss),
        "reduce": lambda: comm.reduce(xs, five, root=1, streams=ss),
        "all_to_all": lambda: comm.all_to_all(xs, five, streams=ss),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=r"^recv has 5 elements; send has 4$"):
            call()
        assert comm.last_plan is None, name
    with pytest.raises(ValueError, match=r"^recv has 3 elements; rank 0's segment of 4 has 2$"):
        comm.reduce_scatter(xs, three, streams=ss)
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(x.to_host(), np.arange(4, dtype=np.float32) + i)
    for y in (*five, *three):
        assert not y.to_host().any()
        y.close()


def test_create_rejects_bad_devices() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        hal.comm.create([])
    d = hal.devices("cpu")[0]
    with pytest.raises(ValueError, match="twice"):
        hal.comm.create([d, d])
    with pytest.raises(TypeError, match="devices\\[1\\]"):
        hal.comm.create([d, "cpu:1"])  # type: ignore[list-item]


# -- planner, overrides, visibility ---------------------------------------------------------
def test_cost_model_picks_by_size() -> None:
    from hal.comm._plan import choose
    from hal.comm._shm import ShmTransport

    def algo(nbytes: int, ranks: int = 4) -> str:
        return choose(
            "all_reduce",
            nbytes=nbytes,
            ranks=ranks,
            hosts=1,
            transport=ShmTransport,
            chunk_bytes=2 << 20,
            path="host-shm",
            override=None,
        ).algorithm

    assert algo(4096) == "recursive_doubling"
    assert algo(256 << 20) in ("rabenseifner", "ring")
    assert algo(256 << 20, ranks=2) != "recursive_doubling"


def test_algo_override_and_impossible_override(monkeypatch: pytest.MonkeyPatch) -> None:
    devs = hal.devices("cpu")[:2]
    monkeypatch.setenv("HAL_COMM_ALGO", "allreduce:ring")
    comm = hal.comm.create(devs)
    xs = [hal.asarray(np.ones(8, np.float32), device=d) for d in devs]
    w = comm.all_reduce(xs, streams=_streams(devs))
    w.wait()
    assert [p.algorithm for p in w.plan] == ["ring", "ring"]
    assert w.plan[0].chosen_by == "HAL_COMM_ALGO"
    comm.close()
    monkeypatch.setenv("HAL_COMM_ALGO", "allreduce:tree")
    with pytest.raises(ValueError, match="all_reduce has no algorithm 'tree'"):
        hal.comm.create(devs)
    monkeypatch.setenv("HAL_COMM_ALGO", "gossip:ring")
    with pytest.raises(ValueError, match="unknown collective 'gossip'"):
        hal.comm.create(devs)


def test_impossible_override_on_three_ranks(python_run) -> None:  # type: ignore[no-untyped-def]
    code = (
        "import numpy as np, hal, hal.comm\n"
        "devs = hal.devices('cpu'); comm = hal.comm.create(devs)\n"
        "ys = [hal.asarray(np.zeros(6, np.float32), device=d) for d in devs]\n"
        "try:\n"
        "    comm.all_gather(None, ys, streams=[d.create_stream() for d in devs])\n"
        "except hal.CommError as e:\n"
        "    print('CommError', e)\n"
    )
    proc = python_run(
        ["-c", code],
        env={
            "HAL_CPU_DEVICES": "3",
            "HAL_BACKENDS": "cpu",
            "HAL_COMM_ALGO": "allgather:recursive_doubling",
        },
    )
    assert "CommError" in proc.stdout and "power-of-two" in proc.stdout, proc.stdout + proc.stderr


def test_plan_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    devs = hal.devices("cpu")[:2]
    comm = hal.comm.create(devs)
    xs = [hal.asarray(np.ones(8, np.float32), device=d) for d in devs]
    with caplog.at_level(logging.DEBUG, logger="hal.comm"):
        comm.all_reduce(xs, streams=_streams(devs)).wait()
    comm.close()
    text = caplog.text
    assert (
        "plan: all_reduce" in text
        and "algorithm=" in text
        and "transport=local" in text
        and "chunk=" in text
    )


def test_hal_log_level_debug_prints_plan(python_run) -> None:  # type: ignore[no-untyped-def]
    code = (
        "import numpy as np, hal, hal.comm\n"
        "devs = hal.devices('cpu'); comm = hal.comm.create(devs)\n"
        "xs = [hal.asarray(np.ones(4, np.float32), device=d) for d in devs]\n"
        "comm.all_reduce(xs, streams=[d.create_stream() for d in devs]).wait(); comm.close()\n"
    )
    proc = python_run(["-c", code], env={"HAL_LOG_LEVEL": "debug", "HAL_BACKENDS": "cpu"})
    assert "plan: all_reduce" in proc.stderr and "algorithm=" in proc.stderr


def test_work_of_a_failed_call_raises_and_later_calls_fail_fast() -> None:
    """A failure is sticky: the communicator refuses further calls with the original cause."""
    devs = hal.devices("cpu")[:2]
    comm = hal.comm.create(devs, timeout_ms=300)
    x = hal.asarray(np.ones(4, np.float32), device=devs[0])
    s = devs[0].create_stream()
    w = comm.ranks[0].all_reduce(x, stream=s)  # rank 1 never calls: no progress
    with pytest.raises(hal.CommError, match=r"no progress for 300 ms.*rank\(s\) 1") as info:
        w.wait()
    assert info.value.op == "all_reduce" and info.value.ranks == (1,)
    with pytest.raises(hal.CommError, match="failed earlier"):
        comm.ranks[0].all_reduce(x, stream=s).wait()
    comm.close()


def test_matrix_module_reference() -> None:
    """The NumPy reference itself: avg truncates integers toward zero."""
    got = matrix.reduce_all([np.array([-3, 3], np.int32), np.array([0, 0], np.int32)], "avg")
    np.testing.assert_array_equal(got, np.array([-1, 1], np.int32))


# -- transports registry, init() without a launcher ---------------------------------------------
def test_transport_plugins_register_through_the_hook() -> None:
    import hal.plugins

    class Pigeon(hal.comm.spi.StagedTransport):
        name = "pigeon"

    class Plugin:
        @hal.plugins.hookimpl
        def hal_register_transports(self, registry: hal.comm.spi.TransportRegistry) -> None:
            registry.add(Pigeon)

    system = hal.runtime().plugins
    plugin = Plugin()
    system.manager.register(plugin, name="pigeon-plugin")
    hal.runtime().clear_caches()  # the transport registry is rebuilt from the hooks
    try:
        names = hal.comm.transports().names
    finally:
        system.manager.unregister(plugin)
        hal.runtime().clear_caches()
    assert {"shm", "tcp", "mpi", "pigeon"} <= set(names)


def test_transport_registry_validates() -> None:
    reg = hal.comm.spi.TransportRegistry()
    with pytest.raises(TypeError, match="not a subclass"):
        reg.add(int)  # type: ignore[arg-type]

    class Nameless(hal.comm.spi.StagedTransport):
        name = "not an identifier"

    with pytest.raises(ValueError, match="identifier"):
        reg.add(Nameless)
    with pytest.raises(ValueError, match="'bogus' is not registered"):
        hal.comm.transports().get("bogus")


def test_init_without_a_launcher_is_a_world_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "HAL_RANK",
        "HAL_WORLD_SIZE",
        "RANK",
        "WORLD_SIZE",
        "PMI_RANK",
        "OMPI_COMM_WORLD_RANK",
    ):
        monkeypatch.delenv(var, raising=False)
    assert hal.comm.detect_launcher()[0] == "none"
    with pytest.raises(ValueError, match="'bogus' is not registered"):
        hal.comm.init(transport="bogus")
    with hal.comm.init(device=hal.devices("cpu")[0]) as comm:
        assert (comm.rank, comm.size) == (0, 1)
        x = hal.asarray(np.arange(5, dtype=np.float32), device=comm.device)
        s = comm.device.create_stream()
        comm.all_reduce(x, op="avg", stream=s).wait()
        comm.barrier().wait()
        np.testing.assert_array_equal(x.to_host(), np.arange(5, dtype=np.float32))


def test_detect_launcher_variables() -> None:
    assert (
        hal.comm.detect_launcher(
            {"HAL_RANK": "1", "HAL_WORLD_SIZE": "2", "HAL_STORE_ADDR": "127.0.0.1:5"}
        )[1]["rank"]
        == 1
    )
    name, env = hal.comm.detect_launcher(
        {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "9"}
    )
    assert name == "torchrun" and env["size"] == 4 and env["addr"] == "h"
    assert hal.comm.detect_launcher({"PMI_RANK": "1", "PMI_SIZE": "2"})[0] == "mpi"
    assert (
        hal.comm.detect_launcher({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})[0]
        == "mpi"
    )
    with pytest.raises(ValueError, match="MASTER_PORT"):
        hal.comm.detect_launcher({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    with pytest.raises(ValueError, match="HAL_RANK='x'"):
        hal.comm.detect_launcher({"HAL_RANK": "x", "HAL_WORLD_SIZE": "2", "HAL_STORE_ADDR": "a:1"})
