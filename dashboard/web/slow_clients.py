"""A request head (request line and headers) must arrive within a time limit, or the
connection is closed: uvicorn's HTTP protocol with a header timeout.

uvicorn bounds the quiet between requests on a keep-alive connection (timeout_keep_alive,
cancelled by the first byte of the next request) but not the wait for a request head:
a client that connects and sends nothing, or half a header, keeps its connection (a file
descriptor and a slot of limit_concurrency) as long as it likes — slowloris.

HeaderTimeoutProtocol arms a timer when a connection opens and again when a response is
complete, and cancels it once a request's headers are complete; if it fires, the
connection is closed without an answer. A request whose head is complete is never cut,
however long its response runs (SSE streams, long-poll claims), and neither is a slow
request body: a reverse proxy that buffers requests covers that.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("switchboard.server")


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """Closes a connection whose next request head is not complete `header_timeout`
    seconds after the connection opened or the previous response ended."""

    header_timeout: float = 10.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_headers_complete(self) -> None:
        self._stop_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn arms its keep-alive timer only when the connection stays open with no
        # pipelined request queued: exactly when the next head is awaited.
        if self.timeout_keep_alive_task is not None:
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._stop_header_timer()
        self.header_timer = self.loop.call_later(self.header_timeout, self._header_timed_out)

    def _stop_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_timed_out(self) -> None:
        self.header_timer = None
        busy = self.cycle is not None and not self.cycle.response_complete
        if busy or self.transport.is_closing():
            return
        log.debug("no complete request head from %s within %gs: closed", self.client, self.header_timeout)
        self.transport.close()


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class to give uvicorn.Config as `http=`, closing after `seconds`."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})
