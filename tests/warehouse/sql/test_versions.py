"""The registry's rules, as pure functions: routing, rollout steps, what retire refuses."""

from __future__ import annotations

import hashlib

import pytest

from warehouse.base.sqlnames import UnsafeNameError, check_user
from warehouse.sql.versions import (
    Version,
    VersionError,
    cohort,
    plan_rollout,
    register_refusal,
    retire_refusal,
    route,
)

VIEW = "revenue_hourly"


def v(version: int, status: str, percent: int = 0) -> Version:
    return Version(VIEW, version, status, percent)


def test_cohort_is_the_contracts_formula():
    # int.from_bytes(sha256(u)[:8], signed) % 100, as docs/contract.md §4 writes it.
    for user in ("analyst.alice", "bob", "engineer.x", "r"):
        raw = int.from_bytes(hashlib.sha256(user.encode()).digest()[:8], "big", signed=True)
        assert cohort(user) == raw % 100
        assert 0 <= cohort(user) < 100
    # A negative raw value floors into 0-99 (Python's % already floors).
    negatives = [
        u for u in (f"user{i}" for i in range(50)) if hashlib.sha256(u.encode()).digest()[0] >= 128
    ]
    assert negatives and all(0 <= cohort(u) < 100 for u in negatives)


def test_route_follows_cohort_then_pins():
    rows = [v(1, "serving", 60), v(2, "ready", 40)]
    users = [f"analyst.u{i}" for i in range(200)]
    for user in users:
        assert route(rows, {}, user) == (2 if cohort(user) < 40 else 1)
    high = next(u for u in users if cohort(u) >= 40)
    low = next(u for u in users if cohort(u) < 40)
    assert route(rows, {high: 2, low: 1}, high) == 2
    assert route(rows, {high: 2, low: 1}, low) == 1


def test_a_pin_to_a_version_that_is_not_live_is_ignored():
    rows = [v(1, "retired"), v(2, "serving", 100)]
    assert route(rows, {"analyst.a": 1}, "analyst.a") == 2


def test_no_live_version_routes_nobody():
    assert route([v(1, "building")], {}, "analyst.a") is None


def test_rolling_a_candidate_out_sets_both_shares():
    rows = [v(1, "serving", 100), v(2, "ready", 0)]
    changes = plan_rollout(rows, 2, 10)
    assert {k: (r.status, r.rollout_percent) for k, r in changes.items()} == {
        1: ("serving", 90),
        2: ("ready", 10),
    }


def test_100_percent_swaps_roles_and_can_be_undone():
    rows = [v(1, "serving", 50), v(2, "ready", 50)]
    at_100 = plan_rollout(rows, 2, 100)
    assert {k: (r.status, r.rollout_percent) for k, r in at_100.items()} == {
        1: ("ready", 0),
        2: ("serving", 100),
    }
    after = [at_100[1], at_100[2]]
    users = [f"analyst.u{i}" for i in range(100)]
    assert {route(after, {}, u) for u in users} == {2}
    # Back to 90 %: v2 is the candidate again and the same cohorts keep it.
    back = plan_rollout(after, 2, 90)
    again = [back[1], back[2]]
    assert {k: (r.status, r.rollout_percent) for k, r in back.items()} == {
        1: ("serving", 10),
        2: ("ready", 90),
    }
    assert all(route(again, {}, u) == (2 if cohort(u) < 90 else 1) for u in users)


def test_an_unchanged_rollout_changes_no_row():
    rows = [v(1, "serving", 80), v(2, "ready", 20)]
    assert plan_rollout(rows, 2, 20) == {}


@pytest.mark.parametrize(
    ("rows", "version", "percent", "match"),
    [
        ([v(1, "serving", 100)], 2, 10, "not registered"),
        ([v(1, "serving", 100), v(2, "building")], 2, 10, "building"),
        ([v(1, "serving", 100), v(2, "failed")], 2, 10, "failed"),
        ([v(1, "retired"), v(2, "serving", 100)], 1, 10, "retired"),
        ([v(1, "serving", 100)], 1, 50, "only live version"),
        ([v(1, "serving", 100), v(2, "ready")], 2, 101, "0 to 100"),
        ([v(1, "serving", 100), v(2, "ready")], 2, -1, "0 to 100"),
    ],
)
def test_rollouts_that_are_refused(rows, version, percent, match):
    with pytest.raises(VersionError, match=match):
        plan_rollout(rows, version, percent)


@pytest.mark.parametrize(
    ("rows", "pins", "version", "match"),
    [
        ([v(1, "serving", 100), v(2, "ready", 0)], {}, 1, "current version"),
        ([v(1, "serving", 90), v(2, "ready", 10)], {}, 2, "10 % of users"),
        ([v(1, "serving", 100), v(2, "ready", 0)], {"analyst.a": 2}, 2, "pinned"),
        ([v(1, "serving", 100), v(2, "building")], {}, 2, "being built"),
        ([v(1, "serving", 100)], {}, 3, "not registered"),
    ],
)
def test_retiring_a_version_someone_is_routed_to_is_refused(rows, pins, version, match):
    assert match in (retire_refusal(rows, pins, version) or "")


def test_a_version_nobody_is_routed_to_can_be_retired():
    rows = [v(1, "ready", 0), v(2, "serving", 100)]
    assert retire_refusal(rows, {"analyst.a": 2}, 1) is None
    assert retire_refusal([v(1, "serving", 100), v(2, "failed")], {}, 2) is None


@pytest.mark.parametrize(
    ("rows", "version", "match"),
    [
        ([v(1, "serving", 100), v(2, "ready")], 2, "already built"),
        ([v(1, "serving", 100)], 1, "already built"),
        ([v(1, "retired"), v(2, "serving", 100)], 1, "new version"),
        ([v(1, "serving", 100), v(2, "building")], 3, "one reprocess per view"),
        ([v(1, "serving", 100), v(2, "ready")], 3, "at most two live"),
    ],
)
def test_reprocess_refusals(rows, version, match):
    assert match in (register_refusal(rows, version) or "")


def test_a_failed_or_stopped_build_can_be_resumed():
    assert register_refusal([v(1, "serving", 100), v(2, "failed")], 2) is None
    assert register_refusal([v(1, "serving", 100), v(2, "building")], 2) is None
    assert register_refusal([], 1) is None


@pytest.mark.parametrize(
    "name",
    ["analyst.alice", "engineer.bob", "regauge", "a@b.c", "user-1_x"],
)
def test_plain_user_names_pass(name):
    assert check_user(name) == name


@pytest.mark.parametrize(
    "name",
    ["Alice", "x; drop table y", "eve'--", "\u0430nalyst.eve", "eve\n", "", "a" * 65, "1abc"],
)
def test_other_user_names_are_refused(name):
    with pytest.raises(UnsafeNameError):
        check_user(name)
