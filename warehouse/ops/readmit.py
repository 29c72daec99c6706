"""`regauge readmit` and `regauge sources deploy`: a source's contract version moves on,
and the records quarantined under an older one come back (docs/contract.md §10).

Both stop ingest between micro-batches and hold its lock while they write: ingest
reads the contract version when it starts, and re-admission's commits must not
interleave with a batch's on the same event ids. Ingest is then as it was, whether
they succeeded or not. The view streams run on: they follow silver's change feed
and fold the re-admitted events in like late ones. Spark runs in a driver of its
own: the work reads Delta's transaction ids through the JVM, which Spark Connect
does not expose."""

from __future__ import annotations

import contextlib
import getpass
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from warehouse import sources
from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.ops import ingest_ctl, sessions
from warehouse.sql import readmissions

log = logging.getLogger(__name__)

OWN_DRIVER = "it reads Delta's transaction ids through the JVM"
UNSUPPORTED = "unsupported_schema_version"


@contextlib.contextmanager
def _session(
    settings: Settings, app_name: str, spark: SparkSession | None
) -> Iterator[SparkSession]:
    """`spark` as given (left running), or a driver of the command's own."""
    if spark is not None:
        yield spark
        return
    with sessions.task_session(settings, app_name, own_driver=OWN_DRIVER) as own:
        yield own


def _engine_source(name: str) -> str:
    """`name`, if it is a declared source; ValueError naming the known ones otherwise."""
    try:
        return sources.get(name).name
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


@dataclass
class Deployed:
    source: str
    before: int
    now: int
    waiting: int  # records quarantined as unsupported_schema_version

    def lines(self) -> list[str]:
        moved = "stays at" if self.before == self.now else f"moved from {self.before} to"
        out = [f"{self.source}: contract version {moved} {self.now}"]
        if self.waiting:
            out.append(
                f"{self.waiting} records are quarantined as {UNSUPPORTED}; "
                f"`regauge readmit {self.source}` validates them again under version {self.now}"
            )
        return out


def deploy(
    settings: Settings, name: str, version: int, spark: SparkSession | None = None
) -> Deployed:
    """Run `version` of the source's contract from ingest's next start on. In `spark`
    when given (a caller's own driver, as the integration tests' is), else in a
    driver of its own."""
    source = _engine_source(name)
    from spark_jobs.engine import silver

    with (
        ingest_ctl.paused(settings, f"`regauge sources deploy {source} {version}`"),
        _session(settings, "regauge-deploy", spark) as spark,
    ):
        before = silver.deploy(spark, settings, version, source)
        waiting = (
            spark.read.format("delta")
            .load(registry.source_tables(source).quarantine.path(settings))
            .where(F.col("reason") == UNSUPPORTED)
            .count()
        )
    log.info("%s: contract version %d -> %d", source, before, version)
    return Deployed(source, before, version, waiting)


@dataclass
class Run:
    readmission_id: str
    contract_version: int
    resumed: bool
    summary: str


def readmit(
    settings: Settings, name: str, reason: str = UNSUPPORTED, spark: SparkSession | None = None
) -> Run:
    """Validate again, under the contract version the lake runs, every record of the
    source quarantined with `reason`; log the run in control.readmissions. In `spark`
    when given, as `deploy`."""
    source = _engine_source(name)
    from spark_jobs.engine import readmit as engine
    from spark_jobs.engine import silver

    engine.check_reason(reason)
    with (
        ingest_ctl.paused(settings, f"`regauge readmit {source}`"),
        _session(settings, "regauge-readmit", spark) as spark,
    ):
        plan = silver.deployed_plan(spark, settings, source)
        rid, resumed = readmissions.start(
            settings, source, reason, plan.contract_version, getpass.getuser()
        )
        log.info(
            "re-admission %s of %s (%s) under contract version %d%s",
            rid,
            source,
            reason,
            plan.contract_version,
            ": resuming a run that did not finish" if resumed else "",
        )

        def counted(d: engine.Readmitted) -> None:
            readmissions.counted(settings, rid, d.examined, d.admitted, d.still_quarantined)

        try:
            done = engine.readmit(spark, settings, rid, reason, plan, counted)
        except BaseException as exc:
            readmissions.fail(settings, rid, str(exc))
            raise
        row = readmissions.finish(settings, rid)
    still = ", ".join(f"{r}={n}" for r, n in sorted(row["still_quarantined"].items()))
    summary = (
        f"{row['examined']} examined, {row['admitted']} admitted, still quarantined: "
        f"{still or 'none'}"
        + (
            f" (this try: {done.describe()})"
            if resumed
            else f"; {done.replaced_winners} later winners replaced"
        )
    )
    return Run(rid, plan.contract_version, resumed, summary)
