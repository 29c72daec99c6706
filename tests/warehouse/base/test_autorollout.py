import pytest

from warehouse.base import autorollout as ar
from warehouse.base.autorollout import Figures, PlanError, Thresholds, Verdict


def held() -> list[Verdict]:
    return [Verdict(g, True, "fine") for g in ar.GATES]


def good() -> Figures:
    return Figures(
        shared_columns=("orders_placed", "gross_revenue"),
        keys_compared=205,
        keys_differing=3,
        keys_unexplained=0,
        lag_versions=1,
        audit_passed=True,
        audit_finished_at="2026-12-04T10:00:00Z",
        queries=12,
    )


# -- the plan ----------------------------------------------------------------------------
def test_steps_parse_from_text_and_default_to_the_issues_five():
    assert ar.parse_steps("1, 5,25,50,100") == (1, 5, 25, 50, 100)
    assert ar.parse_steps([50, 100]) == (50, 100)
    assert ar.plan("revenue_hourly", 2).steps == ar.DEFAULT_STEPS == (1, 5, 25, 50, 100)


@pytest.mark.parametrize(
    ("steps", "says"),
    [
        ("", "at least one"),
        ("1,five,100", "whole percents separated by commas"),
        ("0,100", "[0] not whole percents"),
        ("50,101", "[101] not whole percents"),
        ("50,25,100", "above the one before"),
        ("50,50,100", "above the one before"),
        ("5,50", "last step must be 100"),
        ([True, 100], "not whole percents"),
    ],
)
def test_a_bad_step_list_is_refused_naming_what_is_wrong(steps, says):
    with pytest.raises(PlanError, match=says.replace("[", r"\[").replace("]", r"\]")):
        ar.parse_steps(steps)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"version": 0}, "version 0"),
        ({"version": True}, "version True"),
        ({"hold_s": -1}, "hold -1"),
        ({"hold_s": 90_000}, "a day"),
    ],
)
def test_a_bad_version_or_hold_is_refused(kwargs, says):
    args = {"view": "revenue_hourly", "version": 2, **kwargs}
    with pytest.raises(PlanError, match=says):
        ar.plan(**args)


def test_thresholds_are_whole_numbers_zero_or_more():
    assert Thresholds().as_dict() == {
        "unexplained_keys": 0,
        "lag_versions": 10,
        "failed_queries": 0,
    }
    with pytest.raises(PlanError, match="lag_versions=-1"):
        Thresholds(lag_versions=-1)
    with pytest.raises(PlanError, match=r"failed_queries=1\.5"):
        Thresholds(failed_queries=1.5)  # type: ignore[arg-type]


def test_a_plan_describes_itself():
    p = ar.plan("revenue_hourly", 2, "50,100", 30)
    assert p.describe() == "revenue_hourly v2 through 50 %, 100 %, holding each 30 s"


# -- the gates ---------------------------------------------------------------------------
def test_every_gate_holds_on_good_figures_and_says_what_it_measured():
    verdicts = ar.judge(good(), Thresholds())
    assert [v.gate for v in verdicts] == list(ar.GATES)
    assert all(v.held for v in verdicts), verdicts
    assert verdicts[0].why.startswith(
        "on orders_placed, gross_revenue: 205 final windows compared, 3 differ, 0 with no"
    )
    assert "1 silver versions behind" in verdicts[1].why
    assert "12 analysts' queries" in verdicts[3].why.replace("0 of ", "")


def by_gate(figures: Figures, limits: Thresholds | None = None) -> dict[str, Verdict]:
    return {v.gate: v for v in ar.judge(figures, limits or Thresholds())}


def test_agreement_fails_on_a_difference_no_restatement_explains():
    f = Figures(**{**good().as_dict(), "keys_unexplained": 2, "unexplained_examples": ("a", "b")})
    v = by_gate(f)["agreement"]
    assert not v.held and "2 with no restatement" in v.why and "e.g. a, b" in v.why
    assert by_gate(f, Thresholds(unexplained_keys=2))["agreement"].held


def test_freshness_fails_past_its_threshold_and_when_the_stream_is_not_running():
    assert not by_gate(Figures(**{**good().as_dict(), "lag_versions": 11}))["freshness"].held
    assert by_gate(Figures(**{**good().as_dict(), "lag_versions": 10}))["freshness"].held
    gone = Figures(**{**good().as_dict(), "lag_versions": None, "missing": {"freshness": "down"}})
    assert by_gate(gone)["freshness"] == Verdict("freshness", False, "down")


def test_integrity_needs_a_passed_audit_and_no_failed_one_during_the_step():
    assert not by_gate(Figures(**{**good().as_dict(), "audit_passed": False}))["integrity"].held
    failed_during = Figures(**{**good().as_dict(), "audits_failed_during": 1})
    assert not by_gate(failed_during)["integrity"].held
    none = by_gate(Figures(**{**good().as_dict(), "audit_passed": None}))["integrity"]
    assert not none.held and none.why == "no audit on record"


def test_serving_fails_on_an_analysts_failed_query():
    f = Figures(**{**good().as_dict(), "failed_queries": 1, "failed_examples": ("boom",)})
    v = by_gate(f)["serving"]
    assert not v.held and "1 of 12" in v.why and "e.g. boom" in v.why
    assert by_gate(f, Thresholds(failed_queries=1))["serving"].held


def test_agreement_holds_with_nothing_declared_in_common_and_says_so():
    v = by_gate(Figures(**{**good().as_dict(), "shared_columns": ()}))["agreement"]
    assert v == Verdict(
        "agreement", True, "the candidate declares no columns in common (agrees_with)"
    )


def test_a_figure_not_measured_fails_its_gate():
    verdicts = by_gate(Figures(missing={"agreement": "Trino is away"}))
    assert verdicts["agreement"] == Verdict("agreement", False, "Trino is away")
    assert not verdicts["freshness"].held and not verdicts["integrity"].held


# -- the next move -----------------------------------------------------------------------
P = ar.plan("revenue_hourly", 2, "1,50,100", 10)


def test_all_gates_holding_move_to_the_next_step_then_complete():
    assert ar.first_move(P) == ar.Move("step", 1, 0, "first step: 1 %")
    assert ar.next_move(P, 0, held(), None) == ar.Move(
        "step", 50, 1, "every gate held at 1 %: on to 50 %"
    )
    assert ar.next_move(P, 1, held(), None).percent == 100
    done = ar.next_move(P, 2, held(), None)
    assert (done.kind, done.percent) == ("completed", None)


def test_a_failed_gate_rolls_everyone_back_and_names_the_gate():
    verdicts = held()
    verdicts[1] = Verdict("freshness", False, "12 behind")
    move = ar.next_move(P, 2, verdicts, None)
    assert (move.kind, move.percent, move.step) == ("rolled_back", 0, 2)
    assert move.why == "at 100 %: freshness failed: 12 behind"


def test_a_persons_stop_wins_and_moves_nobody():
    verdicts = [Verdict(g, False, "bad") for g in ar.GATES]
    move = ar.next_move(P, 1, verdicts, "engineer.ada")
    assert (move.kind, move.percent) == ("stopped", None)
    assert move.why == "stopped by engineer.ada at 50 %"


def test_a_move_needs_every_gate_judged_and_a_step_of_the_plan():
    with pytest.raises(PlanError, match="every gate"):
        ar.next_move(P, 0, held()[:3], None)
    with pytest.raises(PlanError, match="step 3"):
        ar.next_move(P, 3, held(), None)
