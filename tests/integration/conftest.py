"""The real local stack, started once per test session with the same code as `make up`.

A service that cannot start fails the tests with its reason (never a skip).
Services this fixture started are stopped at the end; ones already running
before the tests (a developer's stack) are left as they were.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from warehouse.base.settings import Settings
from warehouse.ops import ingest_ctl, streams
from warehouse.ops.stack import services


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Iterator[list[services.Service]]:
    all_services = services.services(settings)
    already = {svc.name for svc in all_services if svc.running()}
    try:
        for svc in all_services:
            svc.start()
        yield all_services
    finally:
        if not already:
            # A stack the tests started leaves nothing running: the watchdog may
            # have started the view host, and it would outlive Kafka.
            services.down(settings, ["airflow"])
            streams.stop_host(settings)
            ingest_ctl.stop(settings)
        for svc in reversed(all_services):
            if svc.name not in already:
                svc.stop()
