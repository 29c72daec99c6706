"""Trust, but verify: every layer checked against the layer it derives from.

- kafka -> bronze: every offset Kafka still holds, up to what bronze has
  copied, is in bronze exactly once. A hole is checked against Kafka itself:
  offsets Kafka has no record for (transaction markers, compaction) are fine.
  What is not copied yet is fine too, unless its oldest record is older than
  `ingest_lag_alert_s`: then ingest has stalled.
- bronze -> silver: `bronze = silver + quarantine + exact duplicates` per
  partition, and nothing downstream that bronze does not have; and by content,
  every silver, quarantine and ledger row equals what the contract's code makes
  of its bronze records (spark_jobs/engine/audit.py), so an UPDATE is named.
- silver -> gold: each live view version equals a batch recompute of its own
  code over the silver snapshot its newest tagged commit names
  (spark_jobs/engine/audit.py).
- routing: each serving view routes to exactly the live versions.

The kafka -> bronze and bronze -> silver checks run for every declared source whose
tables exist (docs/contract.md §10), each on its own topic and tables; another
source's findings name it ("web partition 0"), the shop's read as they always did.

Each check yields `Finding`s; the run's findings go to `lakehouse.gold.audit_runs`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.engine import audit as spark_audit
from spark_jobs.engine.audit import MAX_KEYS, Finding, Run
from warehouse.base import kafka_conf, registry
from warehouse.base.jsonfile import replace_json
from warehouse.base.settings import Settings
from warehouse.ops.lag import kafka_watermarks, uncopied_age_s
from warehouse.sql import accounting, catalog, serving, trino_client, versions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CHECKS = ("kafka_bronze", "bronze_silver", "silver_gold", "routing")
SHOP = registry.SHOP


# -- kafka -> bronze ---------------------------------------------------------------------
def gaps(offsets_from: int, present: Iterable[tuple[int, int]], upto: int) -> list[tuple[int, int]]:
    """Missing [start, end] ranges in [offsets_from, upto], given the present ranges
    (sorted, inclusive)."""
    missing, expect = [], offsets_from
    for start, end in present:
        if start > expect:
            missing.append((expect, min(start - 1, upto)))
        expect = max(expect, end + 1)
    if expect <= upto:
        missing.append((expect, upto))
    return [g for g in missing if g[0] <= g[1]]


def kafka_records_in(
    settings: Settings, partition: int, start: int, end: int, topic: str | None = None
) -> list[int]:
    """Offsets in [start, end] for which Kafka has a record (markers have none)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **kafka_conf.client_conf(settings),
            "group.id": "regauge-audit",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    found: list[int] = []
    try:
        consumer.assign([TopicPartition(topic or registry.TOPIC, partition, start)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(found) < MAX_KEYS:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            offset = msg.offset()
            if offset is None or offset > end:
                break
            found.append(offset)
    finally:
        consumer.close()
    return found


def check_kafka_bronze(settings: Settings, src: registry.SourceTables = SHOP) -> list[Finding]:
    """Per partition of `src`'s topic (subject `<topic>[<partition>]`)."""
    findings = []
    topic = src.topic
    bronze, forgotten = src.bronze.trino_name, src.forgotten.trino_name
    marks = kafka_watermarks(settings, topic=topic)
    doubles = trino_client.query(
        settings,
        f'SELECT partition, "offset", count(*) FROM {bronze} WHERE topic = ? '
        f'GROUP BY partition, "offset" HAVING count(*) > 1 ORDER BY 1, 2 LIMIT {MAX_KEYS}',
        [topic],
    ).rows
    for partition, (low, high) in marks.items():
        subject = f"{topic}[{partition}]"
        ranges = trino_client.query(
            settings,
            # Runs of consecutive offsets, as [start, end]: gaps are what lies between.
            f"""SELECT min(o), max(o) FROM (
                  SELECT "offset" AS o, "offset" - row_number() OVER (ORDER BY "offset") AS run
                  FROM (SELECT "offset" FROM {bronze}
                        WHERE topic = ? AND partition = ? AND "offset" >= ?
                        -- an erased record is accounted for, not missing (docs/contract.md §8)
                        UNION SELECT "offset" FROM {forgotten}
                        WHERE partition = ? AND "offset" >= ?))
                GROUP BY run ORDER BY 1""",
            [topic, partition, low, partition, low],
        ).rows
        copied_to = max((int(r[1]) for r in ranges), default=low - 1)
        holes = gaps(low, [(int(a), int(b)) for a, b in ranges], copied_to)
        # A hole Kafka has no records for is a transaction marker or compaction.
        real = [
            (start, end, found)
            for start, end in holes
            if (found := kafka_records_in(settings, partition, start, end, topic))
        ]
        dup = [(int(r[1]), int(r[2])) for r in doubles if int(r[0]) == partition]
        lag = max(0, high - 1 - copied_to)
        age = uncopied_age_s(settings, partition, copied_to + 1, topic) if lag else None
        stalled = age is not None and age > settings.ingest_lag_alert_s
        detail = {
            "kafka_low": low,
            "kafka_high": high,
            "bronze_through": copied_to,
            "lag": lag,
            "oldest_uncopied_age_s": None if age is None else round(age, 1),
            "missing_ranges": [[s, e] for s, e, _ in real][:MAX_KEYS],
            "missing_offsets": sorted({o for *_, found in real for o in found})[:MAX_KEYS],
            "doubled_offsets": dup,
        }
        ok = not real and not dup and not stalled
        problems = (
            [f"{sum(e - s + 1 for s, e, _ in real)} offsets missing from bronze"] if real else []
        )
        problems += [f"{len(dup)} doubled"] if dup else []
        if stalled:
            limit = settings.ingest_lag_alert_s
            problems.append(
                f"ingest has stalled: {lag} records not copied, the oldest (from offset "
                f"{copied_to + 1}) waiting {age:.0f} s, over the {limit:.0f} s limit "
                "(REGAUGE_INGEST_LAG_ALERT_S); see `regauge ingest status`"
            )
        summary = (
            f"offsets {low}..{copied_to} all in bronze once ({lag} not copied yet"
            + (f", the oldest {age:.0f} s old)" if age is not None else ")")
            if ok
            else "; ".join(problems)
        )
        findings.append(Finding("kafka_bronze", subject, ok, summary, detail))
    return findings


# -- bronze -> silver --------------------------------------------------------------------
def orphans_sql(src: registry.SourceTables = SHOP) -> str:
    """Silver and quarantine rows at a position bronze does not hold."""
    bronze = src.bronze.trino_name
    return f"""
SELECT 'silver' AS layer, s.partition, s."offset" FROM {src.silver.trino_name} AS s
WHERE NOT EXISTS (SELECT 1 FROM {bronze} AS b
                  WHERE b.partition = s.partition AND b."offset" = s."offset")
UNION ALL
SELECT 'quarantine', q.partition, q."offset" FROM {src.quarantine.trino_name} AS q
WHERE NOT EXISTS (SELECT 1 FROM {bronze} AS b
                  WHERE b.partition = q.partition AND b."offset" = q."offset")
ORDER BY 1, 2, 3
LIMIT {MAX_KEYS}
"""


def unsettled_sql(src: registry.SourceTables = SHOP) -> str:
    """Bronze records of one partition (the parameter) in neither the ledger nor the
    quarantine."""
    return f"""
SELECT b.partition, b."offset" FROM {src.bronze.trino_name} AS b
WHERE b.partition = ?
  AND NOT EXISTS (SELECT 1 FROM {src.ledger.trino_name} AS l
                  WHERE l.partition = b.partition AND l."offset" = b."offset")
  AND NOT EXISTS (SELECT 1 FROM {src.quarantine.trino_name} AS q
                  WHERE q.partition = b.partition AND q."offset" = b."offset")
ORDER BY 2
LIMIT {MAX_KEYS}
"""


def winners_sql(src: registry.SourceTables = SHOP) -> str:
    """Every event id the ledger accepted has exactly one row in silver (its winner)."""
    silver, ledger = src.silver.trino_name, src.ledger.trino_name
    return f"""
SELECT 'no silver row' AS problem, l.event_id FROM (SELECT DISTINCT event_id FROM {ledger}) AS l
WHERE NOT EXISTS (SELECT 1 FROM {silver} AS s WHERE s.event_id = l.event_id)
UNION ALL
SELECT 'not in the ledger', s.event_id FROM {silver} AS s
WHERE NOT EXISTS (SELECT 1 FROM {ledger} AS l WHERE l.event_id = s.event_id)
UNION ALL
SELECT 'several silver rows', event_id FROM {silver} GROUP BY event_id HAVING count(*) > 1
ORDER BY 1, 2
LIMIT {MAX_KEYS}
"""


# What an erasure forgot, back again: at a forgotten position, or as an event id
# whose hash the erasure kept (a producer re-sending the event, say).
def _returned(layer: str, table: str, by_event_id: bool, forgotten: str) -> str:
    at = (
        f"EXISTS (SELECT 1 FROM {forgotten} AS f "
        'WHERE f.partition = t.partition AND f."offset" = t."offset")'
    )
    ids = f"SELECT event_id_sha256 FROM {forgotten} WHERE event_id_sha256 IS NOT NULL"
    same_id = f"lower(to_hex(sha256(to_utf8(t.event_id)))) IN ({ids})"
    where = f"{at} OR {same_id}" if by_event_id else at
    return f"SELECT '{layer}' AS layer, t.partition, t.\"offset\" FROM {table} AS t WHERE {where}"


def returned_sql(src: registry.SourceTables = SHOP) -> str:
    return (
        "\nUNION ALL\n".join(
            _returned(layer, table.trino_name, by_id, src.forgotten.trino_name)
            for layer, table, by_id in (
                ("bronze", src.bronze, False),
                ("silver", src.silver, True),
                ("ledger", src.ledger, True),
                ("quarantine", src.quarantine, True),
            )
        )
        + f"\nORDER BY 1, 2, 3 LIMIT {MAX_KEYS}"
    )


def _named(src: registry.SourceTables, subject: str) -> str:
    """A finding's subject: the shop's as it always was, another source's named."""
    return subject if src.source == registry.SHOP_SOURCE else f"{src.source} {subject}"


def check_forgotten(settings: Settings, src: registry.SourceTables = SHOP) -> Finding:
    """Nothing an erasure removed is back in bronze or silver (docs/contract.md §8)."""
    back = trino_client.query(settings, returned_sql(src)).rows
    forgotten = src.forgotten.trino_name
    (n,) = trino_client.query(settings, f"SELECT count(*) FROM {forgotten}").rows[0]
    return Finding(
        "bronze_silver",
        _named(src, "forgotten"),
        not back,
        f"none of the {n} forgotten records is back"
        if not back
        else f"{len(back)} forgotten records are back: "
        + ", ".join(f"{layer} {p}:{o}" for layer, p, o in back[:3]),
        {"back": [[layer, int(p), int(o)] for layer, p, o in back], "forgotten": int(n)},
    )


def check_bronze_silver(
    settings: Settings,
    attempts: int = 4,
    wait_s: float = 15,
    src: registry.SourceTables = SHOP,
) -> list[Finding]:
    """`src`'s accounting per partition, and one silver row per accepted event id.

    Live ingest settles bronze into silver a batch behind, so records bronze
    has and silver has not settled yet must outlast a few looks before they count.
    """
    for attempt in range(1, attempts + 1):
        result = accounting.per_partition(settings, source=src.source)
        cols = result.columns
        rows = [dict(zip(cols, r, strict=True)) for r in result.rows]
        if all(r["unaccounted"] <= 0 for r in rows) or attempt == attempts:
            break
        log.info(
            "bronze -> silver: %s unaccounted; looking again", [r["unaccounted"] for r in rows]
        )
        time.sleep(wait_s)
    orphans = trino_client.query(settings, orphans_sql(src)).rows
    findings = []
    for r in rows:
        partition = int(r["partition"])
        mine = [[layer, int(o)] for layer, p, o in orphans if int(p) == partition]
        ok = r["unaccounted"] == 0 and not mine
        detail: dict[str, Any] = {k: int(v) for k, v in r.items()}
        if r["unaccounted"] > 0:
            detail["unsettled_offsets"] = [
                int(x[1])
                for x in trino_client.query(settings, unsettled_sql(src), [partition]).rows
            ]
        if mine:
            detail["not_in_bronze"] = mine
        summary = (
            f"bronze {r['bronze']} = silver {r['silver']} + quarantine {r['quarantine']} + "
            f"duplicates {r['exact_duplicates']} + forgotten {r['forgotten']}"
            + ("" if ok else f"; {r['unaccounted']} unaccounted, {len(mine)} not in bronze")
        )
        subject = _named(src, f"partition {partition}")
        findings.append(Finding("bronze_silver", subject, ok, summary, detail))
    broken = trino_client.query(settings, winners_sql(src)).rows
    findings.append(
        Finding(
            "bronze_silver",
            _named(src, "event ids"),
            not broken,
            "every accepted event id has exactly one silver row"
            if not broken
            else f"{len(broken)} event ids break one-row-per-event: "
            + ", ".join(f"{eid} ({why})" for why, eid in broken[:3]),
            {"broken": [[why, eid] for why, eid in broken]},
        )
    )
    findings.append(check_forgotten(settings, src))
    return findings


# -- routing -----------------------------------------------------------------------------
# Trino may print the names quoted when it shows a view's SQL.
_ROUTES = re.compile(r'"?lakehouse"?\."?gold"?\."?(?P<view>[a-z][a-z0-9_]*)_v(?P<version>[0-9]+)"?')


def routed_versions(definition: str, view: str) -> set[int]:
    """The versions a serving view's SQL reads from (its gold tables)."""
    return {int(m["version"]) for m in _ROUTES.finditer(definition.lower()) if m["view"] == view}


def check_routing(settings: Settings) -> list[Finding]:
    rows = versions.versions(settings)
    names = {v.view_name for v in rows}
    present = {
        str(r[0])
        for r in trino_client.query(
            settings,
            "SELECT table_name FROM lakehouse.information_schema.views WHERE table_schema = ?",
            [serving.SERVING_SCHEMA],
        ).rows
    }
    findings = []
    for view in sorted(names | present):
        live = {v.version for v in rows if v.view_name == view and v.live}
        status = {v.version: v.status for v in rows if v.view_name == view}
        if view not in present:
            ok = not live
            summary = (
                "no serving view, no live version"
                if ok
                else (f"no serving view, but v{sorted(live)} are live")
            )
            findings.append(Finding("routing", view, ok, summary, {"live": sorted(live)}))
            continue
        definition = str(
            trino_client.scalar(settings, f"SHOW CREATE VIEW {serving.trino_name(view)}")
        )
        routed = routed_versions(definition, view)
        wrong = {v: status.get(v, "unregistered") for v in routed - live}
        unrouted = sorted(live - routed)
        ok = not wrong and not unrouted
        problems = [f"routes to v{v}, which is {s}" for v, s in sorted(wrong.items())] + [
            f"v{v} is live but not routed to" for v in unrouted
        ]
        summary = (
            f"routes to exactly the live versions {sorted(live)}" if ok else "; ".join(problems)
        )
        findings.append(
            Finding(
                "routing",
                view,
                ok,
                summary,
                {"live": sorted(live), "routed": sorted(routed), "wrong": wrong},
            )
        )
    return findings


def describe(run: Run) -> trino_client.Result:
    return trino_client.Result(
        ["check", "subject", "passed", "summary"],
        [(f.check, f.subject, "yes" if f.passed else "NO", f.summary) for f in run.findings],
    )


def run(
    settings: Settings,
    spark: SparkSession,
    checks: Iterable[str] = CHECKS,
    sample: float | None = None,
) -> Run:
    """Run the chosen checks and record their findings in `gold.audit_runs`."""
    wanted = set(checks)
    result = Run()
    tables = audited_sources(spark, settings)
    if "kafka_bronze" in wanted:
        for src in tables:
            result.findings += check_kafka_bronze(settings, src)
    if "bronze_silver" in wanted:
        for src in tables:
            result.findings += check_bronze_silver(settings, src=src)
            result.findings += spark_audit.check_silver_content(spark, settings, sample, src=src)
    if "routing" in wanted:
        result.findings += check_routing(settings)
    if "silver_gold" in wanted:
        live = [(v.view_name, v.version) for v in versions.versions(settings) if v.live]
        result.findings += spark_audit.check_silver_gold(spark, settings, live, sample)
    return record(settings, spark, result, sorted(wanted))


def record(settings: Settings, spark: SparkSession, result: Run, checks: list[str]) -> Run:
    """Put a run on record: its findings in `gold.audit_runs` (what an automatic
    rollout's integrity gate reads), published to Trino, and its verdict for the
    metrics and `regauge status`."""
    spark_audit.record(spark, settings, result)
    catalog.publish(spark_audit.AUDIT_RUNS, settings)
    remember(settings, result, checks)
    return result


def audited_sources(spark: SparkSession, settings: Settings) -> list[registry.SourceTables]:
    """Every declared source whose tables ingest has made (docs/contract.md §10): a
    source declared but never started has nothing to audit yet."""
    from spark_jobs.engine import lake
    from warehouse import sources

    found = [registry.source_tables(name) for name in sorted(sources.discover())]
    return [src for src in found if lake.exists(spark, src.bronze.path(settings))]


def _last_file(settings: Settings) -> Path:
    return settings.state_dir / "audit" / "last.json"


def remember(settings: Settings, run: Run, checks: list[str]) -> None:
    """The verdict, for the view host's metrics (`regauge_audit_age_seconds`,
    `regauge_audit_passed`) and `regauge status`: gold.audit_runs has the detail."""
    replace_json(
        _last_file(settings),
        {
            "run_id": run.run_id,
            "finished_at": time.time(),
            "passed": run.passed,
            "checks": checks,
            "failed": sum(not f.passed for f in run.findings),
            "findings": len(run.findings),
        },
    )


def last_result(settings: Settings) -> dict[str, Any] | None:
    """The last audit's verdict, or None if no audit has finished here."""
    try:
        loaded: dict[str, Any] = json.loads(_last_file(settings).read_text())
    except (OSError, ValueError):
        return None
    return loaded


def verdict(run: Run) -> str:
    """What failed, with its keys, and the one-line result."""
    failed = [f for f in run.findings if not f.passed]
    lines = [
        f"\nFAILED {f.check} {f.subject}: {f.summary}\n  {json.dumps(f.detail, default=str)}"
        for f in failed
    ]
    lines.append(
        f"\naudit {run.run_id}: {'PASSED' if run.passed else 'FAILED'} "
        f"({len(run.findings) - len(failed)} of {len(run.findings)} checks passed); "
        f"details in {registry.GOLD_AUDIT_RUNS.trino_name}"
    )
    return "\n".join(lines)
