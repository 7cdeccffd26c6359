"""Hostile and unlucky clients against the real server (uvicorn on 127.0.0.1, the tiny chat model).

Issue 32, failure 5, each injected: a 20 MB body (413 at once while a small request is served),
NaN sampling settings (400 naming the field), 250 idle or half-sent connections (closed at the
read deadline), 50 clients that leave (one log line each, no traceback) and an abandoned
request (its rows stop decoding: asserted from the batcher's counters).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.sampling import SamplingConfig
from tests.serving.fixtures import TINY_NAME

READ_TIMEOUT = 1.0
SLICE = 16


@pytest.fixture(scope="module")
def server(tiny_model):  # noqa: F811
    """A server with a 1 s read deadline and 16-token decode slices."""
    from jaxrl_mt.serving.server import ServerThread, build_service

    service = build_service(tiny_model, names=[TINY_NAME], max_batch=8, min_prompt_bucket=256, slice_tokens=SLICE)
    with ServerThread(service, read_timeout=READ_TIMEOUT) as srv:
        yield srv


def body(text: str = "hi", **fields) -> bytes:
    return json.dumps({"model": TINY_NAME, "messages": [{"role": "user", "content": text}], "temperature": 0,
                       **fields}).encode()


def post(url: str, data: bytes, timeout: float = 60) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/chat/completions", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def request_head(length: int | None = None) -> bytes:
    """Request headers for a body of ``length`` bytes (None: chunked)."""
    size = b"Content-Length: %d\r\n" % length if length is not None else b"Transfer-Encoding: chunked\r\n"
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + size + b"\r\n"


def read_response(sock: socket.socket) -> bytes:
    got = b""
    while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < int(
            got.split(b"content-length: ")[1].split(b"\r\n")[0]):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def wait_for(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_20mb_body_is_413_at_once_while_a_small_request_is_served(server):
    post(server.url, body(max_tokens=1))  # compiled before the clock starts
    big = body("word " * 4_000_000, max_tokens=1)
    assert len(big) > 20_000_000
    out: dict = {}

    def send_big():
        t0 = time.perf_counter()
        out["big"] = post(server.url, big)  # urllib: Connection: close, writes the whole body first
        out["big_s"] = time.perf_counter() - t0

    thread = threading.Thread(target=send_big)
    thread.start()
    t0 = time.perf_counter()
    small = post(server.url, body(max_tokens=1))
    small_s = time.perf_counter() - t0
    thread.join()
    assert small[0] == 200 and small[1]["usage"]["completion_tokens"] == 1 and small_s < 1.0
    status, err = out["big"]
    assert status == 413 and out["big_s"] < 1.0, out
    assert err["error"]["code"] == "request_too_large" and f"({len(big)} bytes)" in err["error"]["message"]
    # a keep-alive client gets the 413 right after its headers, before it sends the body ...
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        t0 = time.perf_counter()
        sock.sendall(request_head(len(big)))
        head = read_response(sock)
        assert head.startswith(b"HTTP/1.1 413 ") and time.perf_counter() - t0 < 5.0  # was 16-19 s
        sock.sendall(big)  # ... and the server drops the body it then sends, keeping the connection
        sock.sendall(request_head(len(small_body := body(max_tokens=1))) + small_body)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
    # without a Content-Length the body is counted as it arrives and refused at the limit
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request_head(None))
        piece = b"x" * 1_000_000
        try:
            for _ in range(5):
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        except OSError:
            pass  # the server may have answered and closed already
        assert read_response(sock).startswith(b"HTTP/1.1 413 ")
    assert server.service.stats["too_large"] == 3


def test_a_big_conversation_is_rendered_off_the_event_loop(server):
    """A 1.4 MB conversation (700 messages of 2,000 characters) takes seconds of template rendering and
    tokenization (100,000 messages took 3.5 s on the event loop before; so many are now refused before
    rendering): on the preparing threads, while a small request is served."""
    post(server.url, body(max_tokens=1))
    many = json.dumps({"model": TINY_NAME, "messages": [{"role": "user", "content": "w " * 1000}] * 700,
                       "max_tokens": 1}).encode()
    assert len(many) < server.service.max_body_bytes
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("many", post(server.url, many)))
    thread.start()
    time.sleep(0.2)  # it is being rendered
    t0 = time.perf_counter()
    small = post(server.url, body(max_tokens=1))
    small_s = time.perf_counter() - t0
    still_preparing = thread.is_alive()
    thread.join()
    assert small[0] == 200 and small_s < 1.0, small_s
    assert still_preparing  # the small request was answered while the large one was being rendered
    status, err = out["many"]
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("raw,field", [
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "temperature"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": NaN}', "top_p"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": -Infinity}', "temperature"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": 1e999}', "top_p"),
])
def test_non_finite_numbers_are_400_naming_the_field(server, raw, field):
    status, err = post(server.url, raw)
    assert status == 400 and err["error"]["param"] == field and err["error"]["code"] == "invalid_value"
    assert err["error"]["message"].startswith(f"'{field}': ") and "is not a JSON number" in err["error"]["message"]


def test_250_idle_and_half_sent_connections_are_closed_at_the_read_deadline(server):
    before = server.service.stats["read_timeouts"]
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(250)]
    opened = time.monotonic()
    for i, s in enumerate(socks[150:]):  # 100 send half a request: 50 headers cut short, 50 a body cut short
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 else request_head(100) + b"{")

    def closed(s: socket.socket) -> bool:
        s.setblocking(False)
        try:
            return s.recv(1) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    time.sleep(READ_TIMEOUT / 2)
    assert not any(closed(s) for s in socks)  # nothing closed before the deadline
    wait_for(lambda: server.service.stats["read_timeouts"] - before == 250, timeout=READ_TIMEOUT + 10)
    assert time.monotonic() - opened >= READ_TIMEOUT
    assert all(closed(s) for s in socks)
    for s in socks:
        s.close()
    assert post(server.url, body(max_tokens=1))[0] == 200


@pytest.fixture
def server_log():
    """Every record of uvicorn's and the server's loggers (at INFO) while the test runs."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "uvicorn.access", "jaxrl_mt")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    yield records
    for lg, level in zip(loggers, levels):
        lg.removeHandler(handler)
        lg.setLevel(level)


def test_50_disconnects_are_one_log_line_each_and_no_traceback(server, server_log):
    stats = server.service.stats
    before = stats["disconnects"]
    full = body("tell me a story", max_tokens=200)
    streamed = body("tell me a story", max_tokens=200, stream=True)
    for i in range(50):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            if i < 20:  # leaves mid-upload
                sock.sendall(request_head(len(full)) + full[:20])
            elif i < 35:  # leaves while waiting for a non-streamed reply
                sock.sendall(request_head(len(full)) + full)
            else:  # leaves mid-stream
                sock.sendall(request_head(len(streamed)) + streamed)
                got = b""
                while b"data: " not in got:
                    got += sock.recv(4096)
            time.sleep(0.03)  # the request has reached the server
    wait_for(lambda: stats["disconnects"] - before == 50)
    wait_for(lambda: not server.service.batcher.in_flight)
    lines = [r for r in server_log if "client left" in r.getMessage()]
    access = [r for r in server_log if r.name == "uvicorn.access"]  # one per request whose response had begun
    assert len(lines) == 50 and len(server_log) - len(access) == 50, [r.getMessage() for r in server_log]
    assert len(access) == 15 and all('"POST /v1/chat/completions HTTP/1.1" 200' in r.getMessage() for r in access)
    assert not any(r.exc_info for r in server_log) and all("\n" not in r.getMessage() for r in server_log)
    assert sum("before its request was read" in r.getMessage() for r in lines) == 20


def test_abandoned_requests_stop_generating(server):
    """A client that leaves while its spell decodes: its row is dropped at the next segment (of 16 steps)."""
    batcher, budget = server.service.batcher, 96
    status, kept = post(server.url, body("go on", max_tokens=budget))  # 6 segments of 16 steps
    assert status == 200 and kept["usage"]["completion_tokens"] == budget  # left alone it decodes the budget
    assert kept["choices"][0]["finish_reason"] == "length"
    for stream in (False, True):
        wait_for(lambda: batcher.idle)  # the last spell's counters are final (its reply may be sent before)
        stats = dict(batcher.stats)
        segments = stats.get("segments", 0)
        data = body("go on", max_tokens=budget, stream=stream)
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(request_head(len(data)) + data)
            wait_for(lambda: batcher.stats["segments"] > segments)  # noqa: B023 (waited for here) its spell decodes
        wait_for(lambda: batcher.idle)  # its spell is over: its counters are final
        keys = ("spells", "stopped_rows", "tokens", "decoded", "cancelled")
        delta = {k: batcher.stats[k] - stats.get(k, 0) for k in keys}
        assert delta["spells"] == 1 and delta["stopped_rows"] == 1 and delta["cancelled"] == 1, delta
        assert delta["tokens"] == 0, delta  # no reply
        assert 1 <= delta["decoded"] <= 3 * SLICE < budget, delta  # stopped within a few segments, not at 96


@pytest.mark.slow
def test_sliced_greedy_replies_equal_one_sampler_call(server, tiny_model):  # noqa: F811
    """Segments change no greedy reply: the server's replies (decoded in segments of 16 steps, admitted
    among others) equal ``generate_ids``'s."""
    chats = [[{"role": "user", "content": t}] for t in ("go on", "Tell me about the sea.", "Count to ten.")]
    want = server.service.sampler.generate_ids([encode_prompt(tiny_model.tokenizer, c) for c in chats],
                                               SamplingConfig(max_new_tokens=90, temperature=0.0))
    segments = server.service.batcher.stats["segments"]
    for chat, text, reason in zip(chats, want.texts, want.finish_reasons):
        status, got = post(server.url, json.dumps({"model": TINY_NAME, "messages": chat, "temperature": 0,
                                                   "max_tokens": 90}).encode())
        assert status == 200 and got["choices"][0]["message"]["content"] == text
        assert got["choices"][0]["finish_reason"] == reason
    assert server.service.batcher.stats["segments"] - segments >= 3 * 2  # each reply took several segments


def test_a_sampled_seeded_reply_is_the_same_sliced(server, tiny_model):  # noqa: F811
    """A row draws its t-th token with fold_in(its key, t), so a seeded sampled request decoded in
    segments of 16 steps gets the reply of one `generate_ids` call with that seed (choice 0: row seed 0)."""
    chat = [{"role": "user", "content": "Tell me about the sea."}]
    want = server.service.sampler.generate_ids([encode_prompt(tiny_model.tokenizer, chat)],
                                               SamplingConfig(max_new_tokens=40, temperature=1.0), seed=1234)
    segments = server.service.batcher.stats["segments"]
    status, got = post(server.url, json.dumps({"model": TINY_NAME, "messages": chat, "temperature": 1.0,
                                               "max_tokens": 40, "seed": 1234}).encode())
    assert status == 200 and got["choices"][0]["message"]["content"] == want.texts[0]
    assert want.lengths[0] > SLICE and server.service.batcher.stats["segments"] - segments >= 2
