"""The local stack as `make up` starts it: every service real, healthy and wired together."""

import json
import re
import urllib.request

from warehouse.base import registry
from warehouse.ops.stack import services
from warehouse.ops.stack.kafka import kafka_admin
from warehouse.sql import trino_client


def _by_name(stack):
    return {svc.name: svc for svc in stack}


def test_every_service_is_up_with_its_pid_port_and_log(stack):
    for svc in stack:
        st = svc.status()
        assert st.healthy, f"{svc.name} is not healthy"
        for proc in st.procs:
            assert proc.pid is not None
            assert proc.log.is_file()
            assert proc.rss_bytes > 0


def test_starting_what_runs_is_a_no_op(stack):
    before = {svc.name: svc.live_pids() for svc in stack}
    assert [svc.start() for svc in stack] == [False] * len(stack)
    assert {svc.name: svc.live_pids() for svc in stack} == before


def test_the_event_topic_exists_with_its_partitions(stack, settings):
    topics = kafka_admin(settings).list_topics(timeout=10)
    assert len(topics.topics[registry.TOPIC].partitions) == settings.kafka_partitions


def test_trino_federates_postgres_schemas(stack, settings):
    schemas = {r[0] for r in trino_client.query(settings, "SHOW SCHEMAS FROM ops").rows}
    assert {"reference", "control"} <= schemas
    catalogs = {r[0] for r in trino_client.query(settings, "SHOW CATALOGS").rows}
    assert {"lakehouse", "ops"} <= catalogs


def test_airflow_admin_password_file_gives_an_api_token(stack, settings):
    airflow = _by_name(stack)["airflow"]
    password = airflow.admin_password()
    assert password, f"no admin password in {airflow.passwords_file}"
    request = urllib.request.Request(
        f"{settings.airflow_url}/auth/token",
        data=json.dumps({"username": "admin", "password": password}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 201
        assert json.load(resp)["access_token"]


def test_kafka_comes_back_after_down_and_up_with_its_data(stack, settings):
    kafka = _by_name(stack)["kafka"]
    services.down(settings, ["kafka"])
    assert kafka.live_pids() == {"kafka": None}
    services.up(settings, ["kafka"])
    assert kafka.status().healthy
    topics = kafka_admin(settings).list_topics(timeout=10)
    assert registry.TOPIC in topics.topics


def test_clean_airflow_deletes_old_records_and_task_logs_and_keeps_recent_ones(
    stack, settings, capsys
):
    """Issue 68, C: Airflow's database and task logs grow without end (1,440
    watchdog runs a day). An old and a new row of Airflow's audit log, and an old
    and a new task log file: `regauge clean-airflow` (the maintenance DAG's task)
    deletes the old ones, through `airflow db clean` on the real database."""
    import os
    import time
    from datetime import UTC, datetime, timedelta

    import psycopg

    from warehouse.cli import main

    airflow = _by_name(stack)["airflow"]
    old_at = datetime.now(UTC) - timedelta(days=30)
    with psycopg.connect(settings.postgres_dsn(settings.airflow_db), autocommit=True) as conn:
        for at, event in ((old_at, "regauge-test-old"), (datetime.now(UTC), "regauge-test-new")):
            conn.execute("INSERT INTO log (dttm, event) VALUES (%s, %s)", [at, event])
    logs = airflow.home / "logs" / "dag_id=regauge_test"
    old_log, new_log = logs / "run_id=old" / "attempt=1.log", logs / "run_id=new" / "attempt=1.log"
    for path in (old_log, new_log):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("a task's log\n")
    old_s = time.time() - 30 * 86400
    for path in (old_log, old_log.parent):
        os.utime(path, (old_s, old_s))

    assert main(["clean-airflow", "--keep-days", "14"]) == 0
    out = capsys.readouterr().out
    deleted = re.search(r"\(14 days kept\): deleted (\d+) task log files", out)
    assert deleted and int(deleted.group(1)) >= 1, out

    with psycopg.connect(settings.postgres_dsn(settings.airflow_db)) as conn:
        left = conn.execute(
            "SELECT event FROM log WHERE event LIKE 'regauge-test-%' ORDER BY event"
        ).fetchall()
    assert left == [("regauge-test-new",)]
    assert not old_log.parent.exists()
    assert new_log.read_text() == "a task's log\n"
