"""Prometheus metrics: what each process counts, and the text a scrape reads.

Counters and histograms live in prometheus_client's default registry, one set per
process, as Prometheus expects (each process is scraped as its own target). The Store
calls the small functions below after its statement has returned, with the rows that
statement gave back: no extra SQL, nothing counted in the database. The per-queue gauges
are not kept here: each scrape builds them from the overview's counts (`exposition`).
"""

from __future__ import annotations

import functools
from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from dashboard.horizon import Horizon
from dashboard.models import Created, Todo
from dashboard.reads import QueueStats


def _per_queue(name: str, doc: str) -> Counter:
    return Counter(f"switchboard_todos_{name}", doc, ["queue"])


CREATED = _per_queue("created", "Todos created.")
DEDUPLICATED = _per_queue("deduplicated", "Deliveries collapsed onto a live todo with the same key.")
CLAIMED = _per_queue("claimed", "Claims (each attempt counts).")
COMPLETED = _per_queue("completed", "Todos completed.")
FAILED = _per_queue("failed", "Attempts failed by their agent (retried or dead-lettered).")
RETRIED = _per_queue("retried", "Dead-letters retried by an operator.")
DEAD_LETTERED = _per_queue("dead_lettered", "Todos dead-lettered (failed or reaped at the cap).")
REAPED = _per_queue("reaped", "Lapsed leases taken back by the reaper.")
RELEASED = _per_queue("released", "Leases given back, by their agent or by an operator.")
CANCELLED = _per_queue("cancelled", "Todos cancelled (pending or claimed; dead-lettered as cancelled).")
FENCED = Counter(
    "switchboard_fencing_refusals",
    "Heartbeats and acks refused because a later claim superseded their lease.",
    ["queue", "action"],
)
_LONG = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600)
TIME_IN_QUEUE = Histogram(
    "switchboard_todo_time_in_queue_seconds",
    "From becoming claimable (creation, or the time it was scheduled for) to first claim.",
    ["queue"],
    buckets=_LONG,
)
RUN_TIME = Histogram(
    "switchboard_todo_run_seconds",
    "From claim to completion or failure, per attempt.",
    ["queue", "outcome"],
    buckets=_LONG,
)
HTTP_REQUESTS = Histogram(
    "switchboard_http_request_duration_seconds",
    "HTTP requests by method, route template and status.",
    ["method", "route", "status"],
    buckets=(*Histogram.DEFAULT_BUCKETS[:-1], 30, 60),  # long-poll claims wait up to 60 s
)


@functools.lru_cache(maxsize=4096)
def _child(metric, *labels: str):
    """metric.labels(*labels), remembered: the lookup cost more than the count itself on
    the store's hot paths (the metric keeps every child anyway)."""
    return metric.labels(*labels)


def created(results: Iterable[Created]) -> None:
    for (new, queue), n in Tally((r.created, r.todo.queue) for r in results).items():
        _child(CREATED if new else DEDUPLICATED, queue).inc(n)


def claimed(todos: Iterable[Todo]) -> None:
    for todo in todos:
        _child(CLAIMED, todo.queue).inc()
        if todo.attempt == 1:  # the first attempt: later ones wait since a retry or release
            ready = todo.ready_at or todo.created_at
            _child(TIME_IN_QUEUE, todo.queue).observe((todo.claimed_at - ready).total_seconds())


def completed(todos: Iterable[Todo]) -> None:
    for todo in todos:
        _child(COMPLETED, todo.queue).inc()
        _ran(todo, "completed")


def failed(todo: Todo) -> None:
    _child(FAILED, todo.queue).inc()
    _ran(todo, "failed")
    _maybe_dead(todo)


def reaped(todos: Iterable[Todo]) -> None:
    for todo in todos:
        _child(REAPED, todo.queue).inc()
        _maybe_dead(todo)


def released(todo: Todo) -> None:
    _child(RELEASED, todo.queue).inc()


def retried(todo: Todo) -> None:
    _child(RETRIED, todo.queue).inc()


def cancelled(todo: Todo) -> None:
    _child(CANCELLED, todo.queue).inc()


def fenced(queue: str, action: str) -> None:
    _child(FENCED, queue, action).inc()


def request(method: str, route: str, status: int, seconds: float) -> None:
    _child(HTTP_REQUESTS, method, route, str(status)).observe(seconds)


def _ran(todo: Todo, outcome: str) -> None:
    # The finishing statement sets updated_at (and claimed_at is still the attempt's).
    _child(RUN_TIME, todo.queue, outcome).observe((todo.updated_at - todo.claimed_at).total_seconds())


def _maybe_dead(todo: Todo) -> None:
    if todo.state == "failed":
        _child(DEAD_LETTERED, todo.queue).inc()


class _QueueGauges:
    """The overview's counts and what holds back vacuum, as gauges, for one scrape."""

    def __init__(self, stats: list[QueueStats] | None, horizon: Horizon | None):
        self.stats = stats or []
        self.horizon = horizon

    def collect(self):
        yield from self._queues()
        if self.horizon is not None:
            held = GaugeMetricFamily(
                "switchboard_vacuum_held_back_seconds",
                "Age of the oldest open transaction, prepared transaction or replication slot "
                "holding back vacuum in this database (0 when none).",
            )
            held.add_metric([], self.horizon.oldest.age if self.horizon.oldest else 0.0)
            dead = GaugeMetricFamily(
                "switchboard_dead_tuples", "Dead row versions in the hot tables.", labels=["table"]
            )
            for table, n in self.horizon.dead_tuples.items():
                dead.add_metric([table], n)
            yield from (held, dead)

    def _queues(self):
        todos = GaugeMetricFamily(
            "switchboard_queue_todos",
            "Todos by state: ready, scheduled, retrying, claimed, dead.",
            labels=["queue", "state"],
        )
        lapsed = GaugeMetricFamily(
            "switchboard_queue_lapsed_leases",
            "Claimed todos whose lease lapsed, not yet reaped.",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "switchboard_queue_oldest_ready_age_seconds",
            "Age of the oldest claimable todo (0 when none).",
            labels=["queue"],
        )
        for s in self.stats:
            for state in ("ready", "scheduled", "retrying", "claimed", "dead"):
                todos.add_metric([s.queue, state], getattr(s, state))
            lapsed.add_metric([s.queue], s.lapsed)
            oldest.add_metric([s.queue], float(s.oldest_ready_age or 0))  # numeric from SQL
        return [todos, lapsed, oldest]


def exposition(stats: list[QueueStats] | None, horizon: Horizon | None = None) -> bytes:
    """This process's metrics in the Prometheus text format, with the queue gauges from
    `stats` and the vacuum gauges from `horizon` (None: the database did not answer; the
    process's own metrics still do)."""
    text = generate_latest(REGISTRY)
    if stats is not None or horizon is not None:
        gauges = CollectorRegistry()
        gauges.register(_QueueGauges(stats, horizon))
        text += generate_latest(gauges)
    return text
