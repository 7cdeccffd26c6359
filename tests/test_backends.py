"""Tests of the HTTP chat backend against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jaxrl_mt.backends import BackendError, ChatBackend, ChatReply, HTTPBackend, make_backend

# A script maps (request number from 1, request JSON) to (status, headers, body object).
Script = Callable[[int, dict], tuple[int, dict, object]]


def completion(content: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


class FakeOpenAIServer:
    """A threaded HTTP server that answers POST /v1/chat/completions from a script."""

    def __init__(self, script: Script):
        self.script = script
        self.requests: list[dict] = []  # {"path", "headers", "body"} per request
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body}
                    )
                    number = len(server.requests)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, headers, payload = server.script(number, body)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args):  # keep test output quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def serve() -> Iterator[Callable[[Script], FakeOpenAIServer]]:
    servers = []

    def start(script: Script) -> FakeOpenAIServer:
        servers.append(FakeOpenAIServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def conv(text: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def test_reply_and_batch_order(serve):
    # Earlier conversations sleep longer, so replies finish in reverse order.
    def script(number, body):
        index = int(body["messages"][-1]["content"])
        time.sleep(0.05 * (5 - index))
        return 200, {}, completion(f"reply {index}")

    server = serve(script)
    backend = HTTPBackend(server.url, "m", max_workers=4)
    assert isinstance(backend, ChatBackend)
    replies = backend.chat([conv(str(i)) for i in range(5)])
    assert replies == [f"reply {i}" for i in range(5)]
    assert len(server.requests) == 5
    assert server.max_in_flight >= 2  # the batch ran concurrently
    assert backend.chat([]) == []


def test_retries_503_then_succeeds(serve):
    def script(number, body):
        if number <= 2:
            return 503, {}, {"error": {"message": "overloaded"}}
        return 200, {}, completion("finally")

    server = serve(script)
    backend = HTTPBackend(server.url, "m", max_retries=3, backoff=0.01)
    assert backend.chat([conv("hi")]) == ["finally"]
    assert len(server.requests) == 3


def test_always_500_raises_after_all_attempts(serve):
    server = serve(lambda number, body: (500, {}, {"error": {"message": "server exploded"}}))
    backend = HTTPBackend(server.url, "m", max_retries=2, backoff=0.01)
    with pytest.raises(BackendError) as info:
        backend.chat([conv("hi")])
    expected = f"HTTP backend {server.url}: HTTP 500 after 3 attempts: server exploded"
    assert str(info.value) == expected
    assert len(server.requests) == 3  # max_retries + 1


def test_400_fails_without_retry(serve):
    server = serve(lambda number, body: (400, {}, {"error": {"message": "bad model name"}}))
    backend = HTTPBackend(server.url, "m", max_retries=3, backoff=0.01)
    with pytest.raises(BackendError, match=r"HTTP 400: bad model name"):
        backend.chat([conv("hi")])
    assert len(server.requests) == 1


def test_request_body_and_headers(serve, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    server = serve(lambda number, body: (200, {}, completion("ok")))
    HTTPBackend(server.url + "/", "qwen-7b").chat([conv("2+2?")], max_new_tokens=17,
                                                  temperature=0.7)
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["body"] == {
        "model": "qwen-7b",
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "2+2?"}],
        "max_tokens": 17,
        "temperature": 0.7,
    }
    assert request["headers"]["Authorization"] == "Bearer sk-from-env"
    assert request["headers"]["Content-Type"] == "application/json"
    HTTPBackend(server.url, "m", api_key="sk-explicit").chat([conv("x")])
    assert server.requests[1]["headers"]["Authorization"] == "Bearer sk-explicit"
    monkeypatch.delenv("OPENAI_API_KEY")
    HTTPBackend(server.url, "m").chat([conv("x")])
    assert "Authorization" not in server.requests[2]["headers"]


def test_429_respects_retry_after(serve):
    def script(number, body):
        if number == 1:
            return 429, {"Retry-After": "1"}, {"error": "rate limited"}
        return 200, {}, completion("ok")

    server = serve(script)
    backend = HTTPBackend(server.url, "m", backoff=0.001)
    start = time.monotonic()
    assert backend.chat([conv("hi")]) == ["ok"]
    assert time.monotonic() - start >= 0.9  # waited Retry-After, not the 1 ms backoff
    assert len(server.requests) == 2


def test_error_message_from_plain_text_body(serve):
    server = serve(lambda number, body: (502, {}, b"Bad Gateway"))
    with pytest.raises(BackendError, match=r"HTTP 502 after 1 attempts: Bad Gateway$"):
        HTTPBackend(server.url, "m", max_retries=0).chat([conv("hi")])


def test_malformed_reply(serve):
    server = serve(lambda number, body: (200, {}, {"choices": []}))
    with pytest.raises(BackendError, match=r"invalid reply after 3 attempts: .*choices\[0\].message.content"):
        HTTPBackend(server.url, "m", max_retries=2, backoff=0.01).chat([conv("hi")])
    assert len(server.requests) == 3  # an HTTP 200 that is not a chat completion is retried


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as sock:  # find a port, then close it so nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    expected = rf"HTTP backend {url}: connection failed after 2 attempts"
    with pytest.raises(BackendError, match=expected):
        HTTPBackend(url, "m", max_retries=1, backoff=0.01).chat([conv("hi")])


def test_bad_conversations_are_named():
    backend = HTTPBackend("http://127.0.0.1:9/v1", "m")
    with pytest.raises(ValueError, match=r"conversation 1 message 0: field 'content'"):
        backend.chat([conv("ok"), [{"role": "user"}]])
    with pytest.raises(ValueError, match=r"conversation 0 is not a list"):
        backend.chat(["just a string"])
    with pytest.raises(ValueError, match="max_retries=-1"):
        HTTPBackend("http://x", "m", max_retries=-1)


def test_make_backend_http(serve):
    server = serve(lambda number, body: (200, {}, completion(body["model"])))
    backend = make_backend(f"http:{server.url}#my-model", max_retries=1)
    assert isinstance(backend, HTTPBackend)
    assert (backend.base_url, backend.model, backend.max_retries) == (server.url, "my-model", 1)
    assert backend.chat([conv("x")]) == ["my-model"]
    assert make_backend(f"http:{server.url}", model="kw-model").model == "kw-model"
    with pytest.raises(ValueError, match="http:URL#MODEL"):
        make_backend(f"http:{server.url}")


def test_make_backend_unknown_kind():
    with pytest.raises(ValueError, match="unknown backend kind 'grpc'"):
        make_backend("grpc:host:1234")


def test_make_backend_local_import_failure(monkeypatch):
    monkeypatch.setitem(sys.modules, "jaxrl_mt.local_backend", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"'local:builtin:x'.*LocalBackend cannot be imported"):
        make_backend("local:builtin:x")


def test_retry_after_header_forms():
    from email.utils import formatdate

    from jaxrl_mt.backends import MAX_RETRY_AFTER_S, _retry_after

    assert _retry_after(None) is None and _retry_after("soon") is None
    assert _retry_after("2") == 2.0
    assert _retry_after("-5") == 0.0
    assert _retry_after("86400") == MAX_RETRY_AFTER_S
    in_ten_s = _retry_after(formatdate(time.time() + 10, usegmt=True))
    assert 8.0 <= in_ten_s <= 10.0


def test_garbage_200_then_success_and_reply_details(serve):
    replies = [b"<html>proxy error</html>", {"choices": [{"message": {"content": 5}}]},
               {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}]
    server = serve(lambda number, body: (200, {}, replies[number - 1]))
    backend = HTTPBackend(server.url, "m", max_retries=2, backoff=0.01)
    (reply,) = backend.complete([conv("hi")], max_new_tokens=3, temperature=0.5, top_p=0.9, seed=7, stop=["\n"])
    assert reply == ChatReply("ok", "length", 12, 3)
    assert len(server.requests) == 3
    assert {k: server.requests[0]["body"][k] for k in ("top_p", "seed", "stop")} == {"top_p": 0.9, "seed": 7,
                                                                                     "stop": ["\n"]}
    assert (backend.stats["requests"], backend.stats["retries"]) == (1, 2)


def test_timeout_is_retried_then_reported(serve):
    def script(number, body):
        if number <= 2 or body["messages"][-1]["content"] == "always slow":
            time.sleep(0.6)  # longer than the client's timeout
        return 200, {}, completion("late but fine")

    server = serve(script)
    assert HTTPBackend(server.url, "m", timeout=0.2, max_retries=2, backoff=0.01).chat([conv("x")]) == ["late but fine"]
    assert len(server.requests) == 3
    with pytest.raises(BackendError, match=r"connection failed after 2 attempts: timed out \(0.2 s\)$"):
        HTTPBackend(server.url, "m", timeout=0.2, max_retries=1, backoff=0.01).chat([conv("always slow")])


def test_deadline_cancels_queued_requests(serve):
    release = threading.Event()
    server = serve(lambda number, body: (release.wait(5), (200, {}, completion("never in time")))[1])
    backend = HTTPBackend(server.url, "m", timeout=30, max_retries=5, max_workers=2, deadline=0.5)
    start = time.monotonic()
    with pytest.raises(BackendError) as info:
        backend.chat([conv(str(i)) for i in range(10)])
    took = time.monotonic() - start
    release.set()
    assert str(info.value) == (f"HTTP backend {server.url}: batch deadline of 0.5 s passed with 10 of 10 "
                               "requests unanswered (queued ones cancelled)")
    assert 0.45 <= took < 1.5  # not the 30 s timeout, not 10 requests one after another
    time.sleep(0.3)
    assert len(server.requests) == 2  # the 8 queued requests were never sent


def test_api_key_from_named_env_and_never_in_messages(serve, monkeypatch):
    monkeypatch.setenv("MY_EVAL_KEY", "sk-secret-123")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = serve(lambda number, body: (401, {}, {"error": {"message": "bad key"}}))
    backend = make_backend(f"http:{server.url}#m", api_key_env="MY_EVAL_KEY")
    with pytest.raises(BackendError) as info:
        backend.chat([conv("x")])
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in str(info.value) + repr(backend) + str(backend.stats)
    assert HTTPBackend(server.url, "m", api_key_env="").api_key is None
