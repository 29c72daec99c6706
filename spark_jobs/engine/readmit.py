"""Re-admission (docs/contract.md §10): quarantined records validated again under the
contract the lake runs now, and settled as if they had passed when they arrived.

A record that now passes takes its place by the rules of silver (`spark_jobs.engine.silver`):
the first record of its event id in log order is the silver event, so a re-admitted
record can replace a later winner, which then becomes an exact duplicate or a
conflicting one. A record that still fails stays quarantined, with the reason it
fails by today.

The accounting (`warehouse.sql.accounting`: every ledger row in neither silver nor
the quarantine is a duplicate) holds at every commit, because the commits go in
this order:

1. the ledger gains the records that now pass (each is then in the ledger and the
   quarantine, counted once, as quarantined);
2. one MERGE of the quarantine, by position: a record that is now accepted or an
   exact duplicate leaves it (counted as a duplicate meanwhile); one that now loses
   to another becomes a `conflicting_duplicate` in place; one that still fails gets
   today's reason and detail in place;
3. silver gains the winners, replacing later ones (as a micro-batch does);
4. the replaced winners that differ go to the quarantine as conflicts.

Exactly once: the ledger's append and silver's commits run under the transaction
id `readmit/<readmission id>`, so a retried run skips what is committed. A run
killed after step 1 is finished by its rerun: step 2 is keyed by position and
restates what is still quarantined under the reason; then, if the ledger's append
was committed by the earlier try, `silver.reconcile` brings silver and the
conflicts to the ledger's answer (the admitted records left the quarantine and are
not examined again). Ingest must not run meanwhile: the caller holds its lock.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine import contract, faults, lake, silver
from warehouse.base import registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

# Re-admission is one batch of its own, under its own transaction ids.
BATCH = 0


@dataclass
class Readmitted:
    """What a run did (`ops.control.readmissions`' counts)."""

    examined: int = 0
    admitted: int = 0  # left the quarantine: now in silver, or an exact duplicate
    still_quarantined: dict[str, int] = field(default_factory=dict)  # by reason today
    replaced_winners: int = 0
    resumed: bool = False  # an earlier try had committed the ledger's append

    def describe(self) -> str:
        still = ", ".join(f"{r}={n}" for r, n in sorted(self.still_quarantined.items()))
        return (
            f"{self.examined} examined, {self.admitted} admitted, "
            f"{self.replaced_winners} later winners replaced, still quarantined: "
            f"{still or 'none'}" + (" (an earlier try resumed)" if self.resumed else "")
        )


def check_reason(reason: str) -> str:
    """`reason`, if records quarantined with it can be re-admitted; else ValueError."""
    if reason == silver.CONFLICT:
        raise ValueError(
            "conflicting duplicates passed the contract already; dedup settles them "
            "(docs/contract.md §1), re-admission does not"
        )
    readmittable = [r for r in contract.REASONS if r != silver.CONFLICT]
    if reason not in readmittable:
        raise ValueError(f"unknown reason {reason!r}; one of: {', '.join(readmittable)}")
    return reason


def app_id(readmission_id: str) -> str:
    return f"readmit/{readmission_id}"


def readmit(
    spark: SparkSession,
    settings: Settings,
    readmission_id: str,
    reason: str,
    plan: contract.Plan,
    progress: Callable[[Readmitted], None] | None = None,
) -> Readmitted:
    """Validate again, by `plan`, every quarantined record with `reason`, and settle them.

    `progress` is told the counts once the quarantine is restated (step 2): a try
    killed after it left those records out of the quarantine, so its rerun, which
    examines what is still there, cannot count them again."""
    check_reason(reason)
    txn = app_id(readmission_id)
    ledger_txn = f"{txn}/ledger"
    with lake.session_conf(spark, {lake.USER_METADATA: silver.READMISSION_TAG}):
        return _readmit(spark, settings, readmission_id, reason, plan, txn, ledger_txn, progress)


def _readmit(
    spark: SparkSession,
    settings: Settings,
    readmission_id: str,
    reason: str,
    plan: contract.Plan,
    txn: str,
    ledger_txn: str,
    progress: Callable[[Readmitted], None] | None,
) -> Readmitted:
    """`readmit`, its commits tagged (`silver.READMISSION_TAG`)."""
    ledger_path = plan.tables.ledger.path(settings)
    done = Readmitted(resumed=lake.committed(spark, ledger_path, ledger_txn, BATCH))
    quarantined = (
        spark.read.format("delta")
        .load(plan.tables.quarantine.path(settings))
        .where(F.col("reason") == reason)
        .select("partition", "offset")
    )
    checked = contract.validate(silver.bronze_at(spark, settings, quarantined, plan), plan)
    if done.resumed:
        # Only what the earlier try appended to the ledger can pass now: a record
        # quarantined since (ingest ran between the tries) waits for the next run.
        in_ledger = spark.read.format("delta").load(ledger_path).select("partition", "offset")
        checked = checked.join(
            in_ledger.withColumn("_in_ledger", F.lit(True)), ["partition", "offset"], "left"
        ).where(F.col("reject_reason").isNotNull() | F.col("_in_ledger").isNotNull())
        checked = checked.drop("_in_ledger")
    checked = checked.localCheckpoint(eager=True)
    try:
        verdicts = _count(checked, "reject_reason")
        done.examined = sum(verdicts.values())
        log.info(
            "re-admission %s: %d records quarantined as %s", readmission_id, done.examined, reason
        )
        if not done.examined:
            _finish_earlier(spark, settings, done, plan)
            return done
        accepted = checked.where(F.col("reject_reason").isNull())
        lake.append_once(  # 1: skipped when an earlier try committed it
            accepted.select(*silver.LEDGER_SCHEMA.fieldNames()), ledger_path, ledger_txn, BATCH
        )
        state = silver.admitted_state(spark, settings, checked, BATCH, txn, plan)
        try:
            statuses = _count(state.where("in_batch"), "status")
            _restate_quarantine(spark, settings, checked, state, reason, plan)  # 2
        finally:
            state.unpersist()
        done.admitted = statuses[silver.ACCEPTED] + statuses[silver.DUPLICATE]
        still = {r: n for r, n in verdicts.items() if r is not None}
        if statuses[silver.CONFLICT]:
            still[silver.CONFLICT] = statuses[silver.CONFLICT]
        done.still_quarantined = still
        if progress is not None:
            progress(done)  # what became of each record is decided and committed
        faults.maybe_crash("readmit_after_quarantine", BATCH)
        if done.resumed:
            _finish_earlier(spark, settings, done, plan)  # 3 and 4, for every try's records
        else:
            result = silver.finish_admitted(spark, settings, checked, BATCH, txn, plan)  # 3, 4
            done.replaced_winners = result.replaced_winners
    finally:
        checked.unpersist()
    log.info("re-admission %s: %s", readmission_id, done.describe())
    return done


def _count(df: DataFrame, column: str) -> Counter[str | None]:
    return Counter({r[column]: r["count"] for r in df.groupBy(column).count().collect()})


def _finish_earlier(
    spark: SparkSession, settings: Settings, done: Readmitted, plan: contract.Plan
) -> None:
    """An earlier try committed the ledger's append, so the records it admitted may have
    left the quarantine before silver had them: bring silver and the conflicts to the
    ledger's answer."""
    if done.resumed:
        fixed = silver.reconcile(spark, settings, plan)
        log.info(
            "re-admission: an earlier try finished; %d event ids brought to the ledger's answer",
            fixed,
        )


def _restate_quarantine(
    spark: SparkSession,
    settings: Settings,
    checked: DataFrame,
    state: DataFrame,
    reason: str,
    plan: contract.Plan,
) -> None:
    """Step 2: one MERGE by position over the examined records that still hold `reason`:
    out if now accepted or an exact duplicate; a conflict, naming what it lost to, if it
    now loses to another; today's reason and detail if it still fails."""
    key = ["partition", "offset"]
    verdict = checked.select(*key, "reject_reason", "reject_detail", "event_id", "content_hash")
    ours = silver.conflict_detail(state.where("in_batch")).select(
        *key, "status", F.col("detail").alias("conflict")
    )
    source = (
        verdict.join(ours, key, "left")
        .select(
            *key,
            F.when(F.col("reject_reason").isNotNull(), F.lit("update"))
            .when(F.col("status") == silver.CONFLICT, F.lit("update"))
            .otherwise(F.lit("delete"))
            .alias("_op"),
            F.coalesce(
                "reject_reason", F.when(F.col("status") == silver.CONFLICT, F.lit(silver.CONFLICT))
            ).alias("reason"),
            F.when(F.col("reject_reason").isNotNull(), F.col("reject_detail"))
            .otherwise(F.col("conflict"))
            .alias("detail"),
            "event_id",
            "content_hash",
        )
        .localCheckpoint(eager=True)
    )
    try:
        condition = "t.partition = s.partition AND t.offset = s.offset"
        named = silver.named_positions(source)
        if named is not None:
            condition += f" AND ({lake.positions_condition(named, 't')})"
        # Only rows that still hold the reason: a rerun changes nothing twice.
        held = f"t.reason = '{reason}'"
        with lake.source_checkpointed(spark):
            lake.retry_on_conflict(
                lambda: (
                    DeltaTable.forPath(spark, plan.tables.quarantine.path(settings))
                    .alias("t")
                    .merge(source.alias("s"), condition)
                    .whenMatchedDelete(condition=f"s._op = 'delete' AND {held}")
                    .whenMatchedUpdate(
                        condition=f"s._op = 'update' AND {held}",
                        set={
                            "reason": "s.reason",
                            "detail": "s.detail",
                            "event_id": "coalesce(s.event_id, t.event_id)",
                            "content_hash": "coalesce(s.content_hash, t.content_hash)",
                        },
                    )
                    .execute()
                ),
                "re-admission: the quarantine",
            )
    finally:
        source.unpersist()


# The tables a re-admission writes, for its callers' locks and messages.
WRITES = (registry.SILVER_LEDGER, registry.SILVER_QUARANTINE, registry.SILVER_EVENTS)
