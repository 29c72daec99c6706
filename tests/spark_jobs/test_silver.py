"""Silver: dedup decisions (pure) and micro-batches against real Delta tables in a temp lake."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField, StructType

from spark_jobs.engine import contract, ledger_index, silver
from spark_jobs.engine import lake as spark_lake
from spark_jobs.engine.bronze import BRONZE_SCHEMA
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import jobs_so_far
from warehouse.base import registry

KAFKA_TS = datetime(2026, 1, 1, 12, 0, 0)

CANDIDATE_SCHEMA = StructType(
    [*silver.LEDGER_SCHEMA.fields, StructField("in_batch", BooleanType(), False)]
)


def test_classify_keeps_the_first_in_log_order_whatever_arrived_first(spark):
    candidates = spark.createDataFrame(
        [
            # e1: the earliest (partition 0) arrived in this batch, after partition 2's.
            ("e1", 2, 10, "h-a", False),
            ("e1", 0, 99, "h-b", True),
            ("e1", 2, 11, "h-b", False),
            # e2: new in this batch, with a re-send of the same content.
            ("e2", 1, 5, "h-c", True),
            ("e2", 1, 6, "h-c", True),
        ],
        CANDIDATE_SCHEMA,
    )
    got = silver.classify(candidates).select(
        "event_id", "partition", "offset", "status", "winner_partition", "winner_offset", "fresh"
    )
    expected = spark.createDataFrame(
        [
            ("e1", 2, 10, silver.CONFLICT, 0, 99, False),
            ("e1", 0, 99, silver.ACCEPTED, 0, 99, False),
            ("e1", 2, 11, silver.DUPLICATE, 0, 99, False),
            ("e2", 1, 5, silver.ACCEPTED, 1, 5, True),
            ("e2", 1, 6, silver.DUPLICATE, 1, 5, True),
        ],
        "event_id string, partition int, offset bigint, status string, "
        "winner_partition int, winner_offset bigint, fresh boolean",
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_conflict_detail_names_the_record_that_won(spark):
    state = spark.createDataFrame(
        [("e1", 0, 99)], "event_id string, winner_partition int, winner_offset bigint"
    )
    (row,) = silver.conflict_detail(state).collect()
    assert row["detail"] == (
        "event_id e1 was first accepted at partition 0 offset 99 with different content"
    )


# -- micro-batches through real Delta tables ------------------------------------------
def _event(
    event_id: str, customer: str = "c1", quantity: int = 1, day: str = "2026-01-01"
) -> bytes:
    return json.dumps(
        {
            "event_id": event_id,
            "event_type": "cart_item_added",
            "event_time": f"{day}T10:00:00.000Z",
            "customer_id": customer,
            "schema_version": 1,
            "payload": {"product_id": "p1", "quantity": quantity},
        }
    ).encode()


@pytest.fixture(scope="module")
def empty_lake(spark, settings, tmp_path_factory) -> Path:
    """Silver's tables made once for the module (four commits and their checks)."""
    root = tmp_path_factory.mktemp("silver") / "lake"
    silver.ensure_tables(spark, dataclasses.replace(settings, lake_root=str(root)))
    return root


@pytest.fixture
def lake(empty_lake, settings, tmp_path):
    """A lake of the test's own, with silver's tables as `silver.ensure_tables` makes
    them: a copy of the module's (a Delta table's log names its files relatively)."""
    shutil.copytree(empty_lake, tmp_path / "lake")
    return dataclasses.replace(settings, lake_root=str(tmp_path / "lake"))


@pytest.fixture
def run(spark, lake, monkeypatch):
    """A micro-batch through `silver.process_batch` with one ledger index and silver's
    and the quarantine's delta-rs committers kept across the test's batches, as
    ingest keeps them on a
    local lake (so `silver.Decided` decides the batch on the driver); and each
    batch's history, what the batch is decided from, equal to what joining the
    whole ledger finds. Spark's path (no committer: re-admission, recovery, S3, a
    catch-up) runs in the tests that call `process_batch` themselves.

    Until 2026-12-03 each test using this ran twice, "ledger joined" and "ledger
    indexed", end to end. The index changes only `_history` (which earlier records
    are read); the rest of the batch sees the history through `classify` alone, so
    equal history rows mean equal commits. The joined path still runs end to end in
    the tests that call `process_batch` without an index (own partition, reconcile,
    the stopped batch), and in recovery's and re-admission's tests."""
    # The ledger's committer too, as ingest's: its live appends are delta-rs's.
    ledger = spark_lake.Committer(*lake.delta_rs(silver.LEDGER.path(lake)))
    index = ledger_index.LedgerIndex(silver.LEDGER.path(lake), ledger)
    history = silver._history

    def both(spark, settings, accepted, batch_id, app_id, index, keys, plan):
        if index is None:  # one-off batches: the join alone
            return history(spark, settings, accepted, batch_id, app_id, None, None, plan)
        # The joined one first: `follow` moves the index on.
        joined = silver._joined_history(spark, settings, accepted, plan)
        indexed = history(spark, settings, accepted, batch_id, app_id, index, keys, plan)
        if indexed is None:  # all new ids (`silver._settle_new`): so the ledger says too
            assert joined.where(~F.col("in_batch")).isEmpty(), f"batch {batch_id}: earlier ids"
            assert joined.count() == joined.select("event_id").distinct().count()
            return None
        columns = sorted(joined.columns)
        assert sorted(indexed.columns) == columns

        def rows(df):
            return Counter(tuple(r) for r in df.select(*columns).collect())

        assert rows(indexed) == rows(joined), f"batch {batch_id}: the index and the join differ"
        return indexed

    monkeypatch.setattr(silver, "_history", both)

    writer = spark_lake.Committer(*lake.delta_rs(silver.SILVER.path(lake)))
    quarantine = spark_lake.Committer(*lake.delta_rs(silver.QUARANTINE.path(lake)))

    def process(batch, batch_id):
        return silver.process_batch(
            spark, lake, batch, batch_id, "app", index, writer=writer, quarantine=quarantine
        )

    return process


def _batch(spark, lake, rows):
    """Bronze rows for a micro-batch, landed in the lake's bronze first as ingest would."""
    batch = spark.createDataFrame(
        [("shop.events", p, o, KAFKA_TS, "c1", v, KAFKA_TS) for p, o, v in rows], BRONZE_SCHEMA
    )
    batch.write.format("delta").mode("append").save(registry.BRONZE_EVENTS.path(lake))
    return batch


def _tables(spark, s):
    read = spark.read.format("delta").load
    return (
        read(silver.SILVER.path(s)),
        read(silver.QUARANTINE.path(s)),
        read(silver.LEDGER.path(s)),
    )


def _commits(spark, path):
    """The operations of a table's commits after it was made, oldest first."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").where("version > 0")
    return [r.operation for r in history.orderBy("version").collect()]


def test_a_batch_splits_records_into_silver_quarantine_and_duplicates(spark, lake, run):
    """A batch's records end in silver, in the quarantine (rejected or conflicting), or
    nowhere (an exact duplicate), and the ledger keeps every accepted one.

    Over 20 s: the file's first test on Delta tables, one micro-batch through real ones
    (four commits: bronze, the ledger, silver and the quarantine), each read back and two
    histories listed, since what it proves is where each record lands in the tables and
    that the quarantine takes its two rows in one commit."""
    result = run(
        _batch(
            spark,
            lake,
            [
                (0, 0, _event("e1")),
                (0, 1, _event("e1")),  # a retry: exact duplicate
                (0, 2, _event("e1", quantity=5)),  # same id, other content
                (0, 3, b"not json"),
                (0, 4, _event("e2")),
            ],
        ),
        0,
    )
    assert (result.rows_in, result.accepted, result.duplicates, result.conflicts) == (5, 2, 1, 1)
    assert result.rejected == {"malformed_json": 1}

    events, quarantine, ledger = _tables(spark, lake)
    assert sorted((r.event_id, r.offset) for r in events.collect()) == [("e1", 0), ("e2", 4)]
    assert sorted((r.offset, r.reason) for r in quarantine.collect()) == [
        (2, silver.CONFLICT),
        (3, "malformed_json"),
    ]
    (bad,) = quarantine.where("offset = 3").collect()
    assert bytes(bad.raw_value) == b"not json"
    assert ledger.count() == 4  # every accepted record, winner or not
    # No winner was replaced: the rejected record and the conflict are one append.
    assert _commits(spark, silver.QUARANTINE.path(lake)) == ["WRITE"]
    assert _commits(spark, silver.SILVER.path(lake)) == ["WRITE"]


def test_a_batch_of_only_duplicates_commits_nothing_to_silver(spark, lake, run):
    run(_batch(spark, lake, [(0, 0, _event("e1")), (0, 1, _event("e2"))]), 0)
    result = run(_batch(spark, lake, [(1, 0, _event("e1")), (1, 1, _event("e2"))]), 1)

    assert (result.rows_in, result.accepted, result.duplicates) == (2, 0, 2)
    events, quarantine, ledger = _tables(spark, lake)
    assert sorted((r.partition, r.offset) for r in events.collect()) == [(0, 0), (0, 1)]
    assert quarantine.count() == 0
    assert ledger.count() == 4
    assert _commits(spark, silver.SILVER.path(lake)) == ["WRITE"]  # the first batch's
    assert _commits(spark, silver.QUARANTINE.path(lake)) == []


def test_an_earlier_record_arriving_later_takes_over_and_the_loser_is_quarantined(spark, lake, run):
    """A record earlier in log order that arrives in a later batch replaces silver's
    winner, and the former winner and its re-send go to the quarantine.

    Over 20 s: two micro-batches through real Delta tables (seven commits to bronze, the
    ledger, silver and the quarantine, one a MERGE replacing silver's winner), since what
    it proves is what a later batch does with the rows an earlier one committed."""
    # Partition 2 is read first; its record of e1 (and a re-send) lands in silver.
    run(_batch(spark, lake, [(2, 0, _event("e1")), (2, 1, _event("e1"))]), 0)
    # Then partition 0's record of e1 with other content: first in log order, so it wins.
    result = run(_batch(spark, lake, [(0, 7, _event("e1", customer="c9"))]), 1)
    assert result.replaced_winners == 1

    events, quarantine, _ = _tables(spark, lake)
    (winner,) = events.collect()
    assert (winner.partition, winner.offset, winner.customer_id) == (0, 7, "c9")
    # The former winner and its exact re-send both conflict with the new winner.
    assert sorted((r.partition, r.offset, r.reason) for r in quarantine.collect()) == [
        (2, 0, silver.CONFLICT),
        (2, 1, silver.CONFLICT),
    ]


def test_a_replaced_winner_is_found_in_its_own_partition_of_silver(spark, lake):
    """The MERGE that replaces a winner reads the silver partitions of the old winner
    (found in bronze by its position) and of the new one, not all of silver.

    Over 20 s: two micro-batches through real Delta tables (one a MERGE replacing
    silver's winner), since what it proves is which of silver's partition folders the
    second batch's MERGE reads; then bronze read twice by position."""
    days = ["2025-12-27", "2025-12-29", "2025-12-31"]
    first = [(2, i, _event(f"e{i}", day=d)) for i, d in enumerate(days)]
    silver.process_batch(spark, lake, _batch(spark, lake, first), 0, "app")
    # e0's earlier record in log order, on another day: it moves partitions. The
    # other days' files are moved away meanwhile: reading them would fail.
    root = Path(silver.SILVER.path(lake), "event_type=cart_item_added")
    away = {d: root / f"event_date={d}" for d in days[1:]}
    for d, folder in away.items():
        folder.rename(root.with_name(f"away-{d}"))
    late = [(0, 7, _event("e0", customer="c9", day="2025-12-28"))]
    result = silver.process_batch(spark, lake, _batch(spark, lake, late), 1, "app")
    for d, folder in away.items():
        root.with_name(f"away-{d}").rename(folder)
    assert result.replaced_winners == 1

    events, quarantine, _ = _tables(spark, lake)
    assert sorted(
        (r.event_id, r.partition, r.offset, str(r.event_date)) for r in events.collect()
    ) == [
        ("e0", 0, 7, "2025-12-28"),
        ("e1", 2, 1, "2025-12-29"),
        ("e2", 2, 2, "2025-12-31"),
    ]
    assert [(r.partition, r.offset) for r in quarantine.collect()] == [(2, 0)]

    rows = silver.bronze_at(
        spark,
        lake,
        spark.createDataFrame([(2, 1), (0, 7)], "partition int, offset long"),
        contract.PLAN,
    )
    assert sorted((r.partition, r.offset) for r in rows.collect()) == [(0, 7), (2, 1)]
    none = spark.createDataFrame([], "partition int, offset long")
    assert silver.bronze_at(spark, lake, none, contract.PLAN).count() == 0


def test_a_replaced_winner_is_found_among_its_partitions_files_by_position(spark, lake, run):
    """Within the old winner's partition, the MERGE reads only the files whose offsets
    can hold a record of the id: another batch's file of that day is moved away.

    Over 20 s: three micro-batches through real Delta tables (the last a MERGE replacing
    silver's winner), since what it proves is which of the files the first two wrote
    the third one's MERGE reads."""
    run(_batch(spark, lake, [(2, 0, _event("e0"))]), 0)
    day = Path(silver.SILVER.path(lake), "event_type=cart_item_added", "event_date=2026-01-01")
    before = set(day.glob("*.parquet"))
    run(_batch(spark, lake, [(2, 500, _event("e5")), (3, 400, _event("e6"))]), 1)
    (other,) = set(day.glob("*.parquet")) - before
    other.rename(other.with_suffix(".away"))
    result = run(_batch(spark, lake, [(0, 7, _event("e0", customer="c9"))]), 2)
    other.with_suffix(".away").rename(other)
    assert result.replaced_winners == 1
    events, quarantine, _ = _tables(spark, lake)
    assert sorted((r.event_id, r.partition, r.offset, r.customer_id) for r in events.collect()) == [
        ("e0", 0, 7, "c9"),
        ("e5", 2, 500, "c1"),
        ("e6", 3, 400, "c1"),
    ]
    assert [(r.partition, r.offset) for r in quarantine.collect()] == [(2, 0)]


def test_settling_conflicts_reads_only_the_quarantines_files_of_those_positions(spark, lake, run):
    """A replaced winner's conflicts are settled reading only the quarantine's files
    that can hold the ids' positions: a file of other records is moved away.

    Over 20 s: three micro-batches through real Delta tables (eleven commits to bronze,
    the ledger, silver and the quarantine, one a MERGE replacing silver's winner), since
    what it proves is which of the quarantine's files, written by the first two, the
    third reads."""
    quarantine = Path(silver.QUARANTINE.path(lake))
    run(_batch(spark, lake, [(2, 0, _event("e1")), (1, 900, b"{oops")]), 0)
    unrelated = list(quarantine.glob("*.parquet"))
    assert unrelated
    run(_batch(spark, lake, [(2, 1, _event("e1", quantity=4))]), 1)
    for f in unrelated:
        f.rename(f.with_suffix(".away"))
    result = run(_batch(spark, lake, [(0, 7, _event("e1", customer="c9"))]), 2)
    for f in unrelated:
        f.with_suffix(".away").rename(f)
    assert result.replaced_winners == 1
    events, quarantined, _ = _tables(spark, lake)
    assert [(r.partition, r.offset) for r in events.collect()] == [(0, 7)]
    assert sorted((r.partition, r.offset, r.reason) for r in quarantined.collect()) == [
        (1, 900, "malformed_json"),
        (2, 0, silver.CONFLICT),
        (2, 1, silver.CONFLICT),
    ]
    # (2, 1) lost to (2, 0) in the second batch; its detail now names the new winner,
    # as the audit's re-derivation from bronze does.
    details = {r.offset: r.detail for r in quarantined.where("partition = 2").collect()}
    assert details == {
        n: "event_id e1 was first accepted at partition 0 offset 7 with different content"
        for n in (0, 1)
    }


def test_a_replacing_batch_quarantines_in_one_append_and_its_replay_changes_nothing(
    spark, lake, run
):
    """A new winner makes its former winner a conflict: that joins the batch's own
    rejected and conflicting records in its one append, with no MERGE. The batch
    run again (a crash after that append) takes the MERGE's way, keyed by
    position, which finds everything in place: no append, and the same rows.

    Over 20 s: two micro-batches through real Delta tables (eight commits to bronze, the
    ledger, silver and the quarantine, one a MERGE into silver), then the second run
    again, since what it proves is which commits each run makes to the quarantine."""
    path = silver.QUARANTINE.path(lake)
    run(_batch(spark, lake, [(2, 0, _event("e1")), (2, 1, _event("e1"))]), 0)
    before = _commits(spark, path)
    rows = [
        (0, 7, _event("e1", customer="c9")),
        (0, 8, b"[1,2]"),
        (1, 3, _event("e2")),
        (1, 4, _event("e2", quantity=5)),
    ]
    result = run(_batch(spark, lake, rows), 1)
    assert (result.replaced_winners, result.conflicts) == (1, 1)
    assert _commits(spark, path)[len(before) :] == ["WRITE"]
    quarantined = sorted(
        (r.partition, r.offset, r.reason) for r in spark.read.format("delta").load(path).collect()
    )
    assert quarantined == [
        (0, 8, "malformed_json"),
        (1, 4, silver.CONFLICT),
        (2, 0, silver.CONFLICT),
        (2, 1, silver.CONFLICT),
    ]
    settled = [t.orderBy("partition", "offset").collect() for t in _tables(spark, lake)]
    commits = _commits(spark, path)

    run(_batch(spark, lake, rows), 1)

    assert set(_commits(spark, path)[len(commits) :]) <= {"MERGE"}
    assert [t.orderBy("partition", "offset").collect() for t in _tables(spark, lake)] == settled


def test_a_conflict_becomes_a_duplicate_when_a_matching_earlier_record_arrives(spark, lake, run):
    run(_batch(spark, lake, [(2, 0, _event("e1")), (2, 1, _event("e1", quantity=3))]), 0)
    run(_batch(spark, lake, [(0, 0, _event("e1", quantity=3))]), 1)

    events, quarantine, _ = _tables(spark, lake)
    assert [(r.partition, r.offset, r.quantity) for r in events.collect()] == [(0, 0, 3)]
    # (2,1) now equals the winner: an exact duplicate, so it leaves the quarantine.
    assert [(r.partition, r.offset) for r in quarantine.collect()] == [(2, 0)]


def test_replaying_a_committed_batch_changes_nothing(spark, lake, run):
    rows = [(0, 0, _event("e1")), (0, 1, b"[1,2]"), (1, 0, _event("e1", quantity=2))]
    run(_batch(spark, lake, rows), 0)
    before = [t.orderBy("partition", "offset").collect() for t in _tables(spark, lake)]

    run(_batch(spark, lake, rows), 0)  # crash, then replay

    after = [t.orderBy("partition", "offset").collect() for t in _tables(spark, lake)]
    strip = [
        [{k: v for k, v in r.asDict().items() if k != "quarantined_at"} for r in rows_]
        for rows_ in before
    ]
    assert strip == [
        [{k: v for k, v in r.asDict().items() if k != "quarantined_at"} for r in rows_]
        for rows_ in after
    ]


def test_an_indexed_batch_reads_no_ledger_file_its_ids_are_not_in(spark, lake):
    """Only the ledger files holding earlier records of a batch's ids are read: the
    first batch's files are moved away while a batch of new ids runs."""
    index = ledger_index.LedgerIndex(silver.LEDGER.path(lake))
    ledger = Path(silver.LEDGER.path(lake))
    silver.process_batch(
        spark,
        lake,
        _batch(spark, lake, [(0, 0, _event("e0")), (0, 1, _event("e1"))]),
        0,
        "app",
        index,
    )
    first = sorted(ledger.glob("*.parquet"))
    for f in first:
        f.rename(f.with_suffix(".away"))
    result = silver.process_batch(
        spark, lake, _batch(spark, lake, [(0, 2, _event("e2"))]), 1, "app", index
    )
    for f in first:
        f.with_suffix(".away").rename(f)
    assert (result.accepted, result.duplicates) == (1, 0)
    # A re-send of e1 and e1 with other content: found through the index.
    result = silver.process_batch(
        spark,
        lake,
        _batch(spark, lake, [(1, 0, _event("e1")), (1, 1, _event("e1", quantity=5))]),
        2,
        "app",
        index,
    )
    assert (result.accepted, result.duplicates, result.conflicts) == (0, 1, 1)
    events, quarantine, _ = _tables(spark, lake)
    assert sorted((r.event_id, r.partition, r.offset) for r in events.collect()) == [
        ("e0", 0, 0),
        ("e1", 0, 1),
        ("e2", 0, 2),
    ]
    assert [(r.partition, r.offset, r.reason) for r in quarantine.collect()] == [
        (1, 1, silver.CONFLICT)
    ]
    assert len(index) == 5


def test_a_batch_of_new_ids_stays_within_its_spark_jobs(spark, lake):
    """The live path's most common batch: every id new, one record malformed. The
    index tells that none has an earlier record, so nothing is classified
    (`silver._settle_new`): 14 jobs here before, 5 now: the validation, the tally,
    and the ledger's, silver's and the quarantine's appends, a job each."""
    index = ledger_index.LedgerIndex(silver.LEDGER.path(lake))
    first = [(0, o, _event(f"e{o}")) for o in range(3)]
    silver.process_batch(spark, lake, _batch(spark, lake, first), 0, "app", index)
    new = [(0, 3, _event("e3")), (1, 0, _event("e4")), (1, 1, b"{not json")]
    batch = _batch(spark, lake, new)
    before = jobs_so_far(spark)
    result = silver.process_batch(spark, lake, batch, 1, "app", index)
    jobs = jobs_so_far(spark) - before
    assert (result.rows_in, result.accepted, result.duplicates, result.conflicts) == (3, 2, 0, 0)
    events, quarantine, _ = _tables(spark, lake)
    assert sorted(r.event_id for r in events.collect()) == ["e0", "e1", "e2", "e3", "e4"]
    assert [(r.partition, r.offset) for r in quarantine.collect()] == [(1, 1)]
    assert jobs <= 5, f"a batch of new ids ran {jobs} Spark jobs"


def test_a_batch_with_keyed_conflicts_stays_within_its_spark_jobs(spark, lake):
    """Issue 67 holds the live path's structure by its job counts, which a change can
    quietly undo. A batch whose ids met earlier records on their own partition (a
    resend, a conflicting copy, keyed as the first) read those from the ledger
    through Spark's snapshot of it, rebuilt every batch: 21 jobs here (23 on the
    bench's harness). By delta-rs (`lake.read_at_positions`), 17 (19 there). The
    ceiling falls as issue 67 goes on."""
    index = ledger_index.LedgerIndex(silver.LEDGER.path(lake))
    first = [(0, o, _event(f"e{o}")) for o in range(4)]
    silver.process_batch(spark, lake, _batch(spark, lake, first), 0, "app", index)
    again = [(0, 4, _event("e1")), (0, 5, _event("e2", quantity=9)), (0, 6, _event("e9"))]
    batch = _batch(spark, lake, again)
    before = jobs_so_far(spark)
    result = silver.process_batch(spark, lake, batch, 1, "app", index)
    jobs = jobs_so_far(spark) - before
    assert (result.accepted, result.duplicates, result.conflicts) == (1, 1, 1)
    assert jobs <= 17, f"a batch with keyed conflicts ran {jobs} Spark jobs"


def test_a_batch_that_replaces_a_winner_stays_within_its_spark_jobs(spark, lake):
    """As the test above, for a batch whose record comes before its id's winner in
    log order, on another partition: it replaces the winner in silver, and the
    winner becomes a conflict, read back from bronze. Bronze and the quarantine,
    which commit every batch, were read through Spark's snapshots of them: 72 jobs
    here. By delta-rs (`silver.bronze_at`, `_conflict_changes`), 62."""
    index = ledger_index.LedgerIndex(silver.LEDGER.path(lake))
    first = [(1, o, _event(f"e{o}")) for o in range(3)]
    silver.process_batch(spark, lake, _batch(spark, lake, first), 0, "app", index)
    earlier = [(0, 0, _event("e1", quantity=9)), (0, 1, _event("e7"))]
    batch = _batch(spark, lake, earlier)
    before = jobs_so_far(spark)
    result = silver.process_batch(spark, lake, batch, 1, "app", index)
    jobs = jobs_so_far(spark) - before
    assert (result.accepted, result.replaced_winners) == (2, 1)
    events, quarantine, _ = _tables(spark, lake)
    assert ("e1", 0, 0) in {(r.event_id, r.partition, r.offset) for r in events.collect()}
    assert [(r.partition, r.offset, r.reason) for r in quarantine.collect()] == [
        (1, 1, silver.CONFLICT)
    ]
    assert jobs <= 62, f"a batch that replaces a winner ran {jobs} Spark jobs"


def test_a_live_batch_replaces_a_winner_with_delta_rs_and_the_change_feed_shows_it(spark, lake):
    """Ingest's batches on a local lake pass silver's delta-rs committer: the append of
    new ids and the MERGE that replaces a winner are then delta-rs's, here one that
    moves the row to another day's partition. Silver's change feed, as the views
    read it, holds the old row's pre-image and the new one's post-image; the
    quarantine gains the old winner. The batch: 8 Spark jobs, against 62 with
    Spark's MERGE and append (the test above); 51 until its classification came to
    the driver in one job (`silver.Decided`), where its tally, its winners, the
    positions it names and the quarantine's conflicts are now found; 9 until the
    old winner's partition was read from its raw record (`_where_held`)."""
    index = ledger_index.LedgerIndex(silver.LEDGER.path(lake))
    path = silver.SILVER.path(lake)
    writer = spark_lake.Committer(*lake.delta_rs(path))
    rejects = spark_lake.Committer(*lake.delta_rs(silver.QUARANTINE.path(lake)))
    first = [(1, o, _event(f"e{o}")) for o in range(3)]
    silver.process_batch(
        spark, lake, _batch(spark, lake, first), 0, "app", index, writer=writer, quarantine=rejects
    )
    settled, quarantined = writer.version(), rejects.version()
    earlier = [(0, 0, _event("e1", quantity=9, day="2025-12-31")), (0, 1, _event("e7"))]
    batch = _batch(spark, lake, earlier)
    before = jobs_so_far(spark)
    result = silver.process_batch(
        spark, lake, batch, 1, "app", index, writer=writer, quarantine=rejects
    )
    jobs = jobs_so_far(spark) - before
    assert (result.accepted, result.replaced_winners) == (2, 1)
    events, quarantine, _ = _tables(spark, lake)
    assert sorted(
        (r.event_id, r.partition, r.offset, r.quantity, str(r.event_date)) for r in events.collect()
    ) == [
        ("e0", 1, 0, 1, "2026-01-01"),
        ("e1", 0, 0, 9, "2025-12-31"),
        ("e2", 1, 2, 1, "2026-01-01"),
        ("e7", 0, 1, 1, "2026-01-01"),
    ]
    assert [(r.partition, r.offset, r.reason) for r in quarantine.collect()] == [
        (1, 1, silver.CONFLICT)
    ]

    # Both of the batch's commits to silver are delta-rs's: its new id's append, under
    # the batch's transaction id, then the MERGE; and the quarantine's one append.
    def commits(table: str, first: int, last: int) -> list[tuple[str, list[str]]]:
        found = []
        for version in range(first, last + 1):
            log_file = Path(table) / "_delta_log" / f"{version:020d}.json"
            actions = [json.loads(line) for line in log_file.read_text().splitlines()]
            info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
            assert info["engineInfo"].startswith("delta-rs"), info
            found.append((info["operation"], [a["txn"]["appId"] for a in actions if "txn" in a]))
        return found

    assert commits(path, settled + 1, writer.version()) == [
        ("WRITE", ["app/silver-new"]),
        ("MERGE", []),
    ]
    # (one commit: the old winner, now a conflict)
    assert commits(rejects.where, quarantined + 1, rejects.version()) == [
        ("WRITE", ["app/rejected"])
    ]
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", settled + 1)
        .load(path)
    )
    assert sorted(
        (r.event_id, r._change_type, r.partition, r.offset, str(r.event_date))
        for r in feed.collect()
    ) == [
        ("e1", "update_postimage", 0, 0, "2025-12-31"),
        ("e1", "update_preimage", 1, 1, "2026-01-01"),
        ("e7", "insert", 0, 1, "2026-01-01"),
    ]
    assert jobs <= 8, f"a batch that replaces a winner ran {jobs} Spark jobs"
    # Its log line says where its time went, step by step.
    steps = ["tally", "ledger", "history", "classify", "append", "where held", "merge"]
    assert list(result.steps) == [*steps, "quarantine"]
    assert "; steps, s: tally " in result.describe()
    # Retried (a crash after its commits): delta-rs's append finds its id, the MERGE
    # finds the winner in place, and silver gains no commit.
    newest = writer.version()
    again = silver.process_batch(
        spark, lake, batch, 1, "app", index, writer=writer, quarantine=rejects
    )
    assert again.replaced_winners == 1
    assert (writer.version(), rejects.version()) == (newest, quarantined + 1)
    assert _tables(spark, lake)[0].count() == 4
    # delta-rs checkpoints as Spark does (its own default is every 100 commits).
    for table in (path, rejects.where):
        assert spark_lake.table_properties(spark, table)["delta.checkpointInterval"] == "10"


def test_the_ledger_index_rebuilds_after_another_writer(spark, lake):
    """A ledger row the index did not add (here: appended by hand) is found: any commit
    but ingest's own appends and data-free ones (OPTIMIZE) rebuilds the index."""
    index = ledger_index.LedgerIndex(silver.LEDGER.path(lake))
    silver.process_batch(spark, lake, _batch(spark, lake, [(2, 0, _event("e1"))]), 0, "app", index)
    stray = _batch(spark, lake, [(0, 7, _event("e1", customer="c9"))])
    contract.validate(stray).select(*[f.name for f in silver.LEDGER_SCHEMA.fields]).write.format(
        "delta"
    ).mode("append").save(silver.LEDGER.path(lake))
    spark.sql(f"OPTIMIZE delta.`{silver.LEDGER.path(lake)}`")  # data-free: changes nothing

    resend = _batch(spark, lake, [(2, 1, _event("e1"))])
    keys = ledger_index.Keys.of(
        contract.validate(resend).select(*[f.name for f in silver.LEDGER_SCHEMA.fields])
    )
    index.follow(spark, ("app/ledger", 1), keys)
    assert sorted(index.earlier(keys)) == [(0, 7), (2, 0)]
    assert index.version == int(
        spark.sql(f"DESCRIBE HISTORY delta.`{silver.LEDGER.path(lake)}`").first()["version"]
    )


def test_the_ledger_index_follows_layout_commits_and_rebuilds_after_a_delete(
    spark, lake, monkeypatch
):
    path = silver.LEDGER.path(lake)
    index = ledger_index.LedgerIndex(path)
    silver.process_batch(spark, lake, _batch(spark, lake, [(2, 0, _event("e1"))]), 0, "app", index)
    spark.sql(f"OPTIMIZE delta.`{path}`")
    rebuilds = []
    monkeypatch.setattr(index, "rebuild", lambda spark, why: rebuilds.append(why))
    result = silver.process_batch(
        spark,
        lake,
        _batch(spark, lake, [(2, 1, _event("e1")), (2, 2, _event("e2"))]).coalesce(1),
        1,
        "app",
        index,
    )
    assert result.duplicates == 1
    assert rebuilds == []  # its own append and a data-free OPTIMIZE: followed, not rebuilt
    # As an erasure would: one row of a file, so Delta rewrites the rest of it. (A
    # whole file removed needs nothing: a position the ledger lost reads no row.)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE `offset` = 1")
    index.follow(
        spark, ("app/ledger", 2), ledger_index.Keys.of(spark.read.format("delta").load(path))
    )
    assert len(rebuilds) == 1


def test_a_batch_stopped_after_its_ledger_append_settles_with_a_rebuilt_index(spark, lake):
    """A crash after the ledger append: the restarted query builds its index from a
    ledger that holds the batch already, and the batch's rerun is not its own earlier record."""
    silver.process_batch(spark, lake, _batch(spark, lake, [(2, 0, _event("e1"))]), 0, "app")
    stopped = _batch(spark, lake, [(0, 7, _event("e1", customer="c9")), (1, 4, _event("e2"))])
    lake_ledger = silver.LEDGER.path(lake)
    # As the batch's own ledger append (`silver.process_batch`) writes it.
    spark_lake.append_once(
        contract.validate(stopped)
        .where(F.col("reject_reason").isNull())
        .select(*[f.name for f in silver.LEDGER_SCHEMA.fields]),
        lake_ledger,
        "app/ledger",
        1,
    )
    index = ledger_index.LedgerIndex(lake_ledger)
    index.rebuild(spark, "restart")

    result = silver.process_batch(spark, lake, stopped, 1, "app", index)

    assert (result.accepted, result.replaced_winners, result.duplicates) == (2, 1, 0)
    events, quarantine, ledger = _tables(spark, lake)
    assert sorted((r.event_id, r.partition, r.offset) for r in events.collect()) == [
        ("e1", 0, 7),
        ("e2", 1, 4),
    ]
    assert [(r.partition, r.offset) for r in quarantine.collect()] == [(2, 0)]
    assert ledger.count() == 3  # the rerun's append was skipped


def test_reconcile_removes_a_conflict_the_ledger_does_not_hold(spark, lake):
    """A conflict row at a position the ledger no longer holds for its id (an erasure
    stopped between the two tables) is found by recovery, which reads the whole quarantine."""
    silver.process_batch(
        spark,
        lake,
        _batch(spark, lake, [(2, 0, _event("e1")), (2, 1, _event("e1", quantity=2))]),
        0,
        "app",
    )
    stray = (
        spark.read.format("delta")
        .load(silver.QUARANTINE.path(lake))
        .withColumn("offset", F.lit(99).cast("long"))
    )
    stray.write.format("delta").mode("append").save(silver.QUARANTINE.path(lake))

    assert silver.reconcile(spark, lake) == 1

    _, quarantine, _ = _tables(spark, lake)
    assert [(r.partition, r.offset) for r in quarantine.collect()] == [(2, 1)]
    assert silver.reconcile(spark, lake) == 0


def test_silver_rows_have_the_contract_types(spark, lake):
    silver.process_batch(spark, lake, _batch(spark, lake, [(0, 0, _event("e1"))]), 0, "app")
    events, _, _ = _tables(spark, lake)
    assert_df_equality(
        events.select("event_id", "event_time", "quantity", "partition", "offset"),
        spark.createDataFrame(
            [("e1", datetime(2026, 1, 1, 10, 0, 0), 1, 0, 0)],
            "event_id string, event_time timestamp, quantity int, partition int, offset bigint",
        ),
        ignore_nullable=True,
    )
    assert events.where(F.col("content_hash").isNull()).count() == 0


def test_from_records_settles_like_the_streaming_path(spark, lake, run):
    """Settling records all at once (`silver.from_records`, `silver.settle`) gives the
    silver, quarantine and ledger that micro-batches leave.

    Over 20 s: two micro-batches through real Delta tables (eight commits to bronze, the
    ledger, silver and the quarantine, one a MERGE replacing silver's winner), then three
    tables compared with the records settled at once, since what it proves is that both
    paths agree on what the real tables hold."""
    rows = [
        (2, 0, _event("e1")),
        (2, 1, _event("e1")),
        (0, 7, _event("e1", customer="c9")),  # earlier in log order, other content
        (1, 3, b"{oops"),
        (1, 4, _event("e2", quantity=2)),
    ]
    # Streaming: in two micro-batches, partition 2 first.
    run(_batch(spark, lake, rows[:2]), 0)
    run(_batch(spark, lake, rows[2:]), 1)
    streamed, quarantined, ledger = _tables(spark, lake)

    records = _batch(spark, lake, rows)
    at_once = silver.from_records(records)

    def same(a, b):
        assert_df_equality(
            a, b, ignore_row_order=True, ignore_nullable=True, ignore_column_order=True
        )

    same(at_once, streamed)
    # The quarantine and the ledger too (what the audit re-derives from bronze),
    # all but the time each record was quarantined.
    settled = silver.settle(records)
    same(settled.quarantine.drop("quarantined_at"), quarantined.drop("quarantined_at"))
    # e1's records at partition 2 lost to the earlier one at partition 0 (other content).
    assert sorted(r.reason for r in quarantined.collect()) == [
        silver.CONFLICT,
        silver.CONFLICT,
        "malformed_json",
    ]
    same(settled.ledger, ledger)


def test_reconcile_finishes_a_batch_that_stopped_after_its_ledger_append(spark, lake):
    # Batch 0 settled e1 at (2,0). Batch 1 brought an earlier e1 with other content at
    # (0,7) and e2, and stopped after its ledger append: silver and the quarantine
    # never saw it, and with its checkpoint gone nothing would replay it.
    silver.process_batch(spark, lake, _batch(spark, lake, [(2, 0, _event("e1"))]), 0, "app")
    stopped = _batch(spark, lake, [(0, 7, _event("e1", customer="c9")), (1, 4, _event("e2"))])
    checked = contract.validate(stopped).where(F.col("reject_reason").isNull())
    checked.select(*[f.name for f in silver.LEDGER_SCHEMA.fields]).write.format("delta").mode(
        "append"
    ).save(silver.LEDGER.path(lake))

    assert silver.reconcile(spark, lake) == 2  # e1's winner replaced, e2 missing

    events, quarantine, _ = _tables(spark, lake)
    assert sorted((r.event_id, r.partition, r.offset, r.customer_id) for r in events.collect()) == [
        ("e1", 0, 7, "c9"),
        ("e2", 1, 4, "c1"),
    ]
    assert [(r.partition, r.offset, r.reason) for r in quarantine.collect()] == [
        (2, 0, "conflicting_duplicate")
    ]
    assert silver.reconcile(spark, lake) == 0  # nothing left to fix


def test_a_retried_live_batch_restores_an_older_conflict_of_an_id_it_did_not_replace(
    spark, lake, run
):
    """A retry of a batch whose quarantine append is committed settles every touched
    id's conflicts (`_settle_conflicts`). Bronze's records read for the ids whose
    winner the batch replaced (`Decided.earlier`) are not all it may need: here the
    quarantine lost eX's older conflict (1, 1), and eX's winner was not replaced,
    so its raw record is read from bronze, and the conflict comes back."""
    first = [(1, 0, _event("eX")), (1, 1, _event("eX", quantity=2)), (1, 2, _event("eY"))]
    run(_batch(spark, lake, first), 0)
    # eY's earlier copy replaces its winner; eX gains an exact duplicate.
    later = [(0, 0, _event("eY", quantity=3)), (1, 3, _event("eX"))]
    batch = _batch(spark, lake, later)
    assert run(batch, 1).replaced_winners == 1
    quarantine = silver.QUARANTINE.path(lake)

    def conflicts():
        rows = spark.read.format("delta").load(quarantine).where(f"reason = '{silver.CONFLICT}'")
        return sorted((r.partition, r.offset) for r in rows.collect())

    assert conflicts() == [(1, 1), (1, 2)]
    spark.sql(f"DELETE FROM delta.`{quarantine}` WHERE partition = 1 AND offset = 1")
    assert conflicts() == [(1, 2)]
    retried = run(batch, 1)
    assert retried.replaced_winners == 1
    assert conflicts() == [(1, 1), (1, 2)]
