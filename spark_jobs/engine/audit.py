"""The audit's Spark side: silver -> gold for every live view version, and the
record of each run in `lakehouse.gold.audit_runs`.

A gold table's newest commit tagged with silver version E must hold exactly the
view's function of silver as of E (the runner tags every commit it makes). The
audit compares the table *as it is now* with that function, so a later write
by anything other than the stream (a hand-made UPDATE, say) shows up as the
exact keys it changed, together with the commits that did it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType, StructField, StructType, TimestampType

from spark_jobs import views
from spark_jobs.engine import contract, gold_writes, lake, marks, runner, scoping
from spark_jobs.engine.inputs import Position
from spark_jobs.views.base import View
from warehouse.base import registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

# At most this many exact keys are kept per finding: enough to act on.
MAX_KEYS = 20


@dataclass(frozen=True)
class Finding:
    check: str
    subject: str
    passed: bool
    summary: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.findings)


AUDIT_RUNS = registry.GOLD_AUDIT_RUNS
AUDIT_RUNS_SCHEMA = StructType(
    [
        StructField("run_id", StringType(), False),
        StructField("started_at", TimestampType(), False),
        StructField("finished_at", TimestampType(), False),
        StructField("check_name", StringType(), False),
        StructField("subject", StringType(), False),
        StructField("passed", BooleanType(), False),
        StructField("summary", StringType(), False),
        # JSON: the figures, and on failure the exact keys that differ.
        StructField("detail", StringType(), False),
    ]
)


def sample_scopes(view: View, silver: DataFrame, gold: DataFrame, fraction: float) -> DataFrame:
    """A random subset of the view's scopes: those silver yields and those gold holds."""
    scope = list(view.scope_columns)
    every = scoping.scopes_of(view, silver, silver).select(*scope).unionByName(gold.select(*scope))
    return every.distinct().sample(fraction=fraction, seed=int(datetime.now(UTC).timestamp()))


def differing_keys(view: View, want: DataFrame, have: DataFrame) -> tuple[int, int, list[dict]]:
    """(rows missing, rows unexpected, up to MAX_KEYS keys that differ)."""
    missing = want.exceptAll(have).localCheckpoint(eager=True)
    unexpected = have.exceptAll(want).localCheckpoint(eager=True)
    keys = (
        missing.select(*view.key)
        .unionByName(unexpected.select(*view.key))
        .distinct()
        .orderBy(*view.key)
        .limit(MAX_KEYS)
        .collect()
    )
    return (
        missing.count(),
        unexpected.count(),
        [{k: str(v) for k, v in r.asDict().items()} for r in keys],
    )


def _snapshot(spark: SparkSession, path: str) -> tuple[int, tuple[int, Position, str] | None]:
    """A consistent (newest gold version, newest tag at or before it)."""
    while True:
        tag = marks.latest_tag(spark, path)
        version = lake.newest_version(spark, path)
        if marks.latest_tag(spark, path) == tag:
            return version, tag


def check_version(
    spark: SparkSession, settings: Settings, view: View, sample: float | None
) -> Finding:
    subject = f"{view.name} v{view.version}"
    path = gold_writes.gold_table(view).path(settings)
    newest, tag = _snapshot(spark, path)
    if tag is None:
        return Finding("silver_gold", subject, False, "no gold commit names its silver version")
    tag_version, position, _ = tag
    have = runner.read_gold(spark, settings, view, newest)
    silver = runner.read_input(spark, settings, view, position)
    if sample is not None:
        scopes = sample_scopes(view, silver, have, sample).localCheckpoint(eager=True)
        want = gold_writes.gold_rows(view, scoping.restrict(view, silver, scopes))
        have = have.join(F.broadcast(scopes), list(view.scope_columns), "left_semi")
        scope_note = f", {scopes.count()} sampled scopes"
    else:
        want = gold_writes.gold_rows(view, silver)
        scope_note = ""
    missing, unexpected, keys = differing_keys(view, want.localCheckpoint(eager=True), have)
    foreign = (
        DeltaTable.forPath(spark, path)
        .history()
        .where(F.col("version") > tag_version)
        .select("version", "operation")
        .orderBy("version")
        .collect()
    )
    after = [(int(r["version"]), str(r["operation"])) for r in foreign]
    detail = {
        "gold_version": newest,
        "silver_version": position.json(),
        "rows": have.count(),
        "missing": missing,
        "unexpected": unexpected,
        "differing_keys": keys,
        "commits_after_last_stream_commit": after,
        "sampled": sample,
    }
    ok = not (missing or unexpected)
    written_by = ", ".join(f"version {v} ({op})" for v, op in after)
    summary = (
        f"equals its code over {position.describe()}{scope_note}"
        if ok
        else f"{missing + unexpected} rows differ from its code over "
        f"{position.describe()}{scope_note}: keys {json.dumps(keys[:3])}"
        + (f"; written after its stream by {written_by}" if after else "")
    )
    return Finding("silver_gold", subject, ok, summary, detail)


def check_silver_gold(
    spark: SparkSession,
    settings: Settings,
    live: Sequence[tuple[str, int]],
    sample: float | None,
) -> list[Finding]:
    """Check each live (view, version) against its own code."""
    found = []
    for name, version in live:
        try:
            view = views.get(name, version)
        except KeyError as exc:
            found.append(Finding("silver_gold", f"{name} v{version}", False, exc.args[0]))
            continue
        log.info("audit: %s v%d against its own code", name, version)
        found.append(check_version(spark, settings, view, sample))
    return found


def record(spark: SparkSession, settings: Settings, run: Run) -> None:
    """Append the run's findings to gold.audit_runs (the caller publishes it to Trino)."""
    path = AUDIT_RUNS.path(settings)
    lake.ensure_table(spark, path, AUDIT_RUNS_SCHEMA)
    finished = datetime.now(UTC)
    rows = [
        (
            run.run_id,
            run.started_at,
            finished,
            f.check,
            f.subject,
            f.passed,
            f.summary,
            json.dumps(f.detail, default=str),
        )
        for f in run.findings
    ]
    spark.createDataFrame(rows, AUDIT_RUNS_SCHEMA).write.format("delta").mode("append").save(path)


# -- bronze -> silver, by content ------------------------------------------------------
def differing_rows(have: DataFrame, want: DataFrame, key: list[str]) -> DataFrame:
    """Keys on both sides whose other columns differ, with `columns`: the names of
    those that do (NULL-safe). Keys on one side only are the accounting's to find."""
    columns = [c for c in want.columns if c not in key]
    left = have.select(*key, *[F.col(c).alias(f"have_{c}") for c in columns])
    right = want.select(*key, *[F.col(c).alias(f"want_{c}") for c in columns])
    differs = F.array_compact(
        F.array(
            *[F.when(~F.col(f"have_{c}").eqNullSafe(F.col(f"want_{c}")), F.lit(c)) for c in columns]
        )
    )
    return left.join(right, key).select(*key, differs.alias("columns")).where(F.size("columns") > 0)


# What is compared, per table: its key, and the columns bronze cannot give back
# (when a record was quarantined is the time it happened, not a function of it).
CONTENT = {
    "silver": (["event_id"], ()),
    "quarantine": (["partition", "offset"], ("quarantined_at",)),
    "ledger": (["partition", "offset"], ()),
}


def _sampled(df: DataFrame, fraction: float | None) -> DataFrame:
    """Every record of a random share of event ids (all of an id's records decide
    its winner), and the same share of records with no id."""
    if fraction is None:
        return df
    bucket = F.coalesce(F.xxhash64("event_id"), F.xxhash64("partition", "offset"))
    return df.where(F.abs(bucket % 10_000) < int(fraction * 10_000))


def _content_differences(
    spark: SparkSession,
    settings: Settings,
    sample: float | None,
    src: registry.SourceTables = registry.SHOP,
) -> list[tuple[str, int, int, list[dict[str, Any]]]]:
    """(table, rows compared, rows differing, up to MAX_KEYS of them) per table."""
    from spark_jobs.engine import silver as silver_mod

    read = spark.read.format("delta").load
    tables = {
        name: _sampled(read(table.path(settings)), sample).localCheckpoint(eager=True)
        for name, table in (
            ("silver", src.silver),
            ("quarantine", src.quarantine),
            ("ledger", src.ledger),
        )
    }
    settled = (
        tables["ledger"]
        .select("partition", "offset")
        .unionByName(tables["quarantine"].select("partition", "offset"))
        .distinct()
    )
    bronze = read(src.bronze.path(settings)).where(F.col("topic") == src.topic)
    # Validated once: silver, the quarantine and the ledger are all derived from it.
    # By the contract the lake runs: a record it accepts that is still quarantined
    # under an older one (not re-admitted yet, docs/contract.md §10) is a difference.
    plan = silver_mod.deployed_plan(spark, settings, src.source)
    checked = contract.validate(bronze.join(settled, ["partition", "offset"], "left_semi"), plan)
    derived = silver_mod.settle_checked(checked.localCheckpoint(eager=True), plan)
    want = {"silver": derived.silver, "quarantine": derived.quarantine, "ledger": derived.ledger}
    found = []
    for name, (key, skip) in CONTENT.items():
        have = tables[name].drop(*skip)
        diff = differing_rows(have, want[name].select(*have.columns), key).localCheckpoint(
            eager=True
        )
        rows = diff.orderBy(*key).limit(MAX_KEYS).collect()
        differing = [{**{k: r[k] for k in key}, "columns": list(r["columns"])} for r in rows]
        found.append((name, have.count(), diff.count(), differing))
    return found


def check_silver_content(
    spark: SparkSession,
    settings: Settings,
    sample: float | None = None,
    attempts: int = 3,
    wait_s: float = 10.0,
    src: registry.SourceTables = registry.SHOP,
) -> list[Finding]:
    """Every silver, quarantine and ledger row equals what the contract's code makes
    of its bronze record(s): an UPDATE of silver, or of the ledger's content hash,
    is named by key and column.

    Only records the ledger or the quarantine already hold are re-derived, so
    what ingest has not settled yet is not a difference. A row may still differ
    for a moment while a batch is between its commits (a winner replaced), so
    a difference must outlast `attempts` looks to count.
    """
    for attempt in range(1, attempts + 1):
        found = _content_differences(spark, settings, sample, src)
        if all(n == 0 for _, _, n, _ in found) or attempt == attempts:
            break
        log.info("audit: silver content differs; looking again in %.0f s", wait_s)
        time.sleep(wait_s)
    findings = []
    for name, compared, n, differing in found:
        # The shop's subjects as they always were; another source's named.
        subject = (
            f"{name} content"
            if src.source == registry.SHOP_SOURCE
            else f"{src.source} {name} content"
        )
        if n == 0:
            summary = f"{compared:,} rows equal the contract's code over their bronze records"
        else:
            shown = "; ".join(
                " ".join(f"{k}={v}" for k, v in d.items() if k != "columns")
                + f" ({', '.join(d['columns'])})"
                for d in differing[:3]
            )
            summary = f"{n} rows differ from the contract's code over bronze: {shown}"
        findings.append(
            Finding(
                "bronze_silver",
                subject,
                n == 0,
                summary,
                {"rows_compared": compared, "differing": n, "keys": differing, "sampled": sample},
            )
        )
    return findings
