"""The cluster profile end to end on the one-box cluster: Kafka (3 brokers) -> bronze
-> silver on an object store through s3a://, by Spark jobs on a standalone master;
an analyst's query through Trino (a coordinator and a worker) over HTTPS with a
password; the cluster's Airflow reprocessing v1 and v2, rolling out, retiring (the
archive is a copy in the object store), building dbt and auditing; a broker and a
worker killed with SIGKILL under load.

The answers are the contract's, computed from what the generator sent.
`make test` runs the smoke test, which keeps what only the cluster shows: s3a,
three brokers, Trino's worker, HTTPS with passwords; its Spark runs in local mode
(tests/cluster/conftest.py). `make test-cluster` runs all of them, on the master.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from trino.exceptions import HttpError, TrinoQueryError

from spark_jobs import producer
from spark_jobs.engine import lake, silver
from spark_jobs.testing.landing import fresh_seed
from tests.cluster.conftest import cluster_env, regauge
from tests.integration.test_versions import USERS, VIEW, assert_routing
from warehouse.base.registry import (
    BRONZE_EVENTS,
    GOLD_AUDIT_RUNS,
    SILVER_EVENTS,
    gold_view_table,
    mart,
    source_tables,
)
from warehouse.base.registry import SILVER_QUARANTINE as QUARANTINE
from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.ops import airflow_client, autorollout, pipeline
from warehouse.ops.stack import cluster
from warehouse.ops.stack.process import wait_until
from warehouse.sql import catalog, trino_client, versions


def _start_of(seed: int) -> datetime:
    """A day of the run's own, so its windows hold only its events even on a cluster
    whose lake and topic outlive the test."""
    return datetime(2001, 1, 1, tzinfo=UTC) + timedelta(days=seed % 8000)


def _in_range(s: Settings, table: str, columns: str, positions: set[tuple[int, int]]) -> list:
    """Rows of `table` at the partitions and offsets a run's records span, in one
    query (a round trip over HTTPS per partition cost seconds each)."""
    offsets: dict[int, list[int]] = {}
    for partition, offset in positions:
        offsets.setdefault(partition, []).append(offset)
    where = " OR ".join(['(partition = ? AND "offset" BETWEEN ? AND ?)'] * len(offsets))
    params = [v for p, o in sorted(offsets.items()) for v in (p, min(o), max(o))]
    return trino_client.query(
        s, f'SELECT partition, "offset", {columns} FROM {table} WHERE {where}', params
    ).rows


def _judge(s: Settings, run: producer.GeneratedRun) -> None:
    """Bronze holds each record once, silver the contract's winners, the quarantine
    the rest with the contract's reasons: nothing lost, nothing doubled."""
    expected = run.expected()
    sent = {pos for pos in run.positions if pos is not None}
    assert len(sent) == len(run.records)
    bronze = [(p, o) for p, o, _ in _in_range(s, BRONZE_EVENTS.trino_name, "1", sent)]
    assert sorted(bronze) == sorted(sent)  # each once, none missing
    found = trino_client.query(
        s,
        f'SELECT event_id, partition, "offset" FROM {SILVER_EVENTS.trino_name} '
        "WHERE starts_with(event_id, ?)",
        [f"s{run.seed}-"],
    ).rows
    assert len(found) == len(expected.silver)
    assert {r[0]: (r[1], r[2]) for r in found} == expected.silver
    held = {(p, o): reason for p, o, reason in _in_range(s, QUARANTINE.trino_name, "reason", sent)}
    assert held == expected.quarantine


def test_ingest_and_an_analysts_query_on_the_cluster(cluster_settings: Settings):
    """Ingest through three brokers into the object store lands exactly what was sent,
    and an analyst reads it over HTTPS with their own password, under their rules.

    This was test_ingest_replay_and_an_analysts_query_on_the_cluster, which also
    replayed revenue_hourly v1 in a second Spark application: a minute of `make test`
    that repeated what test_views.py shows locally (every view held to the contract,
    live and replayed from bronze and from Kafka). Views built on the cluster are
    tested in `make test-cluster`, where its Airflow reprocesses v1 and v2, validates
    them and audits them against their code over silver (issue 65)."""
    s = cluster_settings
    seed = fresh_seed()
    start = _start_of(seed)
    # 600 records hold every kind of bad record the generator makes; what the
    # cluster adds is where they go (three brokers, s3a), not how many.
    run = pipeline.produce(s, seed=seed, count=600, chaos=True, start=start, days=1)
    assert (run.summary.produced, run.summary.failed) == (600, 0)

    # The three brokers take no client that has not logged in (issue 68, A.5; the
    # producer above logged in as regauge by SCRAM). test_shared_machine.py shows
    # the rest of it (forging, deleting) on the local broker, configured the same.
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    for port in s.kafka_bootstrap.split(","):
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": port, "log_level": 0}).list_topics(timeout=5)

    # The shop's alone: a second source on the cluster shows nothing the local
    # stack's tests do not (its empty tables on s3a took 10 s of this test).
    assert "silver.shop_events" in regauge("ingest-once", "--source", "shop").stdout
    _judge(s, run)
    # An automatic rollout's freshness gate (and the rollout page) reads silver's
    # newest version from its Delta log with delta-rs, here on the object store:
    # the version Trino's history of the table names newest.
    history = f'{SILVER_EVENTS.schema}."{SILVER_EVENTS.name}$history"'
    (newest,) = trino_client.query(s, f"SELECT max(version) FROM lakehouse.{history}").rows[0]
    assert autorollout.silver_newest(s, "shop") == newest > 0
    # Ingest reads the earlier records of a batch's ids from the ledger with delta-rs
    # as well (`silver._history`, issue 67), which here reads the object store: the
    # ledger at five winners' positions holds those five.
    some = dict(sorted(run.expected().silver.items())[:5])
    where, options = s.delta_rs(source_tables("shop").ledger.path(s))
    got = lake.arrow_at_positions(where, options, list(some.values()), silver.LEDGER_SCHEMA)
    assert {(r["event_id"], (r["partition"], r["offset"])) for r in got.to_pylist()} == set(
        some.items()
    )

    # The analyst logs in with their own password, over HTTPS; their rules apply.
    # Silver is theirs to read (docs/contract.md §7): the run's winners, as sent.
    analyst = replace(s, trino_login=cluster.ANALYST, trino_password=cluster.analyst_password())
    runs_silver = (
        f'SELECT event_id, partition, "offset" FROM {SILVER_EVENTS.trino_name} '
        "WHERE starts_with(event_id, ?)"
    )
    rows = trino_client.query(analyst, runs_silver, [f"s{seed}-"], user=cluster.ANALYST).rows
    winners = run.expected().silver
    assert {r[0]: (r[1], r[2]) for r in rows} == winners
    assert len(rows) == len(winners) > 400
    with pytest.raises(TrinoQueryError, match="Access Denied"):
        trino_client.query(
            analyst, f"SELECT count(*) FROM {QUARANTINE.trino_name}", user=cluster.ANALYST
        )
    wrong = replace(analyst, trino_password="not-the-password")
    with pytest.raises(HttpError, match="401"):
        trino_client.query(wrong, "SELECT 1", user=cluster.ANALYST)
    # regauge's own login acts for the analyst (impersonation), under the analyst's rules.
    acting = trino_client.query(s, runs_silver, [f"s{seed}-"], user=cluster.ANALYST).rows
    assert sorted(map(tuple, acting)) == sorted(map(tuple, rows))
    with pytest.raises(TrinoQueryError, match="Access Denied"):
        trino_client.query(s, f"SELECT count(*) FROM {QUARANTINE.trino_name}", user=cluster.ANALYST)


def _stored(s: Settings, prefix: str) -> set[str]:
    """Keys under `prefix` in the lake's bucket. S3Proxy's filesystem backend keeps
    each object as a file named by its key, so its folder is the store's listing."""
    lake = s.lake_root.removeprefix(f"s3a://{cluster.BUCKET}/")
    data = cluster.ObjectStore(s).home / "data" / cluster.BUCKET / lake
    return {str(f.relative_to(data)) for f in (data / prefix).rglob("*") if f.is_file()}


@pytest.mark.full_cluster
def test_the_clusters_airflow_reprocesses_rolls_out_retires_builds_dbt_and_audits(
    cluster_settings: Settings,
):
    s = cluster_settings
    regauge("versions", "forget", VIEW, "--yes")  # a cluster left by an earlier run starts over
    seed = fresh_seed()
    pipeline.produce(s, seed=seed, count=1000, chaos=True, start=_start_of(seed), days=1)
    regauge("ingest-once")
    airflow = airflow_client.Client(s)
    try:
        airflow.run("regauge_reprocess", {"view": VIEW, "version": 1})
        v1 = versions.get(s, VIEW, 1)
        assert (v1.status, v1.rollout_percent) == ("serving", 100)

        airflow.run("regauge_reprocess", {"view": VIEW, "version": 2, "source": "bronze"})
        v2 = versions.get(s, VIEW, 2)
        assert (v2.status, v2.rollout_percent) == ("ready", 0)
        report = v2.validation or {}
        assert report["passed"], report
        assert report["self_check"]["rows"] > 0
        assert report["shared_with"]["disagreements"] == 0, report

        # Routing through the cluster's Trino: regauge's login acts for each analyst.
        airflow.run("regauge_rollout", {"view": VIEW, "version": 2, "percent": 10})
        seen = assert_routing(s, USERS)
        assert {u for u, v in seen.items() if v == 2} == {
            u for u in USERS if versions.cohort(u) < 10
        }
        airflow.run("regauge_rollout", {"view": VIEW, "version": 2, "percent": 100})
        assert set(assert_routing(s, USERS).values()) == {2}

        # Retire v1: out of Trino, and its table and checkpoint copied to the
        # archive and deleted (a rename is a copy and delete on S3).
        v1_table = gold_view_table(VIEW, 1)
        table_prefix = v1_table.path(s).removeprefix(s.lake_root + "/")
        assert any(k.endswith(".json") for k in _stored(s, f"{table_prefix}/_delta_log"))
        archived_before = _stored(s, "_archive")
        airflow.run("regauge_retire", {"view": VIEW, "version": 1})
        assert versions.get(s, VIEW, 1).status == "retired"
        assert not catalog.is_published(v1_table, s)
        assert not _stored(s, table_prefix)
        archived = _stored(s, "_archive") - archived_before
        logs = {k for k in archived if k.startswith(f"_archive/table/gold/{v1_table.name}@")}
        assert any("/_delta_log/" in k for k in logs), sorted(archived)[:20]
        assert any(k.startswith("_archive/checkpoint/") for k in archived), sorted(archived)[:20]

        # dbt on silver in the object store, its marts published to Trino.
        airflow.run("regauge_dbt", {})
        orders = trino_client.query(s, f"SELECT count(*) FROM {mart('fct_orders').trino_name}")
        assert orders.rows[0][0] > 0

        # The audit, as its hourly DAG runs it, passes every check and records them.
        run_id = airflow.run("regauge_audit", {})
        said = airflow.task_log("regauge_audit", run_id, "audit")
        verdict = re.search(r"audit (\S+): PASSED", said)
        assert verdict, said[-3000:]
        audit_id = verdict[1]
        recorded = trino_client.query(
            s,
            f"SELECT subject, passed FROM {GOLD_AUDIT_RUNS.trino_name} WHERE run_id = ?",
            [audit_id],
        ).rows
        assert recorded and all(passed for _, passed in recorded), recorded
        assert any(subject == f"{VIEW} v2" for subject, _ in recorded), recorded
    finally:
        regauge("versions", "forget", VIEW, "--yes")  # its streams stop with it


@pytest.mark.full_cluster
def test_a_broker_and_a_worker_killed_under_load_lose_and_double_nothing(
    cluster_settings: Settings,
):
    s = cluster_settings
    seed = fresh_seed()
    sent: dict[str, producer.GeneratedRun] = {}

    def produce() -> None:
        sent["run"] = pipeline.produce(
            s, seed=seed, count=3000, chaos=True, rate=300, start=_start_of(seed), days=1
        )

    producing = threading.Thread(target=produce)
    producing.start()
    time.sleep(4)
    broker = cluster.KafkaBroker(s, 2)
    pid = broker.live_pids()[broker.name]
    assert pid is not None and producing.is_alive()
    os.killpg(pid, signal.SIGKILL)  # the broker, as a machine loss would
    broker.stop()  # and away, not restarted by supervisord within a second
    producing.join()
    run = sent["run"]
    assert (run.summary.produced, run.summary.failed) == (3000, 0)
    broker.start()  # back into the quorum, catching up from the other two

    workers = [cluster.SparkWorker(s, n) for n in range(1, cluster.SPARK_WORKERS + 1)]
    log = s.state_dir / "logs" / "test-ingest-once.log"
    with log.open("w") as out:
        ingest = subprocess.Popen(
            [str(REPO_ROOT / ".venv" / "bin" / "regauge"), "ingest-once"],
            env=cluster_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    # Once the job's tasks run on a worker, take it away with its executor (the
    # application's one executor is on either worker).
    def running_on() -> cluster.SparkWorker | None:
        return next(
            (
                w
                for w in workers
                for f in w.executor_logs("regauge-ingest-once")
                if f.is_file() and "Running task" in f.read_text(errors="replace")
            ),
            None,
        )

    assert wait_until(lambda: running_on() is not None, 180, interval=0.3), log.read_text()
    assert ingest.poll() is None, "ingest ended before the fault: nothing was tested"
    worker = running_on()
    assert worker is not None
    worker_pid = worker.live_pids()[worker.name]
    assert worker_pid is not None
    os.killpg(worker_pid, signal.SIGKILL)
    try:
        assert ingest.wait(timeout=600) == 0, log.read_text()
    finally:
        ingest.kill()
        worker.start()
    assert "Lost executor" in log.read_text()  # the fault reached the job's tasks

    _judge(s, run)
