"""The whole stack's peak resident memory, sampled every second while the phases run."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from warehouse.base.settings import Settings

if TYPE_CHECKING:
    from warehouse.ops.stack.process import ProcStat


def stack_parts(settings: Settings, stats: list[ProcStat]) -> dict[str, set[int]]:
    """The pids of each part of the stack: the view host's group, then each service's
    whole tree (Airflow's tasks and the JVMs they start too)."""
    from warehouse.ops import streams
    from warehouse.ops.stack import process, services

    # Ingest and every view stream run in the view host's one JVM (its group).
    host_pid = streams.host(settings).pid()
    claimed = {p.pid for p in stats if host_pid is not None and p.pgrp == host_pid}
    parts = {"view host": set(claimed)}
    for svc in services.services(settings):
        roots = [pid for pid in svc.live_pids().values() if pid is not None]
        mine = process.tree_pids(roots, stats) - claimed
        claimed |= mine
        parts[svc.name] = mine
    return parts


class PeakMemory:
    """Samples the whole stack's resident memory every second; the peak of each phase
    (`phase` names the one under way) in bytes, and the parts at that peak.

    The stack is every service's process group (Airflow's tasks included), the
    view host (ingest and every view stream), and this process's own Spark JVM
    (where the bench runs ingest and the replay in its first phases).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.phase = "measuring"
        self.peaks: dict[str, tuple[int, dict[str, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-memory")

    def sample(self) -> dict[str, int]:
        """Resident bytes now, per part of the stack."""
        from warehouse.ops.stack import process

        stats = list(process.proc_stats())
        rss = {p.pid: p.rss_bytes for p in stats}
        parts = {
            name: sum(rss[pid] for pid in pids)
            for name, pids in stack_parts(self.settings, stats).items()
        }
        parts["bench spark"] = process.descendants_rss_bytes(os.getpid())
        return parts

    def _run(self) -> None:
        while not self._stop.is_set():
            parts, phase = self.sample(), self.phase
            if sum(parts.values()) > self.peaks.get(phase, (0, {}))[0]:
                self.peaks[phase] = (sum(parts.values()), parts)
            self._stop.wait(1.0)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
