"""Log lines written by a thread of their own, in batches.

A web process logs a line per request (dashboard/web/access_log.py). Written on the event
loop, a slow stderr (a stalled process manager, a full pipe) would stall every request;
handed to a thread one record at a time (logging's QueueHandler, Litestar's default), each
record cost a lock and a thread wake-up, about a tenth of an API request's CPU. Here a
request only appends its record to a deque; the thread wakes every FLUSH_EVERY seconds and
writes whatever has gathered through the handlers that were there before.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading

FLUSH_EVERY = 0.1  # seconds a line may wait before it is written


class BackgroundHandler(logging.Handler):
    def __init__(self, targets: list[logging.Handler]):
        super().__init__()
        self.targets = targets
        self._records: collections.deque[logging.LogRecord] = collections.deque()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="switchboard-log", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)  # atomic; formatted later, in the thread

    def _run(self) -> None:
        while not self._stopping.wait(FLUSH_EVERY):
            self._write()
        self._write()

    def _write(self) -> None:
        while self._records:
            record = self._records.popleft()
            for target in self.targets:
                if record.levelno >= target.level:
                    target.handle(record)

    def flush(self) -> None:
        """Write what has gathered now, from the calling thread."""
        self._write()

    def close(self) -> None:
        """Write what is left, then stop the thread."""
        self._stopping.set()
        self._thread.join()
        super().close()


def flush() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()


def write_in_background() -> None:
    """Put the root logger's handlers behind a BackgroundHandler (once per process)."""
    root = logging.getLogger()
    if any(isinstance(h, BackgroundHandler) for h in root.handlers):
        return
    handler = BackgroundHandler(root.handlers[:])
    root.handlers[:] = [handler]
    atexit.register(handler.close)
