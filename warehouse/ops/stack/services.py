"""The local stack: PostgreSQL, Kafka, Trino and Airflow, each with start, stop and status.

Every service keeps its data, config and logs under the settings' state
directory and runs under that folder's supervisord. Starting one that already
runs is a no-op; stopping one leaves it stopped.

This module holds the entry points (`up`, `down`, `services()`) and the start
order; the base class is in `base.py`, each service in its own module. The names
callers use stay importable from here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from warehouse.base.settings import Settings
from warehouse.ops.stack.airflow import AIRFLOW_VENV, Airflow
from warehouse.ops.stack.base import (
    INFRA,
    ProcStatus,
    Service,
    Starting,
    Status,
    keep_private,
    stop_together,
)
from warehouse.ops.stack.kafka import Kafka, ensure_topic, kafka_admin
from warehouse.ops.stack.postgres import Postgres
from warehouse.ops.stack.process import ServiceError
from warehouse.ops.stack.supervisor import Supervisor
from warehouse.ops.stack.trino import Trino

__all__ = [
    "AIRFLOW_VENV",
    "INFRA",
    "SERVICE_ORDER",
    "Airflow",
    "Kafka",
    "Postgres",
    "ProcStatus",
    "Service",
    "Status",
    "Trino",
    "down",
    "ensure_topic",
    "kafka_admin",
    "services",
    "stop_together",
    "up",
]

log = logging.getLogger(__name__)


SERVICE_ORDER: tuple[type[Service], ...] = (Postgres, Kafka, Trino, Airflow)


def services(settings: Settings, names: Sequence[str] = ()) -> list[Service]:
    """The services in start order, optionally only the named ones."""
    known = {cls.name: cls for cls in SERVICE_ORDER}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ServiceError(f"unknown service {', '.join(unknown)}; known: {', '.join(known)}")
    return [cls(settings) for cls in SERVICE_ORDER if not names or cls.name in names]


def up(settings: Settings, names: Sequence[str] = ()) -> None:
    """Start the chosen services and wait until each answers: PostgreSQL first and
    alone (Airflow's metadata and the roles the others log in with live there),
    then Kafka, Trino and Airflow together (`Starting`)."""
    keep_private(settings)
    starting = Starting()
    for svc in services(settings, names):
        starting.begin(svc)
        if svc.name == Postgres.name:
            starting.await_all()
    starting.done()


def down(settings: Settings, names: Sequence[str] = ()) -> None:
    chosen = list(reversed(services(settings, names)))
    stopped = stop_together(chosen)
    for svc in chosen:
        if svc.name not in stopped:
            log.info("%s was not running", svc.name)
    # With nothing left to run (the view host stopped too), supervisord goes as well.
    if Supervisor.of_state(settings.state_dir).shutdown_if_idle():
        log.info("supervisord stopped")
