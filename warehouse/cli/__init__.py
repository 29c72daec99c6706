"""`regauge`: the command line for engineers (and for Airflow's tasks).

Every subcommand prints what it did; failures print one line saying what went
wrong and what to do, and exit non-zero. The parser (`parser.py`) imports
nothing heavy; a command's module, one per group (`stack`, `ingest`, `views`,
`versions`, `checks`, `tools`), is imported only when that command runs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from warehouse.base import settings as settings_mod
from warehouse.base.jvm import SetupError
from warehouse.base.sqlnames import UnsafeNameError
from warehouse.base.text import first_line
from warehouse.cli.parser import build_parser

log = logging.getLogger("regauge")

Handler = Callable[[argparse.Namespace], int]


def version() -> str:
    try:
        return package_version("regauge")
    except PackageNotFoundError:  # a checkout that was never installed
        return "unknown"


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # py4j and Spark's Python side are noisy at INFO and say nothing an operator needs.
    # trino's modules set their own loggers to INFO when imported: import them first.
    import trino.client  # noqa: F401

    for noisy in ("py4j", "urllib3", "trino", "trino.client", "trino.dbapi", "trino.auth"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def handler(name: str) -> Handler:
    """The handler a command names, e.g. `views:streams_`, imported now."""
    module, _, function = name.partition(":")
    found: Handler = getattr(importlib.import_module(f"{__name__}.{module}"), function)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(version()).parse_args(argv)
    _configure_logging(args.verbose)
    # Imported here, after parsing: the errors below come from the layers a command
    # uses, and `--help` or a usage error must not pay for loading them.
    import psycopg
    from trino.exceptions import TrinoConnectionError, TrinoQueryError

    from warehouse.ops.airflow_client import AirflowError
    from warehouse.ops.stack.process import ServiceError
    from warehouse.sql.versions import VersionError

    # What a command writes (lake files, checkpoints, reports) is its owner's
    # only, like the services' files: another local account reads none of it.
    # Restored after, for a caller that runs commands in its own process (tests).
    usual = os.umask(0o077)
    try:
        return int(handler(args.handler)(args))
    except (
        SetupError,
        ServiceError,
        settings_mod.SettingsError,
        UnsafeNameError,
        VersionError,
        AirflowError,
    ) as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 2
    except TrinoQueryError as exc:
        print(f"regauge: Trino refused the query: {exc.message}", file=sys.stderr)
        return 2
    except psycopg.OperationalError as exc:
        print(
            f"regauge: PostgreSQL is not reachable ({first_line(exc)}); start it with `regauge up`",
            file=sys.stderr,
        )
        return 2
    except TrinoConnectionError:
        s = settings_mod.get()
        print(
            f"regauge: Trino is not reachable at {s.trino_url}; start it with `regauge up`",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("regauge: interrupted", file=sys.stderr)
        return 130
    finally:
        os.umask(usual)


__all__ = ["build_parser", "main"]
