"""The one-box cluster, started with the same code as `make cluster-up`, once per module.

These tests run the pipeline as a user of the cluster profile would: the CLI in
subprocesses with the cluster's REGAUGE_* settings (Spark jobs submitted to the
standalone master, in local mode for `make test`'s smoke test; the lake in S3Proxy
through s3a://), and clients in this
process given the cluster's settings explicitly. The local stack's settings are
never changed here, so `pytest tests` can run both, one after the other: the
cluster is stopped when its module ends, before the local stack's tests start
(it runs first: `cluster` sorts before `integration`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence

import pytest

from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.ops.stack import cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.cluster)


# `make test`'s smoke test runs its one Spark application in local mode, on s3a all
# the same: the standalone master, its worker and an executor cost about 20 s of the
# suite, and submission to them is `make test-cluster`'s (every DAG runs there).
SMOKE_SPARK = {"REGAUGE_SPARK_MASTER": "local[2]"}
_spark: dict[str, str] = {}


@pytest.fixture(scope="module")
def cluster_settings(request: pytest.FixtureRequest) -> Iterator[Settings]:
    # Only the DAGs' and the kill test need the cluster's Airflow and its Spark;
    # `make test`'s smoke test runs one application, without their processes
    # competing for the two cores.
    full = any(item.get_closest_marker("full_cluster") for item in request.session.items)
    _spark.clear()
    if not full:
        _spark.update(SMOKE_SPARK)
    s = cluster.settings()
    already = {m.name for m in cluster.members(s) if m.running()}
    skip = () if full else ("airflow", "spark-master", "spark-worker-1", "spark-worker-2")
    try:
        cluster.up(s, skip=skip)
        yield s
    finally:
        # Whatever this fixture started goes, even half-started: the local
        # stack's tests that follow need the same ports.
        if not already:
            cluster.down(s)


def regauge(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the CLI against the cluster, as `regauge cluster run -- regauge ...` would."""
    return _run([str(REPO_ROOT / ".venv" / "bin" / "regauge"), *args], timeout)


def cluster_env() -> dict[str, str]:
    return {**os.environ, **cluster.env(), **_spark}


def _run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv,
        env=cluster_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{' '.join(argv[1:])} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc
