"""History charts, drawn on the server as SVG from the rollups (dashboard/rollups.py).

SVG drawn here needs no script, passes the CSP (no inline styles: colours come from
classes in app.css), reads the same in a screenshot as in a browser, and costs one small
query per chart set. Hover values are each point's <title> (the browser's own tooltip).
Four charts per view: throughput (done and failed per minute), backlog (ready and
retrying, as sampled), and the p50/p95 of time in queue and of run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg

from dashboard.durations import duration
from dashboard.errors import InvalidInput
from dashboard.rollups import SQL, percentile


@dataclass(frozen=True)
class Range:
    name: str
    label: str
    grain: str  # the rollup rows it reads
    step: int  # seconds per point
    span: int  # seconds shown


RANGES = {
    r.name: r
    for r in (
        Range("1h", "1 hour", "minute", 60, 3600),
        Range("24h", "24 hours", "minute", 900, 86400),
        Range("7d", "7 days", "hour", 3600, 7 * 86400),
    )
}
DEFAULT_RANGE = "1h"

# The drawing area inside a chart's viewBox (0 0 WIDTH HEIGHT).
WIDTH, HEIGHT = 600, 170
LEFT, RIGHT, TOP, BOTTOM = 46, 592, 12, 146


def check_range(name: str | None) -> Range:
    if name is None or name == "":
        return RANGES[DEFAULT_RANGE]
    if name not in RANGES:
        raise InvalidInput("range", f"must be one of {', '.join(RANGES)}")
    return RANGES[name]


@dataclass
class Line:
    name: str  # also its CSS class
    label: str
    paths: list[str] = field(default_factory=list)  # one per run of points without a gap


@dataclass
class Bar:
    name: str
    x: float
    y: float
    width: float
    height: float


@dataclass
class Hover:
    x: float
    width: float
    text: str


@dataclass
class Chart:
    key: str
    title: str
    unit: str  # "per minute" or "seconds"
    top_label: str
    x_labels: list[tuple[float, str]]
    legend: list[tuple[str, str]]
    lines: list[Line] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    hovers: list[Hover] = field(default_factory=list)
    empty: bool = False


@dataclass
class ChartSet:
    queue: str | None  # None: every queue
    range: Range
    charts: list[Chart]
    empty: bool  # no rollup row at all in the range


async def chart_set(
    db: asyncpg.Pool | asyncpg.Connection, queue: str | None, range_name: str | None
) -> ChartSet:
    rng = check_range(range_name)
    now = datetime.now(UTC)
    since = _bin(now - timedelta(seconds=rng.span), rng.step) + timedelta(seconds=rng.step)
    rows = await SQL.series.fetch(db, grain=rng.grain, queue=queue or "*", since=since, step=float(rng.step))
    by_at = {r["at"]: r for r in rows}
    slots = [since + timedelta(seconds=rng.step * i) for i in range(rng.span // rng.step)]
    points = [by_at.get(at) for at in slots]
    per = rng.step / 60  # minutes per point: throughput is shown per minute
    charts = [
        _bars(rng, slots, points, per),
        _lines(
            "backlog", "Backlog", "todos", rng, slots, points,
            [("ready", "ready", lambda p: p["ready"]), ("retrying", "retrying", lambda p: p["retrying"])],
            _count,
        ),
        _lines(
            "waited", "Time in queue", "seconds", rng, slots, points,
            [("p50", "p50", _quantile("waited", 0.5)), ("p95", "p95", _quantile("waited", 0.95))],
            _seconds,
        ),
        _lines(
            "ran", "Run time", "seconds", rng, slots, points,
            [("p50", "p50", _quantile("ran", 0.5)), ("p95", "p95", _quantile("ran", 0.95))],
            _seconds,
        ),
    ]  # fmt: skip
    return ChartSet(queue, rng, charts, empty=not rows)


def _bin(at: datetime, step: int) -> datetime:
    """`at` rounded down to a multiple of step seconds (the series' date_bin)."""
    origin = datetime(2000, 1, 1, tzinfo=UTC)
    return origin + timedelta(seconds=(at - origin).total_seconds() // step * step)


def _quantile(histogram: str, q: float):
    def value(p):
        return percentile(p[histogram], q) if p[histogram] else None

    return value


def _seconds(v: float) -> str:
    """A latency: milliseconds below a second (a chart of time in queue needs them)."""
    return f"{v * 1000:.0f} ms" if v < 1 else duration(v)


def _count(n: float) -> str:
    return f"{n:,.0f}" if n >= 10 or n == int(n) else f"{n:.1f}"


def _x(i: int, n: int) -> float:
    return LEFT + (RIGHT - LEFT) * i / n


def _y(value: float, top: float) -> float:
    return BOTTOM - (BOTTOM - TOP) * (value / top if top else 0)


def _nice(peak: float) -> float:
    """The axis top: the peak rounded up to 1, 2 or 5 times a power of ten."""
    if peak <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(peak))) / 10 if peak >= 1 else 1.0
    for m in (1, 2, 5, 10):
        if peak <= m * magnitude:
            return m * magnitude
    return 10 * magnitude


def _x_labels(rng: Range, slots: list[datetime]) -> list[tuple[float, str]]:
    fmt = "%a %d %H:%M" if rng.span > 86400 else "%H:%M"
    n = len(slots)
    return [(_x(i, n), slots[i].strftime(fmt) + (" UTC" if i == n - 1 else "")) for i in (0, n // 2, n - 1)]


def _frame(key: str, title: str, unit: str, rng: Range, slots, top: float, fmt) -> Chart:
    return Chart(key, title, unit, fmt(top), _x_labels(rng, slots), legend=[])


def _hover_text(rng: Range, at: datetime, parts: list[str]) -> str:
    fmt = "%a %d %b %H:%M" if rng.span > 86400 else "%H:%M"
    return f"{at.strftime(fmt)} UTC: " + ", ".join(parts)


def _bars(rng: Range, slots, points, per: float) -> Chart:
    """Done and failed per minute, stacked (failed on top)."""
    done = [p["completed"] / per if p else 0.0 for p in points]
    failed = [p["failed"] / per if p else 0.0 for p in points]
    top = _nice(max((d + f for d, f in zip(done, failed, strict=True)), default=0))
    chart = _frame("throughput", "Throughput", "per minute", rng, slots, top, _count)
    chart.legend = [("done", "done / min"), ("failed", "failed / min")]
    n = len(slots)
    width = (RIGHT - LEFT) / n
    for i, (d, f) in enumerate(zip(done, failed, strict=True)):
        x = _x(i, n) + width * 0.1
        if d:
            chart.bars.append(Bar("done", x, _y(d, top), width * 0.8, BOTTOM - _y(d, top)))
        if f:
            chart.bars.append(Bar("failed", x, _y(d + f, top), width * 0.8, _y(d, top) - _y(d + f, top)))
        chart.hovers.append(
            Hover(
                _x(i, n),
                width,
                _hover_text(rng, slots[i], [f"{_count(d)} done/min", f"{_count(f)} failed/min"]),
            )
        )
    chart.empty = not any(done) and not any(failed)
    return chart


def _lines(key, title, unit, rng: Range, slots, points, series, fmt) -> Chart:
    values = [[value(p) if p else None for p in points] for _, _, value in series]
    top = _nice(max((v for vs in values for v in vs if v is not None), default=0))
    chart = _frame(key, title, unit, rng, slots, top, fmt)
    chart.legend = [(name, label) for name, label, _ in series]
    n = len(slots)
    width = (RIGHT - LEFT) / n
    for (name, label, _), vs in zip(series, values, strict=True):
        line = Line(name, label)
        run: list[str] = []
        for i, v in enumerate(vs):
            if v is None:
                if run:
                    line.paths.append(" ".join(run))
                run = []
                continue
            run.append(f"{'M' if not run else 'L'}{_x(i, n) + width / 2:.1f},{_y(v, top):.1f}")
        if run:
            line.paths.append(" ".join(run))
        chart.lines.append(line)
    for i in range(n):
        parts = [
            f"{label} {fmt(vs[i]) if vs[i] is not None else '—'}"
            for (_, label, _), vs in zip(series, values, strict=True)
        ]
        chart.hovers.append(Hover(_x(i, n), width, _hover_text(rng, slots[i], parts)))
    chart.empty = all(v is None for vs in values for v in vs)
    return chart
