"""The server of a ``ChatService`` on a background thread, and building the service for a model."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["ServerThread", "build_service"]


def build_service(model: Any, *, names: Sequence[str] | None = None, max_batch: int = 64, window_ms: float = 5.0,
                  default_max_tokens: int = 256, min_prompt_bucket: int = 32, seed: int = 0) -> Any:
    """A ``ChatService`` for a loaded registry Model."""
    from jaxrl_mt.sampling import Sampler
    from jaxrl_mt.serving.app import ChatService

    sampler = Sampler.from_model(model, max_batch=max_batch, min_prompt_bucket=min_prompt_bucket)
    return ChatService(sampler, list(names or [model.spec]), default_max_tokens=default_max_tokens,
                       window_s=window_ms / 1000, max_rows=max_batch, seed=seed)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class ServerThread:
    """Runs the server of a ``ChatService`` with uvicorn on a background thread (tests, scripts)."""

    def __init__(self, service: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        from jaxrl_mt.serving.app import create_app

        self.service = service
        self.sock = _bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}/v1"
        config = uvicorn.Config(create_app(service), log_level=log_level, timeout_graceful_shutdown=2)
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
