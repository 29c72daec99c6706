"""The rollout page (issue 69): what it shows, and its HTML.

`warehouse.ops.page` gathers a `Page` from the registry, the view host and Trino;
`render` turns it into one self-contained HTML document (inline SVG charts, no
script, no asset to fetch), which Airflow's UI shows under Browse (the plugin in
`dags/plugins/`). Pure: no engine, no IO, so the fast tests hold its content.

Every figure a person reads is also in a `data-*` attribute of its element, so a
test in a browser compares the page with the registry without parsing prose.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Seconds between the page's own reloads: about three of a live stream's rounds.
REFRESH_S = 15
# Hours of the candidate's difference from the current version shown, newest first.
HOURS = 48

HELD, FAILED = "#2e7d32", "#c62828"


@dataclass(frozen=True)
class VersionRow:
    version: int
    status: str  # serving, ready, building, failed
    percent: int  # of unpinned analysts routed to it (docs/contract.md §4)
    analysts: int  # of the analysts listed below, how many see it
    lag_versions: int | None  # silver versions its live stream is behind; None: unknown
    lag_note: str  # why the lag is unknown, or ""
    built_from: str
    validation: str


@dataclass(frozen=True)
class Analyst:
    user: str
    version: int | None
    why: str  # "pin", or "cohort"
    detail: str  # e.g. "cohort 7 < 10 % of v2"


@dataclass(frozen=True)
class Judgement:
    at: str
    percent: int
    held: bool
    gates: dict[str, bool]  # gate -> held
    verdict: str
    figures: dict[str, Any]


@dataclass(frozen=True)
class RolloutRow:
    id: int
    version: int
    current_version: int
    state: str  # running, completed, rolled_back, stopped
    steps: list[int]
    percent: int  # the step reached
    hold_s: float
    started_at: str
    ended_at: str | None
    why: str
    by: str
    moves: list[tuple[str, int]]  # (when, percent) the users were moved to
    judgements: list[Judgement]


@dataclass(frozen=True)
class HourDifference:
    hour: str
    keys: int
    differing: int


@dataclass
class ViewPage:
    view: str
    versions: list[VersionRow]
    analysts: list[Analyst]
    rollouts: list[RolloutRow]
    compared: str | None  # e.g. "v2 against v1 on orders_placed, gross_revenue"
    hours: list[HourDifference]
    problems: list[str] = field(default_factory=list)


@dataclass
class Page:
    generated_at: str
    audit_passed: bool | None
    audit_finished_at: str | None
    views: list[ViewPage]
    problems: list[str] = field(default_factory=list)


# -- what the registry's records say, read back ---------------------------------------
_JUDGED = re.compile(r"^at (\d+) %: (.*); figures (\{.*\})$", re.DOTALL)
_GATE = re.compile(r"(?:^|; )(\w+) (held|FAILED): ")


def judged_detail(percent: int, verdict: str, figures: Mapping[str, Any]) -> str:
    """The detail of a `judged` event in `control.view_events`, which `parse_judged` reads."""
    return f"at {percent} %: {verdict}; figures {json.dumps(figures, default=str)}"


def parse_judged(at: str, detail: str) -> Judgement | None:
    """A `judged` event's detail (`judged_detail`) as a Judgement."""
    found = _JUDGED.match(detail)
    if found is None:
        return None
    percent, verdict, figures = found.groups()
    gates = {gate: state == "held" for gate, state in _GATE.findall(verdict)}
    return Judgement(
        at, int(percent), all(gates.values()), gates, verdict, json.loads(figures) or {}
    )


# -- HTML ------------------------------------------------------------------------------
def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _when(at: str | None) -> str:
    return at[:19].replace("T", " ") if at else "-"


CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }
th { background: #f4f4f4; } td.n { text-align: right; }
.held { color: #2e7d32; } .failed { color: #c62828; font-weight: bold; }
.problem { color: #c62828; } .quiet { color: #777; }
svg { background: #fafafa; border: 1px solid #ddd; }
"""


def render(page: Page) -> str:
    audit = (
        "no audit on record"
        if page.audit_passed is None
        else f"{'passed' if page.audit_passed else 'FAILED'} at {_when(page.audit_finished_at)}"
    )
    audit_class = "held" if page.audit_passed else "failed"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{REFRESH_S}">',
        f"<title>regauge rollouts</title><style>{CSS}</style></head><body>",
        "<h1>regauge: view versions and rollouts</h1>",
        f'<p class="quiet">As of {_e(_when(page.generated_at))} UTC; this page reloads '
        f"every {REFRESH_S} s. Read-only: roll out with <code>regauge autorollout</code> or "
        "the <code>regauge_autorollout</code> DAG.</p>",
        f'<p>Latest audit: <span class="audit {audit_class}" '
        f'data-passed="{_e(page.audit_passed)}">{_e(audit)}</span></p>',
        *(f'<p class="problem">{_e(p)}</p>' for p in page.problems),
    ]
    if not page.views:
        parts.append("<p>No view has a version yet: build one with regauge_reprocess.</p>")
    parts += [_view(v) for v in page.views]
    parts.append("</body></html>")
    return "\n".join(parts)


def _view(v: ViewPage) -> str:
    out = [f'<section class="view" data-view="{_e(v.view)}">', f"<h2>{_e(v.view)}</h2>"]
    out += [f'<p class="problem">{_e(p)}</p>' for p in v.problems]
    out.append(
        "<table><tr><th>version</th><th>status</th><th>share of analysts</th>"
        "<th>analysts listed</th><th>freshness (silver versions behind)</th>"
        "<th>built from</th><th>validation</th></tr>"
    )
    for r in v.versions:
        lag = r.lag_note if r.lag_versions is None else str(r.lag_versions)
        out.append(
            f'<tr class="version" data-version="{r.version}" data-status="{_e(r.status)}" '
            f'data-percent="{r.percent}" data-lag="{_e(r.lag_versions)}">'
            f"<td>v{r.version}</td><td>{_e(r.status)}</td><td class=n>{r.percent} %</td>"
            f"<td class=n>{r.analysts}</td><td>{_e(lag)}</td><td>{_e(r.built_from)}</td>"
            f"<td>{_e(r.validation)}</td></tr>"
        )
    out.append("</table>")
    out.append("<h3>Who sees which version</h3>")
    if v.analysts:
        out.append("<table><tr><th>analyst</th><th>version</th><th>why</th></tr>")
        for a in v.analysts:
            out.append(
                f'<tr class="analyst" data-user="{_e(a.user)}" data-version="{_e(a.version)}" '
                f'data-why="{_e(a.why)}"><td>{_e(a.user)}</td><td>v{_e(a.version)}</td>'
                f"<td>{_e(a.detail)}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append('<p class="quiet">No analyst pinned or seen in Trino\'s recent queries.</p>')
    out.append("<h3>Rollouts</h3>")
    if v.rollouts:
        out.append(_rollout_chart(v.rollouts[0]))
        out.append(_rollouts_table(v.rollouts))
        out.append(_judgements_table(v.rollouts[0]))
    else:
        out.append('<p class="quiet">None yet.</p>')
    out.append("<h3>The candidate against the current version, per hour</h3>")
    if v.compared is None:
        out.append('<p class="quiet">Only one live version, or none shares columns.</p>')
    else:
        out.append(f"<p>{_e(v.compared)}</p>")
        out.append(_difference_chart(v.hours))
    out.append("</section>")
    return "\n".join(out)


def _rollouts_table(rows: list[RolloutRow]) -> str:
    out = [
        "<table><tr><th>#</th><th>version</th><th>state</th><th>steps</th><th>reached</th>"
        "<th>hold</th><th>started</th><th>ended</th><th>by</th><th>why</th></tr>"
    ]
    for r in rows:
        state = r.state.replace("_", " ")
        cls = "failed" if r.state == "rolled_back" else "held" if r.state == "completed" else ""
        out.append(
            f'<tr class="rollout" data-id="{r.id}" data-version="{r.version}" '
            f'data-state="{_e(r.state)}" data-percent="{r.percent}">'
            f"<td>{r.id}</td><td>v{r.version} (from v{r.current_version})</td>"
            f'<td class="{cls}">{_e(state)}</td><td>{_e(", ".join(map(str, r.steps)))}</td>'
            f"<td class=n>{r.percent} %</td><td class=n>{r.hold_s:g} s</td>"
            f"<td>{_e(_when(r.started_at))}</td><td>{_e(_when(r.ended_at))}</td>"
            f"<td>{_e(r.by)}</td><td>{_e(r.why)}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


FIGURES = (
    ("keys_compared", "keys compared"),
    ("keys_unexplained", "unexplained"),
    ("lag_versions", "lag"),
    ("audit_passed", "audit"),
    ("queries", "queries"),
    ("failed_queries", "failed"),
)


def _judgements_table(r: RolloutRow) -> str:
    if not r.judgements:
        return f'<p class="quiet">Rollout {r.id}: no step judged yet.</p>'
    out = [
        f"<p>Rollout {r.id}'s gates, step by step:</p>",
        "<table><tr><th>judged</th><th>step</th><th>gates</th>"
        + "".join(f"<th>{_e(label)}</th>" for _, label in FIGURES)
        + "</tr>",
    ]
    for j in r.judgements:
        gates = ", ".join(
            f'<span class="{"held" if ok else "failed"}">{_e(g)} '
            f"{'held' if ok else 'FAILED'}</span>"
            for g, ok in j.gates.items()
        )
        missing = j.figures.get("missing") or {}
        cells = "".join(
            f"<td class=n>{_e(j.figures.get(k, '-') if k not in missing else 'missing')}</td>"
            for k, _ in FIGURES
        )
        out.append(
            f'<tr class="judgement" data-percent="{j.percent}" data-held="{j.held}" '
            f'title="{_e(j.verdict)}"><td>{_e(_when(j.at))}</td><td class=n>{j.percent} %</td>'
            f"<td>{gates}</td>{cells}</tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _seconds(at: str) -> float:
    return datetime.fromisoformat(at).timestamp()


def _rollout_chart(r: RolloutRow, width: int = 640, height: int = 180) -> str:
    """The share of analysts on the candidate over the rollout's time, with a dot
    per judged step: green where every gate held, red where one failed."""
    pad = 30
    times = [_seconds(t) for t, _ in r.moves] + [_seconds(j.at) for j in r.judgements]
    t0 = _seconds(r.started_at)
    t1 = max([t0 + 1, *times, _seconds(r.ended_at) if r.ended_at else t0 + 1])

    def x(at: str) -> float:
        return pad + (width - 2 * pad) * (_seconds(at) - t0) / (t1 - t0)

    def y(percent: int) -> float:
        return height - pad - (height - 2 * pad) * percent / 100

    points, last = [f"{pad:.1f},{y(0):.1f}"], 0
    for at, percent in r.moves:
        points += [f"{x(at):.1f},{y(last):.1f}", f"{x(at):.1f},{y(percent):.1f}"]
        last = percent
    points.append(f"{width - pad:.1f},{y(last):.1f}")
    dots = "".join(
        f'<circle class="judged" cx="{x(j.at):.1f}" cy="{y(j.percent):.1f}" r="5" '
        f'fill="{HELD if j.held else FAILED}" data-held="{j.held}">'
        f"<title>{_e(_when(j.at))} at {j.percent} %: {_e(j.verdict)}</title></circle>"
        for j in r.judgements
    )
    axis = "".join(
        f'<text x="2" y="{y(p) + 4:.1f}" font-size="10">{p}%</text>' for p in (0, 50, 100)
    )
    return (
        f'<svg class="rollout-chart" data-rollout="{r.id}" width="{width}" height="{height}" '
        f'role="img" aria-label="rollout {r.id}: share of analysts on v{r.version} over time">'
        f'{axis}<polyline fill="none" stroke="#1565c0" stroke-width="2" '
        f'points="{" ".join(points)}"/>{dots}'
        f'<text x="{pad}" y="{height - 8}" font-size="10">{_e(_when(r.started_at))}</text>'
        f'<text x="{width - pad}" y="{height - 8}" font-size="10" text-anchor="end">'
        f"{_e(_when(r.ended_at)) if r.ended_at else 'now'}</text></svg>"
    )


def _difference_chart(hours: list[HourDifference], width: int = 640, height: int = 160) -> str:
    """Per hour, oldest left: the keys either version has (grey) and those where the
    two differ on the shared columns (red)."""
    if not hours:
        return '<p class="quiet">No windows in either table yet.</p>'
    pad = 20
    ordered = sorted(hours, key=lambda h: h.hour)
    top = max(h.keys for h in ordered) or 1
    step = (width - 2 * pad) / len(ordered)
    bars = []
    for i, h in enumerate(ordered):
        for cls, n, fill in (("keys", h.keys, "#bdbdbd"), ("differing", h.differing, FAILED)):
            tall = (height - 2 * pad) * n / top
            bars.append(
                f'<rect class="{cls}" data-hour="{_e(h.hour)}" data-count="{n}" '
                f'x="{pad + i * step:.1f}" y="{height - pad - tall:.1f}" '
                f'width="{max(step - 2, 1):.1f}" height="{tall:.1f}" fill="{fill}">'
                f"<title>{_e(h.hour)}: {n} {'keys' if cls == 'keys' else 'differing'}</title>"
                "</rect>"
            )
    differing = sum(h.differing for h in ordered)
    return (
        f'<svg class="difference-chart" data-differing="{differing}" width="{width}" '
        f'height="{height}" role="img" aria-label="keys per hour, and those that differ">'
        f"{''.join(bars)}"
        f'<text x="{pad}" y="{height - 4}" font-size="10">{_e(ordered[0].hour[:16])}</text>'
        f'<text x="{width - pad}" y="{height - 4}" font-size="10" text-anchor="end">'
        f"{_e(ordered[-1].hour[:16])}</text></svg>"
        f"<p>{differing} of {sum(h.keys for h in ordered)} keys differ over these "
        f"{len(ordered)} hours (restatements in flight explain some while a late event is "
        "folded into one version before the other).</p>"
    )
