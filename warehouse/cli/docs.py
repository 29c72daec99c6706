"""`regauge docs check`: what the docs name exists (run by `make lint`).

A doc that names a file, a link, a command, a `make` target or a DAG that is not
there misleads the next reader, and nothing else notices. This checks what can
be checked mechanically, and only that:

- every relative link in a doc resolves to a file or folder;
- every repository path in backticks (`spark_jobs/engine/silver.py`, `docs/bench/`)
  exists; a path with a placeholder (`<view>`, `*`) is a pattern, not checked;
- every `regauge COMMAND` in backticks names a command the CLI has
  (docs/contract.md is exempt: the contract also names what is still to build);
- every `make` target with a `##` description, and every DAG, is named in a doc.

Docs that record the past (CHANGELOG.md, docs/BENCHMARKS.md, docs/design/,
docs/plans/) keep the names of their day: only their links are checked.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from warehouse.base.settings import REPO_ROOT

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^(?:\./)?((?:spark_jobs|warehouse|tests|dags|docs|infra|dbt|\.ci)/[\w./-]*)")
_TARGET = re.compile(r"^([a-z][a-z-]*):.*##", re.M)
_DAG_FILE = "regauge_*.py"
_HISTORY = ("CHANGELOG.md", "docs/BENCHMARKS.md", "docs/design/", "docs/plans/")
_CONTRACT = "docs/contract.md"
# Made when the stack runs, so absent from a fresh clone (git-ignored).
_MADE_AT_RUN = ("warehouse/data/",)


@dataclass(frozen=True)
class Problem:
    doc: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.what}"


def docs(root: Path) -> list[Path]:
    """The Markdown the project keeps: the README, docs/, dags/README.md, the changelog."""
    found = [root / "README.md", root / "CHANGELOG.md", root / "dags" / "README.md"]
    found += sorted((root / "docs").rglob("*.md"))
    return [p for p in found if p.exists()]


def _is_history(rel: str) -> bool:
    return (
        any(rel == h or rel.startswith(h) for h in _HISTORY if h.endswith("/")) or rel in _HISTORY
    )


def check_doc(root: Path, path: Path, commands: set[str]) -> list[Problem]:
    rel = path.relative_to(root).as_posix()
    problems = []
    in_fence = False
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        for target in _LINK.findall(line):
            if re.match(r"^(https?:|mailto:|#)", target):
                continue
            where = (path.parent / target.split("#", 1)[0]).resolve()
            if not where.exists():
                problems.append(Problem(rel, n, f"link to {target}: no such file"))
        if in_fence or _is_history(rel):
            continue
        for code in _CODE.findall(line):
            problems += _check_code(root, rel, n, code.strip(), commands)
    return problems


def _check_code(root: Path, rel: str, n: int, code: str, commands: set[str]) -> list[Problem]:
    if code.startswith("regauge ") and rel != _CONTRACT:
        word = code.split()[1]
        if not word.startswith("-") and word not in commands:
            return [Problem(rel, n, f"`{code}`: regauge has no command {word!r}")]
        return []
    match = _PATH.match(code)
    if match is None or re.search(r"[<>*{}$]|\.\.\.|…", code):
        return []
    path = match.group(1).split(":", 1)[0].rstrip(".,")
    if not (root / path).exists() and not path.startswith(_MADE_AT_RUN):
        return [Problem(rel, n, f"`{code}`: no such file or folder {path}")]
    return []


def undocumented(root: Path, texts: str) -> list[Problem]:
    """`make` targets and DAGs that no doc names."""
    problems = []
    for target in _TARGET.findall((root / "Makefile").read_text()):
        if f"make {target}" not in texts:
            problems.append(Problem("Makefile", 0, f"`make {target}` is named in no doc"))
    for dag in sorted((root / "dags").glob(_DAG_FILE)):
        if dag.stem not in texts:
            problems.append(Problem(f"dags/{dag.name}", 0, f"DAG {dag.stem} is named in no doc"))
    return problems


def check(root: Path, commands: set[str]) -> list[Problem]:
    found = docs(root)
    problems = [p for doc in found for p in check_doc(root, doc, commands)]
    current = [d for d in found if not _is_history(d.relative_to(root).as_posix())]
    return problems + undocumented(root, "\n".join(d.read_text() for d in current))


def cli_commands() -> set[str]:
    from warehouse.cli.parser import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def docs_check(args: argparse.Namespace) -> int:
    problems = check(REPO_ROOT, cli_commands())
    for problem in problems:
        print(f"regauge: {problem}", file=sys.stderr)
    if problems:
        print(f"regauge: {len(problems)} problems in the docs", file=sys.stderr)
        return 1
    print(f"docs: {len(docs(REPO_ROOT))} files, every link, path, command, target and DAG found")
    return 0
