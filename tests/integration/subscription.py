"""A subscriber as a user runs it, for the tests that follow a view's change topics."""

from __future__ import annotations

import collections
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from warehouse.ops import exporter
from warehouse.ops.subscribe import Change, Copy

Rows = list[dict[str, Any]]


class Subscription:
    """`regauge subscribe VIEW --user U --from-start --format json --metrics-port P`, a
    process of its own, with every line it prints applied to a local copy."""

    def __init__(self, view: str, user: str, log: Path) -> None:
        self.copy = Copy()
        self.resets: list[int | None] = []
        # Every op printed, to hold against the subscriber's own metrics.
        self.ops: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._log: IO[str] = log.open("w")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        argv = ["subscribe", view, "--user", user, "--from-start", "--format", "json"]
        argv += ["--metrics-port", str(port)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "warehouse.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            change = Change(**json.loads(line, parse_float=Decimal))
            with self._lock:
                self.copy.apply(change)
                self.ops[change.op] += 1
                if change.op in ("reset", "waiting"):
                    self.resets.append(change.version)

    def counted(self) -> dict[str, float]:
        """What the subscriber's metrics say it applied, by op."""
        return exporter.by_label(
            exporter.scrape(self.metrics_url), "regauge_subscriber_changes_total", "op"
        )

    def printed(self) -> dict[str, float]:
        with self._lock:
            return {op: float(n) for op, n in self.ops.items()}

    def rows(self) -> Rows:
        with self._lock:
            return list(self.copy.rows.values())

    def wait_equal(self, shape: Callable[[Rows], Any], want: Any, timeout: float = 180) -> None:
        """Wait until `shape(copy's rows)` equals `want`."""
        deadline = time.monotonic() + timeout
        while (got := shape(self.rows())) != want:
            assert self.proc.poll() is None, f"the subscriber ended: {self.proc.returncode}"
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the subscriber's copy (v{self.copy.version}, gold commit "
                    f"{self.copy.gold_version}) differs from what is served: "
                    f"{_difference(got, want)}"
                )
            time.sleep(0.5)  # a local copy: cheap to look at

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self._log.close()


def _difference(got: Any, want: Any) -> str:
    if isinstance(got, list) and isinstance(want, list):
        return (
            f"{len(got)} rows against {len(want)}: missing {sorted(set(want) - set(got))[:5]}, "
            f"unexpected {sorted(set(got) - set(want))[:5]}"
        )
    return f"{got!r} against {want!r}"
