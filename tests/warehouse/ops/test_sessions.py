"""Where a task's Spark work runs: what the view host serves, and when a task may use it.

Real sockets and files; the Spark Connect round trip itself runs against the
view host in tests/integration/test_versions.py.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jobs.engine import session
from tests.ports import free_port
from warehouse.base.settings import Settings
from warehouse.ops import sessions, streams
from warehouse.ops.daemon import Daemon


@pytest.fixture()
def private(settings: Settings, tmp_path: Path) -> Settings:
    return dataclasses.replace(settings, state_dir=tmp_path)


@pytest.fixture()
def token_env() -> Iterator[None]:
    """`serve` hands the token to the JVM through this process's environment."""
    before = os.environ.get(session.CONNECT_TOKEN_ENV)
    yield
    if before is None:
        os.environ.pop(session.CONNECT_TOKEN_ENV, None)
    else:
        os.environ[session.CONNECT_TOKEN_ENV] = before


def test_the_host_serves_connect_on_loopback_with_a_private_token(
    private: Settings, token_env: None
) -> None:
    port = free_port()
    conf, status = sessions.serve(dataclasses.replace(private, spark_connect_port=port))
    assert conf["spark.plugins"] == session.CONNECT_PLUGIN
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.connect.grpc.binding.port"] == str(port)
    assert status == {"spark_connect": f"sc://localhost:{port}"}
    # The token is in no spark.* setting (spark-submit's command line shows those).
    token_file = sessions.token_file(private)
    token = token_file.read_text()
    assert len(token) >= 32 and all(token not in v for v in conf.values())
    assert os.environ[session.CONNECT_TOKEN_ENV] == token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    # A new start, a new token.
    sessions.serve(dataclasses.replace(private, spark_connect_port=port))
    assert token_file.read_text() != token


def test_a_taken_port_leaves_the_host_running_without_connect_and_says_what_to_do(
    private: Settings, token_env: None
) -> None:
    with socket.socket() as held:
        held.bind((sessions.CONNECT_HOST, 0))
        held.listen()
        port = held.getsockname()[1]
        conf, status = sessions.serve(dataclasses.replace(private, spark_connect_port=port))
    assert conf == {}
    error = status["spark_connect_error"]
    assert f"127.0.0.1:{port} is taken" in error and "REGAUGE_SPARK_CONNECT_PORT" in error
    assert not sessions.token_file(private).exists()


def test_connect_is_off_for_port_zero_and_for_an_object_store_lake(private: Settings) -> None:
    assert sessions.serve(dataclasses.replace(private, spark_connect_port=0)) == (
        {},
        {"spark_connect_error": "off (REGAUGE_SPARK_CONNECT_PORT=0)"},
    )
    conf, status = sessions.serve(dataclasses.replace(private, lake_root="s3a://bucket/lake"))
    assert conf == {} and "s3a://bucket/lake" in status["spark_connect_error"]
    off = dataclasses.replace(private, spark_connect_port=0)
    assert sessions.why_not_connect(off) == "REGAUGE_SPARK_CONNECT_PORT is 0"
    s3 = dataclasses.replace(private, lake_root="s3a://bucket/lake")
    assert sessions.why_not_connect(s3) == "the lake is not local (s3a://bucket/lake)"


def test_a_task_uses_the_host_only_when_it_runs_and_serves_connect(
    private: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This test's process may hold the suite's classic session; that reason is
    # checked before the host's, so take it out of the question here.
    monkeypatch.setattr(sessions.SparkContext, "_active_spark_context", None)
    assert sessions.why_not_connect(private) == "the view host is not running"
    host = streams.host(private)
    host.base.mkdir(parents=True, exist_ok=True)
    # A status file naming a pid supervisord does not run is old news.
    host.write_status(state="running", pid=os.getpid(), spark_connect="sc://localhost:15999")
    assert sessions.why_not_connect(private) == "the view host is not running"
    # As if supervisord ran this process as the host.
    monkeypatch.setattr(Daemon, "pid", lambda self: os.getpid())
    host.write_status(state="running", pid=os.getpid(), spark_connect_error="the port is taken")
    assert sessions.why_not_connect(private) == (
        "the view host serves no Spark Connect (the port is taken)"
    )
    host.write_status(state="running", pid=os.getpid(), spark_connect="sc://localhost:15999")
    assert sessions.why_not_connect(private) == f"no token at {sessions.token_file(private)}"
    sessions.token_file(private).write_text("t")
    assert sessions.why_not_connect(private) is None
    # The port is the one the host serves, whatever this process's settings say.
    assert private.spark_connect_port != 15999
    assert sessions._served_port(host.read_status()) == 15999
