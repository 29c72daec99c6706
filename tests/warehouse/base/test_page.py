"""The rollout page's HTML (warehouse.base.page): what a person reads, and the data-*
attributes a browser test compares with the registry."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from warehouse.base import page
from warehouse.base.page import (
    Analyst,
    HourDifference,
    Judgement,
    Page,
    RolloutRow,
    VersionRow,
    ViewPage,
)

FIGURES = {
    "keys_compared": 224,
    "keys_unexplained": 0,
    "lag_versions": 1,
    "audit_passed": True,
    "queries": 3,
    "failed_queries": 1,
    "missing": {},
}


def _judgement(at: str, percent: int, serving_held: bool) -> Judgement:
    state = "held" if serving_held else "FAILED"
    verdict = (
        "agreement held: 0 of 224 unexplained; freshness held: 1 behind; integrity held: "
        f"passed; serving {state}: 1 of 3 failed"
    )
    detail = page.judged_detail(percent, verdict, FIGURES)
    judged = page.parse_judged(at, detail)
    assert judged is not None
    return judged


def sample() -> Page:
    rolled_back = RolloutRow(
        id=7,
        version=2,
        current_version=1,
        state="rolled_back",
        steps=[50, 100],
        percent=50,
        hold_s=15.0,
        started_at="2026-12-05T08:00:00+00:00",
        ended_at="2026-12-05T08:00:20+00:00",
        why="at 50 %: serving failed: 1 of 3 analysts' queries failed (<script>)",
        by="engineer.x",
        moves=[("2026-12-05T08:00:01+00:00", 50), ("2026-12-05T08:00:20+00:00", 0)],
        judgements=[_judgement("2026-12-05T08:00:17+00:00", 50, serving_held=False)],
    )
    view = ViewPage(
        view="revenue_hourly",
        versions=[
            VersionRow(1, "serving", 100, 2, 0, "", "silver@12", "passed: 0 disagreements"),
            VersionRow(2, "ready", 0, 1, None, "not running in the view host", "silver@40", "-"),
        ],
        analysts=[
            Analyst("analyst.alice", 1, "cohort", "cohort 62 ≥ 0 %: the current version"),
            Analyst("analyst.bob", 2, "pin", "pinned to v2"),
        ],
        rollouts=[rolled_back],
        compared="v2 against v1 on window_end, orders_placed, gross_revenue",
        hours=[
            HourDifference("2026-12-05 07:00:00.000 UTC", 40, 0),
            HourDifference("2026-12-05 06:00:00.000 UTC", 38, 2),
        ],
    )
    return Page("2026-12-05T08:01:00+00:00", True, "2026-12-05 07:59:00", [view])


class _Elements(HTMLParser):
    """Every element's tag and attributes, and the page's text."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, cls: str) -> list[dict[str, str | None]]:
        return [a for _, a in self.found if cls in (a.get("class") or "").split()]


def parsed(html: str) -> _Elements:
    p = _Elements()
    p.feed(html)
    return p


def test_a_judged_event_reads_back_as_written_with_each_gate():
    j = _judgement("2026-12-05T08:00:17+00:00", 50, serving_held=False)
    assert (j.percent, j.held) == (50, False)
    assert j.gates == {"agreement": True, "freshness": True, "integrity": True, "serving": False}
    assert j.figures == FIGURES
    assert _judgement("2026-12-05T08:00:17+00:00", 25, serving_held=True).held
    # Another action's detail is not a judgement.
    assert page.parse_judged("2026-12-05T08:00:17+00:00", "50 %: all gates held") is None


def test_the_page_shows_versions_analysts_rollouts_and_the_difference_with_their_figures():
    html = page.render(sample())
    p = parsed(html)
    versions = {a["data-version"]: a for a in p.having("version")}
    assert versions["1"]["data-status"] == "serving" and versions["1"]["data-percent"] == "100"
    assert versions["2"]["data-status"] == "ready" and versions["2"]["data-lag"] == ""
    who = {a["data-user"]: (a["data-version"], a["data-why"]) for a in p.having("analyst")}
    assert who == {"analyst.alice": ("1", "cohort"), "analyst.bob": ("2", "pin")}
    (rollout,) = p.having("rollout")
    assert (rollout["data-state"], rollout["data-percent"]) == ("rolled_back", "50")
    (judged,) = p.having("judgement")
    assert (judged["data-percent"], judged["data-held"]) == ("50", "False")
    # The chart: one dot per judged step, red where a gate failed.
    (dot,) = p.having("judged")
    assert dot["fill"] == page.FAILED
    (line,) = [a for t, a in p.found if t == "polyline"]
    assert len((line["points"] or "").split()) == 2 + 2 * 2  # start, 2 moves, end
    differing = {a["data-hour"]: a["data-count"] for a in p.having("differing")}
    assert differing == {"2026-12-05 07:00:00.000 UTC": "0", "2026-12-05 06:00:00.000 UTC": "2"}
    (chart,) = p.having("difference-chart")
    assert chart["data-differing"] == "2"
    (audit,) = p.having("audit")
    assert audit["data-passed"] == "True"
    text = " ".join(p.text)
    assert "not running in the view host" in text and "pinned to v2" in text
    assert "2 of 78 keys differ" in text


def test_what_the_page_shows_is_escaped_and_it_reloads_itself():
    html = page.render(sample())
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert re.search(rf'<meta http-equiv="refresh" content="{page.REFRESH_S}">', html)


def test_an_empty_registry_and_a_missing_audit_say_so():
    p = parsed(page.render(Page("2026-12-05T08:01:00+00:00", None, None, [], ["Trino: down"])))
    text = " ".join(p.text)
    assert "No view has a version yet" in text and "no audit on record" in text
    assert "Trino: down" in text
