"""Progress of a long Spark job (a replay, a validation), logged as it runs."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.engine import session as session_mod

log = logging.getLogger(__name__)


class Progress:
    """Logs a long Spark job's progress as events done of total, rate and time left.

    Spark reports tasks, not rows; the share of the job's tasks finished
    stands in for the share of events, which is close for a scan-heavy job.
    A session with a JVM here asks Spark's status tracker for its job group's
    tasks; a Spark Connect client is told its operations' stages as they run.
    """

    def __init__(self, spark: SparkSession, label: str, total: int, every_s: float = 5.0) -> None:
        self.spark, self.label, self.total, self.every_s = spark, label, total, every_s
        self.group = f"regauge-{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self.started = 0.0
        self.seconds = 0.0
        self.remote = session_mod.is_connect(spark)
        # Any: pyspark types the handler as its ProgressHandler class, though any
        # callable with its keyword arguments is called.
        self._handler: Any = self._heard
        # Over Spark Connect: each operation's stages as last reported, (tasks, done).
        self._operations: dict[str, list[tuple[int, int]]] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        self.started = time.monotonic()
        log.info("%s: %s events to process", self.label, f"{self.total:,}")
        if self.remote:
            self.spark.registerProgressHandler(self._handler)
        else:
            self.spark.sparkContext.setJobGroup(self.group, self.label)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.remote:
            self.spark.removeProgressHandler(self._handler)
        else:
            self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.seconds = time.monotonic() - self.started

    def _heard(
        self,
        stages: Iterable[Any] | None,
        inflight_tasks: int,
        operation_id: str | None,
        done: bool,
    ) -> None:
        """Spark Connect's report on one operation (its keyword names are the API's)."""
        seen = [(s.num_tasks, s.num_tasks if done else s.num_completed_tasks) for s in stages or ()]
        with self._lock:
            self._operations[operation_id or ""] = seen

    def share_done(self) -> float:
        if self.remote:
            with self._lock:
                reported = [st for seen in self._operations.values() for st in seen]
            total = sum(tasks for tasks, _ in reported)
            return sum(done for _, done in reported) / total if total else 0.0
        tracker = self.spark.sparkContext.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            if job is None:
                continue
            stages = [tracker.getStageInfo(i) for i in job.stageIds]
            tasks = sum(st.numTasks for st in stages if st is not None) or 1
            total += tasks
            # A finished job counts whole: stages it skipped never report tasks.
            if job.status == "SUCCEEDED":
                done += tasks
            else:
                done += sum(st.numCompletedTasks for st in stages if st is not None)
        return done / total if total else 0.0

    def _watch(self) -> None:
        shown = 0.0
        while not self._stop.wait(self.every_s):
            # A job that starts adds its tasks to the total: never report going back.
            share = shown = max(shown, self.share_done())
            elapsed = time.monotonic() - self.started
            rate = share * self.total / elapsed if elapsed else 0.0
            left = f"~{self.total * (1 - share) / rate:.0f} s left" if rate else "starting"
            log.info(
                "%s: ~%s of %s events (%.0f%%), %s events/s, %s",
                self.label,
                f"{int(share * self.total):,}",
                f"{self.total:,}",
                share * 100,
                f"{rate:,.0f}",
                left,
            )

    def summary(self) -> str:
        rate = self.total / self.seconds if self.seconds else 0.0
        return f"{self.total:,} events in {self.seconds:.1f} s ({rate:,.0f} events/s)"
