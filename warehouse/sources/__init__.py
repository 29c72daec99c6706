"""The sources: every module here declares one `SOURCE` (`warehouse.base.declare`).

Adding a source is adding `<name>.py` here (and its test); nothing else lists
sources. A declaration imports `warehouse.base.declare` and nothing of the
engine's.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path
from typing import Any

from warehouse.base import declare, registry
from warehouse.base.declare import Source

_HERE = Path(__file__).parent


def discover() -> dict[str, Source]:
    found: dict[str, Source] = {}
    for module in pkgutil.iter_modules(__path__):
        source = importlib.import_module(f"{__name__}.{module.name}").SOURCE
        if source.name != module.name:
            raise ValueError(
                f"{module.name}.py declares source {source.name!r}; the file name and "
                "the declaration must agree"
            )
        # docs/contract.md §10: source S reads S.events, and its tables follow its name.
        names = registry.source_tables(source.name)
        if source.topic != names.topic:
            raise ValueError(
                f"{module.name}.py declares topic {source.topic!r}; source {source.name!r} "
                f"reads {names.topic!r} (docs/contract.md §10)"
            )
        found[source.name] = source
    return found


def get(name: str) -> Source:
    sources = discover()
    try:
        return sources[name]
    except KeyError:
        raise KeyError(f"unknown source {name!r}; known: {', '.join(sorted(sources))}") from None


# -- accepted contracts: what `regauge sources check` holds the declarations to -------------
def accepted_path(name: str) -> Path:
    """Where a source's accepted contract is recorded, beside its declaration: like a
    schema registry's subject, but in the repository, so `make lint` checks it."""
    return _HERE / f"{name}.accepted.json"


def accepted(name: str) -> dict[str, Any] | None:
    path = accepted_path(name)
    return json.loads(path.read_text()) if path.exists() else None


def unaccepted_versions(source: Source) -> list[int]:
    """The contract versions declared but not yet accepted (`check` also finds a
    declaration changed within an accepted version)."""
    known = accepted(source.name)
    since = (
        set()
        if known is None
        else {
            shape["since"]
            for versions in known["event_types"].values()
            for shape in versions.values()
        }
    )
    return [n for n in range(1, source.contract_version + 1) if n not in since]


def accept(source: Source) -> list[str]:
    """Record `source`'s contract as accepted, unless it is incompatible with what was:
    then nothing is written, and the problems are returned."""
    problems = declare.incompatibilities(accepted(source.name), source)
    if not problems:
        text = json.dumps(declare.canonical(source), indent=2, ensure_ascii=False)
        accepted_path(source.name).write_text(text + "\n")
    return problems


def check() -> tuple[list[str], list[str]]:
    """Every declaration against its accepted contract: (what is wrong, each naming its
    source; what is right, one line per source). Wrong: a change that would alter how
    an accepted record validates or reads, or a contract version not accepted yet."""
    wrong, right = [], []
    for name, source in sorted(discover().items()):
        known = accepted(name)
        problems = declare.incompatibilities(known, source)
        wrong += [f"{name}: incompatible: {p}" for p in problems]
        # Accepted means as recorded, not merely compatible with it.
        changed = known != declare.canonical(source)
        if changed and not problems:
            new = unaccepted_versions(source)
            what = f"contract version(s) {', '.join(map(str, new))}" if new else "the contract"
            wrong.append(
                f"{name}: {what} compatible but not accepted yet; run "
                f"`regauge sources accept {name}`"
            )
        if not problems and not changed:
            right.append(
                f"{name}: contract version {source.contract_version}, compatible and accepted"
            )
    return wrong, right
