"""The DAG files as Airflow itself loads them (in Airflow's own virtualenv).

Checks that every file parses, that the DAG ids and params are the contract's
(docs/contract.md §5), that each param schema refuses what it must, that tasks
run the pipeline's CLI with params passed only through the environment, that
no task defers (the stack runs no triggerer), and that every DAG shows its
file's docstring and every task retries (unless its failure is a verdict) and
logs its failure.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_PYTHON = REPO / ".venv-airflow" / "bin" / "python"

PROBE = r"""
import io, json, logging, sys, types
sys.path.insert(0, sys.argv[1])  # as the DAG processor does with its DAG folder
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
out = {"errors": {k: str(v)[-500:] for k, v in bag.import_errors.items()}, "dags": {}}
def name(f):
    return f"{f.__module__}.{getattr(f, '__qualname__', type(f).__qualname__)}"
for dag_id, dag in bag.dags.items():
    out["dags"][dag_id] = {
        "params": {k: dag.params.get_param(k).schema for k in dag.params},
        "defaults": {k: dag.params.get_param(k).value for k in dag.params
                     if dag.params.get_param(k).has_value},
        "tasks": {t.task_id: {"operator": type(t).__name__,
                              "from_trigger": bool(getattr(t, "start_from_trigger", False)),
                              "command": getattr(t, "bash_command", None),
                              "env": getattr(t, "env", None),
                              "upstream": sorted(t.upstream_task_ids),
                              "trigger_rule": str(t.trigger_rule),
                              "retries": t.retries,
                              "retry_delay_s": t.retry_delay.total_seconds(),
                              "on_failure": [name(f) for f in t.on_failure_callback]}
                  for t in dag.tasks},
        "schedule": getattr(dag.timetable, "summary", str(dag.schedule)),
        "start_date": dag.start_date and dag.start_date.isoformat(),
        "doc_md": dag.doc_md,
        "fileloc": dag.fileloc,
    }
# What the failure callback logs, for a task on its second and last try.
import _regauge
buf = io.StringIO()
handler = logging.StreamHandler(buf)
handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
_regauge.log.addHandler(handler)
ti = types.SimpleNamespace(dag_id="regauge_x", task_id="t_1", run_id="manual__1", try_number=2,
                           max_tries=1)
_regauge.log_failure({"ti": ti, "exception": RuntimeError("exit code 2")})
out["failure_log"] = buf.getvalue()
# When a stack that has no runs of a DAG yet comes up 4 minutes after one of its cron
# times (inside the window Airflow's default `run_immediately` runs at once), its
# first run: [when the stack came up, when the run is due].
import datetime
from airflow.timetables import trigger
from airflow.timetables.base import TimeRestriction
real_utcnow = trigger.utcnow
out["first_runs"] = {}
for dag_id, dag in bag.dags.items():
    if isinstance(dag.timetable, trigger.CronTriggerTimetable):
        up = dag.timetable._align_to_prev(trigger.coerce_datetime(real_utcnow()))
        up += datetime.timedelta(minutes=4)
        trigger.utcnow = lambda: up
        try:
            first = dag.timetable.next_dagrun_info(
                last_automated_data_interval=None,
                restriction=TimeRestriction(earliest=None, latest=None, catchup=False))
        finally:
            trigger.utcnow = real_utcnow
        out["first_runs"][dag_id] = [up.isoformat(), first.run_after.isoformat()]
print(json.dumps(out, default=str))
"""

# Tasks whose failure is a verdict, not a fault: they never retry (see dags/_regauge.py).
NO_RETRY = {
    ("regauge_reprocess", "register"),
    ("regauge_reprocess", "validate"),
    ("regauge_retire", "retire"),
    ("regauge_audit", "audit"),
}
RETRIES = 1
RETRY_DELAY_S = 30.0


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict[str, Any]:
    if not AIRFLOW_PYTHON.is_file():
        pytest.fail(f"Airflow's virtualenv is missing ({AIRFLOW_PYTHON}): run `make setup`")
    home = tmp_path_factory.mktemp("airflow_home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        # The default 30 s per DAG file can run out on 2 cores shared with another
        # test worker's Spark JVM, and would show as an import error.
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "300",
    }
    proc = subprocess.run(
        [str(AIRFLOW_PYTHON), "-c", PROBE, str(REPO / "dags")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_every_dag_file_parses(loaded):
    assert loaded["errors"] == {}
    assert set(loaded["dags"]) == {
        "regauge_reprocess",
        "regauge_rollout",
        "regauge_autorollout",
        "regauge_retire",
        "regauge_watchdog",
        "regauge_audit",
        "regauge_dbt",
        "regauge_forget",
        "regauge_maintenance",
        "regauge_readmit",
    }


def test_reprocess_runs_its_steps_in_order(loaded):
    tasks = loaded["dags"]["regauge_reprocess"]["tasks"]
    order = ["register", "replay", "go_live", "validate", "publish", "mark_ready"]
    assert set(tasks) == set(order)
    for before, after in itertools.pairwise(order):
        assert tasks[after]["upstream"] == [before]
    assert loaded["dags"]["regauge_reprocess"]["defaults"] == {"source": "bronze"}


def test_params_are_the_contracts(loaded):
    dags = loaded["dags"]
    assert set(dags["regauge_reprocess"]["params"]) == {"view", "version", "source"}
    assert {"view", "version", "percent", "pin_user"} <= set(dags["regauge_rollout"]["params"])
    assert set(dags["regauge_retire"]["params"]) == {"view", "version"}
    assert set(dags["regauge_autorollout"]["params"]) == {
        *("view", "version", "steps", "hold_s"),
        *("unexplained_keys", "lag_versions", "failed_queries"),
    }
    assert loaded["dags"]["regauge_autorollout"]["defaults"]["steps"] == [1, 5, 25, 50, 100]
    assert dags["regauge_watchdog"]["params"] == {}
    assert dags["regauge_audit"]["params"] == {}
    assert set(dags["regauge_dbt"]["params"]) == {"select"}
    assert set(dags["regauge_forget"]["params"]) == {"customer_id", "reason"}
    assert set(dags["regauge_maintenance"]["params"]) == {"retention_hours"}
    # Airflow's own records go beside the lake's maintenance, not after it.
    tasks = dags["regauge_maintenance"]["tasks"]
    assert {t: task["upstream"] for t, task in tasks.items()} == {
        "maintain": [],
        "clean_airflow": [],
    }
    assert tasks["clean_airflow"]["command"].endswith('exec "$REGAUGE_BIN" clean-airflow')
    assert set(dags["regauge_readmit"]["params"]) == {"source", "reason"}
    views = dags["regauge_reprocess"]["params"]["view"]["enum"]
    assert views == ["cart_sessions", "revenue_hourly", "visits"]


@pytest.mark.parametrize(
    ("dag_id", "param", "good", "bad"),
    [
        ("regauge_reprocess", "view", "revenue_hourly", ["nope", "x; drop table y", 1]),
        ("regauge_reprocess", "version", 2, [0, -1, "2", 1.5]),
        ("regauge_reprocess", "source", "kafka", ["s3", ""]),
        ("regauge_rollout", "percent", 100, [101, -1, "50"]),
        (
            "regauge_autorollout",
            "steps",
            [1, 50, 100],
            [[], [0, 100], [50, 101], [50, 50, 100], [5, 50], "1,100", [1.5, 100]],
        ),
        ("regauge_autorollout", "hold_s", 2.5, [-1, 86_401, "30", None]),
        ("regauge_autorollout", "lag_versions", 0, [-1, 1.5, "3", None]),
        (
            "regauge_rollout",
            "pin_user",
            "analyst.alice",
            ["\u0430nalyst.alice", "eve'--", "eve\n", "Eve", "a b"],
        ),
        (
            "regauge_dbt",
            "select",
            "fct_orders+ marts.fct_daily_revenue tag:daily",
            ["x; rm -rf /", "$(id)", "fct_orders\n", "'", '"', "`id`", "a" * 201],
        ),
        ("regauge_forget", "customer_id", "c'1 $(id)\n", ["", "c\x001", "x" * 65, 42, None]),
        ("regauge_forget", "reason", "GDPR art. 17 #12", ["", "<b>", "a\nb", "a" * 201, "$(id)"]),
        ("regauge_maintenance", "retention_hours", 0.5, [-1, "12", "1; rm -rf /", [1]]),
        ("regauge_readmit", "source", "shop", ["", "Shop", "s p", "s;id", "s\n", "x" * 65, 1]),
        (
            "regauge_readmit",
            "reason",
            "total_mismatch",
            ["conflicting_duplicate", "late", "", "$(id)", None],
        ),
    ],
)
def test_param_schemas_refuse_bad_values(loaded, dag_id, param, good, bad):
    import jsonschema

    schema = loaded["dags"][dag_id]["params"][param]
    jsonschema.validate(good, schema)
    for value in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, schema)


def test_autorollout_takes_its_steps_lowest_first(loaded):
    """Any steps its schema lets through make a plan the command accepts: the schema
    cannot say "rising", so the task sorts them, and no run exists to be refused."""
    import jinja2

    from warehouse.base.autorollout import parse_steps

    task = loaded["dags"]["regauge_autorollout"]["tasks"]["autorollout"]
    template = jinja2.Environment().from_string(task["env"]["STEPS"])
    for given, taken in [([50, 1, 100], (1, 50, 100)), ([100, 25], (25, 100)), ([100], (100,))]:
        assert parse_steps(template.render(params={"steps": given})) == taken


def test_tasks_call_the_cli_and_take_params_only_from_the_environment(loaded):
    for dag in loaded["dags"].values():
        for task in dag["tasks"].values():
            command = task["command"]
            assert command.startswith("set -euo pipefail; ")
            assert 'exec "$REGAUGE_BIN" ' in command
            assert "{{" not in command, "params must not be pasted into shell text"
            for value in (task["env"] or {}).values():
                # A param, or the run's own id (Airflow makes it; regauge_forget's
                # request id, which its retry resumes under).
                assert value == "{{ run_id }}" or (
                    value.startswith("{{ params.") and value.endswith("}}")
                )


def test_forget_hands_the_id_on_stdin_so_no_process_list_shows_it(loaded, tmp_path):
    """Issue 68, B: an argument is in `ps` for every local account to read. The
    task's own command runs here in bash, with a stand-in for the CLI that reports
    what it was given."""
    task = loaded["dags"]["regauge_forget"]["tasks"]["forget"]
    report = tmp_path / "report.json"
    stand_in = tmp_path / "regauge"
    stand_in.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'stdin': sys.stdin.read(), "
        f"'env': 'CUSTOMER_ID' in os.environ}}, open({str(report)!r}, 'w'))\n"
    )
    stand_in.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "REGAUGE_BIN": str(stand_in)}
    # Any id silver keeps reaches the CLI as it is, with the newline the CLI drops.
    odd = "c'1 $(id) `id`\n"
    env |= {"CUSTOMER_ID": odd, "REASON": "a request", "REQUEST_ID": "manual__2026-12-03"}
    subprocess.run(["bash", "-c", task["command"]], env=env, check=True, timeout=30)
    got = json.loads(report.read_text())
    assert got == {
        "argv": [
            *("forget", "customer", "-", "--reason", "a request"),
            *("--request-id", "manual__2026-12-03"),
        ],
        "stdin": odd + "\n",
        "env": False,
    }


def test_autorollout_hands_every_param_to_the_cli_which_parses_it(loaded, tmp_path):
    """Issue 69: the task's own command, run in bash with a stand-in for the CLI; what
    it was given then goes through regauge's own parser."""
    from warehouse.cli.parser import build_parser

    task = loaded["dags"]["regauge_autorollout"]["tasks"]["autorollout"]
    # A retry of a task killed by the scheduler resumes: it keeps DEFAULT_ARGS' retry.
    assert task["retries"] == 1
    report = tmp_path / "argv.json"
    stand_in = tmp_path / "regauge"
    stand_in.write_text(
        "#!/usr/bin/env python3\n"
        f"import json, sys\njson.dump(sys.argv[1:], open({str(report)!r}, 'w'))\n"
    )
    stand_in.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "REGAUGE_BIN": str(stand_in),
        **dict.fromkeys(("VIEW", "VERSION"), ""),
    }
    env |= {"VIEW": "revenue_hourly", "VERSION": "2", "STEPS": "5,100", "HOLD_S": "2.5"}
    env |= {"UNEXPLAINED_KEYS": "1", "LAG_VERSIONS": "3", "FAILED_QUERIES": "0"}
    env |= {"RUN_ID": "manual__2026-12-04T11:00:00+00:00"}
    subprocess.run(["bash", "-c", task["command"]], env=env, check=True, timeout=30)
    args = build_parser().parse_args(json.loads(report.read_text()))
    assert (args.first, args.second, args.steps) == ("revenue_hourly", "2", "5,100")
    assert args.hold == 2.5
    assert (args.unexplained_keys, args.lag_versions, args.failed_queries) == (1, 3, 0)
    assert (args.by, args.request_id) == ("airflow", "manual__2026-12-04T11:00:00+00:00")


def test_no_task_defers_so_no_triggerer_is_needed(loaded):
    """The stack runs no triggerer (warehouse.ops.stack.airflow): a deferred task
    would wait for one forever. A BashOperator runs its command to the end."""
    for dag_id, dag in loaded["dags"].items():
        for task_id, task in dag["tasks"].items():
            assert task["operator"] == "BashOperator", (dag_id, task_id, task["operator"])
            assert not task["from_trigger"], (dag_id, task_id)


def test_the_watchdog_runs_every_minute(loaded):
    assert "0:01:00" in loaded["dags"]["regauge_watchdog"]["schedule"]


def test_the_audit_dag_deletes_succeeded_erasure_runs_hourly(loaded):
    audit = loaded["dags"]["regauge_audit"]
    # On the hour, with no start_date: a trigger timetable that has one runs the
    # most recent hour at once, so a stack coming up would start an audit.
    assert (audit["schedule"], audit["start_date"]) == ("0 * * * *", None)
    scrub = audit["tasks"]["scrub_erasure_runs"]
    assert scrub["command"].endswith(" forget airflow-runs")
    # Beside the audit, not after it: a failed audit must not keep an id in Airflow.
    assert scrub["upstream"] == []


def test_a_stack_that_comes_up_after_a_scheduled_time_waits_for_the_next(loaded):
    # The hourly audit and the daily maintenance, each a cron trigger timetable. With
    # Airflow's default run_immediately a stack that came up at 05:13 ran the 03:17
    # maintenance at once, beside the tests' first module (dags/_regauge.py).
    first_runs = loaded["first_runs"]
    assert set(first_runs) == {"regauge_audit", "regauge_maintenance"}
    for dag_id, (up, due) in first_runs.items():
        assert datetime.fromisoformat(due) > datetime.fromisoformat(up), (dag_id, up, due)


def test_every_dag_shows_its_files_docstring(loaded):
    for dag_id, dag in loaded["dags"].items():
        path = Path(dag["fileloc"])
        assert path.parent == REPO / "dags", dag_id
        docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        assert docstring and docstring.strip(), f"{path.name} has no docstring"
        assert dag["doc_md"] == docstring, dag_id


def test_every_task_retries_unless_its_failure_is_a_verdict(loaded):
    dags = loaded["dags"]
    assert {(dag_id, t) for dag_id, dag in dags.items() for t in dag["tasks"]} >= NO_RETRY
    for dag_id, dag in dags.items():
        for task_id, task in dag["tasks"].items():
            want = 0 if (dag_id, task_id) in NO_RETRY else RETRIES
            assert task["retries"] == want, (dag_id, task_id)
            # A rollout's retry resumes it, or reports how it ended: it waits 5 s.
            delay = 5 if dag_id == "regauge_autorollout" else RETRY_DELAY_S
            assert task["retry_delay_s"] == delay, (dag_id, task_id)


def test_every_task_logs_its_failure(loaded):
    for dag_id, dag in loaded["dags"].items():
        for task_id, task in dag["tasks"].items():
            assert task["on_failure"] == [
                "_regauge.log_failure",
                "_regauge.WebhookNotifier",
            ], (dag_id, task_id)
    assert loaded["failure_log"] == (
        "ERROR regauge.dags REGAUGE TASK FAILED: dag_id=regauge_x task_id=t_1 "
        "run_id=manual__1 try=2 of 2: RuntimeError: exit code 2\n"
    )


NOTIFY = r"""
import sys, types
sys.path.insert(0, sys.argv[1])
import _regauge
ti = types.SimpleNamespace(dag_id="regauge_forget", task_id="forget", run_id="manual__9",
                           try_number=2, max_tries=1)
# As Airflow calls an on_failure_callback: the notifier instance with the context.
_regauge.WebhookNotifier()({"ti": ti, "exception": RuntimeError("exit code 2"),
                            "params": {"customer_id": "cust-00042"}})
print("notified")
"""


def _notify(url: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "REGAUGE_ALERT_WEBHOOK_URL"}
    if url:
        env["REGAUGE_ALERT_WEBHOOK_URL"] = url
    return subprocess.run(
        [str(AIRFLOW_PYTHON), "-c", NOTIFY, str(REPO / "dags")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_failed_task_reaches_the_alert_webhook_without_its_params():
    """Issue 68, C: the failure callback posts to REGAUGE_ALERT_WEBHOOK_URL, here a
    real HTTP receiver; without the variable nothing is sent, and a receiver that
    is down is logged, not raised."""
    import http.server
    import threading

    got: list[dict[str, Any]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append({"type": self.headers["Content-Type"], **json.loads(body)})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        sent = _notify(url)
        assert sent.returncode == 0 and "notified" in sent.stdout, sent.stderr[-2000:]
        assert got == [
            {
                "type": "application/json",
                "text": "regauge: regauge_forget.forget failed (run manual__9, try 2 of 2): "
                "RuntimeError: exit code 2",
                "dag_id": "regauge_forget",
                "task_id": "forget",
                "run_id": "manual__9",
                "try": 2,
                "tries": 2,
                "error": "RuntimeError: exit code 2",
            }
        ]
        assert _notify(None).returncode == 0 and len(got) == 1
    finally:
        server.shutdown()
        server.server_close()
    down = _notify(url)  # nothing listens there now
    assert down.returncode == 0 and "notified" in down.stdout
    assert "REGAUGE ALERT NOT SENT to " + url in down.stdout + down.stderr


def test_readmit_offers_the_reasons_the_command_takes(loaded):
    """The DAG's list (Airflow's process loads no Spark) is spark_jobs.engine.readmit's."""
    from spark_jobs.engine import contract, readmit

    offered = loaded["dags"]["regauge_readmit"]["params"]["reason"]["enum"]
    assert sorted(offered) == sorted(r for r in contract.REASONS if r != "conflicting_duplicate")
    for reason in offered:
        assert readmit.check_reason(reason) == reason
