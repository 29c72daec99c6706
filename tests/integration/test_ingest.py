"""Kafka -> bronze -> silver through the real broker, Spark, Delta and Trino.

The generator's own record of what it sent (with the positions Kafka gave each
record) says what silver and the quarantine must hold; these tests hold the
lake to it, after a chaos mix, after kill -9, and across a broker restart.
"""

from __future__ import annotations

from spark_jobs import producer
from spark_jobs.expectations import id_checksum
from spark_jobs.testing.landing import assert_exact, fresh_seed, landing
from warehouse.base.registry import SILVER_EVENTS
from warehouse.ops import ingest_ctl, pipeline
from warehouse.sql import accounting, trino_client


def test_a_chaos_mix_lands_exactly_once(stack, settings, spark):
    # Ingest in this process: the view host's must not write the same checkpoints
    # (on a developer's stack the watchdog may have started it).
    ingest_ctl.stop(settings)
    # 4,000 records hold every kind of fault the generator makes, and more positions
    # than silver names as literals (silver.MAX_POSITIONS, 2,000); every later
    # module's replays, audits and compactions pay for each record produced here
    # (it was 50,000, then 10,000).
    seed = fresh_seed()
    run = pipeline.produce(settings, seed=seed, count=4_000, chaos=True)
    assert run.summary.ok, run.summary.errors

    pipeline.ingest_once(spark, settings)

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
