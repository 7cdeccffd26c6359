"""Hostile endpoints (issue 53 items 2 and 4): a lone surrogate in a reply, a redirect to another
origin, a 401 body echoing the key. Real HTTP servers on 127.0.0.1 (``tests.test_backends``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jaxrl_mt.backends import BackendError, HTTPBackend
from jaxrl_mt.text_safety import clean, clean_text
from tests.test_backends import FakeOpenAIServer, completion, conv, serve  # noqa: F401 (fixture)

KEY = "sk-probe-0123456789abcdef"


@pytest.fixture
def other_origin() -> Iterator[tuple[str, list[dict]]]:
    """A server on another port (another origin) recording the headers of any GET or POST."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            seen.append(dict(self.headers))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = _record  # noqa: N815 (http.server naming)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def test_a_lone_surrogate_in_a_reply_becomes_the_replacement_character(serve):  # noqa: F811
    """The probe's reply ``"\\ud800 The answer is 5."`` (JSON escape: a lone surrogate after parsing)."""
    server = serve(lambda n, body: (200, {}, b'{"choices": [{"message": {"content": "\\ud800 The answer is 5."}}]}'))
    reply = HTTPBackend(server.url, "m", api_key_env="").complete([conv("x")])[0]
    assert reply.text == "\ufffd The answer is 5."
    reply.text.encode("utf-8")  # the old code kept '\ud800': UnicodeEncodeError when written


def test_clean_keeps_pairs_and_nested_records():
    assert clean_text("a\ud83d\ude00b") == "a\U0001F600b" and clean_text("ok") == "ok"
    rec = {"turns": [{"text": "x\udfff", "k\ud800": ("y\ud800", 1)}], "score": 1.0}
    assert json.dumps(clean(rec), ensure_ascii=False).encode("utf-8")
    assert clean(rec) == {"turns": [{"text": "x\ufffd", "k\ufffd": ["y\ufffd", 1]}], "score": 1.0}


def test_a_redirect_to_another_origin_is_refused_and_the_key_never_sent(serve, other_origin):  # noqa: F811
    """Before: urllib followed the 302 and the other origin received ``Authorization: Bearer sk-...``."""
    url, seen = other_origin
    first = serve(lambda n, body: (302, {"Location": url + "/steal"}, {}))
    backend = HTTPBackend(first.url, "m", api_key=KEY, max_retries=2, backoff=0)
    with pytest.raises(BackendError) as info:
        backend.chat([conv("x")])
    line = str(info.value)
    assert len(line.splitlines()) == 1 and f"HTTP 302 redirect to another origin {url} refused" in line
    assert seen == [] and len(first.requests) == 1  # not followed, not retried
    assert KEY not in line


def test_a_redirect_within_the_origin_is_still_followed(serve):  # noqa: F811
    """A 307 keeps the POST; urllib answers it as an HTTPError, but never with another origin."""
    server = serve(lambda n, body: (307, {"Location": "/v1/chat/completions"}, {}) if n == 1 else
                   (200, {}, completion("ok")))
    with pytest.raises(BackendError, match="HTTP 307"):  # urllib refuses to re-POST: one line, no leak
        HTTPBackend(server.url, "m", api_key=KEY).chat([conv("x")])


def test_a_401_body_echoing_the_key_is_redacted(serve):  # noqa: F811
    """Before: the echoed ``Bearer sk-...`` was printed in the error line."""
    server = serve(lambda n, body: (401, {}, {"error": {"message": "invalid header: Authorization: " +
                                                        server.requests[-1]["headers"]["Authorization"]}}))
    with pytest.raises(BackendError) as info:
        HTTPBackend(server.url, "m", api_key=KEY).chat([conv("x")])
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert KEY not in str(info.value) and "Bearer [redacted]" in str(info.value)
    assert len(str(info.value).splitlines()) == 1


def test_a_garbage_200_echoing_the_key_is_redacted(serve):  # noqa: F811
    server = serve(lambda n, body: (200, {}, ("Authorization: " + server.requests[-1]["headers"]["Authorization"]
                                              ).encode()))
    with pytest.raises(BackendError) as info:
        HTTPBackend(server.url, "m", api_key=KEY, max_retries=0).chat([conv("x")])
    assert KEY not in str(info.value) and "invalid reply" in str(info.value)
