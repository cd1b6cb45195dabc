"""Building communicators: from the environment (:func:`init`) or from devices (:func:`create`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

import hal
from hal.comm import _ipc, _providers, _versions
from hal.comm._bootstrap import Bootstrap, MpiBootstrap, SoloBootstrap, TcpBootstrap
from hal.comm._communicator import Communicator, DeviceCommunicator
from hal.comm._config import Config
from hal.comm._engine import Engine
from hal.comm._local import LocalFabric, LocalTransport
from hal.comm._options import CommOptions
from hal.comm._topo import EnvTopology, Topology, agreement_hash, planner_key, resolve
from hal.comm._torchstore import TorchStoreBootstrap, next_prefix, torchrun_store, under_torchrun
from hal.comm._transport import Endpoint, TransportRegistry, World
from hal.spi import SETTINGS, parse_int, parse_port, setting

__all__ = ["create", "detect_launcher", "init", "transports"]

_log = logging.getLogger("hal.comm")
_registry: TransportRegistry | None = None
_registry_lock = threading.Lock()


def transports() -> TransportRegistry:
    """Return the transport registry, filled by every plugin's ``hal_register_transports`` hook."""
    global _registry
    with _registry_lock:
        if _registry is None:
            from hal.comm._builtin import plugin_system

            system = plugin_system()
            reg = TransportRegistry()
            call = getattr(system, "call_plugin_hook", None)
            if call is not None:
                call(
                    "hal_register_transports",
                    registry=reg,
                    on_plugin=lambda n: setattr(reg, "_plugin", n),
                )
            else:  # pragma: no cover - older loader
                system.manager.hook.hal_register_transports(registry=reg)
            _registry = reg
        return _registry


def _forget_transports() -> None:
    global _registry
    with _registry_lock:
        _registry = None


hal.runtime().register_cache("hal.comm.transports", _forget_transports)


def _env_int(env: dict[str, str], name: str) -> int:
    """Parse launcher variable ``name`` with its bounds (hal.ConfigError, a ValueError, when bad)."""
    if name in SETTINGS:
        return int(setting(name, env))
    return parse_int(env[name], name, lo=0, hi=1 << 20)


def detect_launcher(env: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """Return ``(launcher, settings)`` read from the environment.

    ``launcher`` is ``hal`` (``hal run``: ``HAL_RANK``, ``HAL_WORLD_SIZE``, ``HAL_STORE_ADDR``),
    ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; ``settings["store"]``
    is ``torch`` under the real torchrun, whose agent serves a TCPStore there (``TORCHELASTIC_*``
    set), ``hal`` when the variables were set by hand), ``mpi``
    (mpiexec of MPICH or Open MPI: ``PMI_RANK``/``PMI_SIZE``, ``OMPI_COMM_WORLD_RANK``/``SIZE``)
    or ``none`` (a world of one rank).
    """
    e = dict(os.environ if env is None else env)
    if "HAL_RANK" in e or "HAL_WORLD_SIZE" in e:
        missing = [k for k in ("HAL_RANK", "HAL_WORLD_SIZE", "HAL_STORE_ADDR") if k not in e]
        if missing:
            raise ValueError(f"hal launcher environment incomplete: {', '.join(missing)} not set")
        host, _, port = e["HAL_STORE_ADDR"].rpartition(":")
        if not port.strip().isdigit():
            raise hal.ConfigError(
                "HAL_STORE_ADDR",
                e["HAL_STORE_ADDR"],
                "HOST:PORT, PORT in 1..65535",
                "is not HOST:PORT",
            )
        try:
            parse_port(port, "HAL_STORE_ADDR port")
        except hal.ConfigError:
            raise hal.ConfigError(
                "HAL_STORE_ADDR",
                e["HAL_STORE_ADDR"],
                "HOST:PORT, PORT in 1..65535",
                "has a port out of range",
            ) from None
        return "hal", {
            "rank": _env_int(e, "HAL_RANK"),
            "size": _env_int(e, "HAL_WORLD_SIZE"),
            "addr": host or "127.0.0.1",
            "port": int(port),
            "local_rank": _env_int(
                {**e, "HAL_LOCAL_RANK": e.get("HAL_LOCAL_RANK", e["HAL_RANK"])}, "HAL_LOCAL_RANK"
            ),
        }
    if "RANK" in e and "WORLD_SIZE" in e:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in e]
        if missing:
            raise ValueError(f"torchrun-style environment incomplete: {', '.join(missing)} not set")
        return "torchrun", {
            "rank": _env_int(e, "RANK"),
            "size": _env_int(e, "WORLD_SIZE"),
            "addr": e["MASTER_ADDR"],
            "port": _env_int(e, "MASTER_PORT"),
            "local_rank": _env_int(
                {**e, "LOCAL_RANK": e.get("LOCAL_RANK", e["RANK"])}, "LOCAL_RANK"
            ),
            # real torchrun serves a TCPStore at MASTER_PORT: rendezvous through it as a client;
            # hand-set variables: hal's own gather server binds MASTER_PORT on rank 0
            "store": "torch" if under_torchrun(e) else "hal",
            "agent_store": e.get("TORCHELASTIC_USE_AGENT_STORE", "True").lower() in ("1", "true"),
        }
    for rk, sz in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rk in e and sz in e:
            local = e.get("MPI_LOCALRANKID") or e.get("OMPI_COMM_WORLD_LOCAL_RANK") or e[rk]
            return "mpi", {
                "rank": _env_int(e, rk),
                "size": _env_int(e, sz),
                "local_rank": int(local),
            }
    return "none", {"rank": 0, "size": 1, "local_rank": 0}


def _check_rank(rank: int, size: int) -> None:
    if size < 1:
        raise ValueError(f"world size {size} must be >= 1")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside the world of {size} ranks")


def _check_transport(registry: Any, name: str | None) -> None:
    """Refuse an unknown transport name before any rendezvous, naming HAL_COMM_TRANSPORT if it came from there."""
    if name is None or name == "local":
        return
    try:
        registry.get(name)
    except ValueError:
        if (setting("HAL_COMM_TRANSPORT") or "").strip() != name:
            raise
        raise hal.ConfigError(
            "HAL_COMM_TRANSPORT",
            name,
            f"{', '.join(registry.names)} or unset",
            "is not a registered transport",
        ) from None


def init(
    *,
    device: hal.Device | None = None,
    transport: str | None = None,
    timeout_ms: float | None = None,
    options: CommOptions | None = None,
    init_timeout_ms: float | None = None,
) -> Communicator:
    """Build this process's rank of a communicator from the environment (``hal run``, torchrun, mpiexec).

    Args:
        device: this rank's device; by default device ``local_rank % count`` of the first backend
            in ``hal.devices()`` order (``HAL_BACKENDS`` sets the order).
        transport: shorthand for ``options.transport``: ``shm``, ``tcp``, ``mpi`` or a plugin's;
            by default ``HAL_COMM_TRANSPORT``, else shared memory when every rank is on this
            host, else TCP.
        timeout_ms: shorthand for ``options.timeout_ms``: progress timeout of every call on the
            communicator; by default ``HAL_COMM_TIMEOUT_MS`` (10 minutes if unset).
        options: a :class:`hal.comm.CommOptions`; each field given wins over its environment
            variable, and the keywords win over the same fields of ``options``.
        init_timeout_ms: shorthand for ``options.init_timeout_ms``: how long this call waits for
            the other ranks (the rendezvous and the transport's set-up); by default
            ``HAL_COMM_INIT_TIMEOUT_MS``, else the larger of 60 s and the progress timeout.

    Raises:
        ValueError: an incomplete or inconsistent environment, an unknown transport.
        hal.ConfigError: a setting (in ``options`` or the environment) does not fit.
        hal.CommError: the rendezvous failed (a rank did not arrive within the init timeout: the
            message names it; ranks disagree on settings).

    Example::

        comm = hal.comm.init(options=hal.comm.CommOptions(timeout_ms=30_000, algo={"all_reduce": "ring"}))
    """
    config = Config.from_env(
        timeout_ms=timeout_ms, transport=transport, options=options, init_timeout_ms=init_timeout_ms
    )
    launcher, env = detect_launcher()
    rank, size = env["rank"], env["size"]
    _check_rank(rank, size)
    device = _rank_device(device, env["local_rank"])
    registry = transports()
    _check_transport(registry, config.transport)  # an unknown name: error before any rendezvous
    boot = _launcher_bootstrap(launcher, env, config)
    store = (env["addr"], env["port"]) if launcher in ("hal", "torchrun") else None
    comm = _build(rank, size, boot, device, config, registry, launcher, store=store)
    if isinstance(boot, TorchStoreBootstrap) and comm._world is not None:
        comm._world["torch_store"] = (boot._store, boot._prefix)
    return comm


def _launcher_bootstrap(launcher: str, env: dict[str, Any], config: Config) -> Bootstrap:
    """Return the bootstrap that meets the other ranks of ``launcher`` (see :func:`detect_launcher`)."""
    rank, size = env["rank"], env["size"]
    if launcher == "torchrun" and env["store"] == "torch":
        tstore = torchrun_store(
            env["addr"], env["port"], rank, size, config.init_timeout_s, agent=env["agent_store"]
        )
        return TorchStoreBootstrap(
            tstore,
            rank,
            size,
            config.init_timeout_s,
            next_prefix(env["addr"], env["port"]),
            route_to=(env["addr"], env["port"]),
        )
    if launcher in ("hal", "torchrun"):
        return TcpBootstrap(rank, size, env["addr"], env["port"], config.init_timeout_s)
    if launcher == "mpi":
        return MpiBootstrap()
    return SoloBootstrap()


def gather_versions(
    *, local: bool = False, timeout_ms: float | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """Return ``(rank, tables)``: every rank's versions table, as :func:`init` compares them.

    Under a launcher every rank meets the others (as :func:`init` does, without connecting a
    transport or checking anything) and each gets all the tables; without one, or with
    ``local``, the table of this process alone. What ``hal doctor`` prints. Each table is
    :func:`hal.comm._versions.collect`'s plus ``rank``, ``host``, ``launcher``, ``device`` and
    ``providers`` (each collective provider: why this rank cannot use it, or None).
    """
    config = Config.from_env(timeout_ms=timeout_ms)
    launcher, env = (
        ("none", {"rank": 0, "size": 1, "local_rank": 0}) if local else detect_launcher()
    )
    rank, size = env["rank"], env["size"]
    _check_rank(rank, size)
    try:
        device: hal.Device | None = _rank_device(None, env["local_rank"])
    except hal.HalError:
        device = None
    registry = transports()
    owner = registry.owners.get(config.transport or "")
    preg = _providers.providers()
    can_use = (
        {}
        if device is None
        else preg.availability(
            device=device, launcher=launcher, size=size, transport=config.transport
        )
    )
    me = {
        "rank": rank,
        "host": socket.gethostname(),
        "launcher": launcher,
        "device": str(device) if device is not None else None,
        **_rank_versions(config, launcher, device, owner, preg, can_use),
        "providers": can_use,
    }
    boot = _launcher_bootstrap(launcher, env, config)
    try:
        return rank, list(boot.allgather(me))
    finally:
        boot.close()


def _rank_versions(
    config: Config,
    launcher: str,
    device: hal.Device | None,
    owner: str | None,
    preg: _providers.ProviderRegistry,
    can_use: dict[str, str | None],
) -> dict[str, Any]:
    """Return this rank's versions table: the transport's owner ``owner`` and those of the providers it can use."""
    return _versions.collect(
        transport=config.transport,
        launcher=launcher,
        device=device,
        transport_owner=owner,
        provider_owners=[
            preg.owners[n] for n, why in can_use.items() if why is None and n in preg.owners
        ],
    )


def _setting_errors(before: str | None) -> None:
    """Raise the ConfigError of a backend ahead of ``before`` in priority order that a bad setting failed.

    Without this a typo (``HAL_CPU_DEVICES=2x``) would quietly move init() to the next backend.
    """
    import hal.plugins

    system = hal.plugins.get_system()
    for name in system.order:
        if name == before:
            return
        rec = system.backends[name]
        if isinstance(rec.error, hal.ConfigError):
            err = rec.error
            exc = hal.ConfigError(err.variable, err.value, err.allowed)
            exc.args = (
                f"{err} (backend {name!r} failed on it; hal.comm.init() does not fall back to "
                f"{'another backend' if before is None else repr(before)})",
            )
            raise exc from err


def _rank_device(device: hal.Device | None, local_rank: int) -> hal.Device:
    if device is None:
        devs = hal.devices()
        _setting_errors(devs[0].backend if devs else None)
        if not devs:
            raise hal.BackendUnavailableError("any", "no device available for this rank")
        devs = [d for d in devs if d.backend == devs[0].backend]  # the preferred backend's devices
        return devs[local_rank % len(devs)]
    if not isinstance(device, hal.Device):
        raise TypeError(f"device={device!r} is not a hal.Device")
    return device


def init_from_store(
    store: Any,
    rank: int,
    size: int,
    *,
    prefix: str,
    local_rank: int | None = None,
    device: hal.Device | None = None,
    transport: str | None = None,
    timeout_ms: float | None = None,
    label: str = "torch",
) -> Communicator:
    """Build this rank's communicator by meeting the others on a ``torch.distributed.Store``.

    What :mod:`hal.torch`'s process group uses (the store torch passes to a backend creator);
    ``prefix`` names the keys of this communicator (the same on every rank, unique per group).
    Device, transport and timeout defaults are those of :func:`init`.
    """
    config = Config.from_env(timeout_ms=timeout_ms, transport=transport)
    _check_rank(rank, size)
    device = _rank_device(device, rank if local_rank is None else local_rank)
    registry = transports()
    _check_transport(registry, config.transport)
    route = None
    if "MASTER_ADDR" in os.environ and os.environ.get("MASTER_PORT", "").isdigit():
        route = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    boot = TorchStoreBootstrap(store, rank, size, config.init_timeout_s, prefix, route_to=route)
    comm = _build(rank, size, boot, device, config, registry, label, store=route)
    if comm._world is not None:
        comm._world["torch_store"] = (store, prefix)
    return comm


def _build(
    rank: int,
    size: int,
    boot: Bootstrap,
    device: hal.Device,
    config: Config,
    registry: TransportRegistry,
    launcher: str,
    *,
    store: tuple[str, int] | None = None,
    extra: dict[str, Any] | None = None,
) -> Communicator:
    """Rendezvous through ``boot``, agree on settings and topology, connect the transport."""
    env_topo = EnvTopology.read()
    try:
        owner = (
            registry.owners.get(config.transport or "")
            if isinstance(registry, TransportRegistry)
            else None
        )
        preg = _providers.providers()
        force = _providers.forced(value=config.provider, label=config.provider_from)
        can_use = preg.availability(
            device=device, launcher=launcher, size=size, transport=config.transport
        )
        versions = _rank_versions(config, launcher, device, owner, preg, can_use)
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "transport": config.transport,
            "algo": config.algo,
            "topo": env_topo.key,
            "planner": planner_key(),
            "addr": getattr(boot, "local_address", None),
            "provider": force,
            **(extra or {}),
            "versions": versions,
            "providers": can_use,
            "device": str(device),
            "ipc": _ipc.local_info(device),
        }
        table = boot.allgather(me)
        _versions.raise_or_warn([t.get("versions") or {} for t in table], rank)
        endpoints = [Endpoint(r, t["host"], t["pid"]) for r, t in enumerate(table)]
        topo, rank_hosts = resolve(env_topo, [t["host"] for t in table])
        me_hash = agreement_hash(topo, rank_hosts, config)
        for key in ("transport", "provider", "algo", "topo", "planner", *(extra or {})):
            values = {repr(t[key]) for t in table}
            if len(values) > 1:
                what = {
                    "transport": "HAL_COMM_TRANSPORT",
                    "provider": "HAL_COMM_PROVIDER",
                    "algo": "HAL_COMM_ALGO",
                    "topo": "the topology (HAL_TOPO_FILE)",
                    "planner": "the planner (its cost model or algorithm lists)",
                }
                what.update({k: k for k in extra or {}})
                raise hal.CommError(
                    f"ranks disagree on {what[key]}: "
                    + ", ".join(f"rank {r}: {t[key]!r}" for r, t in enumerate(table)),
                    op="init",
                    ranks=tuple(
                        r for r, t in enumerate(table) if repr(t[key]) != repr(table[0][key])
                    ),
                )
        # HAL_COMM_IPC=on that cannot run is an error here
        ipc_state = _ipc.decide(rank, table, rank_hosts)
        world = World(
            rank,
            size,
            endpoints,
            boot,
            config.timeout_s,
            device=device,
            init_timeout_s=config.init_timeout_s,
        )
        name = config.transport or ("shm" if len(world.hosts) == 1 else "tcp")
        if size == 1 and config.transport is None:
            tr: Any = LocalTransport(LocalFabric(1), 0)
        else:
            if name == "shm":
                name = _shm_or_fallback(world)
            cls = registry.get(name)
            why = cls.unusable(world)
            if why:
                raise hal.CommError(
                    f"transport {name!r} cannot connect these ranks: {why}", op="init"
                )
            factory: Any = cls  # subclasses take the world; the ABC declares no __init__
            tr = factory(world)
        prov_name, prov_why = _providers.choose(
            force,
            [t.get("providers") or {} for t in table],
            preg.names,
            placements=[(t["host"], str(t.get("device"))) for t in table],
            exclusive=[n for n in preg.names if preg.get(n).one_rank_per_device],
        )
        provider = None
        if prov_name != _providers.GENERIC:
            try:
                provider = preg.get(prov_name)(rank=rank, size=size, device=device, bootstrap=boot)
            except BaseException:
                tr.close()
                raise
        engine = Engine(
            rank=rank,
            size=size,
            device=device,
            transport=tr,
            timeout_s=config.timeout_s,
            check_agreement=True,
            label=launcher,
            inline_bytes=(
                config.inline_bytes
                if config.inline_given
                else max(config.inline_bytes, int(getattr(tr, "inline_bytes", 0)))
            ),
        )
        engine.provider = provider
        engine.ipc = ipc_state
    except BaseException:
        boot.close()
        raise
    comm = Communicator(engine, config=config, hosts=len(set(rank_hosts)), bootstrap=boot)
    comm._set_topology(topo, rank_hosts, me_hash)
    comm._world = {"addrs": [t.get("addr") for t in table], "store": store, "registry": registry}
    _log.info(
        "rank %d/%d on %s: transport %s, collective provider %s (%s) (launcher %s)",
        rank,
        size,
        device,
        tr.name,
        prov_name,
        prov_why,
        launcher,
    )
    return comm


def _shm_or_fallback(world: World) -> str:
    """Check ``/dev/shm`` up front (collective); return ``shm``, or ``tcp`` where HAL_COMM_SHM_FALLBACK=tcp.

    Raises:
        hal.CommError: the rings do not fit and no fallback is configured (the message says how much
            space is needed and how to give more), or the ranks disagree on HAL_COMM_SHM_FALLBACK.
    """
    from hal.comm import _shm

    if len(world.hosts) > 1:
        return "shm"  # unusable() says why
    bad: hal.ConfigError | None = None
    try:
        fallback = setting("HAL_COMM_SHM_FALLBACK") or "none"
    except hal.ConfigError as exc:  # said on every rank, not only here (the others would wait)
        bad, fallback = exc, f"invalid ({exc.value!r})"
    modes = world.bootstrap.allgather(fallback)
    if bad is not None:
        raise bad
    if len(set(modes)) > 1:
        raise hal.CommError(
            "ranks disagree on HAL_COMM_SHM_FALLBACK: "
            + ", ".join(f"rank {r}: {m!r}" for r, m in enumerate(modes)),
            op="init",
        )
    short = _shm.check_space(world)
    if short is None:
        return "shm"
    if fallback == "tcp":
        _log.warning("%s %s; using tcp (HAL_COMM_SHM_FALLBACK=tcp)", _shm.FALLBACK_MARKER, short)
        return "tcp"
    raise hal.CommError(f"shm: {short}", op="init")


def create(
    devices: Sequence[hal.Device],
    *,
    timeout_ms: float | None = None,
    topology: Topology | None = None,
    options: CommOptions | None = None,
) -> DeviceCommunicator:
    """Build a communicator over ``devices`` of this process (any backends; one rank per device).

    Data moves with ``hal.copy``: ``peer`` between devices with a peer path, ``staged``
    through the host otherwise (see :func:`hal.copy_path`). ``topology`` (a
    :class:`hal.comm.Topology` whose ``ranks`` places each device on a host, and whose
    ``links`` describe the links between them) lets the planner choose as on several hosts,
    e.g. the hierarchical all_reduce (docs/topology.md). ``options`` (a
    :class:`hal.comm.CommOptions`) sets the timeout, the algorithms and the inline size, as
    for :func:`init` (its ``transport`` is always the in-process one); ``timeout_ms`` is
    shorthand for ``options.timeout_ms``.
    """
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"topology={topology!r} is not a hal.comm.Topology")
    devs = list(devices) if isinstance(devices, Sequence) else None
    if not devs:
        raise ValueError(f"devices={devices!r} must be a non-empty list of hal.Device")
    for i, d in enumerate(devs):
        if not isinstance(d, hal.Device):
            raise TypeError(f"devices[{i}]={d!r} is not a hal.Device")
    if len(set(devs)) != len(devs):
        raise ValueError(f"devices={[str(d) for d in devs]} lists a device twice")
    config = Config.from_env(timeout_ms=timeout_ms, transport="local", options=options)
    fabric = LocalFabric(len(devs))
    ranks = []
    for r, d in enumerate(devs):
        paths = {"peer" if d.can_access_peer(o) else "staged" for o in devs if o != d}
        tr = LocalTransport(fabric, r, path="peer" if paths <= {"peer"} else "staged")
        eng = Engine(
            rank=r,
            size=len(devs),
            device=d,
            transport=tr,
            timeout_s=config.timeout_s,
            check_agreement=False,
            label="local",
        )
        ranks.append(Communicator(eng, config=config, hosts=1))
    if topology is not None:
        if len(topology.ranks) != len(devs):
            for c in ranks:
                c.close()
            raise ValueError(
                f"topology places {len(topology.ranks)} ranks ('ranks'); it must place each of the {len(devs)} devices"
            )
        digest = topology.digest()
        for c in ranks:
            c._set_topology(topology, topology.ranks, digest)
    dc = DeviceCommunicator(ranks, config)
    dc._hosts, dc._per_host, dc._inter = ranks[0]._hosts, ranks[0]._per_host, ranks[0]._inter
    dc._topology, dc._topology_hash = ranks[0]._topology, ranks[0]._topology_hash
    return dc


def shrink(
    comm: Communicator, exclude: Sequence[int] | None = None, *, timeout_ms: float | None = None
) -> Communicator:
    """Abort ``comm`` and build a communicator of its live ranks (see :meth:`Communicator.shrink`)."""
    world = getattr(comm, "_world", None)
    if not world or (world.get("store") is None and world.get("torch_store") is None):
        raise hal.CommError(
            "shrink needs a communicator built by hal.comm.init under hal run or torchrun",
            op="shrink",
        )
    if exclude is None:
        failure = comm._engine.failure
        exclude = tuple(getattr(failure, "ranks", ()) or ())
    elif isinstance(exclude, (str, bytes)) or not isinstance(exclude, Sequence):
        raise TypeError(f"exclude={exclude!r} must be a sequence of rank numbers")
    excl: set[int] = set()
    for r in exclude:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < comm.size:
            raise ValueError(
                f"exclude={list(exclude)!r}: {r!r} is not a rank of this communicator (0..{comm.size - 1})"
            )
        if r == comm.rank:
            raise ValueError(
                f"exclude={list(exclude)!r} names this rank ({comm.rank}); a rank cannot leave itself out"
            )
        excl.add(r)
    if not excl:
        raise ValueError(
            "shrink: no rank to leave out (the communicator has not failed; pass exclude=[ranks])"
        )
    timeout_s = (
        comm._config.timeout_s
        if timeout_ms is None
        else Config.from_env(timeout_ms=timeout_ms).timeout_s
    )
    comm.abort()
    live = [r for r in range(comm.size) if r not in excl]
    gen = int(world.get("shrinks", 0)) + 1
    addr, port = (
        "",
        0,
    )  # (a torch store outlives every rank: the new communicator meets there, below)
    if world.get("torch_store") is not None:
        addr, port = world["store"] or ("", 0)
    elif (
        live[0] == 0
    ):  # rank 0 lives: its rendezvous server (one per process) serves this round too
        addr, port = world["store"][0], int(world["store"][1])
    else:  # the new leader serves at its own address, the store's port + the shrink count
        addr, port = world["addrs"][live[0]] or world["store"][0], int(world["store"][1]) + gen
    config = dataclasses.replace(comm._config, timeout_s=timeout_s)
    boot: Bootstrap
    if world.get("torch_store") is not None:  # torchrun's store outlives any rank: meet there again
        tstore, prefix = world["torch_store"]
        prefix = f"{prefix}/shrink{gen}-{'.'.join(map(str, sorted(excl)))}"
        boot = TorchStoreBootstrap(
            tstore,
            live.index(comm.rank),
            len(live),
            config.init_timeout_s,
            prefix,
            address=world["addrs"][comm.rank],
        )
    else:
        boot = TcpBootstrap(live.index(comm.rank), len(live), addr, port, config.init_timeout_s)
    new = _build(
        live.index(comm.rank),
        len(live),
        boot,
        comm.device,
        config,
        world["registry"],
        "shrink",
        store=world["store"] if world.get("torch_store") is not None else (addr, port),
        extra={"shrink": [comm.size, sorted(excl), gen]},
    )
    assert new._world is not None
    if isinstance(boot, TorchStoreBootstrap):
        new._world["torch_store"] = (boot._store, boot._prefix)
    new._world["shrinks"] = gen
    new._world["parent_ranks"] = live
    _log.info(
        "rank %d -> %d: shrank %d ranks to %d (left out %s)",
        comm.rank,
        new.rank,
        comm.size,
        len(live),
        sorted(excl),
    )
    return new
