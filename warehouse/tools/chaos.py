"""`make chaos`: real faults injected into the running pipeline, each case judged exactly.

Every case sends generator traffic whose fate the contract fixes in advance
(`spark_jobs/testing/landing.py` compares the lake with it), injects its fault into
the real processes, lets the pipeline recover by itself (or, for data Kafka
deleted, waits for an operator's decision), and reports what it produced,
what reached silver, what was lost or doubled, and how long recovery took.
The audit runs last and must pass.

The cases, in the order they run (ingest is a daemon in those of
`_INGEST_DAEMON_CASES`, as in production; the others drive ingest themselves,
so it is stopped there):

- ingest_kills: kill -9 the ingest process (driver and JVM) at random
  moments while a large chaos run lands.
- broker_stop: kill -9 the Kafka broker mid-stream, restart it 15 s later.
- bad_input: poison pills of every quarantine reason, exact duplicates
  re-sent by a new producer session (so Kafka's idempotence cannot drop
  them), and producers whose clocks are days behind or minutes ahead.
- view_kills: kill -9 a view's job during a replay and during live work.
- commit_crash: die between a micro-batch's Delta commits and its
  checkpoint commit, in ingest and in a view (REGAUGE_FAULT).
- retention: Kafka deletes records ingest has not read; ingest must stop
  loudly, and move on only when an operator accepts the gap.
- lost_checkpoint: an ingest batch stops after its bronze and ledger appends,
  then ingest's checkpoint is deleted; ingest must settle what bronze holds,
  finish the batch, read Kafka on from bronze's last copy, and never double.
- concurrent_writer: a second ingest, and a view's stream beside its own
  replay, are started while traffic lands; both must be refused at once.
- postgres_down: PostgreSQL (the registry, the reference data, Airflow's
  database) stops for a minute while ingest and a view stream run; they
  must ride it out, and the watchdog must say why it cannot look meanwhile.
- disk_full: the lake's disk (a tmpfs of its own, so the real lake is never at
  risk) fills up under running ingest; ingest must say so, lose nothing, and
  resume by itself once space is freed.

Over 400 lines on purpose: one method per case, in the order above, so the
fault table `make chaos` prints reads against one file.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs import generator, producer, views
from spark_jobs.engine import contract, faults, gold_writes, ingest, restatements, runner
from spark_jobs.producer import GeneratedRun
from spark_jobs.testing.landing import Landing, fresh_seed, landing, score, wait_until_settled
from warehouse.base import registry
from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.ops import audit, ingest_ctl, pipeline, writers
from warehouse.ops.stack import process, services

log = logging.getLogger(__name__)

CASES = (
    "ingest_kills",
    "broker_stop",
    "bad_input",
    "view_kills",
    "commit_crash",
    "retention",
    "lost_checkpoint",
    "concurrent_writer",
    "postgres_down",
    "disk_full",
)
# The view the view cases kill: not in the version registry, so no stream daemon
# or watchdog competes with the job being killed.
VIEW = ("cart_sessions", 1)
# The faults are the shop's topic's: catch-ups between them ingest the shop alone.
SHOP = registry.SHOP_SOURCE
# A killed broker is restarted by supervisord; it must answer again within this.
BROKER_BACK_S = 120.0
# How long Airflow's components may take to come back once PostgreSQL does.
AIRFLOW_BACK_S = 180.0
POSTGRES_DOWN_S = 60.0
# The full disk's tmpfs before it is shrunk to full; only what is written uses memory.
DISK_FULL_ROOM = "8g"


@dataclass
class Outcome:
    """One case's figures; `ok` only if nothing was lost or doubled and nothing else differed."""

    case: str
    produced: int = 0
    in_silver: int = 0
    lost: int = 0
    doubled: int = 0
    recovery_s: float = 0.0
    note: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.lost == 0 and self.doubled == 0


def table(outcomes: list[Outcome]) -> str:
    """The summary `make chaos` ends with."""
    head = ("case", "produced", "in silver", "lost", "doubled", "recovery s", "result", "what")
    rows = [
        (
            o.case,
            f"{o.produced:,}",
            f"{o.in_silver:,}",
            f"{o.lost:,}",
            f"{o.doubled:,}",
            f"{o.recovery_s:.1f}",
            "ok" if o.ok else "FAILED",
            o.note,
        )
        for o in outcomes
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)

    def fmt(r: tuple[str, ...]) -> str:
        return "  ".join(
            c.ljust(w) if i in (0, 6, 7) else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()

    return "\n".join([fmt(head), line, *map(fmt, rows)])


@dataclass
class Chaos:
    settings: Settings
    spark: SparkSession
    rng: random.Random = field(default_factory=random.Random)
    say: Callable[[str], None] = print

    # -- helpers ---------------------------------------------------------------------
    def _judge(
        self,
        case: str,
        run: GeneratedRun,
        since: float,
        note: str,
        settings: Settings | None = None,
    ) -> tuple[Outcome, Landing]:
        """Wait until the run settles; its figures, and the lake as it was then."""
        got = wait_until_settled(self.spark, settings or self.settings, run)
        recovery = time.monotonic() - since
        result = score(run, got)
        outcome = Outcome(
            case,
            result.produced,
            result.in_silver,
            result.lost,
            result.doubled,
            recovery,
            note,
            list(result.problems),
        )
        return outcome, got

    @contextmanager
    def _producing(self, count: int, *, rate: float | None = None) -> Iterator[list[GeneratedRun]]:
        """A chaos run sent in the background while the block injects faults."""
        box: list[GeneratedRun] = []
        seed = fresh_seed()
        sender = threading.Thread(
            target=lambda: box.append(
                pipeline.produce(self.settings, seed=seed, count=count, chaos=True, rate=rate)
            ),
            name="chaos-producer",
        )
        sender.start()
        try:
            yield box
        finally:
            sender.join()
        if not box:
            raise RuntimeError("the producer thread failed; see the log above")

    def _kill_ingest(self) -> str:
        """kill -9 ingest's driver and JVM; say which batches were under way."""
        pid = ingest_ctl.pid(self.settings)
        if pid is None:
            raise RuntimeError("ingest is not running, so there is nothing to kill")
        # The status file names each query's last finished batch; the next was under way.
        done = {q: st.get("batch") for q, st in ingest_ctl.read_status(self.settings).items()}
        # Ingest runs in the view host: its driver and JVM are the host's. supervisord
        # starts the host again; the case's `ingest start` then finds it.
        process.stop_group(pid, signal.SIGKILL, 30)
        return ", ".join(f"{q} batch {0 if b is None else b + 1}" for q, b in sorted(done.items()))

    # -- the cases -------------------------------------------------------------------
    def ingest_kills(self, events: int, kills: int, rate: float | None = None) -> Outcome:
        """`kills` x kill -9 of ingest while `events` are sent (at `rate` a second, or
        as fast as Kafka takes them)."""
        ingest_ctl.start(self.settings, None)
        restarted = time.monotonic()
        with self._producing(events, rate=rate) as box:
            for k in range(1, kills + 1):
                # Inside a batch: `ingest start` returns once the query runs, and its
                # first batch after a restart, of the backlog the kill left (a few
                # thousand records), takes 5-15 s on 2 cores, so a later kill mostly
                # lands in that one; warm batches at 200 events/s take 1-2 s. (2-15 s
                # cost the suite 7 s more on average.)
                time.sleep(self.rng.uniform(2.0, 8.0))
                where = self._kill_ingest()
                self.say(f"  kill -9 {k} of {kills}: ingest died during {where or 'its start'}")
                restarted = time.monotonic()
                ingest_ctl.start(self.settings, None)
        return self._judge("ingest_kills", box[0], restarted, f"{kills} x kill -9 of ingest")[0]

    def broker_stop(self, events: int) -> Outcome:
        ingest_ctl.start(self.settings, None)
        kafka = services.Kafka(self.settings)
        # Sent over about 20 s, so the broker dies with records in flight.
        with self._producing(events, rate=events / 20) as box:
            time.sleep(self.rng.uniform(3.0, 8.0))
            pid = kafka.live_pids()["kafka"]
            if pid is None:
                raise RuntimeError("Kafka is not running; run `regauge up` first")
            process.stop_group(pid, signal.SIGKILL, 30)
            killed = time.monotonic()
            # Nobody starts it but supervisord.
            back = process.wait_until(
                lambda: kafka.live_pids()["kafka"] not in (None, pid) and kafka.healthy(),
                BROKER_BACK_S,
            )
            restarted = time.monotonic()
            self.say(
                f"  kill -9 Kafka broker; supervisord had it back in {restarted - killed:.0f} s"
                if back
                else f"  kill -9 Kafka broker; not back within {BROKER_BACK_S:.0f} s"
            )
        outcome, _ = self._judge(
            "broker_stop", box[0], restarted, "broker kill -9, restarted by supervisord"
        )
        if not back:
            outcome.problems.append(
                f"supervisord did not restart Kafka within {BROKER_BACK_S:.0f} s; see "
                f"{kafka.supervisor.log}"
            )
            kafka.start()
        if ingest_ctl.pid(self.settings) is None:
            outcome.problems.append("ingest exited instead of riding out the broker's absence")
        return outcome

    def bad_input(self, events: int) -> Outcome:
        ingest_ctl.start(self.settings, None)
        seed = fresh_seed()
        run = pipeline.produce(self.settings, seed=seed, count=events, chaos=True)
        # Exact re-sends by another producer: a new idempotence session, so the broker
        # stores them again at new offsets and only silver's dedup can catch them.
        valid = [r for r in run.records if r.expect == generator.VALID]
        again = self.rng.sample(valid, max(1, len(valid) // 50))
        run = run + producer.produce_run(self.settings, seed, again)
        now = datetime.now(UTC)
        for n, skew in enumerate((timedelta(days=-2), timedelta(minutes=30)), start=1):
            skewed = generator.skewed(
                seed + n, max(100, events // 20), producer_clock=now + skew, now=now
            )
            run = run + producer.produce_run(self.settings, seed, skewed)
        outcome, got = self._judge("bad_input", run, time.monotonic(), "")
        reasons = set(got.quarantine.values())
        missing = set(contract.REASONS) - reasons
        if missing:
            outcome.problems.append(f"no quarantined record with reason {sorted(missing)}")
        skew_out = sum(1 for r in run.records if r.kind == "clock_skew" and r.expect != "valid")
        outcome.note = (
            f"{len(reasons)} reasons; {len(again):,} re-sent by a new producer; "
            f"{skew_out:,} skewed out of range"
        )
        return outcome

    def view_kills(self, events: int) -> Outcome:
        view = views.get(*VIEW)
        logfile = self._view_log()
        # The replay's JVM starts (some 15 s on 2 cores) while this process sends
        # and ingests the events; killed wherever in its replay it then is.
        began = logfile.stat().st_size if logfile.exists() else 0
        replay = _view_job(logfile, "replay")
        try:
            first = pipeline.produce(self.settings, seed=fresh_seed(), count=events, chaos=True)
            pipeline.ingest_once(self.spark, self.settings, source=SHOP)
        except BaseException:
            _stop_job(replay)
            raise
        in_replay = _kill_when(
            replay, logfile, "events to process", self.rng.uniform(0, 4), start=began
        )
        self.say(f"  kill -9 {view.name}_v{view.version} during its replay" + _missed(in_replay))
        self._rerun(view, replay=True)
        second = pipeline.produce(self.settings, seed=fresh_seed(), count=events // 2, chaos=True)
        pipeline.ingest_once(self.spark, self.settings, source=SHOP)
        job = _view_job(logfile, "stream")
        # Logged once a batch has its changes and before it applies them.
        live = _kill_when(job, logfile, "applying silver versions", self.rng.uniform(2, 10))
        self.say(f"  kill -9 {view.name}_v{view.version} during live processing" + _missed(live))
        restarted = time.monotonic()
        self._rerun(view, replay=False)
        outcome, _ = self._judge("view_kills", first + second, restarted, "")
        lost, doubled = self._view_against_code(view)
        outcome.lost += lost
        outcome.doubled += doubled
        jobs = {"in replay": in_replay, "live": live}
        missed = [when for when, landed in jobs.items() if not landed]
        killed = " and ".join(when for when in jobs if when not in missed) or "never"
        ended = f" (ended before its kill: {', '.join(missed)})" if missed else ""
        outcome.note = (
            f"{view.name}_v{view.version} killed {killed}{ended}; {lost + doubled} rows differ"
        )
        return outcome

    def commit_crash(self, events: int) -> Outcome:
        run = pipeline.produce(self.settings, seed=fresh_seed(), count=events, chaos=True)
        problems = _crash_between_commit_and_checkpoint(
            registry.ingest_checkpoint(self.settings), "silver_after_commit", ["ingest-once"]
        )
        self.say("  ingest died after its Delta commits, before its checkpoint commit")
        restarted = time.monotonic()
        pipeline.ingest_once(
            self.spark, self.settings, source=SHOP
        )  # must skip the crashed batch's appends
        outcome, _ = self._judge("commit_crash", run, restarted, "")
        view = views.get(*VIEW)
        if not runner.has_checkpoint(self.spark, self.settings, view):
            pipeline.replay(self.spark, self.settings, view)
            pipeline.catch_up(self.spark, self.settings, view)
        pipeline.produce(self.settings, seed=fresh_seed(), count=events, chaos=True)
        pipeline.ingest_once(self.spark, self.settings, source=SHOP)
        argv = ["views", "run", view.name, str(view.version)]
        problems += _crash_between_commit_and_checkpoint(
            gold_writes.gold_table(view).checkpoint(self.settings),
            "view_after_commit",
            [*argv, "--mode", "stream", "--until-caught-up"],
        )
        self.say(f"  {view.name}_v{view.version} died after its commit, before its checkpoint")
        pipeline.catch_up(self.spark, self.settings, view)
        lost, doubled = self._view_against_code(view)
        # The repeated batch appends its restatements again: they must be skipped.
        again = self._repeated_restatements(view)
        outcome.lost += lost
        outcome.doubled += doubled + again
        outcome.problems += problems
        outcome.note = (
            f"ingest and {view.name}_v{view.version}; {lost + doubled} view rows differ, "
            f"{again} restatements repeated"
        )
        return outcome

    def retention(self, events: int) -> Outcome:
        from confluent_kafka import TopicPartition

        pipeline.ingest_once(self.spark, self.settings, source=SHOP)  # bronze has everything so far
        doomed = pipeline.produce(self.settings, seed=fresh_seed(), count=events)
        # Retention "expires" the new records before ingest copies them.
        admin = services.kafka_admin(self.settings)
        partitions = [
            TopicPartition(registry.TOPIC, p, -1) for p in range(self.settings.kafka_partitions)
        ]
        for future in admin.delete_records(partitions).values():
            future.result(timeout=30)
        accepted = None
        try:
            problems = self._stops_on_the_gap()
            restarted = time.monotonic()
            # The operator's call, as they make it: the lake must be free for it.
            accepted = _cli("ingest-once", "--accept-data-loss")
            if accepted.returncode != 0:
                problems.append(
                    f"`regauge ingest-once --accept-data-loss` after the gap: exit "
                    f"{accepted.returncode}, {accepted.stderr.strip()[-300:]}"
                )
        finally:
            if accepted is None or accepted.returncode != 0:
                # The gap stays in ingest's checkpoint until someone accepts it, and
                # every later ingest would stop on it: accept it here, so one failed
                # case leaves the pipeline running for the cases after it.
                ingest_ctl.stop(self.settings)
                pipeline.ingest_once(self.spark, self.settings, accept_data_loss=True, source=SHOP)
        # Records after the gap, copied by a plain run: the accepted gap stops no
        # ingest after it.
        after = pipeline.produce(self.settings, seed=fresh_seed(), count=events)
        pipeline.ingest_once(self.spark, self.settings, source=SHOP)
        outcome, _ = self._judge("retention", after, restarted, "")
        gone = landing(self.spark, self.settings, doomed)
        if gone.bronze or gone.silver:
            problems.append("records Kafka deleted before ingest read them are in the lake")
        outcome.problems += problems
        outcome.note = (
            f"{doomed.summary.produced:,} deleted by Kafka before ingest: refused until accepted"
        )
        return outcome

    def _stops_on_the_gap(self) -> list[str]:
        """Ingest in the view host, as in production, reaches the gap: it must stop,
        say why, and stay stopped (not retry past it) until the operator decides."""
        try:
            ingest_ctl.start(self.settings, None)
        except process.ServiceError as exc:  # the gap met before the query ran
            if "no longer holds records" not in str(exc):
                raise
        problems = []
        if not process.wait_until(lambda: ingest_ctl.failure(self.settings) is not None, 180):
            problems.append("ingest in the view host went on past records Kafka had deleted")
        else:
            self.say(f"  ingest stopped: {(ingest_ctl.failure(self.settings) or '')[:160]}")
            time.sleep(5.0)  # longer than the host's first backoff
            if ingest_ctl.pid(self.settings) is not None:
                problems.append("ingest started again on its own after the gap")
        ingest_ctl.stop(self.settings)
        return problems

    def lost_checkpoint(self, events: int) -> Outcome:
        first = pipeline.produce(self.settings, seed=fresh_seed(), count=events, chaos=True)
        # The worst moment to lose it: a batch stopped after its bronze and ledger
        # appends, before silver's, so both hold records silver does not.
        checkpoint = Path(registry.ingest_checkpoint(self.settings))
        problems = _crash_between_commit_and_checkpoint(
            str(checkpoint), "silver_after_ledger", ["ingest-once"]
        )
        if not checkpoint.is_dir():
            problems.append(f"no checkpoint to delete at {checkpoint}")
        shutil.rmtree(checkpoint, ignore_errors=True)
        self.say("  ingest died after its bronze and ledger appends; deleted its checkpoint")
        # Ingested once with no checkpoint (it settles what bronze holds and silver
        # never saw, finishing the stopped batch, then reads Kafka on from bronze's
        # last copy), then once more, from the new checkpoint.
        second = pipeline.produce(self.settings, seed=fresh_seed(), count=events, chaos=True)
        restarted = time.monotonic()
        pipeline.ingest_once(self.spark, self.settings, source=SHOP)
        third = pipeline.produce(self.settings, seed=fresh_seed(), count=events, chaos=True)
        pipeline.ingest_once(self.spark, self.settings, source=SHOP)
        outcome, _ = self._judge("lost_checkpoint", first + second + third, restarted, "")
        outcome.doubled += self._repeated_positions(outcome, self.settings)
        outcome.problems += problems
        outcome.note = (
            "checkpoints deleted after a batch stopped mid-way; re-read, finished, not doubled"
        )
        return outcome

    def concurrent_writer(self, events: int) -> Outcome:
        outcome, live = self._writers_refused(events)
        differ = self._view_caught_up(outcome, live)
        outcome.note += f"; {differ} view rows differ"
        return outcome

    def concurrent_writer_then_postgres_down(
        self, events: int, down_events: int, down_s: float = POSTGRES_DOWN_S
    ) -> tuple[Outcome, Outcome]:
        """`concurrent_writer`, whose view job, live by then, is the stream that
        `postgres_down` keeps running through the outage: one job's JVM start (some
        20 s and 20 CPU-s on 2 cores) instead of two, and a stream that has run
        batches when PostgreSQL goes. The view's rows are counted once, at the end."""
        writer, live = self._writers_refused(events)
        writer.note += "; view rows counted after PostgreSQL's outage"
        try:
            return writer, self.postgres_down(down_events, down_s, stream=live)
        except BaseException:
            _stop_job(live)
            raise

    def _writers_refused(self, events: int) -> tuple[Outcome, subprocess.Popen[bytes]]:
        """A second writer refused beside each (ingest, a view's replay going live) while
        `events` land; the figures, and the view's job, left running live."""
        logfile = self._view_log()
        problems: list[str] = []
        # Replays, then streams on until stopped: it holds the view's lock throughout,
        # taken before its first Spark job. Its JVM starts (some 20 s on 2 cores)
        # while ingest does, and the events are sent once it has the lock, over 10
        # s, so that they land as the refusals happen (two cold CLI commands; the
        # replay went live 13 s after taking the lock in stop 106's run).
        began = logfile.stat().st_size
        first = _view_job(logfile, "replay", until_caught_up=False)
        try:
            ingest_ctl.start(self.settings, None)
            _wait_for(first, logfile, "events to process", began)
            with self._producing(events, rate=events / 10) as box:
                self._refusals(first, logfile, began, problems)
            outcome, _ = self._judge("concurrent_writer", box[0], time.monotonic(), "")
        except BaseException:
            _stop_job(first)
            raise
        outcome.problems += problems
        outcome.note = (
            f"ingest-once beside ingest, a stream beside a replay: {2 - len(problems)} of 2 refused"
        )
        return outcome, first

    def _refusals(
        self, first: subprocess.Popen[bytes], logfile: Path, began: int, problems: list[str]
    ) -> None:
        """While `first` (a replay going live) holds the chaos view, try a second writer of
        it and of ingest; each must be refused at once, naming the holder."""
        name, version = VIEW
        _wait_for(first, logfile, "events to process", began)
        for argv, holder in (
            (["ingest-once"], "the view host"),
            (
                ["views", "run", name, str(version), "--mode", "stream"],
                "`regauge views run --mode replay`",
            ),
        ):
            second = _cli(*argv)
            if second.returncode != 2 or f"is being written by {holder}" not in second.stderr:
                problems.append(
                    f"`regauge {' '.join(argv)}` beside {holder} was not refused: exit "
                    f"{second.returncode}, {second.stderr.strip()[-300:]}"
                )
            else:
                self.say(f"  refused: {second.stderr.strip().splitlines()[-1][:150]}")
        if first.poll() is not None:
            problems.append("the view job holding the lock ended early:\n" + process.tail(logfile))
        else:
            # Stopped once live (a replay stopped part-way leaves no stream to resume).
            _wait_for(first, logfile, "recomputed from", began)

    def postgres_down(
        self,
        events: int,
        down_s: float = POSTGRES_DOWN_S,
        stream: subprocess.Popen[bytes] | None = None,
    ) -> Outcome:
        """PostgreSQL stopped for `down_s` under ingest and the chaos view's `stream`
        (a job started here if None)."""
        ingest_ctl.start(self.settings, None)
        view = views.get(*VIEW)
        if stream is None:
            if not runner.can_stream(self.spark, self.settings, view):
                self._rerun(view, replay=True)
            stream = _view_job(self._view_log(), "stream", until_caught_up=False)
        postgres = services.Postgres(self.settings)
        airflow = services.Airflow(self.settings)
        airflow_pids = airflow.live_pids()
        problems = []
        try:
            with self._producing(events, rate=events / down_s) as box:
                time.sleep(3.0)
                postgres.stop()
                down_at = time.monotonic()
                self.say(f"  PostgreSQL stopped; down for {down_s:.0f} s")
                # The watchdog cannot read the registry: it must say so, and change nothing.
                watchdog = _cli("streams", "ensure")
                if watchdog.returncode != 2 or "PostgreSQL is not reachable" not in watchdog.stderr:
                    problems.append(
                        f"the watchdog without PostgreSQL: exit {watchdog.returncode}, "
                        f"{watchdog.stderr.strip()[-300:]}"
                    )
                time.sleep(max(0.0, down_s - (time.monotonic() - down_at)))
        except BaseException:
            _stop_job(stream)
            raise
        finally:
            postgres.start()  # never left down, whatever happened above
        restarted = time.monotonic()
        for what, alive in (
            ("ingest", ingest_ctl.pid(self.settings) is not None),
            (f"{view.name}_v{view.version}'s stream", stream.poll() is None),
        ):
            if not alive:
                problems.append(f"{what} exited while PostgreSQL was down")
        # Airflow's scheduler and DAG processor exit when their database
        # goes away; supervisord starts them again (with a growing backoff) until
        # it is back. Nobody else may.
        airflow_died = airflow.live_pids() != airflow_pids
        if not process.wait_until(airflow.healthy, AIRFLOW_BACK_S, interval=2.0):
            problems.append(
                f"Airflow was not healthy within {AIRFLOW_BACK_S:.0f} s of PostgreSQL's return; "
                f"supervisord's view: {[(p.name, p.state) for p in airflow.status().procs]}"
            )
            services.up(self.settings, ["airflow"])
        elif airflow_died:
            self.say("  Airflow's components exited without PostgreSQL; supervisord restarted them")
        watchdog = _cli("streams", "ensure")
        if watchdog.returncode != 0:
            problems.append(f"the watchdog still fails: {watchdog.stderr.strip()[-300:]}")
        outcome, _ = self._judge("postgres_down", box[0], restarted, "")
        differ = self._view_caught_up(outcome, stream)
        outcome.problems += problems
        outcome.note = (
            f"PostgreSQL down {down_s:.0f} s under ingest and a stream; "
            f"{differ} view rows differ; Airflow "
            + ("exited, restarted by supervisord" if airflow_died else "rode it out")
        )
        return outcome

    def disk_full(self, events: int) -> Outcome:
        mount = self.settings.state_dir / "chaos" / "full_disk"
        # A lake of its own on the small disk; state (logs, status) stays on the big one,
        # and nothing is published to Trino, which keeps reading the real lake.
        full = replace(
            self.settings,
            lake_root=str(mount / "lake"),
            state_dir=self.settings.state_dir / "chaos" / "full_disk_state",
        )
        problems = []
        with _tmpfs(mount, DISK_FULL_ROOM):
            ingest.run_once(self.spark, full, source=SHOP)  # the topic so far, copied
            said = _Messages("spark_jobs.engine.ingest")
            stop = threading.Event()
            running = threading.Thread(
                target=ingest.run,
                args=(self.spark, full, stop),
                kwargs={"status_file": full.state_dir / "ingest" / "status.json"},
                name="chaos-ingest-on-full-disk",
            )
            running.start()
            try:
                _fill(mount)
                self.say(f"  the lake's disk is full ({mount})")
                run = pipeline.produce(self.settings, seed=fresh_seed(), count=events, chaos=True)
                message = said.wait_for("disk is full", 180)
                if message is None:
                    problems.append("ingest never said that the disk is full")
                else:
                    self.say(f"  ingest said: {message[:160]}")
                _mount_tmpfs(mount, DISK_FULL_ROOM, remount=True)
                (mount / "filler").unlink()
                self.say("  space freed")
                restarted = time.monotonic()
                outcome, _ = self._judge("disk_full", run, restarted, "", full)
            finally:
                stop.set()
                running.join(300)
                said.close()
                if running.is_alive():
                    # Unmounting now would let its writes land on the disk underneath.
                    raise RuntimeError(f"ingest on {mount} did not stop; left mounted")
            outcome.doubled += self._repeated_positions(outcome, full)
        outcome.problems += problems
        outcome.note = "lake disk full under running ingest; resumed when freed"
        return outcome

    def audit(self) -> Outcome:
        result = audit.run(self.settings, self.spark)
        failed = [f for f in result.findings if not f.passed]
        return Outcome(
            "audit",
            note=f"{len(result.findings) - len(failed)} of {len(result.findings)} checks passed",
            problems=[f"{f.check} {f.subject}: {f.summary}" for f in failed],
        )

    def _view_log(self) -> Path:
        """Where the chaos view's jobs write, one file for every case."""
        logfile = self.settings.state_dir / "chaos" / "view.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        return logfile

    def _repeated_positions(self, outcome: Outcome, settings: Settings) -> int:
        """Positions the ledger or the quarantine holds twice (`landing` counts bronze, silver)."""
        repeated = 0
        for table in (registry.SILVER_LEDGER, registry.SILVER_QUARANTINE):
            again = (
                self.spark.read.format("delta")
                .load(table.path(settings))
                .groupBy("partition", "offset")
                .count()
                .where("count > 1")
                .count()
            )
            if again:
                outcome.problems.append(f"{again:,} positions twice in {table.key}")
            repeated += again
        return repeated

    def _view_caught_up(self, outcome: Outcome, live: subprocess.Popen[bytes]) -> int:
        """Stop the chaos view's live job, catch it up, and count its rows against its code.

        Call once the traffic is settled in silver, or the catch-up misses some of it.
        """
        _stop_job(live)
        view = views.get(*VIEW)
        self._rerun(view, replay=False)
        lost, doubled = self._view_against_code(view)
        outcome.lost += lost
        outcome.doubled += doubled
        return lost + doubled

    def _rerun(self, view: views.View, *, replay: bool) -> None:
        """What `regauge views run --until-caught-up` does after a job was stopped or
        killed (`--mode replay` if `replay`): in this process's Spark, not a new
        JVM's (some 20 CPU-s on 2 cores), since the fault was the other process's.
        The writer's lock is taken as `views run` takes it, so one the stopped job
        left held would still show."""
        with writers.view(self.settings, view.name, view.version, "`regauge chaos`"):
            if replay:
                pipeline.replay(self.spark, self.settings, view)
            pipeline.catch_up(self.spark, self.settings, view)

    def _repeated_restatements(self, view: views.View) -> int:
        """Restatement rows of the view beyond one per key."""
        table = self.spark.read.format("delta").load(restatements.RESTATEMENTS.path(self.settings))
        mine = table.where((F.col("view") == view.name) & (F.col("version") == view.version))
        counts = mine.groupBy(*restatements.RESTATEMENT_KEY).count()
        (extra,) = counts.agg(F.sum(F.col("count") - 1)).first() or (None,)
        return int(extra or 0)

    def _view_against_code(self, view: views.View) -> tuple[int, int]:
        """(rows the view's code gives that gold lacks, rows gold has that it does not)."""
        # Each computed once (both differences need both sides): the code's rows are
        # a whole replay of the view.
        gold = runner.read_gold(self.spark, self.settings, view).localCheckpoint()
        want = gold_writes.gold_rows(view, runner.read_silver(self.spark, self.settings))
        want = want.localCheckpoint()
        return want.exceptAll(gold).count(), gold.exceptAll(want).count()


def _view_job(log: Path, mode: str, until_caught_up: bool = True) -> subprocess.Popen[bytes]:
    """`regauge views run` for the chaos view, as an operator runs it, in its own group."""
    name, version = VIEW
    until = ["--until-caught-up"] if until_caught_up else []
    with log.open("ab") as out:
        job = subprocess.Popen(
            [
                *(sys.executable, "-m", "warehouse.cli", "views", "run", name),
                *(str(version), "--mode", mode, *until),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    return job


# The cases that run VIEW's jobs themselves, so no stream may hold its table.
_VIEW_CASES = ("view_kills", "commit_crash", "concurrent_writer", "postgres_down")
# The cases that run the ingest daemon, as in production; the others drive ingest themselves.
_INGEST_DAEMON_CASES = (
    "ingest_kills",
    "broker_stop",
    "bad_input",
    "concurrent_writer",
    "postgres_down",
)


class _Messages(logging.Handler):
    """What a logger says, kept to be waited for."""

    def __init__(self, logger: str) -> None:
        super().__init__(logging.INFO)
        self.logger = logging.getLogger(logger)
        self.said: list[str] = []
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())

    def wait_for(self, text: str, timeout: float) -> str | None:
        def found() -> str | None:
            return next((m for m in self.said if text in m), None)

        process.wait_until(lambda: found() is not None, timeout)
        return found()

    def close(self) -> None:
        self.logger.removeHandler(self)
        super().close()


def _mount_tmpfs(
    mount: Path, size: str, *, remount: bool = False, check: bool = True
) -> subprocess.CompletedProcess[str]:
    options = f"remount,size={size}" if remount else f"size={size}"
    return subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)],
        check=check,
        capture_output=True,
        text=True,
    )


@contextmanager
def _tmpfs(mount: Path, size: str) -> Iterator[None]:
    """A tmpfs at `mount` for the block (mounting needs root, as `make chaos` has here)."""
    mount.mkdir(parents=True, exist_ok=True)
    _mount_tmpfs(mount, size)
    try:
        yield
    finally:
        done = subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, text=True)
        if done.returncode != 0:
            log.error("could not unmount %s: %s", mount, done.stderr.strip())


def _fill(mount: Path) -> None:
    """Shrink the tmpfs to what it holds plus 1 MiB, and fill that MiB."""
    for attempt in range(5):
        # Ingest may write between the look and the shrink; the remount then refuses.
        used = shutil.disk_usage(mount).used
        done = _mount_tmpfs(mount, str(used + 2**20), remount=True, check=False)
        if done.returncode == 0:
            break
        if attempt == 4:
            raise RuntimeError(f"could not shrink {mount}: {done.stderr.strip()}")
        time.sleep(1.0)
    with open(mount / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass  # full


def _stop_job(job: subprocess.Popen[bytes]) -> None:
    """Stop a `regauge views run` job: SIGTERM stops its stream cleanly."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(120)


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """One `regauge` command, as an operator (or Airflow) runs it."""
    return subprocess.run(
        [sys.executable, "-m", "warehouse.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )


def _wait_for(job: subprocess.Popen[bytes], log: Path, marker: str, start: int = 0) -> None:
    """Wait until `marker` shows in the job's log after byte `start`."""

    def shown() -> bool:
        return marker in log.read_bytes()[start:].decode(errors="replace")

    if process.wait_until(shown, 300, alive=lambda: job.poll() is None, interval=0.2):
        return
    if job.poll() is not None:
        raise RuntimeError(f"the job ended before {marker!r}:\n" + process.tail(log))
    raise RuntimeError(f"never saw {marker!r} in {log}")


def _missed(landed: bool) -> str:
    return "" if landed else " (it had ended already: nothing was killed)"


def _kill_when(
    job: subprocess.Popen[bytes],
    log: Path,
    marker: str,
    extra_s: float,
    start: int | None = None,
) -> bool:
    """kill -9 the job (driver and JVM) `extra_s` after `marker` shows in its log
    (after byte `start`, or what the log holds now); whether it still ran then (a
    short job on a small lake can end first)."""
    if start is None:
        start = log.stat().st_size if log.exists() else 0
    _wait_for(job, log, marker, start)
    time.sleep(extra_s)
    # Kill before asking whether it ran: polling first would reap a job that just
    # ended, and its process group would be gone (ESRCH). An unreaped leader keeps
    # its group, and the exit status says whether the kill or the job's end came first.
    os.killpg(job.pid, signal.SIGKILL)
    return job.wait(30) == -signal.SIGKILL


def _next_batch(checkpoint: str) -> int:
    done = [int(p.name) for p in (Path(checkpoint) / "commits").glob("[0-9]*")]
    return max(done, default=-1) + 1


def _crash_between_commit_and_checkpoint(checkpoint: str, point: str, argv: list[str]) -> list[str]:
    """Run argv with the fault armed for its next batch; say what is not as planned."""
    batch = _next_batch(checkpoint)
    job = subprocess.run(
        [sys.executable, "-m", "warehouse.cli", *argv],
        env={**os.environ, faults.ENV: f"{point}:{batch}"},
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO_ROOT,
    )
    problems = []
    if job.returncode != 137:
        problems.append(
            f"{point}: exit {job.returncode}, not the fault's 137: {job.stderr[-1000:]}"
        )
    # The batch was planned (its offsets written) but never marked done.
    if not (Path(checkpoint) / "offsets" / str(batch)).exists():
        problems.append(f"{point}: batch {batch} was never planned")
    if (Path(checkpoint) / "commits" / str(batch)).exists():
        problems.append(f"{point}: batch {batch} was marked done; the fault came too late")
    return problems


def run(
    settings: Settings,
    spark: SparkSession,
    *,
    events: int,
    kills: int,
    cases: tuple[str, ...] = CASES,
    seed: int | None = None,
) -> list[Outcome]:
    """Every chosen case, then the audit; ingest is left as it was found."""
    check_view_unregistered(settings, cases)
    was_running = ingest_ctl.pid(settings) is not None
    chaos = Chaos(settings, spark, random.Random(seed))
    small = max(2_000, events // 10)
    plan: dict[str, Callable[[], Outcome]] = {
        "ingest_kills": lambda: chaos.ingest_kills(events, kills),
        "broker_stop": lambda: chaos.broker_stop(small),
        "bad_input": lambda: chaos.bad_input(small),
        "view_kills": lambda: chaos.view_kills(max(2_000, events // 20)),
        "commit_crash": lambda: chaos.commit_crash(3_000),
        "retention": lambda: chaos.retention(500),
        "lost_checkpoint": lambda: chaos.lost_checkpoint(1_000),
        "concurrent_writer": lambda: chaos.concurrent_writer(small),
        "postgres_down": lambda: chaos.postgres_down(small),
        "disk_full": lambda: chaos.disk_full(2_000),
    }
    outcomes = []
    try:
        for case in cases:
            if case not in _INGEST_DAEMON_CASES:
                ingest_ctl.stop(settings)  # these cases run ingest themselves
            print(f"chaos: {case}")
            outcome = plan[case]()
            print(f"chaos: {case} {'ok' if outcome.ok else 'FAILED'}: {outcome.note}")
            for p in outcome.problems:
                print(f"  problem: {p}")
            outcomes.append(outcome)
        ingest_ctl.stop(settings)
        pipeline.ingest_once(spark, settings)  # the audit compares caught-up layers
        print("chaos: audit")
        outcomes.append(chaos.audit())
    finally:
        if was_running:
            ingest_ctl.start(settings, None)
        else:
            ingest_ctl.stop(settings)
    return outcomes


def check_view_unregistered(settings: Settings, cases: tuple[str, ...]) -> None:
    """Refuse, before any fault, view cases whose VIEW is a registered version: its
    stream in the view host holds the table, and every job the case runs would be
    refused (`make bench` registers all three views, cart_sessions v1 included)."""
    from warehouse.sql import versions

    chosen = [c for c in cases if c in _VIEW_CASES]
    if not chosen:
        return
    name, number = VIEW
    registered = [
        v
        for v in versions.versions(settings, name)
        if v.version == number and v.status not in ("retired", "failed")
    ]
    if registered:
        raise process.ServiceError(
            f"the chaos cases {', '.join(chosen)} kill and rerun {name} v{number}'s jobs, but "
            f"{name} v{number} is registered ({registered[0].status}) and its stream holds "
            f"its table. Run the other cases (--cases), or start a new lake with `make clean` "
            "(and `make chaos` before `make bench`)"
        )
