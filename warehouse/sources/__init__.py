"""The sources: every module here declares one `SOURCE` (`warehouse.base.declare`).

Adding a source is adding `<name>.py` here (and its test); nothing else lists
sources. A declaration imports `warehouse.base.declare` and nothing of the
engine's.
"""

from __future__ import annotations

import importlib
import pkgutil

from warehouse.base.declare import Source


def discover() -> dict[str, Source]:
    found: dict[str, Source] = {}
    for module in pkgutil.iter_modules(__path__):
        source = importlib.import_module(f"{__name__}.{module.name}").SOURCE
        if source.name != module.name:
            raise ValueError(
                f"{module.name}.py declares source {source.name!r}; the file name and "
                "the declaration must agree"
            )
        found[source.name] = source
    return found


def get(name: str) -> Source:
    sources = discover()
    try:
        return sources[name]
    except KeyError:
        raise KeyError(f"unknown source {name!r}; known: {', '.join(sorted(sources))}") from None
