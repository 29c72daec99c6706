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
    parent_name, _, child = name.rpartition(".")
    parent = sys.modules.get(parent_name)
    # Bound as the import system binds a submodule, on its package too: `from package
    # import child` reads the package's attribute first. In `make test` the Spark
    # tests run beside test_versions.py, which adds the deliberately wrong v3 file
    # under this same name; a listing of the views in this process while it was
    # there left the package's attribute bound to that module (CI, stop 104).
    before = getattr(parent, child, None) if parent else None
    sys.modules[name] = module
    if parent:
        setattr(parent, child, module)
    try:
        exec(compile(block(first_line), name, "exec"), vars(module))
        yield module
    finally:
        del sys.modules[name]
        if parent:
            if before is None:
                delattr(parent, child)
            else:
                setattr(parent, child, before)


def guide_tests(first_line: str) -> dict[str, Callable[..., object]]:
    """The test functions the block starting `first_line` defines, by name."""
    namespace: dict[str, object] = {"__name__": "guide_test"}
    exec(compile(block(first_line), "guide", "exec"), namespace)
    return {k: v for k, v in namespace.items() if k.startswith("test_") and callable(v)}
