"""The real local stack, started once per test session with the same code as `make up`.

A service that cannot start fails the tests with its reason (never a skip).
Services this fixture started are stopped at the end; ones already running
before the tests (a developer's stack) are left as they were.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from warehouse.base import settings as settings_mod
from warehouse.base.settings import Settings
from warehouse.ops import airflow_client, ingest_ctl, streams, writers
from warehouse.ops.stack import services
from warehouse.ops.stack.supervisor import Supervisor

# These modules run first, in this order; the others after them, as collected. The
# marts test_dbt.py builds hold the customer test_audit.py's erasure forgets, which
# then need no dbt run of its own (a cold process, a minute of the suite). The lake
# only grows, and the modules that replay, validate or compact all of it come before
# the ones that produce the most (test_chaos.py, test_ingest.py): on the lake of
# 2026-12-03's order they replayed about 63,000 events where they now find about
# 13,000. The audit's erasure comes before the views' modules, so it rewrites no
# more view tables than it did. Maintenance comes before test_versions.py, whose
# streams commit every 150 events: in stop 105's runs silver held 482 files when it
# was maintained, 329 of them from those commits (16 of the task's 88 s), and the
# rollouts' replays then read silver compacted.
FIRST_MODULES = (
    "test_analysts.py",
    "test_dbt.py",
    "test_audit.py",
    "test_views.py",
    "test_maintenance.py",
    "test_versions.py",
)
# And these last, in this order: the big producers, then test_sources.py, which
# leaves the lake at the shop's contract version 2, which the generator's
# expectations (written for §1) do not know.
LAST_MODULES = ("test_chaos.py", "test_ingest.py", "test_sources.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        if "tests/integration/" not in str(item.fspath):
            return -1  # the cluster's tests, before the local stack starts
        name = item.path.name
        if name in LAST_MODULES:
            return len(FIRST_MODULES) + 1 + LAST_MODULES.index(name)
        return FIRST_MODULES.index(name) if name in FIRST_MODULES else len(FIRST_MODULES)

    for item in items:
        if "tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
    items.sort(key=rank)  # stable: the order within each rank stays


# Paused while the tests run. The hourly audit: the tests run the audit themselves,
# and a scheduled run (144 s of Spark alone, docs/SCALING.md) would take the 2 cores
# at whatever point of the suite the hour struck. The watchdog: a task and a CLI
# process every minute; the tests that need it (test_versions.py) unpause it.
QUIET_DAGS = ("regauge_audit", "regauge_watchdog")
# Lines of the view host's log shown under a failed test.
HOST_LOG_TAIL = 40


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Under a failed test, the end of the view host's log (ingest and the streams run
    there, in another process, so a fault of theirs shows nowhere else) and the
    status ingest last reported."""
    report = yield
    if report.failed and call.when in ("setup", "call"):
        settings = settings_mod.get()
        log = streams.host(settings).log
        lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
        status = ingest_ctl.read_status(settings)
        report.sections.append(
            (
                f"view host ({log}, last {HOST_LOG_TAIL} lines; ingest status {status})",
                "\n".join(lines[-HOST_LOG_TAIL:]) or "(no log)",
            )
        )
        # Who held the pipeline's writer locks when the test failed: a holder left
        # over from an earlier test (an erasure still running in Airflow, say)
        # refuses every ingest after it.
        held = {
            lock.stem: writers.holder_of(lock)
            for lock in sorted((settings.state_dir / "writers").glob("*.lock"))
            if writers.busy(settings, lock.stem.replace("_", " ")) is not None
        }
        report.sections.append(("writer locks held", str(held or "none")))
    return report


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Iterator[list[services.Service]]:
    all_services = services.services(settings)
    already = {svc.name for svc in all_services if svc.running()}
    was_paused: dict[str, bool] = {}
    try:
        services.up(settings)
        airflow = airflow_client.Client(settings)
        was_paused = airflow.quiet(QUIET_DAGS)
        yield all_services
    finally:
        if was_paused:
            # The stack's state outlives the tests: a developer's stack keeps its audit.
            airflow.restore(was_paused)
        if not already:
            # A stack the tests started leaves nothing running: the watchdog may
            # have started the view host, and it would outlive Kafka.
            services.down(settings, ["airflow"])
            streams.shutdown(settings)
            ingest_ctl.stop(settings)
        services.stop_together([s for s in reversed(all_services) if s.name not in already])
        if not already:
            Supervisor.of_state(settings.state_dir).shutdown_if_idle()
