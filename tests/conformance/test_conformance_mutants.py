"""The suite catches broken backends: every mutant fails on its expected requirement ID.

A suite that passes a broken backend is the worst bug this project can have, so each
mutant (tests/conformance/hal_mutants.py) is a real backend registered through an entry
point, run under the emulator's jitter, and must fail the requirement it breaks; the
unmutated control built the same way must pass all of them.
"""

from __future__ import annotations

import threading

import pytest
from hal_mutants import CATCHES, MUTANTS

import hal
import hal._copy
from hal.conformance import Instance, Requirement, Suite, catalogue
from hal.conformance.spi import Target

pytestmark = pytest.mark.usefixtures("mutants")


def _req(rid: str) -> Requirement:
    return next(r for r in catalogue() if r.id == rid)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_fails_on_expected_requirement(name: str) -> None:
    _, rid, broken = MUTANTS[name]
    entry, outcomes = Suite(name).run_requirement(_req(rid))
    CATCHES[name] = entry["status"] == "fail"
    assert entry["status"] == "fail", f"{name} ({broken}) passed {rid}: the suite misses this bug"
    assert entry["reason"] and all(o.status in ("fail", "pass") for o in outcomes)


def test_control_passes_every_requirement_the_mutants_fail() -> None:
    suite = Suite("mut_control")
    for rid in sorted({m[1] for m in MUTANTS.values()}):
        entry, _ = suite.run_requirement(_req(rid))
        assert entry["status"] == "pass", f"the unmutated control fails {rid}: {entry['reason']}"


def test_declared_absent_capability_skips_with_the_backends_reason() -> None:
    suite = Suite("ok_declared_absent")
    values, _ = suite.run_requirement(_req("DLPACK-VALUES"))
    assert values["status"] == "skip"
    assert "fixture: no DLPack on this board" in values["reason"]
    timing, _ = suite.run_requirement(_req("EVENT-TIMING-PLAUSIBLE"))
    assert timing["status"] == "skip" and "no reason given" in timing["reason"]
    consistent, _ = suite.run_requirement(_req("DLPACK-CONSISTENT"))
    assert consistent["status"] == "pass", consistent["reason"]
    for rid in ("EVENT-CLOSE", "ERR-EVENT-ARGS"):
        entry, _ = suite.run_requirement(_req(rid))
        assert entry["status"] == "pass", f"{rid}: {entry['reason']}"


def test_core_mutation_use_after_close_undetected_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hal core enforces use-after-close; a core that frees but keeps the handle usable fails."""
    monkeypatch.setattr(hal.Buffer, "close", lambda self: self._finalizer())
    entry, _ = Suite("cpu").run_requirement(_req("MEM-USE-AFTER-CLOSE"))
    assert entry["status"] == "fail"


def test_core_mutation_unchecked_sizes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A core that stops validating sizes (silent success on a bad argument) fails ERR-*."""
    monkeypatch.setattr(hal._copy, "_as_size", lambda value, name: int(value))
    suite = Suite("cpu")
    for rid in ("ERR-COPY-BOUNDS", "ERR-MEMSET-ARGS"):
        entry, _ = suite.run_requirement(_req(rid))
        assert entry["status"] == "fail", rid


def _instance(check: object, rid: str = "MEM-FIXTURE-CHECK") -> tuple[Suite, Instance]:
    suite = Suite("mut_control", timeout=1.0)
    req = Requirement(rid, "a fixture requirement", "MEM", check)
    return suite, Instance(req, suite.devices[:1], str(suite.devices[0]))


def test_undeclared_skip_is_a_failure() -> None:
    def check(t: Target) -> None:
        pytest.skip("the check gave up")

    suite, inst = _instance(check)
    out = suite.execute(inst)
    assert out.status == "fail" and "undeclared skip" in out.reason


def test_not_applicable_by_declaration_is_a_skip() -> None:
    def check(t: Target) -> None:
        raise t.not_applicable("the backend declares no peer path here", capability="p2p")

    suite, inst = _instance(check)
    out = suite.execute(inst)
    assert out.status == "skip" and "no peer path" in out.reason and out.basis == "capability"


def test_a_skip_for_any_reason_but_a_capability_is_a_failure() -> None:
    def check(t: Target) -> None:
        raise t.not_applicable("the compile cache returned no binary on this device")

    suite, inst = _instance(check)
    out = suite.execute(inst)
    assert out.status == "fail" and "not a declared-absent capability" in out.reason


def test_hang_is_a_failure_not_a_hung_certification() -> None:
    release = threading.Event()

    def check(t: Target) -> None:
        release.wait(30)

    suite, inst = _instance(check)
    try:
        out = suite.execute(inst)
    finally:
        release.set()
    assert out.status == "fail" and "did not finish within 1 s" in out.reason


def test_a_crashing_check_reports_the_exception() -> None:
    def check(t: Target) -> None:
        t.alloc(16)
        raise KeyError("boom")

    suite, inst = _instance(check)
    out = suite.execute(inst)
    assert out.status == "fail" and "KeyError" in out.reason and "boom" in out.traceback
