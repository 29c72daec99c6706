"""The CLI's arguments, without the stack: choices that match their owners, one argument
style for view versions, and a `--help` that loads no Spark."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spark_jobs import generator
from spark_jobs.engine import runner
from warehouse.cli import main
from warehouse.cli import parser as cli
from warehouse.ops import audit
from warehouse.sql import trino_client, versions
from warehouse.tools import bench, chaos


def test_the_choices_spelled_in_the_parser_are_their_owners():
    assert cli.CHAOS_CASES == chaos.CASES
    assert cli.AUDIT_CHECKS == audit.CHECKS
    assert cli.SOURCES == runner.SOURCES == versions.SOURCES
    assert set(cli.QUERY_FORMATS) == set(trino_client.FORMATS)
    assert cli.GENERATOR_START == generator.DEFAULT_START
    assert cli.BENCH_OUT == bench.DEFAULT_OUT


def test_the_cli_knows_every_case_and_refuses_others():
    assert cli.CHAOS_CASES == chaos.CASES
    args = cli.build_parser().parse_args(["chaos", "--cases", "retention,bad_input"])
    assert args.cases == ("retention", "bad_input")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["chaos", "--cases", "meteor"])


def test_the_cli_knows_every_audit_check_and_refuses_others():
    assert cli.AUDIT_CHECKS == audit.CHECKS
    args = cli.build_parser().parse_args(["audit", "--checks", "routing,kafka_bronze"])
    assert args.checks == ("routing", "kafka_bronze")
    for bad in ("meteor", "routing,meteor", ","):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["audit", "--checks", bad])


def test_the_bench_runs_every_phase_or_a_named_subset():
    assert cli.build_parser().parse_args(["bench"]).phases == bench.PHASES
    args = cli.build_parser().parse_args(["bench", "--phases", "freshness,queries"])
    assert args.phases == ("freshness", "queries")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench", "--phases", "ingest"])


def test_maintain_takes_tables_and_a_retention_and_refuses_a_negative_one(capsys):
    args = cli.build_parser().parse_args(
        ["maintain", "--table", "silver.shop_events", "--table", "gold.x_v1", "--dry-run"]
    )
    assert (args.tables, args.retention_hours, args.dry_run) == (
        ["silver.shop_events", "gold.x_v1"],
        None,
        True,
    )
    assert cli.build_parser().parse_args(["maintain", "--retention-hours", "0.5"]).tables == []
    for bad in ("-1", "nan", "a week"):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["maintain", "--retention-hours", bad])
    assert "--retention-hours" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["views", "run", "revenue_hourly", "2"],
        ["streams", "start", "revenue_hourly", "2"],
        ["versions", "build", "revenue_hourly", "2"],
        ["retire", "revenue_hourly", "2"],
        ["rollout", "revenue_hourly", "2", "10"],
    ],
)
def test_every_command_takes_a_view_version_as_view_then_version(argv):
    args = cli.build_parser().parse_args(argv)
    assert (args.view, args.version) == ("revenue_hourly", 2)


@pytest.mark.parametrize("command", ["views run", "versions build"])
def test_every_replay_source_has_one_name(command):
    argv = [*command.split(), "revenue_hourly", "2", "--source", "kafka"]
    assert cli.build_parser().parse_args(argv).source == "kafka"
    assert cli.build_parser().parse_args(argv[:-2]).source == "bronze"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*argv[:-1], "silver"])


def _in_a_fresh_interpreter(code: str) -> str:
    """What `code` prints in a new Python: this one may have Spark loaded by other tests."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout


def test_help_and_version_answer_without_loading_spark_or_trino():
    probe = (
        "import sys\n"
        "from warehouse.cli import main\n"
        "for argv in (['--help'], ['--version'], ['views', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, (argv, exc.code)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pyspark', 'py4j', 'delta', 'trino', 'psycopg', 'confluent_kafka'))\n"
        "print('HEAVY', heavy)\n"
    )
    out = _in_a_fresh_interpreter(probe)
    assert "usage: regauge" in out
    assert "regauge 0." in out
    assert out.strip().splitlines()[-1] == "HEAVY []"


def test_settings_name_each_secret_without_printing_it():
    env = {
        "REGAUGE_TRINO_SCHEME": "https",
        "REGAUGE_TRINO_PASSWORD": "trino-pw-123",
        "REGAUGE_S3_SECRET_KEY": "s3-secret-456",
    }
    out = subprocess.run(
        [sys.executable, "-m", "warehouse.cli", "settings"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "trino-pw-123" not in out and "s3-secret-456" not in out
    shown = dict(line.split(maxsplit=1) for line in out.splitlines() if line[:1].isalpha())
    assert shown["s3_secret_key"] == shown["trino_password"] == shown["postgres_password"]
    assert shown["trino_password"] == "(set)" and shown["s3_access_key"] == "None"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["subscribe", "no_such_view", "--user", "ana"], "unknown view 'no_such_view'; known: "),
        (["subscribe", "revenue_hourly", "--user", "Robert'); DROP"], "user name"),
    ],
)
def test_subscribe_refuses_an_unknown_view_or_user_before_connecting(argv, says, capsys):
    from warehouse.cli import main

    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_subscribe_refuses_a_taken_metrics_port_before_connecting(capsys):
    import socket

    from warehouse.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["subscribe", "revenue_hourly", "--user", "ana", "--metrics-port", str(port)]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f":{port} is taken" in err and "choose another --metrics-port" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["forget", "customer", ""], "is not 1-64 characters"),
        (["forget", "customer", "x" * 65], "is not 1-64 characters"),
        (["forget", "order", "o-1"], "invalid choice: 'order'"),
        (["forget", "customer", "c-1", "--request-id", "a b"], "is not 1-250 characters"),
    ],
)
def test_forget_refuses_a_bad_id_before_anything_runs(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["forget", "customer"], "needs the customer's ID"),
        (["forget", "airflow-runs", "cust-00042"], "takes no ID"),
        (["forget", "airflow-runs", "--request-id", "r-1"], "no --request-id"),
        (["forget", "resume"], "needs an erasure_id (32 hex digits)"),
        (["forget", "resume", "cust-00042"], "needs an erasure_id (32 hex digits)"),
        (["forget", "resume", "0" * 32, "--request-id", "r-1"], "takes no --request-id"),
    ],
)
def test_forget_says_which_argument_is_wrong(argv, says, capsys):
    from warehouse.cli import main

    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_forget_reads_the_id_from_stdin_and_checks_it_there(monkeypatch, capsys):
    """`-` keeps the id out of the process list (regauge_forget passes it so)."""
    import io

    from warehouse.cli import main
    from warehouse.ops import erasure

    monkeypatch.setattr("sys.stdin", io.StringIO("x" * 65 + "\n"))
    assert main(["forget", "customer", "-"]) == 2
    assert "is not 1-64 characters" in capsys.readouterr().err
    # A good one reaches the erasure as it was given; the erasure is stood in for
    # by its report (it needs the whole stack: tests/integration/test_audit.py).
    given: list[str] = []

    def erase(_settings, customer_id, _reason, _request_id):
        given.append(customer_id)
        return erasure.Report("e-1")

    monkeypatch.setattr(erasure, "forget_customer", erase)
    monkeypatch.setattr("sys.stdin", io.StringIO("cust-00042\n"))
    assert main(["forget", "customer", "-", "--reason", "a request"]) == 0
    # Any id silver keeps (issue 68, B): only the newline that ends stdin is dropped.
    monkeypatch.setattr("sys.stdin", io.StringIO("o'brien; DROP\n x \n"))
    assert main(["forget", "customer", "-", "--reason", "a request"]) == 0
    assert given == ["cust-00042", "o'brien; DROP\n x "]
    assert "erasure e-1: 0 Kafka records forgotten" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("reason", "says"),
    [
        ("request from cust-00042", "names the customer"),
        ("<script>", "1-200 characters"),
        ("", "1-200 characters"),
    ],
)
def test_forget_refuses_a_reason_the_erasure_log_must_not_keep(reason, says, capsys):
    from warehouse.cli import main

    # Refused before PostgreSQL, Spark or the pipeline is touched (none runs here).
    assert main(["forget", "customer", "cust-00042", "--reason", reason]) == 2
    assert says in capsys.readouterr().err


def test_sources_show_prints_a_declared_contract_without_loading_spark():
    """`regauge sources show shop`, in a fresh interpreter: no Spark is loaded."""
    probe = (
        "import sys\n"
        "from warehouse.cli import main\n"
        "code = main(['sources', 'show', 'shop'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j'))\n"
        "print('EXIT', code, 'HEAVY', heavy)\n"
    )
    out = _in_a_fresh_interpreter(probe)
    assert out.startswith("source shop: topic shop.events, keyed by customer_id")
    assert "items[].unit_price" in out and "one of EUR, USD, GBP" in out
    assert out.strip().splitlines()[-1] == "EXIT 0 HEAVY []"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["sources", "show", "pos"], "unknown source 'pos'; known: shop, web"),
        (["sources", "show"], "sources show needs a SOURCE; known: shop, web"),
    ],
)
def test_sources_show_names_the_sources_there_are(argv, says, capsys):
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_an_empty_query_is_refused_in_one_line_before_trino_is_asked(capsys):
    from warehouse.cli import main

    # No Trino runs here: a request would fail otherwise.
    assert main(["query", " \n"]) == 2
    assert capsys.readouterr().err == "regauge: query: the SQL is empty; give one statement\n"


def test_deploy_and_readmit_print_what_their_runs_did(monkeypatch, capsys):
    """The CLI's lines for `sources deploy` and a resumed `readmit`. The runs themselves
    are tests/integration/test_sources.py's (in its driver, for the suite's time); only
    the printing is here, so the runs are stood in for by their results."""
    from warehouse.ops import readmit

    monkeypatch.setattr(readmit, "deploy", lambda s, n, v: readmit.Deployed(n, 1, v, 3))
    monkeypatch.setattr(
        readmit, "readmit", lambda s, n, r: readmit.Run("r-1", 2, True, "3 examined, 2 admitted")
    )
    assert main(["sources", "deploy", "shop", "2"]) == 0
    assert main(["readmit", "shop"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "shop: contract version moved from 1 to 2",
        "3 records are quarantined as unsupported_schema_version; "
        "`regauge readmit shop` validates them again under version 2",
        "re-admission r-1 under contract version 2, resuming the run that did not finish: "
        "3 examined, 2 admitted",
    ]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["autorollout", "revenue_hourly"], "the following arguments are required"),
        (["autorollout", "revenue_hourly", "2", "--hold", "-1"], "from 0 to 86400 seconds"),
        (["autorollout", "revenue_hourly", "2", "--hold", "nan"], "from 0 to 86400 seconds"),
        (["autorollout", "revenue_hourly", "2", "--lag-versions", "-1"], "must be 0 or more"),
        (["autorollout", "revenue_hourly", "2", "--failed-queries", "x"], "not a whole number"),
        (["autorollout", "revenue_hourly", "2", "--by", "a b"], "letters, digits"),
        (["autorollout", "revenue_hourly", "2", "--request-id", "a;b"], "is not 1-250"),
    ],
)
def test_autorollout_refuses_bad_options_before_anything_runs(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["autorollout", "revenue_hourly", "two"], "version 'two' must be 1 or more"),
        (["autorollout", "revenue_hourly", "0"], "version '0' must be 1 or more"),
        (["autorollout", "revenue_hourly", "2", "--steps", "50,25,100"], "above the one before"),
        (["autorollout", "revenue_hourly", "2", "--steps", "5,50"], "last step must be 100"),
        (["autorollout", "Revenue", "2"], "view 'Revenue'"),
        (["autorollout", "stop", "x;y"], "view 'x;y'"),
    ],
)
def test_autorollout_refuses_a_bad_plan_before_the_registry_is_read(argv, says, capsys):
    """The steps' order and the names are checked by the command, before PostgreSQL."""
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_help_after_a_cluster_action_is_help_and_stray_arguments_are_refused(capsys, monkeypatch):
    """`regauge cluster up --help` started the one-box cluster: `--help` went to run's
    command (argparse.REMAINDER). Now it prints the help; a stray argument is refused."""
    from warehouse.ops.stack import cluster

    def no_cluster(*_args, **_kwargs):
        raise AssertionError("the cluster was asked to start")

    monkeypatch.setattr(cluster, "up", no_cluster)
    with pytest.raises(SystemExit) as exited:
        main(["cluster", "up", "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: regauge cluster")
    assert main(["cluster", "down", "now"]) == 2
    assert "cluster down takes no further arguments (got now)" in capsys.readouterr().err
