"""Log lines written by a thread of their own, in batches.

A web process logs a line per request (dashboard/web/access_log.py). Written on the event
loop, a slow stderr (a stalled process manager, a full pipe) would stall every request;
handed to a thread one record at a time (logging's QueueHandler, Litestar's default), each
record cost a lock and a thread wake-up, about a tenth of an API request's CPU. Here a
request only appends its record to a deque; the thread wakes every FLUSH_EVERY seconds and
writes whatever has gathered through the handlers that were there before, a stream
handler's lines in one write. The access log goes further: a request appends only its
facts (`defer`), and the thread makes the record (dated when the request ended) too.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

FLUSH_EVERY = 0.1  # seconds a line may wait before it is written


class BackgroundHandler(logging.Handler):
    def __init__(self, targets: list[logging.Handler]):
        super().__init__()
        self.targets = targets
        self._records: collections.deque[logging.LogRecord] = collections.deque()
        self._calls: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="switchboard-log", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)  # atomic; formatted later, in the thread
        if self._stopping.is_set():  # closed (logging.config closes every handler): write now
            self._write()

    def _run(self) -> None:
        while not self._stopping.wait(FLUSH_EVERY):
            self._write()
        self._write()

    def defer(self, call: Callable[..., None], *args: Any) -> None:
        """Run `call(*args)` on the thread before its next write (at once once closed)."""
        if self._stopping.is_set():
            call(*args)
        else:
            self._calls.append((call, args))

    def _write(self) -> None:
        while self._calls:
            call, args = self._calls.popleft()
            call(*args)  # it logs: its records join self._records
        records = []
        while self._records:
            records.append(self._records.popleft())
        for target in self.targets:
            mine = [r for r in records if r.levelno >= target.level]
            if type(target).emit is logging.StreamHandler.emit:
                _write_lines(target, mine)
            else:
                for record in mine:
                    target.handle(record)

    def flush(self) -> None:
        """Write what has gathered now, from the calling thread."""
        self._write()

    def close(self) -> None:
        """Write what is left, then stop the thread."""
        self._stopping.set()
        self._thread.join()
        super().close()


def _write_lines(target: logging.StreamHandler, records: list[logging.LogRecord]) -> None:
    """What target.handle would write for each record, in one write and one flush."""
    lines = []
    for record in records:
        try:
            if target.filter(record):
                lines.append(target.format(record) + target.terminator)
        except Exception:
            target.handleError(record)
    if not lines:
        return
    with target.lock:  # type: ignore[union-attr]  # created by Handler.__init__
        try:
            target.stream.write("".join(lines))
            target.flush()
        except Exception:
            target.handleError(records[-1])


_writer: BackgroundHandler | None = None  # serve's, once write_in_background made it


def defer(call: Callable[..., None], *args: Any) -> None:
    """`call(*args)` on serve's log thread, or now where there is none (tests, other commands)."""
    if _writer is None:
        call(*args)
    else:
        _writer.defer(call, *args)


def flush() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()


def write_in_background() -> None:
    """Put the root logger's handlers behind a BackgroundHandler (once per process)."""
    root = logging.getLogger()
    if any(isinstance(h, BackgroundHandler) for h in root.handlers):
        return
    global _writer
    handler = BackgroundHandler(root.handlers[:])
    root.handlers[:] = [handler]
    _writer = handler
    atexit.register(handler.close)
