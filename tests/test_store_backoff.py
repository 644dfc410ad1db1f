"""Retry backoff with full jitter (0003_backoff_jitter.sql): a failure below the cap
retries after a random delay in [0, min(2^attempt, 3600)] s, so a burst of failures does
not come back as a burst."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.factories import new_todo


async def retry_delays(store, pool, count: int, attempt: int) -> list[float]:
    """Fail `count` claimed todos at once (on many connections); each retry delay in seconds."""
    await store.create_many([new_todo(title=f"t{i}", max_attempts=100) for i in range(count)])
    await pool.execute("UPDATE todos SET attempt = $1", attempt - 1)
    held = await store.claim_batch(["q"], "w1", 300, count)
    await asyncio.gather(*(store.fail(t.id, "w1", t.lease_token, "downstream outage") for t in held))
    rows = await pool.fetch("SELECT extract(epoch FROM next_retry_at - updated_at) AS delay FROM todos")
    return [float(r["delay"]) for r in rows]


async def test_a_thousand_simultaneous_failures_come_back_spread_over_the_jitter_window(store, pool):
    delays = await retry_delays(store, pool, 1000, attempt=3)  # window: [0, 2^3 = 8] s
    assert len(delays) == 1000 and all(0 <= d <= 8.001 for d in delays)
    assert min(delays) < 0.5 and max(delays) > 7.5
    buckets = Counter(int(d) for d in delays)  # eight one-second buckets of ~125 each
    assert all(60 <= buckets[b] <= 200 for b in range(8)), buckets


async def test_jittered_retry_delays_never_pass_the_one_hour_cap(store, pool):
    delays = await retry_delays(store, pool, 300, attempt=20)  # 2^20 s, capped at 3600
    assert all(0 <= d <= 3600.001 for d in delays)
    assert max(delays) > 3000 and min(delays) < 600
