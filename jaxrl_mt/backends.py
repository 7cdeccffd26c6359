"""Chat backends: the one interface behind every LLM-backed helper.

The user simulator, the response judge and the LLM segmenter all take a ``ChatBackend``: an
object whose ``chat`` answers a batch of conversations, one reply each. Two implementations:

- ``HTTPBackend``: any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, llama.cpp server,
  OpenAI, ...), stdlib only (``urllib``), requests of a batch run concurrently, transient failures
  retried with exponential backoff.
- ``jaxrl_mt.local_backend.LocalBackend``: the local JAX model (imported lazily by
  ``make_backend("local")``, so this module does not import JAX).

Helpers that have a rule-based default (the judge's ``classify_rule_based``) use it when no
backend is given; that default is not a chat backend.
"""

from __future__ import annotations

import email.utils
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, runtime_checkable

__all__ = ["BackendError", "ChatBackend", "HTTPBackend", "make_backend"]

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}
Conversation = Sequence[Message]
MAX_RETRY_AFTER_S = 60.0  # longest Retry-After honoured; longer server requests are capped


@runtime_checkable
class ChatBackend(Protocol):
    """Answers a batch of conversations."""

    def chat(
        self,
        conversations: Sequence[Sequence[Mapping[str, str]]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
    ) -> list[str]:
        """Returns one assistant reply per conversation, in order."""
        ...


class BackendError(RuntimeError):
    """A backend failed to produce a reply."""


def _check_conversations(conversations: Sequence[Conversation]) -> None:
    for i, conversation in enumerate(conversations):
        if isinstance(conversation, (str, bytes)) or not isinstance(conversation, Sequence):
            raise ValueError(f"conversation {i} is not a list of messages: {conversation!r:.80}")
        for j, message in enumerate(conversation):
            if not isinstance(message, Mapping):
                raise ValueError(f"conversation {i} message {j} is not a mapping: {message!r:.80}")
            for field in ("role", "content"):
                if not isinstance(message.get(field), str):
                    raise ValueError(
                        f"conversation {i} message {j}: field {field!r} missing or not a string"
                    )


def _error_message(body: bytes) -> str:
    """The error text of a response body: ``error.message`` of OpenAI-style JSON, else the text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(data, Mapping):
        error = data.get("error", data.get("message", data.get("detail")))
        if isinstance(error, Mapping) and "message" in error:
            return str(error["message"])
        if error is not None:
            return str(error)
    return text[:500]


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), capped, if given."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


class HTTPBackend:
    """A ``ChatBackend`` for any OpenAI-compatible chat-completions endpoint.

    Connection errors, timeouts, HTTP 429 and 5xx are retried ``max_retries`` times with delays
    ``backoff * 2**attempt`` seconds (or the server's Retry-After when present); other 4xx fail at
    once. A failure raises ``BackendError`` naming the endpoint, the status and the server's error
    message.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_workers: int = 4,
    ):
        """Configures the endpoint.

        Args:
          base_url: e.g. ``http://127.0.0.1:8000/v1``; requests go to
            ``{base_url}/chat/completions``.
          model: the ``model`` field of each request.
          api_key: bearer token; defaults to the ``OPENAI_API_KEY`` environment variable (none sent
            if neither is set).
          timeout: seconds per request.
          max_retries: retries after the first attempt for retryable failures.
          backoff: first retry delay in seconds, doubled each retry.
          max_workers: concurrent requests within a batch.
        """
        if max_retries < 0 or max_workers < 1 or timeout <= 0 or backoff < 0:
            raise ValueError(
                f"HTTPBackend: bad settings max_retries={max_retries}, max_workers={max_workers}, "
                f"timeout={timeout}, backoff={backoff}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_workers = max_workers

    def __repr__(self) -> str:
        return f"HTTPBackend({self.base_url!r}, model={self.model!r})"

    def chat(
        self,
        conversations: Sequence[Sequence[Mapping[str, str]]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
    ) -> list[str]:
        """Sends each conversation as one request (concurrently); returns the replies in order."""
        _check_conversations(conversations)
        payloads = [
            {
                "model": self.model,
                "messages": [{"role": m["role"], "content": m["content"]} for m in conversation],
                "max_tokens": int(max_new_tokens),
                "temperature": float(temperature),
            }
            for conversation in conversations
        ]
        if len(payloads) <= 1 or self.max_workers == 1:
            return [self._complete(p) for p in payloads]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(payloads))) as pool:
            return list(pool.map(self._complete, payloads))

    def _complete(self, payload: Mapping) -> str:
        """One chat completion with retries."""
        url = f"{self.base_url}/chat/completions"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(payload).encode("utf-8")
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            delay = self.backoff * 2**attempt
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
                return self._parse_reply(body)
            except urllib.error.HTTPError as exc:
                message = _error_message(exc.read() or b"")
                failure = f"HTTP {exc.code}"
                if exc.code != 429 and exc.code < 500:
                    raise BackendError(
                        f"HTTP backend {self.base_url}: {failure}: {message}"
                    ) from exc
                wait = _retry_after(exc.headers.get("Retry-After") if exc.headers else None)
                delay = delay if wait is None else wait
                last = f"{failure} after {attempts} attempts: {message}"
            except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as exc:
                reason = getattr(exc, "reason", exc)
                last = f"connection failed after {attempts} attempts: {reason}"
            if attempt + 1 < attempts:
                time.sleep(delay)
        raise BackendError(f"HTTP backend {self.base_url}: {last}")

    def _parse_reply(self, body: bytes) -> str:
        try:
            data = json.loads(body)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise BackendError(
                f"HTTP backend {self.base_url}: reply lacks choices[0].message.content: "
                f"{body[:200]!r}"
            ) from exc
        if content is None:
            return ""
        if not isinstance(content, str):
            raise BackendError(
                f"HTTP backend {self.base_url}: choices[0].message.content is not a string: "
                f"{content!r:.200}"
            )
        return content


def make_backend(spec: str, **kw) -> ChatBackend:
    """Builds a backend from a spec string.

    Specs:
      ``"http:URL#MODEL"``: ``HTTPBackend(URL, MODEL, **kw)`` (the model may instead be given as
      ``model=`` in ``kw``), e.g. ``"http:http://127.0.0.1:8000/v1#qwen2.5-7b-instruct"``.
      ``"local"`` / ``"local:MODEL_SPEC"``: ``jaxrl_mt.local_backend.LocalBackend([MODEL_SPEC],
      **kw)``, imported only here.

    Raises:
      ValueError: an unknown kind or an http spec without URL or model.
      ImportError: the local backend is unavailable.
    """
    kind, _, rest = spec.partition(":")
    if kind == "http":
        url, _, model = rest.partition("#")
        model = model or kw.pop("model", None)
        if not url or not model:
            raise ValueError(f"backend spec {spec!r}: expected 'http:URL#MODEL'")
        return HTTPBackend(url, model, **kw)
    if kind == "local":
        try:
            from jaxrl_mt.local_backend import LocalBackend  # lazy: keeps JAX out of this module
        except ImportError as exc:
            raise ImportError(
                f"backend spec {spec!r}: jaxrl_mt.local_backend.LocalBackend cannot be imported "
                f"({exc})"
            ) from exc
        return LocalBackend(rest, **kw) if rest else LocalBackend(**kw)
    raise ValueError(f"unknown backend kind {kind!r} in spec {spec!r}; expected 'http' or 'local'")
