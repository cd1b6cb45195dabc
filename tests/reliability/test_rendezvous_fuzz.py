"""A rendezvous and a TCP set-up that hostile clients cannot hurt (docs/reliability.md, docs/security.md).

Fuzzing (hypothesis, a fixed number of examples) of the rendezvous hello, a bounded random
campaign against the TCP transport's hello, and the exhaustion cases: idle connections, huge
length headers, nested JSON, a non-object message, running out of file descriptors. After each,
the server still serves a real rank, and no thread of it died (an unhandled exception in a
thread is an error under pytest's ``filterwarnings = error``).
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hal.comm._auth import Keys, new_nonce
from hal.comm._bootstrap import _MAX_PENDING, _PROTO, Bootstrap, TcpBootstrap, _servers
from hal.comm._tcp import _HELLO, _HELLO_MAGIC, TcpTransport
from hal.comm._transport import Endpoint, World

SECRET = b"fuzz-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """A rendezvous server (rank 0 of a world of one) for the whole module; yields its port."""
    port = _free_port()
    boot = TcpBootstrap(0, 1, "127.0.0.1", port, 10.0, secret=SECRET)
    try:
        yield port
    finally:
        boot.close()


def _still_serves(port: int) -> None:
    """A real rank (a new generation of one) gets its allgather answered."""
    boot = TcpBootstrap(0, 1, "127.0.0.1", port, 10.0, secret=SECRET)
    try:
        assert boot.allgather({"still": "serving"}) == [{"still": "serving"}]
    finally:
        boot.close()
    assert _servers[("127.0.0.1", port)].thread.is_alive()


def _framed(obj: Any) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack("<I", len(data)) + data


def _drain(s: socket.socket) -> None:
    s.settimeout(3)
    try:
        while s.recv(4096):
            pass
    except (ConnectionResetError, TimeoutError):
        pass


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_hello_like = st.fixed_dictionaries(
    {
        "hal": st.sampled_from([_PROTO, "x", 1]),
        "gen": _json,
        "rank": _json,
        "size": _json,
        "nonce": st.sampled_from([new_nonce().hex(), "zz" * 16, "", 5]),
    }
)
_messages = st.one_of(
    st.binary(max_size=300),  # raw bytes
    _json.map(_framed),  # any JSON, framed
    _hello_like.map(_framed),  # hello-shaped, with wrong types and values
    st.integers(0, 2**32 - 1).map(lambda n: struct.pack("<I", n) + b"{"),  # any length header
    st.integers(1, 3000).map(lambda d: _framed_raw("[" * d + "]" * d)),  # nesting
)


def _framed_raw(text: str) -> bytes:
    return struct.pack("<I", len(text)) + text.encode()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(first=_messages, then=_messages)
def test_fuzz_rendezvous_hello(server: int, first: bytes, then: bytes) -> None:
    """Random hellos (two messages each): the server answers or hangs up, never dies, never serves values."""
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        try:
            s.sendall(first)
            s.settimeout(0.2)
            try:
                answer = s.recv(4096)
            except TimeoutError:
                answer = b""
            assert b"values" not in answer
            s.sendall(then)
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert _servers[("127.0.0.1", server)].thread.is_alive()


def test_fuzzed_server_still_serves(server: int) -> None:
    """After the campaign (and a second, valid-shaped one with wrong proofs), a real rank still joins."""
    keys = Keys(b"not the secret")
    for rank in range(20):
        with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
            nc = new_nonce()
            s.sendall(
                _framed({"hal": _PROTO, "gen": 0, "rank": rank, "size": 2, "nonce": nc.hex()})
            )
            s.sendall(_framed({"mac": keys.mac("rdzv-client", b"x", nc).hex()}))
            _drain(s)
    _still_serves(server)


def test_idle_connections_hold_neither_threads_nor_the_real_ranks(server: int) -> None:
    """300 idle connections: at most 32 are kept (a thread each, closed after the hello time), the
    oldest dropped for newer ones; a real rank still joins at once (before: 300 threads, forever)."""
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", server), timeout=5) for _ in range(300)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= _MAX_PENDING + 2
        _still_serves(server)
    finally:
        for s in idle:
            s.close()


def test_huge_length_header_is_refused_without_reading(server: int) -> None:
    """A 64 MiB length header before authentication: the server hangs up without waiting for the body."""
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        s.sendall(struct.pack("<I", 64 << 20) + b"x" * 1000)
        s.settimeout(5)
        try:
            assert s.recv(10) == b""
        except ConnectionResetError:
            pass
    _still_serves(server)


@pytest.mark.parametrize("payload", ["[" * 100000 + "]" * 100000, "[1, 2]", '"text"', "null"])
def test_nested_or_non_object_message_closes_that_connection(server: int, payload: str) -> None:
    """Deep nesting, a list, a string, null: hung up on; the serving thread does not die."""
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        s.sendall(_framed_raw(payload))
        _drain(s)
    _still_serves(server)


EMFILE_CHILD = """
import os, resource, sys, time
from hal.comm._bootstrap import TcpBootstrap, _servers
port = int(sys.argv[1])
boot = TcpBootstrap(0, 1, "127.0.0.1", port, 10.0, secret=b"s")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
in_use = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 4, hard))  # a handful of connections exhaust it
print("READY", flush=True)
sys.stdin.readline()  # the flood has come and gone
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
again = TcpBootstrap(0, 1, "127.0.0.1", port, 10.0, secret=b"s")
print("SERVED", again.allgather(1), "EMFILE", _servers[("127.0.0.1", port)].out_of_fds, flush=True)
"""


def test_out_of_descriptors_does_not_kill_the_accept_thread() -> None:
    """Rank 0's process runs out of file descriptors under a flood (EMFILE in accept); once the flood
    ends the server accepts again (before: the accept thread died, the next init timed out)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child = subprocess.Popen(
        [sys.executable, "-c", EMFILE_CHILD, str(port)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "READY"
        flood = []
        for _ in range(120):
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break
        time.sleep(1.0)  # the server meets EMFILE in accept() meanwhile
        for s in flood:
            s.close()
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
        assert "SERVED [1]" in out, out + err
        assert int(out.split("EMFILE")[1]) > 0, out  # the flood did exhaust the descriptors
    finally:
        child.kill()
        child.wait()


# -- the TCP transport's hello ------------------------------------------------------------------


class _ThreadBoot(Bootstrap):
    def __init__(self, rank: int, shared: dict[str, Any]) -> None:
        self.rank, self.size, self.shared, self.secret = rank, 2, shared, SECRET
        self.local_address = "127.0.0.1"

    def allgather(self, value: Any) -> list[Any]:
        sh = self.shared
        sh["values"][self.rank] = value
        sh["barrier"].wait()
        table = [sh["values"][0], sh["values"][1]]
        sh["table"] = table
        sh["published"].set()
        if self.rank == 1:
            sh["gate"].wait(60)  # rank 1 connects once the campaign has run
        return table


def _garbage(rng: random.Random, dest: tuple[str, int]) -> socket.socket | None:
    """One hostile connection to a TCP transport's listener (random kind)."""
    try:
        s = socket.create_connection(dest, timeout=2)
    except OSError:
        return None
    kind = rng.randrange(5)
    try:
        if kind == 0:
            s.sendall(rng.randbytes(rng.randrange(1, 200)))
        elif kind == 1:  # the right magic, a random claim, then random bytes as the proof
            s.sendall(
                _HELLO.pack(_HELLO_MAGIC, rng.randrange(-3, 5), rng.randrange(-2, 3), new_nonce())
            )
            s.sendall(rng.randbytes(rng.choice([0, 10, 32, 64])))
        elif kind == 2:  # a partial hello, then silence
            s.sendall(_HELLO.pack(_HELLO_MAGIC, 1, 0, new_nonce())[: rng.randrange(1, _HELLO.size)])
        elif kind == 3:  # the former hello (rank, socket) and forged data
            s.sendall(struct.pack("<ii", 1, 0) + rng.randbytes(512))
        # kind 4: silent
    except OSError:
        pass
    return s


@pytest.mark.parametrize("seed", [1, 2])
def test_random_campaign_on_the_tcp_hello(seed: int) -> None:
    """60 hostile connections of random kinds reach rank 0's listener before the real rank 1: set-up
    completes within the (short) timeout, the real rank's data arrives, nothing else does."""
    _campaign(seed, 60)


def test_tcp_set_up_and_transfer_with_descriptors_above_1024() -> None:
    """A process with more than 1024 files open (a training job, a data loader; here the
    conformance suite's leftovers once did it): the sockets of the TCP set-up and transport get
    descriptors past select()'s limit, and set-up, hostile hellos and the transfer still work
    (they wait with poll(2): hal.comm._transport.wait_fds)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"at most {hard} descriptors here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler: list[int] = []
    try:
        while not filler or filler[-1] < 1030:
            filler.append(os.open(os.devnull, os.O_RDONLY))
        _campaign(3, 10, min_fd=1030)
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _campaign(seed: int, hostile: int, min_fd: int = 0) -> None:
    rng = random.Random(seed)
    shared: dict[str, Any] = {
        "values": {},
        "barrier": threading.Barrier(2),
        "published": threading.Event(),
        "gate": threading.Event(),
    }
    out: list[Any] = [None, None]

    def run(r: int) -> None:
        world = World(r, 2, [Endpoint(0, "h", 0), Endpoint(1, "h", 1)], _ThreadBoot(r, shared), 5.0)
        try:
            out[r] = TcpTransport(world)
        except Exception as exc:  # noqa: BLE001 - checked below
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    socks: list[socket.socket] = []
    try:
        assert shared["published"].wait(30)
        dest = (shared["table"][0]["addr"], shared["table"][0]["port"])
        for _ in range(hostile):
            s = _garbage(rng, dest)
            if s is not None:
                socks.append(s)
    finally:
        shared["gate"].set()
        for t in threads:
            t.join(60)
        for s in socks:
            s.close()
    t0, t1 = out
    try:
        assert isinstance(t0, TcpTransport) and isinstance(t1, TcpTransport), out
        fds = [c.sock.fileno() for t in (t0, t1) for p in t._peers.values() for c in p.conns]
        assert fds and min(fds) >= min_fd, fds
        payload = os.urandom(4096)
        space = t1.send_space(0)
        space[: len(payload)] = payload
        t1.send_commit(0, len(payload))
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:
            t1.poll()
            got = t0.recv_data(1, len(payload))
        assert got is not None and bytes(got) == payload
    finally:
        for t in (t0, t1):
            if isinstance(t, TcpTransport):
                t.close()
