"""The whole stack's peak resident memory, sampled every second while the phases run."""

from __future__ import annotations

import os
import threading

from warehouse.base.settings import Settings


class PeakMemory:
    """Samples the whole stack's resident memory every second; `peak` in bytes.

    The stack is every service's process group, the ingest and view-stream
    daemons, and this process's own Spark JVM (where the bench runs ingest and
    the replay). The bench's Python process itself is left out: it only holds
    the records it is about to send.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.peak = 0
        self.at_peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-memory")

    def sample(self) -> dict[str, int]:
        """Resident bytes now, per part of the stack."""
        from warehouse.ops import streams
        from warehouse.ops.stack import process, services

        parts: dict[str, int] = {}
        for svc in services.services(self.settings):
            pids = [pid for pid in svc.live_pids().values() if pid is not None]
            parts[svc.name] = sum(process.group_rss_bytes(pid) for pid in pids)
        # Ingest and every view stream run in the view host's one JVM.
        host_pid = streams.host(self.settings).pid()
        parts["view host"] = process.group_rss_bytes(host_pid) if host_pid else 0
        parts["bench spark"] = process.descendants_rss_bytes(os.getpid())
        return parts

    def _run(self) -> None:
        while not self._stop.is_set():
            parts = self.sample()
            if sum(parts.values()) > self.peak:
                self.peak, self.at_peak = sum(parts.values()), parts
            self._stop.wait(1.0)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
