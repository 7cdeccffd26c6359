"""The OpenAI chat-completions wire format: request validation and response bodies.

Only what the server implements is accepted with meaning: ``model``, ``messages`` (roles system,
developer (as system), user, assistant; content a string or a list of text parts),
``temperature`` [0, 2], ``top_p`` (0, 1], ``max_tokens`` / ``max_completion_tokens`` >= 1,
``stop`` (a string or up to 4), ``seed``, ``n`` (1..MAX_N), ``stream`` and
``stream_options.include_usage``. Other fields that clients commonly send are ignored; a bad
value of a known field is a :class:`RequestError` (HTTP 400) naming the field. The body must be
strict JSON: ``NaN``, ``Infinity`` and numbers that overflow to infinity (``1e999``), which
Python's parser accepts, are refused wherever they stand, naming the field (JSON has no
non-finite numbers; a NaN temperature would pass every range check). Text the model cannot take
(a lone surrogate, which JSON's ``\ud800`` escape yields and UTF-8 cannot encode) in ``model``, a
message or a stop string is refused the same way, naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_mt.text_safety import first_lone_surrogate

__all__ = ["DEFAULT_LARGE_BODY_BYTES", "DEFAULT_MAX_BODY_BYTES", "MAX_DRAIN_BYTES", "MAX_N", "ChatRequest", "Choice",
           "RequestError", "chunk_body", "completion_body", "error_body", "loads_strict", "models_body",
           "parse_chat_request"]

MAX_N = 16  # most choices per request
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # largest request body by default (4 MiB: ~1M tokens of text)
DEFAULT_LARGE_BODY_BYTES = 256 * 1024  # larger bodies are prepared in a lane of their own
MAX_DRAIN_BYTES = 64 * 1024 * 1024  # most bytes of a refused body read and dropped so its client can read the 413
MAX_STOPS = 4  # most stop strings per request (as OpenAI)
ROLE_ALIASES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        kind = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}.get(
            self.status, "server_error")
        return error_body(self.message, kind, param=self.param, code=self.code)


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions request."""

    model: str
    messages: tuple[dict[str, str], ...]
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    max_tokens: int | None = None  # None: the server's default, capped by the context
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage


@dataclasses.dataclass(frozen=True)
class Choice:
    """One generated reply."""

    text: str
    finish_reason: str  # "stop" | "length"
    completion_tokens: int


def _bad(param: str, message: str) -> RequestError:
    return RequestError(400, f"'{param}': {message}", param=param, code="invalid_value")


def _text(value: str, where: str) -> str:
    """``value``, or a 400 naming ``where`` when it holds a lone surrogate (UTF-8 cannot encode it)."""
    at = first_lone_surrogate(value)
    if at is not None:
        raise _bad(where, f"invalid text: a lone surrogate U+{ord(value[at]):04X} at character {at}")
    return value


def _number(body: Mapping[str, Any], field: str, default: float, lo: float, hi: float, *, lo_open: bool = False
            ) -> float:
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(field, f"expected a number, got {json.dumps(value)[:40]}")
    if not math.isfinite(value):  # NaN passes every range comparison
        raise _bad(field, f"expected a finite number, got {value}")
    if value > hi or value < lo or (lo_open and value == lo):
        raise _bad(field, f"{value} is out of range {'(' if lo_open else '['}{lo:g}, {hi:g}]")
    return float(value)


def _integer(body: Mapping[str, Any], field: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(field, f"expected an integer, got {json.dumps(value)[:40]}")
    if value < lo or (hi is not None and value > hi):
        raise _bad(field, f"{value} is out of range [{lo}, {'inf' if hi is None else hi}]")
    return value


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return _text(value, where)
    if isinstance(value, list):
        parts = []
        for j, part in enumerate(value):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}[{j}]", "only text content parts ({'type': 'text', 'text': ...}) are supported")
            parts.append(_text(part["text"], f"{where}[{j}].text"))
        return "".join(parts)
    raise _bad(where, "expected a string or a list of text parts")


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise _bad("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise _bad(f"messages[{i}]", "expected an object with 'role' and 'content'")
        role = ROLE_ALIASES.get(m.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise _bad(f"messages[{i}].role", f"unsupported role {json.dumps(m.get('role'))[:40]}; expected one of "
                                              f"{', '.join(ROLE_ALIASES)}")
        out.append({"role": role, "content": _content(m.get("content"), f"messages[{i}].content")})
    return tuple(out)


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise _bad("stop", f"expected a non-empty string or a list of at most {MAX_STOPS} of them")
    return tuple(_text(s, "stop" if isinstance(value, str) else f"stop[{i}]") for i, s in enumerate(stops))


class _NonFinite:
    """Stands in for a NaN / Infinity literal (or an overflowing number) while the body is parsed."""

    def __init__(self, text: str):
        self.text = text


def _path_of_non_finite(body: Any) -> tuple[str, str]:
    """The field path (``temperature``, ``messages[0].content``) and text of the first non-finite number."""
    todo: list[tuple[Any, str]] = [(body, "")]
    while todo:  # iterative: the depth of a body is bounded only by the recursion limit of json
        value, path = todo.pop()
        if isinstance(value, _NonFinite):
            return path or "(body)", value.text
        if isinstance(value, Mapping):
            todo.extend((v, f"{path}.{k}" if path else str(k)) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            todo.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(value))))
    raise AssertionError("no non-finite number found")


def loads_strict(raw: bytes | str) -> Any:
    """``json.loads`` without Python's extensions (``NaN``, ``Infinity``, ``1e999`` as inf).

    Raises:
      RequestError: 400 ``invalid_json`` for malformed or too deeply nested JSON; 400
        ``invalid_value`` naming the field of a non-finite number.
    """
    seen: list[bool] = []

    def constant(text: str) -> _NonFinite:
        seen.append(True)
        return _NonFinite(text)

    def number(text: str) -> float | _NonFinite:
        value = float(text)
        return value if math.isfinite(value) else constant(text)

    try:
        body = json.loads(raw, parse_constant=constant, parse_float=number)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"malformed JSON body: {e}", code="invalid_json") from None
    except RecursionError:
        raise RequestError(400, "malformed JSON body: nested too deeply", code="invalid_json") from None
    if seen:
        path, text = _path_of_non_finite(body)
        raise _bad(path, f"{text[:40]} is not a JSON number (JSON has no NaN or Infinity)")
    return body


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Validates a request body.

    Raises:
      RequestError: 400 for malformed JSON, a non-finite number or a bad field (the model's
        existence is the caller's check).
    """
    body = loads_strict(raw)
    if not isinstance(body, Mapping):
        raise RequestError(400, "the body must be a JSON object", code="invalid_json")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("model", "a model name (string) is required")
    _text(body["model"], "model")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    max_tokens = _integer(body, "max_tokens", 1) if max_tokens is None else max_tokens
    stream = False if body.get("stream") is None else body["stream"]
    options = body.get("stream_options") or {}
    if not isinstance(stream, bool):
        raise _bad("stream", "expected true or false")
    if not isinstance(options, Mapping):
        raise _bad("stream_options", "expected an object")
    return ChatRequest(model=body["model"], messages=_messages(body.get("messages")),
                       temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                       top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True), max_tokens=max_tokens,
                       stop=_stops(body.get("stop")), seed=_integer(body, "seed", -(2**63), 2**63 - 1),
                       n=_integer(body, "n", 1, MAX_N) or 1, stream=stream,
                       include_usage=bool(options.get("include_usage", False)))


def error_body(message: str, kind: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id() -> str:
    """A fresh completion id."""
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def completion_body(cid: str, model: str, choices: Sequence[Choice], prompt_tokens: int) -> dict[str, Any]:
    """The body of a non-streamed completion."""
    used = sum(c.completion_tokens for c in choices)
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                         "finish_reason": c.finish_reason} for i, c in enumerate(choices)],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used}}


def chunk_body(cid: str, model: str, choices: Sequence[dict[str, Any]], usage: dict[str, int] | None = None
               ) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of a stream (``choices``: ``{"index", "delta", "finish_reason"}``)."""
    out: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                           "choices": list(choices)}
    if usage is not None:
        out["usage"] = usage
    return out


def models_body(names: Sequence[str], created: int) -> dict[str, Any]:
    """The body of ``GET /v1/models``."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "jaxrl_mt"}
                                       for n in names]}
