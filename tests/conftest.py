"""Fixtures shared by every test: the settings and one Spark session per run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_jobs.session import build_session
from warehouse.base import settings as settings_mod
from warehouse.base.settings import Settings


@pytest.fixture(scope="session")
def settings() -> Settings:
    return settings_mod.get()


@pytest.fixture(scope="session")
def spark(settings: Settings) -> Iterator[SparkSession]:
    """One session for the whole run: starting a JVM costs seconds."""
    session = build_session("regauge-tests", settings, ui=False)
    yield session
    session.stop()
