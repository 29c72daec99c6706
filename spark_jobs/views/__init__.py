"""The view registry: every module here named `<view>_v<N>` declares one `VIEW`.

Adding revenue_hourly v3 is adding `revenue_hourly_v3.py` (and its tests);
nothing else lists views.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

from spark_jobs.views.base import View
from warehouse.base import registry

_MODULE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)_v(?P<version>[1-9][0-9]*)$")


def discover() -> dict[tuple[str, int], View]:
    found: dict[tuple[str, int], View] = {}
    for module in pkgutil.iter_modules(__path__):
        match = _MODULE.match(module.name)
        if not match:
            continue
        try:
            view = importlib.import_module(f"{__name__}.{module.name}").VIEW
        except (ModuleNotFoundError, FileNotFoundError):
            # Removed since the listing (found gone, or gone between being found and
            # read): what the listing a moment later has. Anything else, such as a
            # module it imports being missing, is an error.
            if any(Path(d, f"{module.name}.py").exists() for d in __path__):
                raise
            continue
        if (view.name, view.version) != (match["name"], int(match["version"])):
            raise ValueError(
                f"{module.name}.py declares {view.name} v{view.version}; the file name "
                "and the declaration must agree"
            )
        found[(view.name, view.version)] = view
    return found


def of_the_shop() -> dict[tuple[str, int], View]:
    """The views that read the shop's silver alone: what `make bench` measures, over
    the shop's generated traffic, so its figures compare with earlier runs."""
    return {k: v for k, v in discover().items() if v.sources == (registry.SHOP_SOURCE,)}


def get(name: str, version: int) -> View:
    views = discover()
    try:
        return views[(name, version)]
    except KeyError:
        known = ", ".join(f"{n} v{v}" for n, v in sorted(views))
        raise KeyError(f"unknown view {name} v{version}; known: {known}") from None


def names() -> list[str]:
    return sorted({name for name, _ in discover()})
