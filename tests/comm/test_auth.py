"""Authenticated jobs (docs/security.md): the secret, the hellos, the heartbeats, exact binding.

Strangers here are real processes and raw sockets on loopback: a stock hal rank without the
secret, a client claiming rank 99 or a rank twice, a client racing the real rank to rank 0's
TCP listener, forged heartbeats.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hal
from hal.comm._auth import Keys, local_secret_path, new_nonce
from hal.comm._bootstrap import (
    _HELLO_LIMIT,
    _PROTO,
    Bootstrap,
    TcpBootstrap,
    _claim,
    _recv,
    _send,
    _Server,
    _servers,
)
from hal.comm._config import job_secret
from hal.comm._tcp import _HB, _HB_MAGIC, _HELLO, _HELLO_MAGIC, TcpTransport
from hal.comm._transport import Endpoint, World

SECRET = b"test-secret-0123456789abcdef"


def _free_port(host: str = "127.0.0.1") -> int:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", PYTHONUNBUFFERED="1", **kw)
    return env


RANK_CODE = """
import sys, numpy as np, hal, hal.comm
try:
    comm = hal.comm.init()
except hal.CommError as e:
    print("REFUSED", e.ranks, e, flush=True)
    sys.exit(3)
s = comm.device.create_stream()
x = hal.asarray(np.full(1024, comm.rank + 1.0, np.float32), device=comm.device)
comm.all_reduce(x, op="sum", stream=s).wait()
print("SUM", float(x.to_host()[0]), comm.size, flush=True)
comm.close()
"""


def _rank(rank: int, size: int, addr: str, **kw: str) -> subprocess.Popen[str]:
    env = _env(HAL_RANK=str(rank), HAL_WORLD_SIZE=str(size), HAL_STORE_ADDR=addr, **kw)
    return subprocess.Popen(
        [sys.executable, "-c", RANK_CODE],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _hello(
    port: int, keys: Keys, *, gen: int, rank: int, size: int, host: str = "127.0.0.1"
) -> tuple[socket.socket, Any]:
    """Speak the rendezvous hello as a raw client; return (socket, the server's last answer)."""
    s = socket.create_connection((host, port), timeout=10)
    nc = new_nonce()
    _send(s, {"hal": _PROTO, "gen": gen, "rank": rank, "size": size, "nonce": nc.hex()})
    ch = _recv(s, _HELLO_LIMIT)
    ns = bytes.fromhex(ch["nonce"])
    _send(s, {"mac": keys.mac("rdzv-client", ns, nc, _claim(gen, rank, size)).hex()})
    try:
        return s, _recv(s, _HELLO_LIMIT)
    except ConnectionError:
        return s, None


# -- the secret ---------------------------------------------------------------------------------


def test_secret_from_env_and_owner_only_file(tmp_path: Path) -> None:
    """HAL_COMM_SECRET is taken as is; HAL_COMM_SECRET_FILE must be owner-only, else refused naming it
    with a hal.ConfigError (a ValueError) that never carries the secret."""
    assert job_secret({}) is None
    assert job_secret({"HAL_COMM_SECRET": "abc"}) == b"abc"
    f = tmp_path / "secret"
    f.write_text("s3cret\n")
    f.chmod(0o644)
    with pytest.raises(
        hal.ConfigError, match=r"HAL_COMM_SECRET_FILE=.*secret.*accessible to others \(mode 0644\)"
    ):
        job_secret({"HAL_COMM_SECRET_FILE": str(f)})
    f.chmod(0o600)
    assert job_secret({"HAL_COMM_SECRET_FILE": str(f)}) == b"s3cret"
    with pytest.raises(hal.ConfigError, match="both set") as err:
        job_secret({"HAL_COMM_SECRET_FILE": str(f), "HAL_COMM_SECRET": "x-the-secret"})
    assert err.value.variable == "HAL_COMM_SECRET_FILE" and "x-the-secret" not in repr(
        err.value.__dict__
    )
    with pytest.raises(hal.ConfigError, match="empty"):
        job_secret({"HAL_COMM_SECRET": ""})
    with pytest.raises(hal.ConfigError, match="nosuch"):
        job_secret({"HAL_COMM_SECRET_FILE": str(tmp_path / "nosuch")})
    f.unlink()
    os.symlink(tmp_path, f)
    with pytest.raises(hal.ConfigError, match=r"cannot be read|not a regular file"):
        job_secret({"HAL_COMM_SECRET_FILE": str(f)})


def test_hal_run_gives_its_ranks_a_secret(tmp_path: Path) -> None:
    """``hal run`` sets a fresh HAL_COMM_SECRET for its ranks (one per job, the same on every rank)."""
    from hal.cli._run import launch

    out = tmp_path / "secrets"
    code = "import os, sys; open(sys.argv[1] + os.environ['HAL_RANK'], 'w').write(os.environ['HAL_COMM_SECRET'])"
    env = _env()
    assert launch(2, [sys.executable, "-c", code, str(out)], env=env)[0] == 0
    first = {(tmp_path / f"secrets{r}").read_text() for r in (0, 1)}
    assert launch(2, [sys.executable, "-c", code, str(out)], env=env)[0] == 0
    second = {(tmp_path / f"secrets{r}").read_text() for r in (0, 1)}
    assert len(first) == 1 and len(second) == 1 and first != second and len(first.pop()) == 64


# -- strangers at the rendezvous ----------------------------------------------------------------


def _wait_for_server(port: int) -> None:
    deadline = time.monotonic() + 20
    while ("127.0.0.1", port) not in _servers and time.monotonic() < deadline:
        time.sleep(0.01)


def test_stock_rank_without_the_secret_cannot_join() -> None:
    """A stock hal process claiming rank 1 without the job's secret, before the real rank 1: refused;
    the real ranks then compute the right sum (before: the stranger got rank 0's data and fed it a sum)."""
    addr = f"127.0.0.1:{_free_port()}"
    job = {
        "HAL_COMM_SECRET": SECRET.decode(),
        "HAL_COMM_TRANSPORT": "tcp",
        "HAL_COMM_TIMEOUT_MS": "60000",
    }
    r0 = _rank(0, 2, addr, **job)
    try:
        for stranger_env in ({}, {"HAL_COMM_SECRET": "a-guess"}):
            stranger = _rank(
                1, 2, addr, HAL_COMM_TRANSPORT="tcp", HAL_COMM_TIMEOUT_MS="20000", **stranger_env
            )
            out, err = stranger.communicate(timeout=60)
            assert stranger.returncode == 3 and "did not prove it holds the job's secret" in out, (
                out + err
            )
        r1 = _rank(1, 2, addr, **job)
        out1, err1 = r1.communicate(timeout=60)
        out0, err0 = r0.communicate(timeout=60)
    finally:
        if r0.poll() is None:
            r0.kill()
            r0.communicate()
    assert "SUM 3.0 2" in out0 and "SUM 3.0 2" in out1, out0 + err0 + out1 + err1


def test_same_host_job_without_secret_keeps_one_in_a_user_only_file(tmp_path: Path) -> None:
    """Ranks set up by hand on loopback, no HAL_COMM_SECRET: rank 0 writes a secret only this user can
    read (0600 in a 0700 directory) before it listens; a rank that cannot read it (here: another
    TMPDIR, as another user would be) is refused; the real rank joins; the file goes with rank 0."""
    port = _free_port()
    addr = f"127.0.0.1:{port}"
    job = {"HAL_COMM_TRANSPORT": "tcp", "HAL_COMM_TIMEOUT_MS": "60000"}
    r0 = _rank(0, 2, addr, **job)
    try:
        path = Path(local_secret_path(port) or "")
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
        elsewhere = tmp_path / "other-user-tmp"
        elsewhere.mkdir()
        stranger = _rank(
            1, 2, addr, TMPDIR=str(elsewhere), HAL_COMM_TIMEOUT_MS="20000", HAL_COMM_TRANSPORT="tcp"
        )
        out, err = stranger.communicate(timeout=60)
        assert stranger.returncode == 3 and "did not prove it holds the job's secret" in out, (
            out + err
        )
        assert "same host without HAL_COMM_SECRET" in out, out
        r1 = _rank(1, 2, addr, **job)
        out1, err1 = r1.communicate(timeout=60)
        out0, err0 = r0.communicate(timeout=60)
    finally:
        if r0.poll() is None:
            r0.kill()
            r0.communicate()
    assert "SUM 3.0 2" in out0 and "SUM 3.0 2" in out1, out0 + err0 + out1 + err1
    assert not path.exists()


def test_same_host_job_whose_key_directory_is_open_to_others_warns(tmp_path: Path) -> None:
    """If $TMPDIR/hal-comm-UID is not this user's alone (another user made it, mode 0777), the
    job cannot keep a key file there and runs unauthenticated: every rank says so with a
    hal.HalWarning naming the directory, instead of running open silently."""
    port = _free_port()
    shared = tmp_path / f"hal-comm-{os.geteuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    job = {"TMPDIR": str(tmp_path), "HAL_COMM_TRANSPORT": "tcp", "HAL_COMM_TIMEOUT_MS": "60000"}
    ranks = [_rank(r, 2, f"127.0.0.1:{port}", **job) for r in range(2)]
    outs = [p.communicate(timeout=120) for p in ranks]
    for out, err in outs:
        assert "SUM 3.0 2" in out, out + err
        assert "HalWarning" in err and "runs without a job secret" in err, err
        assert f"{shared} is not this user's alone" in err, err
    assert not list(shared.iterdir())  # no key file was written into the open directory


@pytest.fixture
def server() -> Iterator[tuple[int, TcpBootstrap]]:
    """Rank 0 of a world of 1 serving at a fresh loopback port (with the test secret)."""
    port = _free_port()
    boot = TcpBootstrap(0, 1, "127.0.0.1", port, 10.0, secret=SECRET)
    try:
        yield port, boot
    finally:
        boot.close()


def test_raw_client_without_secret_is_refused_and_served_nothing(
    server: tuple[int, TcpBootstrap],
) -> None:
    """A raw socket claiming rank 99 of 2 without the secret learns nothing (before: served every pid and address)."""
    port, _boot = server
    s, answer = _hello(port, Keys(b"wrong"), gen=0, rank=99, size=2)
    with s:
        assert (
            isinstance(answer, dict)
            and "authentication failed" in answer["error"]
            and "values" not in answer
        )
        s.settimeout(5)
        assert s.recv(100) == b""  # and hung up
    assert "failed authentication claiming rank 99" in " ".join(
        _servers[("127.0.0.1", port)].refused
    )


def test_rank_outside_the_world_is_refused_even_with_the_secret(
    server: tuple[int, TcpBootstrap],
) -> None:
    """A client holding the secret but claiming rank 99 in a world of 2 is refused, naming the claim."""
    port, _boot = server
    s, answer = _hello(port, Keys(SECRET), gen=7, rank=99, size=2)
    with s:
        assert answer == {"error": "rank 99 is outside the world of 2 ranks (0..1)", "rank": 99}


def test_duplicate_claim_fails_the_rendezvous_naming_both_claimants() -> None:
    """Rank 1 of 3 claimed twice before the world is complete: the second claim is refused and the
    other ranks' init fails, saying a duplicate claim was seen and from where."""
    port = _free_port()
    keys = Keys(SECRET)
    result: dict[str, Any] = {}

    def rank0() -> None:
        try:
            boot = TcpBootstrap(0, 3, "127.0.0.1", port, 20.0, secret=SECRET)
        except hal.CommError as exc:  # refused at its hello (the duplicate came first)
            result["error"] = exc
            return
        try:
            result["values"] = boot.allgather("r0")
        except hal.CommError as exc:
            result["error"] = exc
        finally:
            boot.close()

    t = threading.Thread(target=rank0)
    t.start()
    _wait_for_server(port)
    first, ok = _hello(port, keys, gen=0, rank=1, size=3)
    assert ok == {"ok": True}
    second, refused = _hello(port, keys, gen=0, rank=1, size=3)
    with first, second:
        assert "rank 1 was claimed twice: first by 127.0.0.1:" in refused["error"], refused
        assert f"then by 127.0.0.1:{second.getsockname()[1]}" in refused["error"]
        t.join(30)
    err = result["error"]
    assert isinstance(err, hal.CommError) and "claimed twice" in str(err) and err.ranks == (1,)


def test_a_claim_after_a_duplicate_names_the_duplicated_rank() -> None:
    """Once rank 1 was claimed twice the world has failed: a later claim (rank 2 here; rank 0's own
    hello when it comes after the duplicate) is refused with the duplicate's reason, naming rank 1,
    the rank at fault, and not the claimant (rank 0's init then blamed rank 0)."""
    port = _free_port()
    keys = Keys(SECRET)
    srv = _Server("127.0.0.1", port, SECRET)  # rank 0's rendezvous, without rank 0's own hello
    try:
        first, ok = _hello(port, keys, gen=0, rank=1, size=3)
        second, dup = _hello(port, keys, gen=0, rank=1, size=3)
        third, late = _hello(port, keys, gen=0, rank=2, size=3)
        with first, second, third:
            assert ok == {"ok": True}
            assert "rank 1 was claimed twice" in dup["error"] and dup["rank"] == 1, dup
            assert late == {"error": dup["error"], "rank": 1}, late
    finally:
        srv.sock.close()


def test_late_comer_to_a_complete_world_is_refused_alone() -> None:
    """Once every rank claimed, another claim (even with the secret) is refused as a late-comer and
    the ranks that are in carry on (the rendezvous is closed, not failed)."""
    port = _free_port()
    result: dict[str, Any] = {}

    def rank0() -> None:
        boot = TcpBootstrap(0, 2, "127.0.0.1", port, 20.0, secret=SECRET)
        try:
            result["values"] = boot.allgather("r0")
        finally:
            boot.close()

    t = threading.Thread(target=rank0)
    t.start()
    _wait_for_server(port)
    srv = _servers[("127.0.0.1", port)]
    while (0, 0) not in srv.claims and t.is_alive():
        time.sleep(0.01)
    real, ok = _hello(port, Keys(SECRET), gen=0, rank=1, size=2)
    with real:
        assert ok == {"ok": True}
        late, refused = _hello(port, Keys(SECRET), gen=0, rank=1, size=2)
        with late:
            assert "late-comer claiming rank 1" in refused["error"], refused
        _send(real, {"round": 0, "value": "r1"})
        assert _recv(real) == {"values": ["r0", "r1"]}
        t.join(30)
    assert result["values"] == ["r0", "r1"]


def test_forged_round_is_a_comm_error_not_a_key_error() -> None:
    """An authenticated client sending a round out of turn is hung up on; rank 0's allgather raises
    CommError naming it (before: a raw KeyError from init)."""
    port = _free_port()
    result: dict[str, Any] = {}

    def rank0() -> None:
        boot = TcpBootstrap(0, 2, "127.0.0.1", port, 20.0, secret=SECRET)
        try:
            boot.allgather("r0")
        except Exception as exc:  # noqa: BLE001 - the type is what is checked
            result["error"] = exc
        finally:
            boot.close()

    t = threading.Thread(target=rank0)
    t.start()
    _wait_for_server(port)
    s, ok = _hello(port, Keys(SECRET), gen=0, rank=1, size=2)
    with s:
        assert ok == {"ok": True}
        _send(s, {"round": 5, "value": {"forged": True}})
        t.join(30)
    assert isinstance(result["error"], hal.CommError) and result["error"].ranks == (1,), result


# -- exact binding ------------------------------------------------------------------------------


def test_non_local_master_addr_is_refused_not_widened() -> None:
    """Rank 0 with MASTER_ADDR not of this host: a CommError naming it; nothing listens on 0.0.0.0."""
    port = _free_port()
    with pytest.raises(
        hal.CommError, match=r"198\.51\.100\.7.*not an address of this host.*HAL_COMM_IFNAME"
    ):
        TcpBootstrap(0, 1, "198.51.100.7", port, 2.0, secret=SECRET)
    with socket.create_server(("0.0.0.0", port)):  # nothing took the port on every interface
        pass


def test_ifname_chooses_the_interface_to_listen_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """MASTER_ADDR not of this host, HAL_COMM_IFNAME=lo: rank 0 listens on lo's address only."""
    from hal.comm._bootstrap import _server

    port = _free_port()
    monkeypatch.setenv("HAL_COMM_IFNAME", "=lo")
    _server("198.51.100.8", port, SECRET)
    assert _servers[("198.51.100.8", port)].sock.getsockname()[0] == "127.0.0.1"


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this host")
def test_ipv6_rendezvous_and_transport() -> None:
    """HAL_STORE_ADDR=[::1]:PORT: rendezvous and TCP transport over IPv6 (before: bound 0.0.0.0, then failed)."""
    addr = f"[::1]:{_free_port('::1')}"
    job = {
        "HAL_COMM_SECRET": SECRET.decode(),
        "HAL_COMM_TRANSPORT": "tcp",
        "HAL_COMM_TIMEOUT_MS": "60000",
    }
    procs = [_rank(r, 2, addr, **job) for r in (0, 1)]
    outs = [p.communicate(timeout=90) for p in procs]
    for out, err in outs:
        assert "SUM 3.0 2" in out, out + err


# -- the TCP transport's hello and heartbeats ---------------------------------------------------


class _ThreadBoot(Bootstrap):
    """An in-process rendezvous for ranks run as threads (records the last table)."""

    shared: dict[str, Any]

    def __init__(self, rank: int, size: int, shared: dict[str, Any], secret: bytes | None) -> None:
        self.rank, self.size, self.shared, self.secret = rank, size, shared, secret
        self.local_address = "127.0.0.1"

    def allgather(self, value: Any) -> list[Any]:
        sh = self.shared
        with sh["lock"]:
            sh["values"][self.rank] = json.loads(json.dumps(value))
        sh["barrier"].wait()
        table = [sh["values"][r] for r in range(self.size)]
        sh["table"] = table
        sh["published"].set()
        sh["barrier"].wait()
        if self.rank > 0:
            sh["gate"].wait(30)  # the higher ranks connect only after the stranger moved
        return table


def _transports(
    size: int, secrets: list[bytes | None], timeout_s: float, before: Any = None
) -> list[Any]:
    """Set up ``size`` TcpTransports as threads; ``before(table)`` runs once the table is known,
    while the ranks are still connecting (a stranger's chance to race them)."""
    shared: dict[str, Any] = {
        "lock": threading.Lock(),
        "values": {},
        "barrier": threading.Barrier(size),
        "published": threading.Event(),
        "gate": threading.Event(),
    }
    out: list[Any] = [None] * size

    def run(r: int) -> None:
        boot = _ThreadBoot(r, size, shared, secrets[r])
        world = World(r, size, [Endpoint(i, "h", i) for i in range(size)], boot, timeout_s)
        try:
            out[r] = TcpTransport(world)
        except Exception as exc:  # noqa: BLE001 - returned to the test
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    try:
        shared["published"].wait(30)
        if before is not None:
            before(shared["table"])
    finally:
        shared["gate"].set()
        for t in threads:
            t.join(60)
    return out


def _move(a: Any, b: Any, peer_a: int, peer_b: int, payload: bytes) -> bytes:
    """Send ``payload`` from transport ``a`` (to rank ``peer_b``) and return what ``b`` received."""
    space = a.send_space(peer_b)
    space[: len(payload)] = payload
    a.send_commit(peer_b, len(payload))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        a.poll()
        got = b.recv_data(peer_a, len(payload))
        if got is not None:
            data = bytes(got)
            b.recv_release(peer_a)
            return data
        time.sleep(0.001)
    raise AssertionError("nothing arrived")


def test_strangers_racing_the_real_rank_to_the_tcp_listener_are_dropped() -> None:
    """Before the real rank 1 connects, strangers reach rank 0's listener: one silent, one with the old
    unauthenticated hello and forged data, one with the new hello but no secret. Rank 0 drops them all,
    takes the real rank (set-up is not held up by the silent one) and receives only its data."""
    strangers: list[socket.socket] = []

    def race(table: list[dict[str, Any]]) -> None:
        dest = (table[0]["addr"], table[0]["port"])
        silent = socket.create_connection(dest, timeout=5)
        old = socket.create_connection(dest, timeout=5)
        old.sendall(struct.pack("<ii", 1, 0) + b"\xff" * 4096)  # the former hello, then forged data
        new = socket.create_connection(dest, timeout=5)
        new.sendall(_HELLO.pack(_HELLO_MAGIC, 1, 0, new_nonce()))
        new.recv(48)  # rank 0's challenge
        new.sendall(os.urandom(32))  # a guessed proof
        strangers.extend((silent, old, new))

    t0, t1 = _transports(2, [SECRET, SECRET], timeout_s=5.0, before=race)
    try:
        assert isinstance(t0, TcpTransport) and isinstance(t1, TcpTransport), (t0, t1)
        assert _move(t1, t0, 1, 0, b"real data" * 10) == b"real data" * 10
        for s in strangers:  # each was hung up on (the one that sent data unread: reset)
            s.settimeout(5)
            try:
                got = s.recv(100)
            except ConnectionResetError:
                got = b""
            assert got == b""
    finally:
        for s in strangers:
            s.close()
        for t in (t0, t1):
            if isinstance(t, TcpTransport):
                t.close()


def test_ranks_with_different_secrets_do_not_connect() -> None:
    """Rank 1 holds another secret: set-up fails on it, naming rank 0 and the secret."""
    t0, t1 = _transports(2, [SECRET, b"other"], timeout_s=3.0)
    try:
        assert isinstance(t1, hal.CommError) and "secret" in str(t1) and t1.ranks == (0,), t1
        assert isinstance(t0, hal.CommError), t0  # rank 0 never got an authenticated rank 1
    finally:
        for t in (t0, t1):
            if isinstance(t, TcpTransport):
                t.close()


def test_forged_heartbeats_do_not_hide_a_stopped_rank() -> None:
    """Rank 1's heartbeats stop; a stranger sprays rank 0 with beats for rank 1 (the old magic + rank,
    the new format without the secret, and a replay of a real beat): rank 0 still sees rank 1 silent."""
    t0, t1 = _transports(2, [SECRET, SECRET], timeout_s=1.0)
    try:
        hb0, hb1 = t0._hb, t1._hb
        hb1._stop.set()  # rank 1 stops beating (as if SIGSTOPped)
        hb1._thread.join()
        dest = ("127.0.0.1", hb0.port)
        real = hb1._packet()  # its last genuine beat, which a stranger captures and replays
        hb1.sock.sendto(real, dest)
        time.sleep(hb0.interval)
        forged_body = _HB.pack(_HB_MAGIC, 1, 1 << 40, 0, 0)
        forged = [
            struct.pack("<4si", b"HALH", 1),
            forged_body + b"\x00" * 16,
            forged_body + Keys(b"guess").mac("heartbeat", hb0.session, forged_body)[:16],
            real,
        ]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            deadline = time.monotonic() + 6 * hb0.interval + 0.5
            while time.monotonic() < deadline:
                for pkt in forged:
                    s.sendto(pkt, dest)
                time.sleep(hb0.interval / 4)
        assert 1 in hb0.stale(0.0), hb0.seen
        assert hb0.forged > 10
    finally:
        t0.close()
        t1.close()


def test_a_secret_mismatch_is_reported_as_refused_authentication_on_both_sides() -> None:
    """TCP transport, rank 1 of another secret: rank 1 refuses rank 0's proof and says the secret is
    wrong or missing; rank 0 records that rank 1 refused authentication (before: "hung up during its
    hello", a closed connection). Neither message holds a secret."""
    t0, t1 = _transports(2, [SECRET, b"other-secret"], timeout_s=3.0)
    try:
        assert isinstance(t1, hal.CommError), t1
        assert "authentication with rank 0 failed on rank 1, wrong or missing secret" in str(t1), t1
        assert isinstance(t0, hal.CommError), t0
        assert "claimed rank 1, then refused authentication: wrong or missing secret" in str(t0), t0
        assert "hung up" not in str(t0), t0
        for text in (str(t0), str(t1)):
            assert SECRET.decode() not in text and "other-secret" not in text
    finally:
        for t in (t0, t1):
            if isinstance(t, TcpTransport):
                t.close()


@pytest.mark.parametrize("stranger_env", [{"HAL_COMM_SECRET": "another-secret"}, {}])
def test_rendezvous_refusal_for_a_secret_mismatch_names_it_on_both_ranks(
    stranger_env: dict[str, str],
) -> None:
    """Real ranks at the rendezvous, rank 1 with a wrong or no HAL_COMM_SECRET: rank 1's error says
    authentication failed, wrong or missing secret (and whether it holds one); rank 0 logs the refusal
    at once and its init error names rank 1's refused authentication (before: 'ConnectionError:
    connection closed'). No secret appears in either rank's output."""
    addr = f"127.0.0.1:{_free_port()}"
    quick = {"HAL_COMM_TRANSPORT": "tcp", "HAL_COMM_INIT_TIMEOUT_MS": "5000"}
    r0 = _rank(0, 2, addr, HAL_COMM_SECRET=SECRET.decode(), **quick)
    r1 = _rank(1, 2, addr, **stranger_env, **quick)
    out1, err1 = r1.communicate(timeout=60)
    out0, err0 = r0.communicate(timeout=60)
    assert (
        r1.returncode == 3
        and "authentication failed at the rendezvous, wrong or missing secret" in out1
    ), out1 + err1
    hint = "this rank has a secret" if stranger_env else "this rank has none: HAL_COMM_SECRET"
    assert hint in out1, out1
    assert r0.returncode == 3 and "never arrived" in out0, out0 + err0
    assert "claimed rank 1, then refused authentication: wrong or missing secret" in out0, out0
    assert "connection closed" not in out0, out0
    assert "hal.comm rendezvous: refused" in err0 and "refused authentication" in err0, err0
    for text in (out0, err0, out1, err1):
        assert SECRET.decode() not in text and "another-secret" not in text


def test_a_flood_of_failed_hellos_logs_eight_refusals_not_one_per_connection(
    server: tuple[int, TcpBootstrap], caplog: pytest.LogCaptureFixture
) -> None:
    """A stranger that answers the rendezvous' proof with 'auth failed' (or hangs up) 20 times: rank 0
    records each refusal, but logs only the first 8, the last saying the rest are not logged."""
    port, _boot = server
    srv = _servers[("127.0.0.1", port)]
    with caplog.at_level("WARNING", logger="hal.comm"):
        for i in range(20):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                nc = new_nonce()
                _send(s, {"hal": _PROTO, "gen": 0, "rank": 1, "size": 2, "nonce": nc.hex()})
                _recv(s, _HELLO_LIMIT)
                if i % 2:
                    _send(s, {"auth": "failed"})
                else:
                    s.shutdown(socket.SHUT_WR)  # hangs up instead of proving the secret
                s.settimeout(10)
                try:
                    assert s.recv(100) == b""  # hung up on
                except ConnectionResetError:
                    pass
        while srv.auth_logged < 20:
            time.sleep(0.01)
    lines = [
        r.getMessage() for r in caplog.records if "hal.comm rendezvous: refused" in r.getMessage()
    ]
    assert len(lines) == 8, lines
    assert lines[-1].endswith("; further refusals are not logged") and all(
        "authentication" in line for line in lines
    )
    assert "refused authentication: wrong or missing secret" in " ".join(srv.refused)
    assert "no proof of the job's secret" in " ".join(srv.refused)
