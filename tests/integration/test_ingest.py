"""Kafka -> bronze -> silver through the real broker, Spark, Delta and Trino.

The generator's own record of what it sent (with the positions Kafka gave each
record) says what silver and the quarantine must hold; these tests hold the
lake to it, after a chaos mix, after kill -9, and across a broker restart.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jobs import ingest, producer
from spark_jobs.generator import id_checksum
from tests.integration.landing import assert_exact, fresh_seed, landing, wait_until_settled
from warehouse import accounting, trino_client
from warehouse.registry import SILVER_EVENTS
from warehouse.settings import REPO_ROOT
from warehouse.stack import services


def test_a_chaos_mix_lands_exactly_once(stack, settings, spark):
    seed = fresh_seed()
    run = producer.produce_generated(settings, seed=seed, count=50_000, chaos=True)
    assert run.summary.ok, run.summary.errors

    ingest.run_once(spark, settings)

    assert_exact(run, landing(spark, settings, run))
    # Every quarantine reason was injected and found.
    reasons = set(run.expected().by_reason())
    assert {"oversize", "malformed_json", "conflicting_duplicate", "total_mismatch"} <= reasons
    # Through Trino: the run's silver event ids match the generator's checksum...
    found = trino_client.query(
        settings,
        "SELECT count(*), sum(from_base(substr(to_hex(sha256(to_utf8(event_id))), 1, 8), 16)) "
        f"FROM {SILVER_EVENTS.trino_name} WHERE starts_with(event_id, ?)",
        [f"s{seed}-"],
    ).rows[0]
    expected = run.expected()
    assert (found[0], found[1]) == (len(expected.silver), id_checksum(expected.silver))
    # ...and the accounting holds per partition over the whole lake.
    rows = accounting.per_partition(settings).rows
    assert len(rows) == settings.kafka_partitions
    assert [r[-1] for r in rows] == [0] * len(rows), rows


def test_a_record_the_broker_would_refuse_is_refused_and_counted(stack, settings):
    huge = b'{"event_id":"huge"}' + b" " * producer.MAX_RECORD_BYTES
    summary, positions = producer.produce_records(settings, [(b"k", b"{}"), (b"k", huge)])
    assert (summary.produced, summary.refused, summary.failed) == (1, 1, 0)
    assert positions[1] is None
    assert "Kafka accepts at most 1,000,000" in summary.errors[0]


# -- ingest as its own process ---------------------------------------------------------
class IngestProcess:
    """`regauge ingest run`, as an operator would start it, in a process we can kill."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "warehouse.cli", "ingest", "run"],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 180
        while "silver query started" not in self.log.read_text(errors="replace")[offset:]:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "ingest did not start in 180 s"
            time.sleep(0.5)

    def kill_9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)  # the driver and its JVM, mid-work
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture
def ingest_process(stack, tmp_path) -> Iterator[IngestProcess]:
    proc = IngestProcess(tmp_path / "ingest.log")
    try:
        yield proc
    finally:
        proc.stop()


def test_kill_9_twice_loses_nothing_and_doubles_nothing(settings, spark, ingest_process):
    seed = fresh_seed()
    rng = random.Random(seed)
    ingest_process.start()
    run = producer.produce_generated(settings, seed=seed, count=30_000, chaos=True)
    for _ in range(2):
        # Somewhere inside the bronze or silver micro-batch the burst started.
        time.sleep(rng.uniform(2.0, 15.0))
        ingest_process.kill_9()
        ingest_process.start()
    got = wait_until_settled(spark, settings, run)
    assert_exact(run, got)


def test_ingest_rides_out_a_broker_restart(settings, spark, ingest_process):
    ingest_process.start()
    before = producer.produce_generated(settings, seed=fresh_seed(), count=3_000, chaos=True)
    assert_exact(before, wait_until_settled(spark, settings, before))

    kafka = services.Kafka(settings)
    kafka.stop()
    time.sleep(15)  # long enough for the Kafka source to fail its fetches
    kafka.start()
    after = producer.produce_generated(settings, seed=fresh_seed(), count=3_000, chaos=True)

    assert_exact(after, wait_until_settled(spark, settings, after))
    assert ingest_process.alive, "ingest should recover by itself, not exit"


def test_a_gap_in_the_log_stops_ingest_until_an_operator_accepts_it(stack, settings, spark):
    from confluent_kafka import TopicPartition

    from warehouse.registry import BRONZE_EVENTS, TOPIC

    ingest.run_once(spark, settings)  # bronze has everything so far
    doomed = producer.produce_generated(settings, seed=fresh_seed(), count=40)
    # Retention "expires" the new records before bronze copies them.
    admin = services.kafka_admin(settings)
    partitions = [TopicPartition(TOPIC, p, -1) for p in range(settings.kafka_partitions)]
    for future in admin.delete_records(partitions).values():
        future.result(timeout=30)

    with pytest.raises(ingest.DataLossError, match="bronze would have a gap"):
        ingest.run_once(spark, settings)

    ingest.run_once(spark, settings, accept_data_loss=True)
    after = producer.produce_generated(settings, seed=fresh_seed(), count=500)
    ingest.run_once(spark, settings)
    assert_exact(after, landing(spark, settings, after))
    lost = landing(spark, settings, doomed)
    assert (lost.bronze, len(lost.silver)) == (0, 0)
    assert spark.read.format("delta").load(BRONZE_EVENTS.path(settings)).count() > 0
