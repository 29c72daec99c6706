"""The worked examples of the guides in docs/architecture.md, run as written: a
guide's module and its test are taken from its text (as chispa's
`tests/test_readme_examples.py` runs its README) and imported under the name the
guide gives, without writing a file, so the registries that list files never see it."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def block(first_line: str) -> str:
    """The ```python block of the guide whose first line is `first_line`."""
    for body in re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S):
        if body.startswith(first_line + "\n"):
            return str(body)
    raise AssertionError(f"docs/architecture.md has no python block starting {first_line!r}")


@contextmanager
def module_from(first_line: str, name: str) -> Iterator[types.ModuleType]:
    """The block starting `first_line`, importable as `name` while the context lasts."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(block(first_line), name, "exec"), vars(module))
        yield module
    finally:
        del sys.modules[name]


def guide_tests(first_line: str) -> dict[str, Callable[..., object]]:
    """The test functions the block starting `first_line` defines, by name."""
    namespace: dict[str, object] = {"__name__": "guide_test"}
    exec(compile(block(first_line), "guide", "exec"), namespace)
    return {k: v for k, v in namespace.items() if k.startswith("test_") and callable(v)}
