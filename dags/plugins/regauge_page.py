"""regauge's rollout page in Airflow's UI: Browse > regauge rollouts (issue 69).

The api-server serves it at /regauge/ to users logged in to Airflow (its own
`_token` cookie or a bearer token; 401 otherwise). The page itself is made by the
pipeline's CLI, `regauge page`, as every task's work is: Airflow's virtualenv has
no regauge package, and the page reads the registry, the view host and Trino
exactly as the rollout's gates do. Loaded from `[core] plugins_folder`, which
regauge points here (`.airflowignore` keeps the DAG processor out).
"""

from __future__ import annotations

import html
import os
import subprocess

from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

# Longer than the page's few queries take on a busy machine; shorter than a person waits.
TIMEOUT_S = 60

app = FastAPI(title="regauge rollouts", docs_url=None, redoc_url=None, openapi_url=None)


@app.get("/", response_class=HTMLResponse)
def rollout_page(user: GetUserDep) -> HTMLResponse:
    # A plain def: FastAPI runs it in a worker thread, so the api-server's loop
    # keeps serving while the CLI runs.
    argv = [os.environ["REGAUGE_BIN"], "page"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return HTMLResponse(
            f"<p>`regauge page` took over {TIMEOUT_S} s; is the stack busy?</p>", status_code=504
        )
    if done.returncode != 0:
        said = html.escape(done.stderr[-3000:])
        return HTMLResponse(
            f"<p>`regauge page` failed (exit {done.returncode}):</p><pre>{said}</pre>",
            status_code=500,
        )
    return HTMLResponse(done.stdout)


class RegaugePage(AirflowPlugin):
    name = "regauge_page"
    fastapi_apps = [{"app": app, "url_prefix": "/regauge", "name": "regauge rollouts"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {
            "name": "regauge rollouts",
            "href": "/regauge/",
            "url_route": "regauge",
            "destination": "nav",
            "category": "browse",
        }
    ]
