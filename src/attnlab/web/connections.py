"""Connections the explorer will hold: total deadlines, and a limit per client (slow-client defence).

uvicorn closes a keep-alive connection that sits idle, but nothing else: a client that sends its
headers a byte every few seconds holds its connection for ever, and uvicorn's own concurrency limit
counts those connections, so a few hundred of them made every request (the health check included) a
503. The guard wraps uvicorn's HTTP protocol (``http=`` in its Config) and keeps, per connection:

* **a deadline for the request head**: request line and headers complete within ``header_timeout_s`` of
  connecting, or a 408 line is written and the connection closed;
* **one request per connection** (``OneRequestPerConnection`` makes every answer ``Connection: close``),
  so that deadline is the only one the head ever needs; the body and the model have their own total
  deadlines in the app, and ``lifetime_s`` aborts anything still open after that (a client that never
  reads its answer included);
* **a limit of connections per client** (IP address) still sending their request, and of open
  connections in all. Over either, the newcomer closes the oldest *stalled* connection (of that client,
  then of anyone): one still sending its request ``grace_s`` after it opened. Slow clients evict each
  other, never a request being answered, and a burst of fresh requests is let in (the inference queue
  answers those, 503 "busy" beyond it). Only when ``max_open`` are open and none is stalled is the
  newcomer refused (503). On loopback every client is one address: a user's health check shares the
  limit with an attacker's connections, and still gets in by evicting one. What this does not stop: a
  client holding more than ``max_open`` connections at once, each re-opened within ``grace_s`` of the
  last being closed, keeps the server full (newcomers get 503 until it stops).

Every refusal is a **lingering close** (RFC 9112, 9.6): the one-line answer, then the end of the server's
half, then reading (discarding) until the client ends its half or ``LINGER_S`` passes. A plain close
made the kernel reset a client still writing its request, which lost the answer and saw no HTTP reply
at all (a burst from a client slowed by a loaded machine did so). A connection whose bytes already wait
unread in its socket is never taken for stalled.

The request stream of each connection is followed with a second h11 parser (h11 is uvicorn's own) to
know when its head and its whole request have arrived; what it reads is discarded as it goes.
"""

from __future__ import annotations

import asyncio
import json
import select
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11


@dataclass
class GuardSettings:
    """The explorer's connection limits: head deadline, lifetime, stalled connections per client and in all, grace."""
    header_timeout_s: float = 5.0  # request line + headers, from the moment of connecting
    lifetime_s: float = 60.0  # anything longer is aborted (head + body + model deadlines fit well inside)
    per_client: int = 64  # connections of one client IP still sending their request (a browser opens 6)
    max_open: int = 512  # open connections in all
    grace_s: float = 1.0  # a connection still sending its request after this long is "stalled": evictable


LINGER_S = 2.0  # how long a refused connection is still read (and discarded) after its answer


def _response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


class ConnectionGuard:
    """The open connections, oldest first; admits, evicts and counts."""

    def __init__(self, settings: GuardSettings | None = None) -> None:
        self.settings = settings or GuardSettings()
        self.open: dict[GuardedConnection, None] = {}  # insertion-ordered: oldest first
        self.stats = {"admitted": 0, "evicted": 0, "refused": 0, "head_timeouts": 0, "aborted": 0}

    def admit(self, conn: GuardedConnection) -> bool:
        """Register ``conn``, first closing a stalled connection of its client when that client already
        has ``per_client`` connections waiting (none stalled: a burst of fresh ones, let in), and one of
        anyone's when ``max_open`` are open; False when the server is full and nothing is stalled."""
        s = self.settings
        if sum(c.waiting and c.client == conn.client for c in self.open) >= s.per_client:
            self._evict(conn.client, s.grace_s)
        if len(self.open) >= s.max_open and not self._evict(None, s.grace_s):
            self.stats["refused"] += 1
            return False
        self.open[conn] = None
        self.stats["admitted"] += 1
        return True

    def _evict(self, client: str | None, grace_s: float) -> bool:
        """Close the oldest connection still sending its request after ``grace_s`` (of ``client``, or of
        anyone); False if there is none."""
        now = asyncio.get_running_loop().time()
        for other in self.open:
            if (other.waiting and now - other.opened >= grace_s and client in (None, other.client)
                    and not other.unread()):
                self.stats["evicted"] += 1
                other.close(408, "Request Timeout", "closed: another connection needed the room, and this one "
                            "had not sent its request")
                return True
        return False

    def release(self, conn: GuardedConnection) -> None:
        """Forget a closed connection."""
        self.open.pop(conn, None)


class GuardedConnection(asyncio.Protocol):
    """Wraps one uvicorn protocol instance: passes every event on, and enforces the guard's deadlines."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard, loop: asyncio.AbstractEventLoop) -> None:
        self.inner, self.guard, self.loop = inner, guard, loop
        self.client = "?"
        self.opened = loop.time()
        self.waiting = True  # the request has not fully arrived yet
        self.closed = False
        self._parser: h11.Connection | None = h11.Connection(h11.SERVER)
        self._timers: list[asyncio.TimerHandle] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self.inner.connection_made(transport)
        if not self.guard.admit(self):
            self.close(503, "Service Unavailable", "too many connections are being answered; retry shortly")
            return
        s = self.guard.settings
        self._timers = [self.loop.call_later(s.header_timeout_s, self._head_late),
                        self.loop.call_later(s.lifetime_s, self._too_long)]

    def unread(self) -> bool:
        """Whether bytes (or the end) from the client already wait in the socket, not yet read by this
        loop: such a connection is not stalled, only not read yet (a burst of connections is accepted
        before their requests are read, and a busy machine can stretch that past the grace)."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return False
        try:
            return bool(select.select([sock.fileno()], [], [], 0)[0])
        except (OSError, ValueError):  # closed meanwhile
            return False

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._parser is not None:
            self._follow(data)
        self.inner.data_received(data)

    def _follow(self, data: bytes) -> None:
        """Feed the copy parser; note when the head, then the whole request, has arrived."""
        assert self._parser is not None
        try:
            self._parser.receive_data(data)
            while True:
                event = self._parser.next_event()
                if isinstance(event, h11.Request):
                    self._timers[0].cancel()  # the head is in: its deadline is met
                elif isinstance(event, h11.EndOfMessage) or event is h11.PAUSED:
                    self.waiting, self._parser = False, None
                    return
                elif event is h11.NEED_DATA:
                    return
        except h11.RemoteProtocolError:  # malformed: uvicorn answers 400 and closes; stop following
            self.waiting, self._parser = False, None

    def _head_late(self) -> None:
        self.guard.stats["head_timeouts"] += 1
        self.close(408, "Request Timeout", f"the request head did not arrive within "
                   f"{self.guard.settings.header_timeout_s:g} s")

    def _too_long(self) -> None:
        self.guard.stats["aborted"] += 1
        self._end()
        if self.transport is not None:
            self.transport.abort()

    def _end(self) -> None:
        """No longer counted by the guard, no timer left."""
        self.closed = True
        self.guard.release(self)
        for timer in self._timers:
            timer.cancel()

    def close(self, status: int, reason: str, message: str) -> None:
        """Answer one line (only if nothing was answered yet: the request is still arriving) and close."""
        if self.closed:
            return
        self._end()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.waiting and transport.can_write_eof():
            # a lingering close (as nginx's): answer, end our half, and go on reading (discarding) until
            # the client ends its own or LINGER_S passes. Closing at once would make the kernel reset a
            # client that writes its request after our answer arrived, losing the answer it had not read
            transport.write(_response(status, reason, message))
            transport.write_eof()
            self._timers.append(self.loop.call_later(LINGER_S, transport.close))
            return
        if self.waiting:
            transport.write(_response(status, reason, message))
        transport.close()

    def eof_received(self) -> bool | None:
        if self.closed:  # lingering: the client has ended its half too; asyncio closes the transport
            return None
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self._parser = None
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class OneRequestPerConnection:
    """ASGI middleware: every response says ``Connection: close`` (so each connection carries one request,
    and the head deadline covers every request head)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def closing_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        return await self.app(scope, receive, closing_send)


def uvicorn_config(app: Any, host: str = "127.0.0.1", port: int = 8000, settings: GuardSettings | None = None,
                   **kwargs: Any) -> Any:
    """uvicorn's Config for ``app`` with every connection guarded (one guard for the server, on
    ``config.guard``); ``kwargs`` go to uvicorn (e.g. ``log_level``)."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    guard = ConnectionGuard(settings)

    def protocol(config: Any, server_state: Any, app_state: Any, _loop: Any = None) -> GuardedConnection:
        loop = _loop or asyncio.get_event_loop()
        return GuardedConnection(H11Protocol(config, server_state, app_state, _loop), guard, loop)

    # uvicorn's own concurrency limit is left off: it counted the slow connections the guard now evicts
    config = uvicorn.Config(OneRequestPerConnection(app), host=host, port=port, http=protocol,  # type: ignore[arg-type]
                            limit_concurrency=None, timeout_keep_alive=5, **kwargs)
    config.guard = guard  # type: ignore[attr-defined]
    return config
