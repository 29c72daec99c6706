"""Fixtures shared by every test: the settings and one Spark session per run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_jobs.session import INTERPRETED_CONF, build_session
from warehouse.base import settings as settings_mod
from warehouse.base.settings import Settings


@pytest.fixture(scope="session")
def settings() -> Settings:
    return settings_mod.get()


@pytest.fixture(scope="session")
def spark(settings: Settings) -> Iterator[SparkSession]:
    """One session for the whole run: starting a JVM costs seconds.

    Without generated code: the tests' data are a few rows to some thousands, for
    which compiling each query (Janino, then the JIT) costs more than it saves.
    tests/spark_jobs/views/test_scope.py took 173 s instead of 245 s on 2 cores.
    Live batches run this way too (`runner.LIVE_SESSION_CONF`); test_runner.py
    compares them with a replay and a batch that compile theirs, and the
    integration tests' view host runs as deployed.
    """
    session = build_session("regauge-tests", settings, ui=False, extra_conf=INTERPRETED_CONF)
    yield session
    session.stop()
