"""Not a benchmark: the other process in queue_throughput.py's hint wake-up latency.

    python bench/hint_listener.py DSN QUEUE

Starts a dashboard.notify.Hub of its own on DSN (its own LISTEN connection, as a worker
or another web process has), subscribes to QUEUE, prints `ready`, then one line per
wake-up: the time.monotonic() at which the subscription's wait returned (CLOCK_MONOTONIC,
the same clock in every process on the machine) and the queues hinted. Stops on SIGTERM
or when stdin closes, stopping its hub first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time

from dashboard.notify import Hub


async def listen(dsn: str, queue: str) -> None:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    loop.add_signal_handler(signal.SIGTERM, main.cancel)
    loop.add_reader(sys.stdin.fileno(), lambda: sys.stdin.read(1) or main.cancel())
    hub = Hub(dsn)
    await hub.start()
    try:
        if not hub.connected.is_set():
            raise SystemExit("the hub did not connect")
        with hub.subscribe([queue]) as sub:
            print("ready", flush=True)
            while True:
                await sub.wait()
                woke = time.monotonic()
                hinted, resync = sub.take()
                print(
                    f"{woke:.9f} {','.join(sorted(hinted)) or '-'}{' resync' if resync else ''}", flush=True
                )
    finally:
        await hub.stop()


def main() -> int:
    dsn, queue = sys.argv[1:3]
    with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
        asyncio.run(listen(dsn, queue))
    return 0


if __name__ == "__main__":
    sys.exit(main())
