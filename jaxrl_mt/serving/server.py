"""The server of a ``ChatService`` on a background thread, building the service for a model, and
the HTTP protocol with a read timeout.

uvicorn's own timers do not cover a request that is never completed: ``timeout_keep_alive``
starts only after a response, so a connection that sends nothing, or half a request, is held
forever (measured: 250 such connections all still open after 10 s). ``timed_protocol`` adds the
missing one, as Go's ``http.Server.ReadTimeout``: a request's headers and body must arrive
within ``read_timeout`` seconds of its first byte (for a connection's first request, of the
connection's opening), else the connection is closed and counted (``read_timeouts`` in
``/stats``). The deadline is not extended by trickled bytes. After an early response (a 413
sent before the body was read) the rest of the body is read and dropped, so that a client which
writes its whole body before reading can read the refusal; at most ``drain_bytes`` of it, and
within the same deadline.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from jaxrl_mt.serving.protocol import MAX_DRAIN_BYTES

__all__ = ["DEFAULT_READ_TIMEOUT_S", "ServerThread", "build_service", "timed_protocol"]

DEFAULT_READ_TIMEOUT_S = 30.0  # a request's headers and body must arrive within this many seconds


def build_service(model: Any, *, names: Sequence[str] | None = None, max_batch: int = 64, window_ms: float = 5.0,
                  default_max_tokens: int = 256, min_prompt_bucket: int = 32, seed: int = 0, **kw: Any) -> Any:
    """A ``ChatService`` for a loaded registry Model (keyword arguments: ``ChatService``'s
    ``slice_tokens``, ``prefill_tokens``, ``max_body_bytes``, ``prepare_workers``, ``large_body_bytes``)."""
    from jaxrl_mt.sampling import Sampler
    from jaxrl_mt.serving.app import ChatService

    sampler = Sampler.from_model(model, max_batch=max_batch, min_prompt_bucket=min_prompt_bucket)
    return ChatService(sampler, list(names or [model.spec]), default_max_tokens=default_max_tokens,
                       window_s=window_ms / 1000, max_rows=max_batch, seed=seed, **kw)


def timed_protocol(read_timeout: float, counters: Counter, drain_bytes: int = MAX_DRAIN_BYTES) -> type:
    """uvicorn's h11 protocol with a request read deadline (see the module doc); ``counters`` gets
    ``read_timeouts`` and ``drain_closed`` (connections closed after ``drain_bytes`` of an unread body)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        """``H11Protocol`` whose requests must be complete within ``read_timeout`` seconds."""

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            self._read_timer: Any = None
            self._drained = 0
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._read_timer is None:
                self._read_timer = self.loop.call_later(read_timeout, self._timed_out)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                self._disarm()
                return
            state = self.conn.their_state
            if state is h11.SEND_BODY or (state is h11.IDLE and self.conn.trailing_data[0]):  # begun, not complete
                self._arm()
            else:
                self._disarm()
            if self.cycle is not None and self.cycle.response_complete and self.conn.their_state is h11.SEND_BODY:
                self._drained += len(data)  # an early response was sent: this body is being dropped
                if self._drained > drain_bytes:
                    counters["drain_closed"] += 1
                    self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _timed_out(self) -> None:
            self._read_timer = None
            if not self.transport.is_closing():
                counters["read_timeouts"] += 1
                self.transport.close()

    return TimedH11Protocol


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class ServerThread:
    """Runs the server of a ``ChatService`` with uvicorn on a background thread (tests, scripts)."""

    def __init__(self, service: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 read_timeout: float = DEFAULT_READ_TIMEOUT_S):
        import uvicorn

        from jaxrl_mt.serving.app import create_app

        if not read_timeout > 0:
            raise ValueError(f"read_timeout must be > 0, got {read_timeout}")
        self.service = service
        self.sock = _bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}/v1"
        config = uvicorn.Config(create_app(service), log_level=log_level, timeout_graceful_shutdown=2,
                                http=timed_protocol(read_timeout, service.stats))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="jaxrl-mt-serve")

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread ended before it started")
            self.thread.join(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
