"""History charts in a real Chromium: drawn with data and without, ranges switch, hover
values, live updates, no CSP violation; screenshots at 1400 px and 390 px."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from dashboard.rollups import BOUNDS, SAMPLE_KEEP_SECONDS, SQL
from dashboard.store import Store
from tests.browser.conftest import on_database
from tests.browser.test_dashboard_browser import csp_violations
from tests.factories import new_todo, unique

pytestmark = pytest.mark.browser


def seed_minutes(dsn: str, queue: str, minutes: int, done: int, *, ago: int = 1) -> None:
    """Minute rollup rows for `queue` over the last `minutes` minutes (the newest `ago`
    minutes back), each with `done` completions, a failure, a backlog and histograms."""
    hist = [0] * (len(BOUNDS) + 1)
    hist[BOUNDS.index(1.0)] = done  # between 0.5 s and 1 s

    async def work(conn):
        await conn.execute(
            """INSERT INTO queue_rollups (grain, queue, at, created, claimed, completed, failed,
                                          waited, ran, ready, retrying)
               SELECT 'minute', $1, date_trunc('minute', now()) - make_interval(mins => m),
                      $3, $3, $3, 1, $4, $4, 10 + m, m % 3
               FROM generate_series($5::int, $5 + $2 - 1) AS m
               ON CONFLICT (grain, queue, at) DO UPDATE SET completed = excluded.completed""",
            queue,
            minutes,
            done,
            hist,
            ago,
        )

    on_database(dsn, work)


def sample_backlog(dsn: str) -> None:
    """What the live server's backlog sampler does every few seconds, done now (without its
    lock, which the server's own job may hold): a seeded queue's backlog of zero is written
    into this minute's and this hour's rows, so a test sees the same rows whenever it runs."""

    async def work(conn):
        await SQL.sample_backlog.execute(conn, keep_seconds=SAMPLE_KEEP_SECONDS)

    on_database(dsn, work)


def test_queue_charts_draw_data_switch_ranges_and_show_values(logged_in, live_dsn, console, shot):
    page = logged_in
    queue = unique("charts")
    seed_minutes(live_dsn, queue, 50, 12)
    sample_backlog(live_dsn)
    page.goto(f"/queues/{queue}")

    charts = page.locator("#charts figure.chart")
    expect(charts).to_have_count(4)
    throughput = page.locator('[data-chart="throughput"]')
    expect(throughput.locator("rect.bar.done")).to_have_count(50)
    expect(throughput.locator("rect.bar.failed")).to_have_count(50)
    expect(page.locator('[data-chart="backlog"] path.line.ready')).to_have_count(1)
    expect(page.locator('[data-chart="waited"] path.line.p50')).to_have_count(1)
    titles = throughput.locator("rect.hover title").all_text_contents()
    assert any("12 done/min, 1 failed/min" in t for t in titles), titles[:3]
    waited = page.locator('[data-chart="waited"] rect.hover title').all_text_contents()
    assert any(re.search(r"p50 \d+ ms", t) for t in waited), waited[:3]
    shot("1h")

    page.locator(".ranges a", has_text="24h").click()
    expect(page.locator(".ranges a.current")).to_have_text("24h")
    expect(page).to_have_url(re.compile(r"range=24h"))
    # 15-minute points: 50 minutes of data fall into 4 or 5 of them
    assert page.locator('[data-chart="throughput"] rect.bar.done').count() in (4, 5)

    page.locator(".ranges a", has_text="7d").click()
    expect(page.locator(".ranges a.current")).to_have_text("7d")
    # 7-day points are hours, and no hour row was seeded: none of the minutes' completions,
    # times or backlog show. (The sampler's zero backlog for this hour is the one point.)
    expect(page.locator('[data-chart="throughput"] rect.bar')).to_have_count(0)
    for key in ("throughput", "waited", "ran"):
        expect(page.locator(f'[data-chart="{key}"] text.nodata')).to_have_count(1)
    backlog = page.locator('[data-chart="backlog"] rect.hover title').all_text_contents()
    assert backlog and not any(re.search(r"(ready|retrying) [1-9]", t) for t in backlog), backlog[-3:]
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"/queues/{queue}?range=1h")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot("390")
    assert csp_violations(console) == []


def test_charts_without_data_say_so(logged_in, console):
    page = logged_in
    page.goto(f"/queues/{unique('nochart')}")
    expect(page.locator("#charts p.empty")).to_contain_text("No history in the last 1 hour")
    expect(page.locator("#charts figure.chart.empty")).to_have_count(4)
    expect(page.locator("#charts text.nodata")).to_have_count(4)
    assert csp_violations(console) == []


def test_overview_charts_render_and_update_live(logged_in, live_dsn, console, shot):
    page = logged_in
    queue = unique("livechart")
    page.goto(f"/queues/{queue}")
    expect(page.locator("#charts p.empty")).to_be_visible()

    seed_minutes(live_dsn, queue, 5, 7)

    async def enqueue(conn):  # a hint for the queue: its page refreshes the charts
        await Store(conn).create(new_todo(queue, "wake"))

    on_database(live_dsn, enqueue)
    expect(page.locator('[data-chart="throughput"] rect.bar.done')).to_have_count(5, timeout=40_000)

    page.goto("/")
    expect(page.locator("#charts figure.chart")).to_have_count(4)
    expect(page.locator(".ranges a.current")).to_have_text("1h")
    shot("overview")
    assert csp_violations(console) == []
