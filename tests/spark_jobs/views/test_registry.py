"""The view registry: every `<view>_v<N>.py` is a version, and each stands alone.

Nothing here lists the versions there are: adding or retiring one is adding or
deleting its module and its test.
"""

from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path

import pytest

from spark_jobs import views

VIEWS_DIR = Path(views.__file__).parent
VERSION_FILE = re.compile(r"[a-z][a-z0-9_]*_v[1-9][0-9]*")


def _version_modules() -> list[Path]:
    return sorted(p for p in VIEWS_DIR.glob("*.py") if VERSION_FILE.fullmatch(p.stem))


def test_the_registry_finds_every_view_version():
    found = views.discover()
    assert found
    assert sorted(v.table_name for v in found.values()) == [p.stem for p in _version_modules()]
    for name, version in found:
        assert views.get(name, version).table_name == f"{name}_v{version}"
    # Shared helpers (hourly.py) and the machinery are not versions.
    assert not {"hourly", "base", "runner", "validate"} & {v.name for v in found.values()}


def test_a_version_removed_between_listing_and_import_is_left_out(monkeypatch):
    """The view host and Airflow's tasks list the views while a file may be removed
    (test_versions.py removes its deliberately wrong v3, with the Spark tests listing
    beside it): what is gone by its import is what a listing a moment later finds."""
    listed = list(pkgutil.iter_modules(views.__path__))
    gone = pkgutil.ModuleInfo(listed[0].module_finder, "removed_meanwhile_v1", False)
    monkeypatch.setattr(views.pkgutil, "iter_modules", lambda path: [*listed, gone])
    found = views.discover()
    assert ("removed_meanwhile", 1) not in found
    assert sorted(v.table_name for v in found.values()) == [p.stem for p in _version_modules()]


def test_an_unknown_version_names_the_known_ones():
    with pytest.raises(KeyError, match=r"known: .+ v\d"):
        views.get("revenue_hourly", 999)


@pytest.mark.parametrize("path", _version_modules(), ids=lambda p: p.stem)
def test_no_version_imports_another_so_any_can_be_deleted(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported |= {f"{node.module}.{a.name}" for a in node.names}
    others = {m for m in imported if VERSION_FILE.fullmatch(m.rsplit(".", 1)[-1])}
    assert not others, f"{path.name} imports {others}: share code through a helper module"
