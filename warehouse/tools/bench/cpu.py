"""Where the cores went during a phase: CPU seconds per part of the stack, the view
host's threads by kind, and each of its streaming queries' Spark task time.

A figure that misses its target by a factor of ten is either waiting or short of
CPU. These say which, and for what: freshness on 2 cores was found this way to
run with the cores nearly always busy, the view host taking most of them, and
the JIT compiler a large part of the host's share in a host's first minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse.base.settings import Settings

# HotSpot's and Spark's thread names, by what the thread does (/proc keeps the
# first 15 characters of a name).
THREAD_KINDS = (
    ("JIT", ("C1 CompilerThre", "C2 CompilerThre")),
    ("Spark tasks", ("Executor task",)),
    ("query drivers", ("stream executio",)),
    ("GC", ("GC Thread", "G1 ", "VM Thread")),
    # The host's Python process: foreachBatch bodies and their Py4J calls.
    ("Python", ("python",)),
)


def thread_kind(name: str) -> str:
    """What a thread of the view host does, from its name."""
    for kind, prefixes in THREAD_KINDS:
        if name.startswith(prefixes):
            return kind
    return "other"


def _thread_seconds(pids: Iterable[int]) -> dict[tuple[int, int], tuple[str, float]]:
    from warehouse.ops.stack import process

    return {
        (pid, tid): named for pid in pids for tid, named in process.thread_cpu_seconds(pid).items()
    }


@dataclass(frozen=True)
class Snapshot:
    at: float
    by_pid: dict[int, float]
    parts: dict[str, set[int]]
    host_threads: dict[tuple[int, int], tuple[str, float]]


def snapshot(settings: Settings) -> Snapshot:
    """Every process's CPU seconds so far, which part of the stack each belongs to,
    and the view host's threads' (the bench's own processes count as "bench")."""
    from warehouse.ops.stack import process
    from warehouse.tools.bench.memory import stack_parts

    stats = list(process.proc_stats())
    parts = stack_parts(settings, stats)
    parts["bench"] = process.tree_pids([os.getpid()], stats) - set().union(*parts.values())
    return Snapshot(
        time.monotonic(),
        {p.pid: p.cpu_seconds for p in stats},
        parts,
        _thread_seconds(parts["view host"]),
    )


@dataclass(frozen=True)
class CpuUse:
    seconds: float
    cores: int
    parts: dict[str, float]
    host_threads: dict[str, float]

    @property
    def busy(self) -> float:
        """The share of the machine's CPU time that the stack used."""
        return sum(self.parts.values()) / (self.seconds * self.cores) if self.seconds else 0.0

    def describe(self) -> str:
        used = sum(self.parts.values())
        host = ", ".join(f"{k} {v:.0f}" for k, v in _largest(self.host_threads))
        parts = ", ".join(
            f"{k} {v:.0f}" + (f" ({host})" if k == "view host" and host else "")
            for k, v in _largest(self.parts)
        )
        return (
            f"{used:.0f} of {self.seconds * self.cores:.0f} CPU-s in {self.seconds:.0f} s "
            f"({self.busy:.0%} of {self.cores} cores): {parts}"
        )


def _largest(values: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(((k, v) for k, v in values.items() if v >= 0.5), key=lambda kv: -kv[1])


def between(before: Snapshot, after: Snapshot, cores: int | None = None) -> CpuUse:
    """CPU seconds each part used from one snapshot to the next. A process that
    started in between counts from zero; one that ended in between is lost (a
    short Airflow task, say), so the parts are a floor."""
    parts: dict[str, float] = {}
    for name, pids in after.parts.items():
        for pid in pids:
            used = max(0.0, after.by_pid.get(pid, 0.0) - before.by_pid.get(pid, 0.0))
            parts[name] = parts.get(name, 0.0) + used
    threads: dict[str, float] = {}
    for key, (name, seconds) in after.host_threads.items():
        kind = thread_kind(name)
        used = max(0.0, seconds - before.host_threads.get(key, ("", 0.0))[1])
        threads[kind] = threads.get(kind, 0.0) + used
    return CpuUse(after.at - before.at, cores or os.cpu_count() or 1, parts, threads)


# -- the event log: Spark task time per streaming query ----------------------------------
def _applications(folder: Path, since_ms: float) -> Iterator[list[Path]]:
    """Each application's event files in `folder` that were written since `since_ms`,
    in the order Spark wrote them (events_1_..., events_2_..., ..., events_10_...)."""
    for app in sorted(folder.glob("eventlog_v2_*")):
        files = sorted(app.glob("events_*"), key=lambda p: int(p.name.split("_")[1]))
        try:
            # Earlier runs' logs stay in the folder (`keep_newest`); one not
            # written since holds no job of the phase.
            if files and files[-1].stat().st_mtime * 1000 >= since_ms:
                yield files
        except FileNotFoundError:
            continue


def _events(files: list[Path]) -> Iterator[dict[str, Any]]:
    for path in files:
        with path.open() as lines:
            for line in lines:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # the line a running application is writing


def keep_newest(folder: Path, applications: int) -> list[Path]:
    """Delete all but the newest applications' event logs in `folder` (a full bench
    run writes about 200 MB of them); returns what it deleted."""

    def written(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    logs = sorted(folder.glob("eventlog_v2_*"), key=written, reverse=True)
    for old in logs[applications:]:
        shutil.rmtree(old, ignore_errors=True)
    return logs[applications:]


def task_seconds_by_query(folder: Path, since_ms: float) -> dict[str, float]:
    """Spark task time (launch to finish, summed) of the jobs submitted since
    `since_ms` (epoch ms), per streaming query name, from every application's
    event log in `folder` written since; work outside a query (a task through
    Spark Connect, a bench phase's own) counts as "other"."""
    seconds: dict[str, float] = {}
    for files in _applications(folder, since_ms):
        names: dict[str, str] = {}
        job_query: dict[int, str] = {}
        stage_job: dict[int, int] = {}
        by_query: dict[str, float] = {}
        for e in _events(files):
            kind = str(e.get("Event"))
            if kind.endswith(("QueryStartedEvent", "QueryProgressEvent")):
                about = e.get("progress", e)
                if "id" in about:
                    names[str(about["id"])] = str(about.get("name"))
            elif kind == "SparkListenerJobStart" and e.get("Submission Time", 0) >= since_ms:
                job = int(e["Job ID"])
                props = e.get("Properties") or {}
                job_query[job] = str(props.get("sql.streaming.queryId") or "")
                for stage in e.get("Stage IDs") or []:
                    stage_job[int(stage)] = job
            elif kind == "SparkListenerTaskEnd" and e.get("Stage ID") in stage_job:
                info = e.get("Task Info") or {}
                if "Finish Time" in info and "Launch Time" in info:
                    query = job_query[stage_job[e["Stage ID"]]]
                    ran = (info["Finish Time"] - info["Launch Time"]) / 1000
                    by_query[query] = by_query.get(query, 0.0) + ran
        # Named at the end: a query's name may come after its first tasks.
        for query, ran in by_query.items():
            name = names.get(query, "other") if query else "other"
            seconds[name] = seconds.get(name, 0.0) + ran
    return seconds


def describe_tasks(seconds: dict[str, float]) -> str:
    total = sum(seconds.values())
    return (
        ", ".join(f"{name} {s:.0f} s ({s / total:.0%})" for name, s in _largest(seconds))
        if total
        else "none"
    )
