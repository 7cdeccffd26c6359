"""Chat backends: the one interface behind every LLM-backed helper.

The user simulator, the response judge and the LLM segmenter all take a ``ChatBackend``: an
object whose ``chat`` answers a batch of conversations, one reply each. Two implementations:

- ``HTTPBackend``: any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, llama.cpp server,
  OpenAI, ``python -m jaxrl_mt.serve``, ...), stdlib only (``urllib``): requests of a batch run
  concurrently on daemon threads, transient failures (connection errors, timeouts, 429, 5xx and
  HTTP 200 replies that are not a chat completion) are retried with exponential backoff, and an
  optional deadline per batch cancels what is still queued. ``HTTPBackend.complete`` returns the
  reply with its finish reason and token usage (what an evaluated assistant needs);
  ``HTTPBackend.chat`` the text only.
- ``jaxrl_mt.local_backend.LocalBackend``: the local JAX model (imported lazily by
  ``make_backend("local")``, so this module does not import JAX).

Helpers that have a rule-based default (the judge's ``classify_rule_based``) use it when no
backend is given; that default is not a chat backend.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from jaxrl_mt.http_safety import MAX_RETRY_AFTER_S, CrossOrigin, SameOriginRedirects, redact
from jaxrl_mt.http_safety import error_message as _error_message
from jaxrl_mt.http_safety import retry_after as _retry_after
from jaxrl_mt.text_safety import clean_text

__all__ = ["MAX_RETRY_AFTER_S", "BackendError", "ChatBackend", "ChatReply", "HTTPBackend", "make_backend"]

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}
Conversation = Sequence[Message]


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


@dataclasses.dataclass(frozen=True)
class ChatReply:
    """One chat completion: the reply text, why it ended and the token usage the server reported."""

    text: str
    finish_reason: str  # "stop" | "length" | what the server said ("stop" when it said nothing)
    prompt_tokens: int | None = None  # usage.prompt_tokens (None: not reported)
    completion_tokens: int | None = None  # usage.completion_tokens (None: not reported)


class _BadReply(ValueError):
    """An HTTP 200 reply that is not a chat completion (retried like a 5xx)."""


class _Cancelled(Exception):
    """The batch of this request failed or passed its deadline: stop retrying."""


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


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


class HTTPBackend:
    """A ``ChatBackend`` for any OpenAI-compatible chat-completions endpoint.

    Connection errors, timeouts, HTTP 429, 5xx and HTTP 200 replies that are not a chat
    completion are retried ``max_retries`` times with delays ``backoff * 2**attempt`` seconds (or
    the server's Retry-After when present); other 4xx fail at once. With a ``deadline``, a batch
    that is not answered within it fails: its queued requests are cancelled, retries stop, and
    no request attempt outlives the deadline by more than its own socket timeout. A failure raises
    ``BackendError`` with one line naming the endpoint, the status and the server's error message.
    The API key is sent as a bearer token to the configured origin only (``http_safety``: a redirect
    elsewhere fails in one line naming it) and never appears in a message (redacted), ``repr`` or
    ``stats``. A lone surrogate in a reply becomes U+FFFD (``text_safety.clean_text``).
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
        *,
        api_key_env: str = "OPENAI_API_KEY",
        deadline: float | None = None,
        role: str = "",
    ):
        """Configures the endpoint.

        Args:
          base_url: e.g. ``http://127.0.0.1:8000/v1``; requests go to
            ``{base_url}/chat/completions``.
          model: the ``model`` field of each request.
          api_key: bearer token; defaults to the environment variable named by ``api_key_env``
            (none sent if neither is set).
          timeout: seconds per request attempt (socket timeout).
          max_retries: retries after the first attempt for retryable failures.
          backoff: first retry delay in seconds, doubled each retry.
          max_workers: concurrent requests within a batch.
          api_key_env: the environment variable holding the key ("" for none).
          deadline: seconds a whole batch (one ``chat``/``complete`` call) may take; None or 0:
            no limit beyond the retries.
          role: what the endpoint serves (``judge``, ``user simulator``), named in every error line
            with the model: ``HTTP backend URL (judge, model M): ...``.
        """
        if max_retries < 0 or max_workers < 1 or timeout <= 0 or backoff < 0 or (deadline or 0) < 0:
            raise ValueError(
                f"HTTPBackend: bad settings max_retries={max_retries}, max_workers={max_workers}, "
                f"timeout={timeout}, backoff={backoff}, deadline={deadline}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else (os.environ.get(api_key_env) if api_key_env else None)
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_workers = max_workers
        self.deadline = deadline or None
        self._name = f"HTTP backend {self.base_url}" + (f" ({role}, model {model})" if role else "")
        self.stats: Counter = Counter()  # requests, retries, failures, cancelled (thread-safe updates)
        self._lock = threading.Lock()
        self._opener = urllib.request.build_opener(SameOriginRedirects())

    def _error(self, text: str) -> BackendError:
        """A ``BackendError`` of ``text`` with the API key (and any bearer token) redacted."""
        return BackendError(redact(text, self.api_key))

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
        return [r.text for r in self.complete(conversations, max_new_tokens=max_new_tokens,
                                              temperature=temperature)]

    def complete(
        self,
        conversations: Sequence[Sequence[Mapping[str, str]]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> list[ChatReply]:
        """One ``ChatReply`` per conversation, in order (requests run concurrently).

        Args:
          conversations: lists of ``{"role", "content"}`` messages.
          max_new_tokens, temperature: the request's ``max_tokens`` and ``temperature``.
          top_p, seed, stop: sent only when given.

        Raises:
          BackendError: a request failed for good, or the batch passed its deadline.
        """
        _check_conversations(conversations)
        extra: dict[str, Any] = {"top_p": top_p, "seed": seed, "stop": list(stop) if stop else None}
        payloads = [
            {
                "model": self.model,
                "messages": [{"role": m["role"], "content": m["content"]} for m in conversation],
                "max_tokens": int(max_new_tokens),
                "temperature": float(temperature),
                **{k: v for k, v in extra.items() if v is not None},
            }
            for conversation in conversations
        ]
        return self._run_batch(payloads) if payloads else []

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _run_batch(self, payloads: Sequence[Mapping]) -> list[ChatReply]:
        """Answers payloads on up to ``max_workers`` daemon threads, within the deadline."""
        n = len(payloads)
        results: list[ChatReply | None] = [None] * n
        errors: list[BackendError] = []
        state = {"next": 0, "done": 0}
        cond = threading.Condition()
        stop = threading.Event()
        ends = None if self.deadline is None else time.monotonic() + self.deadline

        def worker() -> None:
            while not stop.is_set():
                with cond:
                    i = state["next"]
                    state["next"] += 1
                if i >= n:
                    return
                try:
                    results[i] = self._complete(payloads[i], stop, ends)
                except _Cancelled:
                    return
                except BackendError as exc:
                    with cond:
                        errors.append(exc)
                    stop.set()
                except Exception as exc:  # noqa: BLE001 (a worker must report, never die silently)
                    with cond:
                        errors.append(self._error(f"{self._name}: {type(exc).__name__}: "
                                                  f"{_one_line(redact(str(exc), self.api_key))}"))
                    stop.set()
                with cond:
                    state["done"] += 1
                    cond.notify_all()
                if errors:
                    return

        for _ in range(min(self.max_workers, n)):
            threading.Thread(target=worker, daemon=True, name="http-backend").start()
        with cond:
            while state["done"] < n and not errors:
                left = None if ends is None else ends - time.monotonic()
                if left is not None and left <= 0:
                    break
                cond.wait(left if left is not None else 1.0)
                if errors:
                    break
            stop.set()
            cond.notify_all()
            if errors:
                raise errors[0]
            if state["done"] < n:
                self._count("cancelled")
                raise BackendError(
                    f"{self._name}: batch deadline of {self.deadline:g} s passed with "
                    f"{n - state['done']} of {n} requests unanswered (queued ones cancelled)")
        return [r for r in results if r is not None]

    def _complete(self, payload: Mapping, stop: threading.Event, ends: float | None) -> ChatReply:
        """One chat completion with retries; raises ``_Cancelled`` once ``stop`` is set."""
        url = f"{self.base_url}/chat/completions"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(payload).encode("utf-8")
        attempts = self.max_retries + 1
        last = ""
        for attempt in range(attempts):
            if stop.is_set():
                raise _Cancelled()
            left = None if ends is None else ends - time.monotonic()
            timeout = self.timeout if left is None else max(0.05, min(self.timeout, left))
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            delay = self.backoff * 2**attempt
            self._count("requests" if attempt == 0 else "retries")
            try:
                with self._opener.open(request, timeout=timeout) as response:
                    body = response.read()
                return self._parse_reply(body)
            except CrossOrigin as exc:
                self._count("failures")
                raise self._error(f"{self._name}: {exc}") from None
            except urllib.error.HTTPError as exc:
                message = _one_line(redact(_error_message(exc.read() or b""), self.api_key))
                failure = f"HTTP {exc.code}"
                if exc.code != 429 and exc.code < 500:
                    self._count("failures")
                    raise self._error(f"{self._name}: {failure}: {message}") from None
                wait = _retry_after(exc.headers.get("Retry-After") if exc.headers else None)
                delay = delay if wait is None else wait
                last = f"{failure} after {attempts} attempts: {message}"
            except _BadReply as exc:
                last = f"invalid reply after {attempts} attempts: {exc}"
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout,
                    TimeoutError) as exc:
                reason = getattr(exc, "reason", exc)
                reason = f"timed out ({timeout:g} s)" if isinstance(reason, (socket.timeout, TimeoutError)) else reason
                last = f"connection failed after {attempts} attempts: {_one_line(str(reason) or type(reason).__name__)}"
            if attempt + 1 < attempts:
                if ends is not None:
                    delay = min(delay, max(0.0, ends - time.monotonic()))
                if stop.wait(delay):
                    raise _Cancelled()
        self._count("failures")
        raise self._error(f"{self._name}: {last}")

    def _parse_reply(self, body: bytes) -> ChatReply:
        """The ``ChatReply`` of a 200 body; ``_BadReply`` when it is not a chat completion."""
        try:
            data = json.loads(body)
            choice = data["choices"][0]
            content = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _BadReply(f"reply lacks choices[0].message.content: {redact(repr(body[:200]), self.api_key)}"
                            ) from None
        if content is not None and not isinstance(content, str):
            raise _BadReply(redact(f"choices[0].message.content is not a string: {content!r:.200}", self.api_key))
        usage = data.get("usage") if isinstance(data.get("usage"), Mapping) else {}

        def count(key: str) -> int | None:
            value = usage.get(key)
            return value if isinstance(value, int) and value >= 0 else None

        finish = choice.get("finish_reason") if isinstance(choice, Mapping) else None
        return ChatReply(clean_text(content or ""), finish if isinstance(finish, str) and finish else "stop",
                         count("prompt_tokens"), count("completion_tokens"))


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
