"""TorchStoreBootstrap (hal.comm's rendezvous on a torch.distributed store) in one process:
rank order, the published secret, HAL_COMM_SECRET, key clean-up, and a timeout naming the absent rank."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

torch_dist = pytest.importorskip(
    "torch.distributed", reason="torch is not installed (pip install 'hal-sdk[torch]')"
)

import hal  # noqa: E402
from hal.comm._torchstore import TorchStoreBootstrap  # noqa: E402


@pytest.fixture
def store() -> Any:
    return torch_dist.TCPStore(
        "127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False
    )


def client(master: Any) -> Any:
    return torch_dist.TCPStore("127.0.0.1", master.port, None, False, timedelta(seconds=10))


def run_ranks(master: Any, size: int, prefix: str, rounds: list[Any]) -> list[Any]:
    out: list[Any] = [None] * size
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            boot = TorchStoreBootstrap(client(master), r, size, 10.0, prefix)
            out[r] = (boot.secret, [boot.allgather(v(r)) for v in rounds])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return out


def test_allgather_in_rank_order_and_one_secret(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HAL_COMM_SECRET", raising=False)
    monkeypatch.delenv("HAL_COMM_SECRET_FILE", raising=False)
    out = run_ranks(store, 3, "t/a", [lambda r: {"rank": r}, lambda r: [r, "x" * r]])
    secrets = {o[0] for o in out}
    assert len(secrets) == 1 and len(next(iter(secrets))) == 32
    for o in out:
        assert o[1] == [[{"rank": 0}, {"rank": 1}, {"rank": 2}], [[0, ""], [1, "x"], [2, "xx"]]]
    # round 0's keys were deleted once round 1 completed; round 1's stay until the next round
    assert not store.check(["t/a/0/0"]) and store.check(["t/a/1/0"])
    # another prefix is another communicator: a fresh secret, no stale values
    again = run_ranks(store, 2, "t/b", [lambda r: r * 7])
    assert [o[1] for o in again] == [[[0, 7]], [[0, 7]]] and again[0][0] not in secrets


def test_job_secret_wins_and_stays_out_of_the_store(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAL_COMM_SECRET", "s3cret-of-the-job")
    out = run_ranks(store, 2, "t/c", [lambda r: r])
    assert {o[0] for o in out} == {b"s3cret-of-the-job"}
    assert not store.check(["t/c/secret"])


def test_absent_rank_is_named_after_the_timeout(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HAL_COMM_SECRET", raising=False)
    boot = TorchStoreBootstrap(client(store), 0, 3, 1.0, "t/d")
    boot_1 = TorchStoreBootstrap(client(store), 1, 3, 1.0, "t/d")
    other: list[BaseException] = []

    def rank_1() -> None:
        try:
            boot_1.allgather(1)
        except hal.CommError as exc:
            other.append(exc)

    done = threading.Thread(target=rank_1)
    done.start()
    with pytest.raises(hal.CommError, match=r"rank\(s\) 2 never arrived") as err:
        boot.allgather(0)
    done.join(10)
    assert err.value.ranks == (2,)
    assert len(other) == 1 and getattr(other[0], "ranks", None) == (2,)


def test_a_late_rank_is_told_the_other_gave_up_first(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 arrives after rank 0's init timed out: rank 1 passes round 0 (rank 0's key is there)
    and times out in round 1; its error says rank 0 gave up first waiting for rank 1, instead of
    blaming rank 0 alone (what torchrun showed: 'rank(s) 0 never arrived')."""
    monkeypatch.setenv("HAL_COMM_SECRET", "s3cret-of-the-job")
    boot_0 = TorchStoreBootstrap(client(store), 0, 2, 1.0, "t/late")
    with pytest.raises(hal.CommError, match=r"round 0; rank\(s\) 1 never arrived$"):
        boot_0.allgather(0)
    boot_1 = TorchStoreBootstrap(client(store), 1, 2, 1.0, "t/late")
    assert boot_1.allgather(1) == [0, 1]
    with pytest.raises(hal.CommError) as err:
        boot_1.allgather(1)
    assert err.value.ranks == (0,)
    assert str(err.value).endswith(
        "round 1; rank(s) 0 never arrived (rank 0 gave up first: its init timed out waiting for "
        "round 0 (for rank(s) 1))"
    )


def test_without_a_secret_the_gave_up_note_is_named_unsigned(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun without HAL_COMM_SECRET: the late rank's error still says rank 0 gave up first, and
    that it learnt this from an unsigned note in torchrun's store anyone could have written, with
    the remedy (before: the note read as if authenticated)."""
    monkeypatch.delenv("HAL_COMM_SECRET", raising=False)
    monkeypatch.delenv("HAL_COMM_SECRET_FILE", raising=False)
    boot_0 = TorchStoreBootstrap(client(store), 0, 2, 1.0, "t/unsigned")
    with pytest.raises(hal.CommError, match=r"round 0; rank\(s\) 1 never arrived$"):
        boot_0.allgather(0)
    boot_1 = TorchStoreBootstrap(client(store), 1, 2, 1.0, "t/unsigned")
    assert boot_1.allgather(1) == [0, 1]
    with pytest.raises(hal.CommError) as err:
        boot_1.allgather(1)
    assert str(err.value).endswith(
        "round 1; rank(s) 0 never arrived (rank 0 gave up first, by an unsigned note in torchrun's store "
        "(no HAL_COMM_SECRET: anyone who reaches MASTER_ADDR:MASTER_PORT could have written it; set "
        "HAL_COMM_SECRET on every rank for signed notes): its init timed out waiting for round 0 (for "
        "rank(s) 1))"
    ), err.value


def test_with_a_secret_a_forged_gave_up_note_is_not_believed(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With HAL_COMM_SECRET the gave-up note carries a MAC: one a stranger wrote into torchrun's store
    (unsigned, or signed with another secret) is reported as not believed, never as rank 0's word."""
    monkeypatch.setenv("HAL_COMM_SECRET", "s3cret-of-the-job")
    stranger = client(store)
    stranger.set("t/forged/gaveup/0", '{"what": "round 0", "missing": [1]}')
    boot_1 = TorchStoreBootstrap(client(store), 1, 2, 1.0, "t/forged")
    with pytest.raises(hal.CommError) as err:
        boot_1.allgather(1)
    text = str(err.value)
    assert (
        "says rank 0 gave up first, but it carries no valid MAC of this job's secret: not believed"
        in text
    )
    assert "rank 0 gave up first:" not in text and "s3cret" not in text, text


@pytest.mark.parametrize(
    ("forged", "needle"),
    [
        (b"garbage{", "is not JSON"),
        (b"[" * 100_000, "is not JSON"),
        (b"5", "is a JSON int, not an object"),
        (b'{"rank": "x"}', "lacks the key"),
    ],
)
def test_a_value_forged_in_the_store_is_a_comm_error(
    store: Any, monkeypatch: pytest.MonkeyPatch, forged: bytes, needle: str
) -> None:
    """Anyone who reaches torchrun's store can write hal's keys: rank 0 reading what a stranger
    wrote in rank 1's place ends init with hal.CommError naming rank 1 and the key, not with
    json's JSONDecodeError, a RecursionError, an AttributeError or a KeyError."""
    monkeypatch.delenv("HAL_COMM_SECRET", raising=False)  # the secret is published in the store
    monkeypatch.delenv("HAL_COMM_SECRET_FILE", raising=False)
    client(store).set("t/f/0/1", forged)  # rank 1 never comes; the stranger wrote its key
    boot = TorchStoreBootstrap(client(store), 0, 2, 10.0, "t/f")
    with pytest.raises(hal.CommError, match=needle) as err:
        boot.allgather({"rank": 0, "host": "h"})
    assert (
        err.value.ranks == (1,)
        and "t/f/0/1" in str(err.value)
        and "torchrun's store" in str(err.value)
    )


@pytest.mark.parametrize(
    "forged",
    [b'{"rank": 1, "host": "h"}', b'{"v": "{}", "mac": "00"}', b"garbage{", b"[" * 100_000],
)
def test_with_the_jobs_secret_a_value_without_its_mac_is_refused(
    store: Any, monkeypatch: pytest.MonkeyPatch, forged: bytes
) -> None:
    """With HAL_COMM_SECRET every value in the store carries a MAC of the job's secret: a table a
    stranger wrote in rank 1's place, however well-formed, is refused naming rank 1."""
    monkeypatch.setenv("HAL_COMM_SECRET", "s3cret-of-the-job")
    client(store).set("t/mac/0/1", forged)
    boot = TorchStoreBootstrap(client(store), 0, 2, 10.0, "t/mac")
    with pytest.raises(hal.CommError, match="carries no valid MAC of this job's secret") as err:
        boot.allgather({"rank": 0, "host": "h"})
    assert err.value.ranks == (1,) and "t/mac/0/1" in str(err.value)


def test_ranks_with_different_secrets_refuse_each_other(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks under torchrun whose HAL_COMM_SECRET differ (shared memory would have joined them
    without a word): each refuses the other's value, naming it; equal secrets agree."""
    errors: dict[int, BaseException] = {}
    boots = []
    for r, secret in enumerate(["secret-a", "secret-b"]):
        monkeypatch.setenv("HAL_COMM_SECRET", secret)  # each rank's own, read when it is made
        boots.append(TorchStoreBootstrap(client(store), r, 2, 10.0, "t/two"))

    def rank(r: int) -> None:
        try:
            boots[r].allgather({"rank": r})
        except hal.CommError as exc:
            errors[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(errors) == [0, 1]
    for r, exc in errors.items():
        assert getattr(exc, "ranks", None) == (1 - r,) and "HAL_COMM_SECRET" in str(exc)
    monkeypatch.setenv("HAL_COMM_SECRET", "same")
    assert run_ranks(store, 2, "t/same", [lambda r: {"rank": r}])[0][1] == [
        [{"rank": 0}, {"rank": 1}]
    ]


def test_a_rank_without_the_secret_rank_0_has_is_told(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 has HAL_COMM_SECRET (so it publishes none), rank 1 has not: rank 1's wait for the
    published secret times out saying the secret may be set on rank 0 only."""
    monkeypatch.delenv("HAL_COMM_SECRET", raising=False)
    monkeypatch.delenv("HAL_COMM_SECRET_FILE", raising=False)
    with pytest.raises(
        hal.CommError,
        match="rank 0 has HAL_COMM_SECRET / HAL_COMM_SECRET_FILE and this rank has not",
    ):
        TorchStoreBootstrap(client(store), 1, 2, 1.0, "t/nosecret")
