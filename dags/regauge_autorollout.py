"""regauge_autorollout(view, version, steps, hold_s, thresholds): roll a ready
candidate out by itself.

Step by step (default 1, 5, 25, 50, 100 % of analysts, taken lowest first
whatever the order given), each step held for
`hold_s` seconds and then judged on four gates measured from the real systems:
agreement with the current version (net of restatements), the candidate's
freshness, the latest audit, and analysts' failed queries on the serving view.
All hold: the next step. One fails: everyone goes back to the current version,
and the gate and its figures are recorded (`regauge versions show VIEW VERSION`).
Pins are never moved. Stop it with `regauge autorollout stop VIEW`, or mark this
run failed: the rollout then stays where it is. A retry of the same run resumes
its rollout, or reports how it ended; it never starts a second one.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from _regauge import dag_args, regauge, version_param, view_param

# The longest plan: 100 steps of a day each would not fit; the task may hold
# for a day and a bit (a one-day hold of the last step, plus the others' time).
TIMEOUT = timedelta(hours=26)
QUICK_RETRY = timedelta(seconds=5)


def _count(default: int, text: str) -> Param:
    return Param(default, type="integer", minimum=0, maximum=1_000_000, description=text)


with DAG(
    dag_id="regauge_autorollout",
    description="roll a view version out step by step while its gates hold; back on a failure",
    schedule=None,
    params={
        "view": view_param(),
        "version": version_param(),
        "steps": Param(
            [1, 5, 25, 50, 100],
            type="array",
            items={"type": "integer", "minimum": 1, "maximum": 100},
            minItems=1,
            maxItems=100,
            uniqueItems=True,
            # Taken lowest first (the task sorts them): every list the schema lets
            # through is a plan the command accepts, so none is refused after a run
            # exists. JSON Schema cannot say "rising".
            contains={"const": 100},
            description="percents of analysts to pass through, one of them 100; taken lowest first",
        ),
        "hold_s": Param(
            300, type="number", minimum=0, maximum=86_400, description="seconds each step holds"
        ),
        "unexplained_keys": _count(0, "agreement: differing final windows with no restatement"),
        "lag_versions": _count(10, "freshness: silver versions the candidate may be behind"),
        "failed_queries": _count(0, "serving: analysts' failed queries on the view per step"),
    },
    **dag_args(__doc__),
) as dag:
    task = regauge(
        "autorollout",
        'autorollout "$VIEW" "$VERSION" --steps "$STEPS" --hold "$HOLD_S" '
        '--unexplained-keys "$UNEXPLAINED_KEYS" --lag-versions "$LAG_VERSIONS" '
        '--failed-queries "$FAILED_QUERIES" --by airflow --request-id "$RUN_ID"',
        VIEW="{{ params.view }}",
        VERSION="{{ params.version }}",
        STEPS="{{ params.steps | sort | join(',') }}",
        HOLD_S="{{ params.hold_s }}",
        UNEXPLAINED_KEYS="{{ params.unexplained_keys }}",
        LAG_VERSIONS="{{ params.lag_versions }}",
        FAILED_QUERIES="{{ params.failed_queries }}",
        RUN_ID="{{ run_id }}",
    )
    task.execution_timeout = TIMEOUT
    # A retry resumes a rollout whose task was killed (its driver holds no state), or
    # reports one that ended by a verdict: soon, not after the usual 30 s.
    task.retry_delay = QUICK_RETRY
