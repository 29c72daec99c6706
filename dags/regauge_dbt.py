"""regauge_dbt: build and test the dbt project on silver (models, then their tests).

One `dbt build` task. astronomer-cosmos would render one task per model, but
the graph it renders is fixed when the DAG is parsed, so a run could not honour
this DAG's `select` param. Each of its tasks would also start its own Spark JVM,
which costs about 20 s per model on 2 cores. The task's log is dbt's own, node
by node.

Params: `select`, dbt's node selection (`fct_orders+`, `tag:daily`,
`marts.fct_daily_revenue`), empty for everything. Airflow holds it to a plain
selector pattern before a run exists, and it reaches the shell only as $SELECT.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from _regauge import dag_args, regauge

# Names, graph operators and method selectors; no quotes, `$`, `;` or newlines.
SELECT_PATTERN = r"^[A-Za-z0-9_.:+*@,/ -]{0,200}(?![\s\S])"

with DAG(
    dag_id="regauge_dbt",
    description="dbt build on silver: staging, intermediate and marts, with their tests",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    params={
        "select": Param(
            "",
            type="string",
            pattern=SELECT_PATTERN,
            description="dbt node selection, e.g. fct_orders+ (empty: the whole project)",
        )
    },
    **dag_args(__doc__),
) as dag:
    regauge("dbt_build", 'dbt build ${SELECT:+--select "$SELECT"}', SELECT="{{ params.select }}")
