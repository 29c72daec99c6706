"""Lifecycle steps on one view run one at a time, serving view included (issue 19):
a step started while another holds the view's lock waits, and changes nothing
until it gets the lock."""

from __future__ import annotations

import threading
import time

import psycopg

from warehouse.base.settings import Settings
from warehouse.ops import lifecycle
from warehouse.sql import versions

VIEW = "lock_probe"


def _registered(settings: Settings) -> int:
    with psycopg.connect(settings.postgres_dsn()) as conn:
        (n,) = conn.execute(
            "SELECT count(*) FROM control.view_versions WHERE view_name = %s", [VIEW]
        ).fetchone() or (0,)
    return int(n)


def test_a_step_waits_for_the_view_lock_and_then_completes(settings, stack):
    with psycopg.connect(settings.postgres_dsn()) as conn:
        conn.execute("DELETE FROM control.view_versions WHERE view_name = %s", [VIEW])
        conn.execute(
            "INSERT INTO control.view_versions (view_name, version, status, rollout_percent) "
            "VALUES (%s, 1, 'failed', 0), (%s, 2, 'failed', 0)",
            [VIEW, VIEW],
        )
    done: list[list[str]] = []
    with versions.exclusive(settings, VIEW):
        step = threading.Thread(target=lambda: done.append(lifecycle.forget(settings, VIEW)))
        step.start()
        time.sleep(3)
        # Blocked on the lock: the registry is as it was.
        assert step.is_alive()
        assert _registered(settings) == 2
        # Another view is not held up.
        with versions.exclusive(settings, "other_probe"):
            pass
    step.join(timeout=120)
    assert not step.is_alive()
    assert _registered(settings) == 0
    assert done and done[0][-1] == f"2 versions of {VIEW} forgotten"
