"""uvicorn's httptools protocol with the two limits it lacks: the size of a request's head
(request line and headers) and the time a client may take to send it or to go silent in the
middle of a body.

httptools keeps an unfinished header in memory as it arrives and uvicorn sets no timer before a
connection's first response, so 16 clients sending 4 MiB headers slowly held 80 MiB and were
never closed, and a 32 MiB header was served. Here a head past `max_head` bytes is answered 431
and closed (the limit holds to within one read, at most 256 KiB), a head not complete within
`timeout` seconds of the connection or of its first byte is answered 408 and closed, and a body
that sends nothing for `timeout` seconds is closed (the app sees the client gone).

A refusal closes the way HTTP servers do it (nginx's lingering close): the answer, then a
half-close (FIN after it), then whatever the client still sends is read and dropped until it
closes or LINGER seconds pass. Closing at once with the client's bytes unread makes the kernel
reset the connection, which can drop the answer before it leaves: the client, still sending its
4 MiB header, saw "connection reset" instead of the 431 (once in a CI run, under load).

The limit is each request's own: pipelined requests arriving in one read are counted one by one
(the request line and headers as the parser hands them over), and a head still unfinished at
the end of a read counts the reads it spans, so 200 pipelined GETs with 1 KiB of headers each
are 200 heads of 1 KiB, not one of 200 KiB.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _response(status: str, message: str) -> bytes:
    body = ('{"error": "%s"}' % message).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


LINGER = 2.0  # seconds a refused connection is drained (at most; the client's close ends it sooner)


class LimitedProtocol(HttpToolsProtocol):
    max_head = 64 * 1024
    timeout = 15.0
    refused: Callable[[str], None] = staticmethod(lambda reason: None)  # counts refusals (metrics)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head = 0  # bytes of the current request's head the parser has handed over
        self._spanned = 0  # bytes of the reads an unfinished head has spanned since it began
        self._began = False  # a request began during the current read
        self._in_head = True
        self._in_body = False
        self._timer: asyncio.TimerHandle | None = None
        self._lingering = False  # refused: the answer is out, what still arrives is dropped
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _done(self) -> bool:
        """Refused or closing: nothing more reaches the app, nothing more is answered."""
        return self._lingering or self.transport.is_closing()

    def _arm(self) -> None:
        if self._lingering:
            return  # its own timer ends it
        self._disarm()
        self._timer = self.loop.call_later(self.timeout, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _refuse(self, status: str, message: str, reason: str) -> None:
        self._disarm()
        self._in_head = self._in_body = False
        if not self._done():
            self.transport.write(_response(status, message))
            self._lingering = True
            if self.transport.can_write_eof():
                self.transport.write_eof()  # FIN after the answer; the client's EOF then closes it
                self._timer = self.loop.call_later(min(LINGER, self.timeout), self.transport.close)
            else:
                self.transport.close()
        type(self).refused(reason)

    def _expired(self) -> None:
        self._timer = None
        if self._done():
            return
        if self._in_head:
            self._refuse("408 Request Timeout", f"the request's headers did not arrive within {self.timeout:g}s "
                         "(GPUX_READ_TIMEOUT)", "header_timeout")
        elif self._in_body:
            self._in_body = False
            self.transport.close()  # the app reads a disconnect and answers nobody
            type(self).refused("body_timeout")

    def data_received(self, data: bytes) -> None:
        if self._done():
            return  # dropped: a refused connection's rest is never parsed nor kept
        if self._in_body:
            self._arm()  # the body is still arriving: its silence is what is timed
        self._began = False
        super().data_received(data)
        if self._in_head and not self._done():
            # an unfinished head the parser holds: the reads it spans count whole; the read it
            # began in is not counted (the parser hands its complete fields over, counted above)
            self._spanned = 0 if self._began else self._spanned + len(data)
            self._check_head(self._spanned)

    def _check_head(self, size: int) -> None:
        if size > self.max_head and not self._done():
            self._refuse("431 Request Header Fields Too Large", f"the request's headers exceed {self.max_head} "
                         "bytes (GPUX_MAX_HEADER_BYTES)", "headers")

    # Once refused, the rest of the read is parsed to no effect: nothing more reaches the app.
    def on_url(self, url: bytes) -> None:
        self._head += len(url)
        self._check_head(self._head)
        if not self._done():
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head += len(name) + len(value) + 4  # "name: value\r\n"
        self._check_head(self._head)
        if not self._done():
            super().on_header(name, value)

    def on_message_begin(self) -> None:
        if self._lingering:
            return  # a pipelined request after the refusal: never begun
        super().on_message_begin()
        self._began = True
        self._head = self._spanned = 0
        if not self._in_head:  # a later request on this connection: its head is timed anew
            self._in_head = True
            self._arm()

    def on_headers_complete(self) -> None:
        if self._done():
            return
        self._in_head, self._in_body = False, True
        self._arm()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._done() or self.cycle is not None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        if not self._done() or self.cycle is not None:
            super().on_message_complete()


def protocol(max_head: int, timeout: float, refused: Callable[[str], None]) -> Any:
    """The protocol class for uvicorn's `http` setting, with these limits."""
    return type("LimitedProtocol", (LimitedProtocol,), {"max_head": max_head, "timeout": timeout,
                                                         "refused": staticmethod(refused)})
