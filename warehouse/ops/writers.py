"""One writer at a time: ingest, and each view version's table.

Two writers of the same thing corrupt it quietly: a replay deletes the
checkpoint of the stream running beside it, and `ingest-once` beside the
ingest daemon reads Kafka from a checkpoint the daemon is moving. So every
process that writes takes the thing's lock first, and a second one is refused
at once with a message naming the holder:

- `ingest`: `regauge ingest run` (the daemon), `ingest-once`;
- `view <view>_v<N>`: `regauge views run` in any mode, the reprocess DAG's
  replay (`versions build`), and the view host for each query it runs.

The lock is an exclusive `flock` on a file under the state directory, where
regauge's processes run. The kernel releases it when its holder exits however
it exits (kill -9 included), so a crash never leaves a stale lock. The file
holds the holder's description for the message.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from warehouse.base.settings import Settings
from warehouse.base.sqlnames import check_identifier
from warehouse.ops.stack.process import ServiceError

log = logging.getLogger(__name__)


class WriterBusy(ServiceError):
    """Another process writes this already."""


def ingest_resource() -> str:
    return "ingest"


def view_resource(view: str, version: int) -> str:
    check_identifier(view, "view")
    return f"view {view}_v{int(version)}"


class Writer:
    """The lock on one resource; `acquire` refuses at once if another process holds it.

    A `shared` holder (`beside_erasure_refused`) may hold it with others like it,
    never with an exclusive one; it leaves the file's description alone.
    """

    def __init__(
        self, settings: Settings, resource: str, holder: str, shared: bool = False
    ) -> None:
        self.resource, self.holder, self.shared = resource, holder, shared
        self.path = settings.state_dir / "writers" / (resource.replace(" ", "_") + ".lock")
        self._file: IO[str] | None = None

    def acquire(self, wait_s: float = 0.0) -> Writer:
        """Take the lock; refused at once, or after `wait_s` seconds of trying."""
        if self._file is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 - held until release()
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(f, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    f.close()
                    raise WriterBusy(self._refusal()) from None
                if not told:
                    log.info("%s (for %.0f s at most)", self._refusal(), left)
                    told = True
                time.sleep(min(2.0, left))
        if not self.shared:
            f.seek(0)
            f.truncate()
            since = datetime.now(UTC).isoformat(timespec="seconds")
            f.write(f"{self.holder} (pid {os.getpid()}, since {since})\n")
            f.flush()
        self._file = f
        return self

    def _refusal(self) -> str:
        if self.shared:
            return (
                f"an erasure is running ({holder_of(self.path)}); {self.holder} beside it could "
                "bring the forgotten customer back, so it is refused: run it again once the "
                "erasure has finished (`regauge status`)"
            )
        if self.resource == ERASURE and not self.path.read_text().strip():
            return (
                f"a dbt run, table maintenance or a reprocess is running, and {self.holder} "
                "waits for it: beside an erasure, it could bring the customer back"
            )
        return (
            f"{self.resource} is being written by {holder_of(self.path)}; two writers "
            f"would corrupt it, so {self.holder} is refused: stop that one first"
        )

    def release(self) -> None:
        if self._file is None:
            return
        if not self.shared:
            self._file.truncate(0)
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()
        self._file = None

    def __enter__(self) -> Writer:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder_of(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "another process"


def ingest(settings: Settings, holder: str) -> Writer:
    return Writer(settings, ingest_resource(), holder)


def view(settings: Settings, view_name: str, version: int, holder: str) -> Writer:
    return Writer(settings, view_resource(view_name, version), holder)


ERASURE = "erasure"


# How long an erasure waits for a dbt run, maintenance or a reprocess to finish.
ERASURE_WAITS_S = 1800.0


def erasure(settings: Settings, holder: str) -> Writer:
    """Held while `regauge forget` has the pipeline stopped: the watchdog waits."""
    return Writer(settings, ERASURE, holder)


def beside_erasure_refused(settings: Settings, holder: str) -> Writer:
    """A shared hold on the erasure's lock, for work that could bring a forgotten
    customer back if it ran beside an erasure: a dbt run (an incremental model
    merging rows it read before the deletion), table maintenance (a compaction
    rewriting files the erasure is rewriting), a new reprocess (a replay of silver
    as it was). Any number of them hold it at once; each is refused while an
    erasure runs, and an erasure waits for them (`ERASURE_WAITS_S`)."""
    return Writer(settings, ERASURE, holder, shared=True)


def busy(settings: Settings, resource: str) -> str | None:
    """Who holds `resource` now (None: nobody), without waiting or keeping it.
    Shared holders of the erasure's lock are not an erasure: a shared probe
    only fails on an exclusive holder."""
    probe = Writer(settings, resource, "a probe", shared=True)
    try:
        probe.acquire()
    except WriterBusy:
        return holder_of(probe.path)
    probe.release()
    return None
