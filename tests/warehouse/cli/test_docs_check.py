"""`regauge docs check`: each kind of stale name is found, and the repository has none."""

from __future__ import annotations

from pathlib import Path

from warehouse.base.settings import REPO_ROOT
from warehouse.cli import docs

MAKEFILE = "build:  ## make it\nclean:  ## remove it\n\t@rm -rf x\n"


def _repo(tmp_path: Path, readme: str, files: dict[str, str]) -> Path:
    (tmp_path / "Makefile").write_text(MAKEFILE)
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "regauge_audit.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "spark_jobs").mkdir()
    (tmp_path / "spark_jobs" / "silver.py").write_text("")
    (tmp_path / "README.md").write_text(readme)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


GOOD = (
    "Run `make build` or `make clean`; DAG regauge_audit; see [ops](docs/ops.md) and "
    "`spark_jobs/silver.py:12`, `regauge audit --sample 0.1`, `spark_jobs/<view>_v<N>.py`, "
    "`warehouse/data/lake/`.\n"
)


def test_a_doc_that_names_only_what_exists_passes(tmp_path):
    root = _repo(tmp_path, GOOD, {"docs/ops.md": "# ops\n"})
    assert docs.check(root, {"audit"}) == []


def test_each_stale_name_is_found_with_its_line(tmp_path):
    readme = GOOD + (
        "A [gone link](docs/gone.md#part) and `spark_jobs/bronze.py`.\n"
        "```sh\nregauge nothing  # a fenced block is an example, not checked\n```\n"
        "Then `regauge replay VIEW`.\n"
    )
    root = _repo(
        tmp_path,
        readme.replace("`make clean`", "cleaning").replace("DAG regauge_audit", ""),
        {
            "docs/ops.md": "# ops\n",
            "CHANGELOG.md": "Once `spark_jobs/old.py`, and a [link](docs/none.md).\n",
        },
    )
    got = [str(p) for p in docs.check(root, {"audit"})]
    assert got == [
        "README.md:2: link to docs/gone.md#part: no such file",
        "README.md:2: `spark_jobs/bronze.py`: no such file or folder spark_jobs/bronze.py",
        "README.md:6: `regauge replay VIEW`: regauge has no command 'replay'",
        # The changelog keeps the names of its day; only its links must resolve.
        "CHANGELOG.md:1: link to docs/none.md: no such file",
        "Makefile:0: `make clean` is named in no doc",
        "dags/regauge_audit.py:0: DAG regauge_audit is named in no doc",
    ]


def test_the_repositorys_docs_name_only_what_exists():
    problems = docs.check(REPO_ROOT, docs.cli_commands())
    assert [str(p) for p in problems] == []
