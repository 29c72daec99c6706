"""A rollout that drives itself (issue 69): its plan, its gates' verdicts, its next move.

Pure rules, no IO: `warehouse.ops.autorollout` measures the figures, records each
decision and moves users; everything it decides is decided here, so each rule is
tested without a stack.

A rollout moves a candidate version's share of (unpinned) analysts through rising
steps, e.g. 1, 5, 25, 50, 100 %. At each step it holds for a set time, then judges
four gates from measured figures:
- agreement: on the columns the candidate shares with the current version
  (`agrees_with`), every final window agrees, or the difference is explained by a
  restatement recorded since the candidate's build;
- freshness: the candidate's stream has read silver to within a few versions;
- integrity: the latest audit passed, and none failed while the step held;
- serving: analysts' queries on the serving view did not fail while the step held.
All hold: the next step (after the last, the rollout is complete). One fails: every
analyst goes back to the current version (0 %), and the failed gate is recorded
with its figures. A person's stop wins over both, and moves nobody.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

DEFAULT_STEPS = (1, 5, 25, 50, 100)
DEFAULT_HOLD_S = 300.0
GATES = ("agreement", "freshness", "integrity", "serving")
# A rollout's states (control.rollouts.state); only `running` may still move users.
STATES = ("running", "completed", "rolled_back", "stopped")


class PlanError(ValueError):
    """A rollout plan that is refused before anything moves; the message says why."""


@dataclass(frozen=True)
class Thresholds:
    """How much each gate tolerates. The defaults are strict: a number that differs
    without a restatement to explain it, or an analyst's failed query, fails."""

    # agreement: keys that differ on shared columns with no restatement explaining them
    unexplained_keys: int = 0
    # freshness: silver versions the candidate's stream may be behind silver's newest
    lag_versions: int = 10
    # serving: analysts' failed queries on the serving view while a step holds
    failed_queries: int = 0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PlanError(f"threshold {name}={value!r} must be a whole number, 0 or more")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    view: str
    version: int
    steps: tuple[int, ...] = DEFAULT_STEPS
    hold_s: float = DEFAULT_HOLD_S
    thresholds: Thresholds = field(default_factory=Thresholds)

    def describe(self) -> str:
        return (
            f"{self.view} v{self.version} through {', '.join(f'{s} %' for s in self.steps)}, "
            f"holding each {self.hold_s:g} s"
        )


def parse_steps(text: str | Sequence[int]) -> tuple[int, ...]:
    """`"1,5,25,50,100"` (or a sequence) as checked steps: whole percents from 1 to 100,
    rising, ending at 100 (a rollout that stops short is a manual `regauge rollout`)."""
    if isinstance(text, str):
        parts = [p.strip() for p in text.split(",") if p.strip()]
        try:
            steps = tuple(int(p) for p in parts)
        except ValueError:
            raise PlanError(
                f"steps {text!r}: expected whole percents separated by commas, e.g. 1,5,25,50,100"
            ) from None
    else:
        steps = tuple(text)
    if not steps:
        raise PlanError("steps: name at least one percent, ending at 100")
    bad = [s for s in steps if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 100]
    if bad:
        raise PlanError(f"steps {list(steps)}: {bad} not whole percents from 1 to 100")
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise PlanError(f"steps {list(steps)}: each step must be above the one before")
    if steps[-1] != 100:
        raise PlanError(f"steps {list(steps)}: the last step must be 100 (everyone)")
    return steps


def plan(
    view: str,
    version: int,
    steps: str | Sequence[int] = DEFAULT_STEPS,
    hold_s: float = DEFAULT_HOLD_S,
    thresholds: Thresholds | None = None,
) -> Plan:
    """A checked plan; anything wrong is a PlanError naming it."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise PlanError(f"version {version!r} must be a whole number, 1 or more")
    if not isinstance(hold_s, int | float) or not 0 <= hold_s <= 86_400:
        raise PlanError(f"hold {hold_s!r} s must be from 0 to 86400 seconds (a day)")
    return Plan(view, version, parse_steps(steps), float(hold_s), thresholds or Thresholds())


@dataclass(frozen=True)
class Figures:
    """What was measured at the end of one step's hold. None: could not be measured,
    which fails the gate (a gate never holds on a figure it does not have)."""

    # agreement: the columns compared (the candidate's, named as in `agrees_with`)
    shared_columns: tuple[str, ...] = ()
    keys_compared: int | None = None
    keys_differing: int | None = None
    keys_unexplained: int | None = None
    unexplained_examples: tuple[str, ...] = ()
    # freshness: silver versions behind silver's newest (worst source); None if the
    # candidate's stream is not running or has not reported yet
    lag_versions: int | None = None
    # integrity
    audit_passed: bool | None = None
    audit_finished_at: str | None = None
    audits_failed_during: int = 0
    # serving
    queries: int = 0
    failed_queries: int = 0
    failed_examples: tuple[str, ...] = ()
    # why a figure is missing, per gate
    missing: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["shared_columns"] = list(self.shared_columns)
        found["unexplained_examples"] = list(self.unexplained_examples)
        found["failed_examples"] = list(self.failed_examples)
        return found


@dataclass(frozen=True)
class Verdict:
    gate: str
    held: bool
    why: str


def judge(figures: Figures, limits: Thresholds) -> list[Verdict]:
    """One verdict per gate, in GATES' order."""
    return [
        _agreement(figures, limits),
        _freshness(figures, limits),
        _integrity(figures),
        _serving(figures, limits),
    ]


def _agreement(f: Figures, limits: Thresholds) -> Verdict:
    if f.keys_unexplained is None or f.keys_compared is None:
        return Verdict("agreement", False, f.missing.get("agreement", "not measured"))
    if not f.shared_columns:
        return Verdict(
            "agreement", True, "the candidate declares no columns in common (agrees_with)"
        )
    why = (
        f"on {', '.join(f.shared_columns)}: {f.keys_compared} final windows compared, "
        f"{f.keys_differing or 0} differ, "
        f"{f.keys_unexplained} with no restatement to explain them"
        + (f" (e.g. {', '.join(f.unexplained_examples[:3])})" if f.unexplained_examples else "")
        + f"; at most {limits.unexplained_keys} allowed"
    )
    return Verdict("agreement", f.keys_unexplained <= limits.unexplained_keys, why)


def _freshness(f: Figures, limits: Thresholds) -> Verdict:
    if f.lag_versions is None:
        return Verdict("freshness", False, f.missing.get("freshness", "not measured"))
    why = (
        f"{f.lag_versions} silver versions behind silver's newest; "
        f"at most {limits.lag_versions} allowed"
    )
    return Verdict("freshness", f.lag_versions <= limits.lag_versions, why)


def _integrity(f: Figures) -> Verdict:
    if f.audit_passed is None:
        return Verdict("integrity", False, f.missing.get("integrity", "no audit on record"))
    why = (
        f"the latest audit (finished {f.audit_finished_at}) "
        f"{'passed' if f.audit_passed else 'FAILED'}; "
        f"{f.audits_failed_during} audit runs failed while the step held"
    )
    return Verdict("integrity", f.audit_passed and f.audits_failed_during == 0, why)


def _serving(f: Figures, limits: Thresholds) -> Verdict:
    why = (
        f"{f.failed_queries} of {f.queries} analysts' queries on the serving view failed "
        f"while the step held; at most {limits.failed_queries} allowed"
        + (f" (e.g. {f.failed_examples[0]})" if f.failed_examples else "")
    )
    return Verdict("serving", f.failed_queries <= limits.failed_queries, why)


MoveKind = Literal["step", "completed", "rolled_back", "stopped"]


@dataclass(frozen=True)
class Move:
    """What to do next: route `percent` % to the candidate (a step), or end the
    rollout in a state; `percent` is None when nobody moves."""

    kind: MoveKind
    percent: int | None
    step: int
    why: str


def first_move(p: Plan) -> Move:
    return Move("step", p.steps[0], 0, f"first step: {p.steps[0]} %")


def next_move(p: Plan, step: int, verdicts: Sequence[Verdict], stop_by: str | None) -> Move:
    """After step `step` (an index into p.steps) held and was judged.

    A person's stop wins, and nobody moves: the rollout stays where it is. A failed
    gate sends everyone back to the current version. All holding, the next step; after
    the last one (100 %), the rollout is complete.
    """
    if not 0 <= step < len(p.steps):
        raise PlanError(f"step {step} is not one of the plan's {len(p.steps)} steps")
    if stop_by is not None:
        return Move("stopped", None, step, f"stopped by {stop_by} at {p.steps[step]} %")
    if {v.gate for v in verdicts} != set(GATES):
        raise PlanError(f"every gate must be judged ({', '.join(GATES)})")
    failed = [v for v in verdicts if not v.held]
    if failed:
        why = "; ".join(f"{v.gate} failed: {v.why}" for v in failed)
        return Move("rolled_back", 0, step, f"at {p.steps[step]} %: {why}")
    if step == len(p.steps) - 1:
        steps = ", ".join(f"{s} %" for s in p.steps)
        return Move("completed", None, step, f"every gate held at every step ({steps})")
    nxt = p.steps[step + 1]
    return Move("step", nxt, step + 1, f"every gate held at {p.steps[step]} %: on to {nxt} %")
