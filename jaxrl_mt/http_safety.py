"""The API key of an HTTP endpoint kept to its origin and out of error lines.

``SameOriginRedirects`` is a urllib redirect handler that follows a redirect only within the
request's origin (scheme, host, port): urllib copies every header of a request, ``Authorization``
included, onto the redirected one, so a 302 to another host would hand it the key. A redirect
elsewhere raises ``CrossOrigin`` (one line naming the origin), not followed. ``redact`` removes the
key, and any ``Bearer`` token, from text bound for an error line or a log (a 401 body may echo it).
``error_message`` and ``retry_after`` read an error response's body and Retry-After header.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["MAX_RETRY_AFTER_S", "CrossOrigin", "SameOriginRedirects", "error_message", "origin", "redact",
           "retry_after"]

MAX_RETRY_AFTER_S = 60.0  # longest Retry-After honoured; longer server requests are capped


class CrossOrigin(Exception):
    """The endpoint redirected to another origin (refused: the API key must not follow)."""

    def __init__(self, code: int, origin: str):
        super().__init__(f"HTTP {code} redirect to another origin {origin} refused (the API key is sent to "
                         "the configured origin only)")


def origin(url: str) -> str:
    """``scheme://host:port`` of a URL (the default port made explicit)."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return f"{parts.scheme}://{parts.hostname}:{port}"


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects within the request's origin only; another origin raises ``CrossOrigin``."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 (urllib's hook)
        new = urllib.parse.urljoin(req.full_url, newurl)
        if origin(new) != origin(req.full_url):
            fp.close()
            raise CrossOrigin(code, origin(new))
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',}]+")


def redact(text: str, secret: str | None) -> str:
    """``text`` without ``secret`` (nor any ``Bearer`` token): each replaced by ``[redacted]``."""
    if secret:
        text = text.replace(secret, "[redacted]")
    return _BEARER.sub(r"\1[redacted]", text)


def error_message(body: bytes) -> str:
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


def retry_after(value: str | None) -> float | None:
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
