"""The alert rules regauge ships (infra/prometheus/alerts.yml) load into a real
Prometheus rule engine, fire on the series they are for and stay quiet on healthy
ones (promtool's unit tests, alerts-test.yml), and name only metrics regauge
exports (issue 68, C)."""

from __future__ import annotations

import re
import subprocess

import pytest
from prometheus_client import Counter, Gauge, Histogram

from warehouse.base import metrics
from warehouse.base.settings import REPO_ROOT, load

RULES = REPO_ROOT / "infra" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    tool = load({}).cache_dir / "promtool" / "promtool"
    if not tool.is_file():
        pytest.fail(f"promtool is not in {tool.parent}: run `make setup`")
    return str(tool)


def test_the_rules_load(promtool):
    check = subprocess.run(
        [promtool, "check", "rules", "alerts.yml"], cwd=RULES, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 6 rules found" in check.stdout


def test_each_rule_fires_on_its_fault_and_not_before(promtool):
    test = subprocess.run(
        [promtool, "test", "rules", "alerts-test.yml"], cwd=RULES, capture_output=True, text=True
    )
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def test_every_rule_is_tested_and_names_only_metrics_regauge_exports():
    rules = (RULES / "alerts.yml").read_text()
    tests = (RULES / "alerts-test.yml").read_text()
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", rules, re.MULTILINE))
    # A case that expects an alert has exp_labels; one that expects none, `[]`.
    cases = re.findall(r"alertname: (\w+)\n\s+exp_alerts:(.*)", tests)
    fired = {name for name, rest in cases if rest.strip() != "[]"}
    assert len(alerts) == 6 and fired == alerts
    exported = {
        m._name
        for m in vars(metrics).values()
        if isinstance(m, Counter | Gauge | Histogram) and m._name.startswith("regauge_")
    }
    exprs = re.findall(r"^\s+expr: (.+)$", rules, re.MULTILINE)
    named = {n for e in exprs for n in re.findall(r"regauge_[a-z_]+", e)}
    assert len(exprs) == 6 and named and named <= exported, named - exported
