"""What the benchmarks compute and print: percentiles, one variant's rates over the
repetitions, concurrent jobs timed together, the rotating order of the variants, CPU use
while measuring, and plain-text tables.

Pure Python on numbers and strings, apart from reading CPU times: no server, no database
and no app here (that is harness.py).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Protocol

import psutil


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between closest ranks."""
    data = sorted(values)
    if not data:
        return float("nan")
    k = (len(data) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


@dataclass
class Series:
    """One variant's throughput over the repetitions."""

    key: str
    label: str
    rates: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """(max - min) / median, as a fraction."""
        if len(self.rates) < 2:
            return 0.0
        return (max(self.rates) - min(self.rates)) / self.median

    def rate_cells(self) -> tuple[str, str]:
        """The median and the spread (± half the min-max range) as the tables show them."""
        return f"{self.median:,.0f}", f"±{self.spread * 50:.0f}%" if len(self.rates) > 1 else ""


async def timed(jobs: list[Awaitable[int]]) -> tuple[float, int]:
    """Run the jobs concurrently; seconds taken and the sum of what they return."""
    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(job) for job in jobs]
    elapsed = time.perf_counter() - start
    return elapsed, sum(t.result() for t in tasks)


def rotated(variants: list, rep: int) -> list:
    """The variants in a different order each repetition."""
    k = rep % len(variants)
    return variants[k:] + variants[:k]


# -- CPU use -------------------------------------------------------------------------------


class Measured(Protocol):
    def cpu_seconds(self) -> float: ...


@dataclass
class CPU:
    """CPU seconds used during a measurement by the app and this process; the rest of the
    machine's busy time (PostgreSQL and anything else running) in cores."""

    app: float
    bench: float
    rest: float  # cores
    wall: float

    def per_todo(self, n: int) -> tuple[float, float]:
        """ms of CPU per todo: (app, bench)."""
        return self.app * 1000 / n, self.bench * 1000 / n

    def cores(self) -> str:
        """Cores used: the app, this process, and the rest of the machine."""
        return (
            f"app {self.app / self.wall:.2f}, bench {self.bench / self.wall:.2f}, rest of the machine "
            f"(PostgreSQL and anything else) {self.rest:.2f}"
        )


class CPUMeter:
    """`with CPUMeter(app) as meter:` ... then meter.result, the CPU used while inside."""

    def __init__(self, app: Measured) -> None:
        self.app = app

    def __enter__(self) -> CPUMeter:
        self.wall = time.perf_counter()
        self.app0 = self.app.cpu_seconds()
        self.bench0 = time.process_time()
        self.busy0 = self._busy()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self.wall
        app = self.app.cpu_seconds() - self.app0
        bench = time.process_time() - self.bench0
        busy = self._busy() - self.busy0
        self.result = CPU(app, bench, max(0.0, busy - app - bench) / wall, wall)

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)


# -- tables --------------------------------------------------------------------------------


def table(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    """Rows of cells in aligned columns (those in `right` right-aligned), two spaces apart;
    a row of one cell is a section heading, after a blank line."""
    full = [r for r in rows if len(r) > 1]
    widths = [max(len(r[i]) for r in full) for i in range(len(full[0]))]
    out = []
    for r in rows:
        if len(r) == 1:
            out.extend(["", r[0]])
            continue
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return out
