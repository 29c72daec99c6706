"""Where a command's Spark work runs: in the view host's application, through Spark
Connect, when the host runs; else in a Spark driver of the command's own.

The view host is one long-lived Spark application (ingest and every live
view query). It also serves Spark Connect on 127.0.0.1 (`serve`), so
Airflow's replay and validate tasks run their jobs in its JVM: a gRPC
session costs about a second, where a driver of their own costs a JVM's
start and warm-up (about 20 CPU-s on 2 cores) and a heap of its own while a
reprocess runs beside the live streams.

Only a client with the host's token connects: it changes with every start
of the host and lives in a file only the host's user can read.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from spark_jobs.engine import session
from warehouse.base.settings import Settings
from warehouse.base.text import first_line
from warehouse.ops import streams
from warehouse.ops.stack import process

log = logging.getLogger(__name__)

# The only address served: clients are this machine's Airflow tasks and CLI.
CONNECT_HOST = "127.0.0.1"


def token_file(settings: Settings) -> Path:
    return streams.host(settings).base / "connect.token"


def serve(settings: Settings) -> tuple[dict[str, str], dict[str, str]]:
    """For the view host before its session starts: the Spark settings that serve
    Spark Connect, and what its status file should say of it (the endpoint, or why
    there is none). The host runs on without it: its queries matter more."""
    port = settings.spark_connect_port
    if not port:
        return {}, {"spark_connect_error": "off (REGAUGE_SPARK_CONNECT_PORT=0)"}
    if not settings.lake_is_local:
        # Connect clients reach the lake's small files (checkpoint markers) directly.
        return {}, {
            "spark_connect_error": f"served for a local lake only, not {settings.lake_root}"
        }
    if process.port_taken(port, CONNECT_HOST):
        error = (
            f"the Spark Connect port {CONNECT_HOST}:{port} is taken; set "
            "REGAUGE_SPARK_CONNECT_PORT to a free port (0: none). Until then each "
            "replay and validate task starts a Spark driver of its own"
        )
        log.error("%s", error)
        return {}, {"spark_connect_error": error}
    token = secrets.token_urlsafe(32)
    path = token_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    # The JVM this process starts next inherits it (see session.CONNECT_TOKEN_ENV).
    os.environ[session.CONNECT_TOKEN_ENV] = token
    log.info("Spark Connect at sc://localhost:%d for Airflow's tasks and the CLI", port)
    return session.connect_conf(CONNECT_HOST, port), {"spark_connect": f"sc://localhost:{port}"}


class HostLost(RuntimeError):
    """The view host stopped or restarted while a command's work ran in it: the
    work is whole or not done, and may be run again."""


def _served_port(status: dict[str, Any]) -> int | None:
    """The port the running host serves Connect on, as its status says (the
    host's settings decide it, not this process's)."""
    url = status.get("spark_connect")
    return int(str(url).rsplit(":", 1)[1]) if url else None


def why_not_connect(settings: Settings) -> str | None:
    """Why this process cannot run its Spark work in the view host (None: it can)."""
    if not settings.spark_connect_port:
        return "REGAUGE_SPARK_CONNECT_PORT is 0"
    if not settings.lake_is_local:
        # A Connect client reaches the lake's small files from this process.
        return f"the lake is not local ({settings.lake_root})"
    if SparkContext._active_spark_context is not None:
        # PySpark refuses a Connect session beside a classic one (tests, the host).
        return "this process has a Spark driver already"
    status = streams.host(settings).read_status()
    if status.get("state") != "running":
        return "the view host is not running"
    if _served_port(status) is None:
        return f"the view host serves no Spark Connect ({status.get('spark_connect_error')})"
    if not token_file(settings).is_file():
        return f"no token at {token_file(settings)}"
    return None


@contextlib.contextmanager
def task_session(
    settings: Settings, app_name: str, own_driver: str | None = None
) -> Iterator[SparkSession]:
    """A Spark session for one command's work, stopped (released) when it ends;
    a driver of its own when `own_driver` says why the work needs one.

    Raises HostLost when the work failed because the view host it ran in
    stopped or restarted meanwhile."""
    reason = own_driver or why_not_connect(settings)
    spark: SparkSession | None = None
    host_pid = streams.host(settings).pid()
    if reason is None:
        try:
            port = _served_port(streams.host(settings).read_status())
            assert port is not None
            token = token_file(settings).read_text().strip()
            spark = session.connect_session(port, token)
            spark.range(1).collect()  # the host may have restarted with a new token
            log.info(
                "%s: Spark work runs in the view host (pid %s) through Spark Connect",
                app_name,
                host_pid,
            )
        except Exception as exc:
            reason = f"could not connect to the view host ({first_line(exc)})"
            if spark is not None:
                with contextlib.suppress(Exception):
                    spark.stop()
            spark = None
    if spark is None:
        log.info("%s: starting a Spark driver of its own: %s", app_name, reason)
        _leave_connect_mode()
        spark = session.build_session(app_name, settings, ui=False)
    remote = session.is_connect(spark)
    try:
        yield spark
    except Exception as exc:
        host = streams.host(settings)
        now = host.pid()
        # A host stopping keeps its pid until it is gone, but no longer says it runs.
        if remote and (now != host_pid or host.read_status().get("state") != "running"):
            raise HostLost(
                f"{app_name}: the view host (pid {host_pid}) "
                + (f"restarted (now pid {now})" if now and now != host_pid else "stopped")
                + f" while this ran in it ({first_line(exc)})"
            ) from exc
        raise
    finally:
        if remote:
            # PySpark 4.2's stop() releases the server's session first and then
            # waits for the client's pending releases of finished operations,
            # each of which then logs an ERROR with a stack trace in the host's
            # log (INVALID_HANDLE.SESSION_CLOSED). Let them land first.
            pending = list(getattr(spark.client, "_release_futures", ()))
            concurrent.futures.wait(pending, timeout=10)
        with contextlib.suppress(Exception):  # a host gone has nothing to release
            spark.stop()
        if remote:
            _leave_connect_mode()


def _leave_connect_mode() -> None:
    """A Connect session marks the process as Connect's, which PySpark's classic
    builder would obey afterwards (and fail: no URL)."""
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
