"""regauge_reprocess(view, version, source): build a new view version from all history.

register (building) -> replay history into its table -> go live from exactly
where the replay ended -> validate -> publish to Trino -> mark ready.
A failed gate marks the version failed and stops its stream; the current
version keeps serving. Every task can be re-run: each looks at the registry
first, and the replay rebuilds from scratch.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from _regauge import dag_args, no_retry, regauge, version_param, view_param

ARGS = '"$VIEW" "$VERSION"'

with DAG(
    dag_id="regauge_reprocess",
    description="replay history into a new view version, validate it, make it ready",
    schedule=None,
    params={
        "view": view_param(),
        "version": version_param(),
        "source": Param(
            "bronze",
            type="string",
            enum=["bronze", "kafka"],
            description="bronze: all history (via silver); kafka: what Kafka still holds",
        ),
    },
    **dag_args(__doc__),
) as dag:
    env = {
        "VIEW": "{{ params.view }}",
        "VERSION": "{{ params.version }}",
        "SOURCE": "{{ params.source }}",
    }
    (
        # No retry for register: its refusal ("already built", "was retired") is the
        # verdict the caller waits for, and nothing has been done yet when it fails.
        no_retry(regauge("register", f'versions register {ARGS} --source "$SOURCE"', **env))
        >> regauge("replay", f'versions build {ARGS} --source "$SOURCE"', **env)
        >> regauge("go_live", f"versions go-live {ARGS}", **env)
        # No retry for the gate: a failed validation marks the version failed, and
        # a second try would only be refused ("is failed; nothing to validate").
        >> no_retry(regauge("validate", f"versions validate {ARGS}", **env))
        >> regauge("publish", f"versions publish {ARGS}", **env)
        >> regauge("mark_ready", f"versions ready {ARGS}", **env)
    )
