"""The cluster profile end to end on the one-box cluster: Kafka (3 brokers) -> bronze
-> silver on an object store through s3a://, by Spark jobs on a standalone master;
a view replayed there; an analyst's query through Trino over HTTPS with a password;
a broker and a worker killed with SIGKILL under load.

The answers are the contract's, computed from what the generator sent.
`make test` runs the smoke test; `make test-cluster` all of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from trino.exceptions import HttpError, TrinoQueryError

from spark_jobs import producer
from spark_jobs.testing.landing import fresh_seed
from tests.cluster.conftest import cluster_env, regauge
from tests.integration.test_views import accepted_events, expected_revenue_v1
from warehouse.base.registry import BRONZE_EVENTS, SILVER_EVENTS, gold_view_table
from warehouse.base.registry import SILVER_QUARANTINE as QUARANTINE
from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.ops import pipeline
from warehouse.ops.stack import cluster
from warehouse.ops.stack.process import wait_until
from warehouse.sql import trino_client


def _start_of(seed: int) -> datetime:
    """A day of the run's own, so its windows hold only its events even on a cluster
    whose lake and topic outlive the test."""
    return datetime(2001, 1, 1, tzinfo=UTC) + timedelta(days=seed % 8000)


def _in_range(s: Settings, table: str, columns: str, positions: set[tuple[int, int]]) -> list:
    """Rows of `table` at the partitions and offsets a run's records span."""
    rows = []
    for partition in sorted({p for p, _ in positions}):
        offsets = [o for p, o in positions if p == partition]
        rows += [
            (partition, *r)
            for r in trino_client.query(
                s,
                f'SELECT "offset", {columns} FROM {table} '
                'WHERE partition = ? AND "offset" BETWEEN ? AND ?',
                [partition, min(offsets), max(offsets)],
            ).rows
        ]
    return rows


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


def test_ingest_replay_and_an_analysts_query_on_the_cluster(cluster_settings: Settings):
    s = cluster_settings
    seed = fresh_seed()
    start = _start_of(seed)
    run = pipeline.produce(s, seed=seed, count=1500, chaos=True, start=start, days=1)
    assert (run.summary.produced, run.summary.failed) == (1500, 0)

    assert "silver.shop_events" in regauge("ingest-once").stdout
    _judge(s, run)

    regauge("views", "run", "revenue_hourly", "1", "--mode", "replay", "--until-caught-up")

    # The analyst logs in with their own password, over HTTPS; their rules apply.
    analyst = replace(s, trino_login=cluster.ANALYST, trino_password=cluster.analyst_password())
    table = gold_view_table("revenue_hourly", 1).trino_name
    rows = trino_client.query(
        analyst,
        f"SELECT window_start, window_end, currency, orders, revenue FROM {table} "
        "WHERE window_start >= ? AND window_start < ?",
        [start, start + timedelta(days=2)],
        user=cluster.ANALYST,
    ).rows
    assert set(rows) == expected_revenue_v1(accepted_events(run))
    assert len(rows) > 10
    with pytest.raises(TrinoQueryError, match="Access Denied"):
        trino_client.query(
            analyst, f"SELECT count(*) FROM {QUARANTINE.trino_name}", user=cluster.ANALYST
        )
    wrong = replace(analyst, trino_password="not-the-password")
    with pytest.raises(HttpError, match="401"):
        trino_client.query(wrong, "SELECT 1", user=cluster.ANALYST)
    # regauge's own login acts for the analyst (impersonation), under the analyst's rules.
    assert set(trino_client.query(s, f"SELECT * FROM {table}", user=cluster.ANALYST).rows) >= set(
        rows
    )
    with pytest.raises(TrinoQueryError, match="Access Denied"):
        trino_client.query(s, f"SELECT count(*) FROM {QUARANTINE.trino_name}", user=cluster.ANALYST)


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
    pid = broker.pidfile(broker.name).live_pid()
    assert pid is not None and producing.is_alive()
    os.killpg(pid, signal.SIGKILL)  # the broker, as a machine loss would
    producing.join()
    run = sent["run"]
    assert (run.summary.produced, run.summary.failed) == (3000, 0)
    broker.start()  # back into the quorum, catching up from the other two

    worker = cluster.SparkWorker(s, 1)
    log = s.state_dir / "logs" / "test-ingest-once.log"
    with log.open("w") as out:
        ingest = subprocess.Popen(
            [str(REPO_ROOT / ".venv" / "bin" / "regauge"), "ingest-once"],
            env=cluster_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    # Once the job's tasks run on the worker, take it away with its executors.
    def tasks_running() -> bool:
        return any(
            f.is_file() and "Running task" in f.read_text(errors="replace")
            for f in worker.executor_logs("regauge-ingest-once")
        )

    assert wait_until(tasks_running, 180, interval=0.3), log.read_text()
    assert ingest.poll() is None, "ingest ended before the fault: nothing was tested"
    worker_pid = worker.pidfile(worker.name).live_pid()
    assert worker_pid is not None
    os.killpg(worker_pid, signal.SIGKILL)
    try:
        assert ingest.wait(timeout=600) == 0, log.read_text()
    finally:
        ingest.kill()
        worker.start()
    assert "Lost executor" in log.read_text()  # the fault reached the job's tasks

    _judge(s, run)
