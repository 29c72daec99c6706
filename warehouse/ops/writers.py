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
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from warehouse.base.settings import Settings
from warehouse.base.sqlnames import check_identifier
from warehouse.ops.stack.process import ServiceError


class WriterBusy(ServiceError):
    """Another process writes this already."""


def ingest_resource() -> str:
    return "ingest"


def view_resource(view: str, version: int) -> str:
    check_identifier(view, "view")
    return f"view {view}_v{int(version)}"


class Writer:
    """The lock on one resource; `acquire` refuses at once if another process holds it."""

    def __init__(self, settings: Settings, resource: str, holder: str) -> None:
        self.resource, self.holder = resource, holder
        self.path = settings.state_dir / "writers" / (resource.replace(" ", "_") + ".lock")
        self._file: IO[str] | None = None

    def acquire(self) -> Writer:
        if self._file is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise WriterBusy(
                f"{self.resource} is being written by {holder_of(self.path)}; two writers "
                f"would corrupt it, so {self.holder} is refused: stop that one first"
            ) from None
        f.seek(0)
        f.truncate()
        since = datetime.now(UTC).isoformat(timespec="seconds")
        f.write(f"{self.holder} (pid {os.getpid()}, since {since})\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is None:
            return
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


def erasure(settings: Settings, holder: str) -> Writer:
    """Held while `regauge forget` has the pipeline stopped: the watchdog waits."""
    return Writer(settings, ERASURE, holder)


def busy(settings: Settings, resource: str) -> str | None:
    """Who holds `resource` now (None: nobody), without waiting or keeping it."""
    probe = Writer(settings, resource, "a probe")
    try:
        probe.acquire()
    except WriterBusy:
        return holder_of(probe.path)
    probe.release()
    return None
