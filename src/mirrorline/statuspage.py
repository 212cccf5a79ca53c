"""``run``'s status page as HTML, from a :class:`Page` of figures: per target its state, applied position and lag, the
lag over the last hour as a chart, each table stopped at a target with its reason, since when and what ends it; the
log's size, the slot's retained WAL, units and changes per second. One self-contained document (its style inline, the
chart an inline SVG drawn here, no script and nothing fetched from elsewhere) that reloads itself every few seconds
and reads on a phone. Pure: :mod:`mirrorline.metrics` gathers the figures and serves it."""

from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass, field

REFRESH_SECONDS = 5
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@dataclass
class TargetRow:
    name: str
    state: str  # live, catching up, stopped
    position: str  # the applied position ("" unknown)
    lag_seconds: float | None
    lag_bytes: int | None
    error: str = ""  # a target stopped: why


@dataclass
class StoppedTable:
    target: str
    table: str
    reason: str
    since: float  # epoch seconds
    remedy: str  # what ends it


@dataclass
class Page:
    now: float  # epoch seconds
    targets: list[TargetRow]
    stopped: list[StoppedTable]
    history: list[tuple[float, dict[str, float]]]  # (epoch seconds, lag seconds per target), oldest first
    log_bytes: int | None = None
    slot: str = ""
    slot_retained_bytes: int | None = None
    units_per_second: float | None = None
    changes_per_second: float | None = None
    capture_running: bool | None = None
    notes: list[str] = field(default_factory=list)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def clock(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def chart(page: Page, width: int = 640, height: int = 220, span: float = 3600.0) -> str:
    """The lag of each target over the last ``span`` seconds as an inline SVG: a line per target, its points the
    page's history (``data-points`` on each line: how many)."""
    left, right, top, bottom = 48, 8, 10, 26
    w, h = width - left - right, height - top - bottom
    start = page.now - span
    names = [t.name for t in page.targets]
    peak = max([v for _, lags in page.history for v in lags.values()] + [1.0])
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="lag per target over the last hour">',
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for frac in (0.0, 0.5, 1.0):
        y = top + h - frac * h
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_e(seconds(peak * frac))}</text>')
    for label, x in (("1 h ago", left), ("30 min", left + w / 2), ("now", left + w)):
        anchor = "start" if x == left else "end" if x == left + w else "middle"
        parts.append(f'<text x="{x:.1f}" y="{height - 6}" text-anchor="{anchor}">{label}</text>')
    for i, name in enumerate(names):
        pts = [
            (left + (t - start) / span * w, top + h - lags[name] / peak * h)
            for t, lags in page.history
            if name in lags and t >= start
        ]
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        parts.append(
            f'<polyline class="lag" data-target="{_e(name)}" data-points="{len(pts)}" points="{coords}" '
            f'fill="none" stroke="{color}" stroke-width="2"/>'
        )
    parts.append("</svg>")
    legend = " ".join(
        f'<span class="key"><i style="background:{COLORS[i % len(COLORS)]}"></i>{_e(n)}</span>'
        for i, n in enumerate(names)
    )
    return "".join(parts) + f'<div class="legend">{legend}</div>'


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;padding:12px;color:#222;
background:#fff;max-width:980px;margin:auto}
h1{font-size:1.3em;margin:.2em 0}h2{font-size:1.05em;margin:1.2em 0 .4em}
.figs{display:flex;flex-wrap:wrap;gap:8px}.fig{border:1px solid #ddd;border-radius:6px;padding:6px 10px;min-width:9em}
.fig b{display:block;font-size:1.15em}.muted{color:#666;font-size:.85em}
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:5px 8px;
border-bottom:1px solid #eee;vertical-align:top}td.n{text-align:right;white-space:nowrap}
.state{font-weight:600;border-radius:4px;padding:1px 6px}.live{background:#e3f5e1;color:#1b6e1b}
.stopped{background:#fde2e1;color:#a11}.catching{background:#fff4d6;color:#8a6100}
.chart{width:100%;height:auto;font-size:11px;fill:#555}.legend{font-size:.85em}
.key{margin-right:12px;white-space:nowrap}.key i{display:inline-block;width:10px;height:10px;margin-right:4px}
.card{border:1px solid #f3c2c0;background:#fff8f8;border-radius:6px;padding:8px 10px;margin:6px 0}
.card div{margin-top:4px}code{background:#f3f3f3;padding:1px 4px;border-radius:3px;word-break:break-all}
"""


def render(page: Page) -> str:
    """The page as one HTML document."""
    figs = [
        ("targets", str(len(page.targets))),
        ("stopped tables", str(len(page.stopped))),
        ("capture", "-" if page.capture_running is None else "running" if page.capture_running else "NOT RUNNING"),
        ("units / s", "-" if page.units_per_second is None else f"{page.units_per_second:.2f}"),
        ("changes / s", "-" if page.changes_per_second is None else f"{page.changes_per_second:,.0f}"),
        ("log", size(page.log_bytes)),
        (f"slot {page.slot}".strip() + " retains", size(page.slot_retained_bytes)),
    ]
    rows = []
    for t in page.targets:
        css = {"live": "live", "stopped": "stopped"}.get(t.state, "catching")
        err = f'<div class="muted">{_e(t.error)}</div>' if t.error else ""
        rows.append(
            f'<tr class="target" data-target="{_e(t.name)}" data-state="{_e(t.state)}"><td>{_e(t.name)}{err}</td>'
            f'<td><span class="state {css}">{_e(t.state)}</span></td><td><code>{_e(t.position or "-")}</code></td>'
            f'<td class="n">{_e(seconds(t.lag_seconds))}</td><td class="n">{_e(size(t.lag_bytes))}</td></tr>'
        )
    stopped = "".join(
        f'<div class="card stopped-table" data-target="{_e(s.target)}" data-table="{_e(s.table)}">'
        f'<b>{_e(s.table)}</b> at <b>{_e(s.target)}</b> <span class="muted">since {_e(clock(s.since))}</span>'
        f"<div>{_e(s.reason)}</div><div class=muted>what ends it: <code>{_e(s.remedy)}</code></div></div>"
        for s in page.stopped
    )
    stopped_html = stopped or '<p class="muted" id="no-stopped">No table is stopped.</p>'
    notes = "".join(f'<p class="muted">{_e(n)}</p>' for n in page.notes)
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>mirrorline status</title><style>{STYLE}</style></head><body>"
        f'<h1>mirrorline</h1><p class="muted">as of {_e(clock(page.now))}; this page reloads every '
        f"{REFRESH_SECONDS} s; the figures in Prometheus form are at <a href=/metrics>/metrics</a></p>"
        '<div class="figs">'
        + "".join(f'<div class="fig"><span class="muted">{_e(k)}</span><b>{_e(v)}</b></div>' for k, v in figs)
        + "</div><h2>Targets</h2>"
        '<div class="scroll"><table id="targets"><tr><th>target</th><th>state</th><th>applied</th><th>lag</th>'
        "<th>behind</th></tr>" + "".join(rows) + "</table></div>"
        "<h2>Lag over the last hour</h2>"
        + chart(page)
        + "<h2>Stopped tables</h2>"
        + stopped_html
        + notes
        + "</body></html>\n"
    )
