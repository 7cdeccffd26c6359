"""A server that cannot be starved (issue 53, item 7), against the real server (uvicorn on
127.0.0.1, the tiny chat model, real HTTP clients).

Each case is the probe's, scaled to the tiny model: big bodies of one-character messages (a small
request is not queued behind their parsing), a long prompt (prefilled in pieces, a small request
admitted between them, dropped between them when its client leaves), many rows waiting at once
(at most ``max_batch`` rows hold a slot at once) and a tiny ``top_p`` (the most likely token is
kept: the reply is the greedy one, not garbage).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tests.serving.fixtures import TINY_NAME
from tests.serving.test_hostile import body, post, request_head, wait_for

MAX_BATCH = 4
PIECE = 128  # prefill piece of the server under test
LONG_WORDS = 420  # a user message of about 1,250 tokens: 10 pieces


@pytest.fixture(scope="module")
def server(tiny_model):  # noqa: F811
    """A server with one preparing thread, 4 slots, 16-step segments and 128-token prefill pieces."""
    from jaxrl_mt.serving.server import ServerThread, build_service

    service = build_service(tiny_model, names=[TINY_NAME], max_batch=MAX_BATCH, min_prompt_bucket=256,
                            slice_tokens=16, prepare_workers=1)
    service.batcher.prefill_tokens = PIECE  # an attribute: read when a job is admitted
    with ServerThread(service, read_timeout=30) as srv:
        post(srv.url, body(max_tokens=1))  # compiled before any clock starts: a short reply ...
        post(srv.url, body(long_prompt(), max_tokens=16))  # ... and the pieces and segments of a long prompt
        yield srv


def timed(url: str, data: bytes) -> tuple[int, dict, float]:
    t0 = time.perf_counter()
    status, reply = post(url, data)
    return status, reply, time.perf_counter() - t0


def long_prompt() -> str:
    """A user message of about 1,250 tokens (every long request here has one cache size: one compile)."""
    return " ".join(f"w{i % 97}" for i in range(LONG_WORDS))


def test_tiny_top_p_keeps_the_most_likely_token(server):
    """top_p 1e-38 (0 in float32) and 1e-45 kept no token and sampled uniformly: garbage with 200."""
    status, greedy = post(server.url, body("Name a colour.", max_tokens=12))
    assert status == 200
    for top_p in (1e-38, 1e-45):
        status, got = post(server.url, body("Name a colour.", max_tokens=12, temperature=1.0, top_p=top_p, seed=3))
        assert status == 200 and got["choices"][0]["message"]["content"] == greedy["choices"][0]["message"][
            "content"], top_p


def test_100000_messages_are_refused_before_rendering(server):
    """The probe's body: 100,000 one-character messages (3.4 MB) can never fit the context (each message
    renders to at least 5 tokens): refused at once, not after seconds of rendering and tokenization."""
    many = json.dumps({"model": TINY_NAME, "messages": [{"role": "user", "content": "w"}] * 100_000,
                       "max_tokens": 1}).encode()
    assert 3_400_000 < len(many) < server.service.max_body_bytes
    status, err, seconds = timed(server.url, many)
    assert status == 400 and err["error"]["code"] == "context_length_exceeded" and seconds < 1.5, seconds
    assert "100000 messages take at least 500000 tokens (5 each)" in err["error"]["message"]


def test_big_bodies_are_prepared_in_their_own_lane(server):
    """Two bodies of 700 messages of 2,000 characters (1.4 MB) each take seconds to tokenize; a small
    request sent meanwhile is answered at once, not queued behind them (it waited for both before)."""
    many = json.dumps({"model": TINY_NAME, "messages": [{"role": "user", "content": "w " * 1000}] * 700,
                       "max_tokens": 1}).encode()
    assert 256 * 1024 < len(many) < server.service.max_body_bytes  # over the large-body lane's threshold
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(timed(server.url, many))) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # both are being prepared
    status, reply, small_s = timed(server.url, body(max_tokens=1))
    busy = sum(t.is_alive() for t in threads)
    for t in threads:
        t.join()
    assert status == 200 and reply["usage"]["completion_tokens"] == 1
    assert busy >= 1 and small_s < 0.5, (busy, small_s, [o[2] for o in out])  # the big ones still being prepared
    assert [o[0] for o in out] == [400, 400]
    assert all(o[1]["error"]["code"] == "context_length_exceeded" for o in out)


def test_at_most_max_batch_rows_hold_a_slot_at_once(server):
    """Three requests of n = 4 arrive while the worker is busy: 12 more rows, never more than 4 decoding
    at once (64 clients x n = 16 were once one call of 1,024 rows); the waiting rows take the slots
    that free up."""
    batcher = server.service.batcher
    batcher.max_rows_seen = 0
    busy = threading.Thread(target=post, args=(server.url, body(long_prompt(), max_tokens=16)))
    busy.start()
    wait_for(lambda: batcher.in_flight)
    rows = batcher.stats["rows"]
    out: list = []
    clients = [threading.Thread(target=lambda i=i: out.append(post(server.url, body(f"Count to {i}.", n=4,
                                                                                   max_tokens=2))))
               for i in range(3)]
    for t in clients:
        t.start()
    for t in clients + [busy]:
        t.join()
    assert [s for s, _ in out] == [200] * 3 and all(len(r["choices"]) == 4 for _, r in out)
    assert batcher.max_rows_seen == MAX_BATCH and batcher.stats["rows"] - rows == 12


def test_a_small_request_is_answered_between_the_pieces_of_a_long_prefill(server):
    """A 1,250-token prompt is prefilled in pieces of 128: a small request that arrives meanwhile is
    admitted into the running spell and answered before the long one ends (it once waited for the
    whole prefill and decode)."""
    batcher = server.service.batcher
    refills = batcher.stats["refills"]
    long_out: list = []
    worker = threading.Thread(target=lambda: long_out.append(post(server.url, body(long_prompt(), max_tokens=16))))
    worker.start()
    wait_for(lambda: batcher.in_flight)
    status, reply, small_s = timed(server.url, body("hi", max_tokens=2))
    long_running = worker.is_alive()
    worker.join()
    assert status == 200 and long_running, small_s  # answered while the long prompt was still in its call
    assert batcher.stats["refills"] > refills
    (long_status, long_reply), = long_out
    assert long_status == 200 and long_reply["usage"]["completion_tokens"] == 16
    assert long_reply["usage"]["prompt_tokens"] > 9 * PIECE


def test_a_long_prefill_is_dropped_between_pieces_when_its_client_leaves(server):
    """The client of a 1,250-token prompt leaves during its prefill: its row is dropped before any
    decode, between pieces (it was once prefilled whole and decoded)."""
    batcher = server.service.batcher
    stats = dict(batcher.stats)
    data = body(long_prompt(), max_tokens=16)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request_head(len(data)) + data)
        wait_for(lambda: batcher.in_flight)  # its call has started
    wait_for(lambda: not batcher.in_flight)
    delta = {k: batcher.stats[k] - stats.get(k, 0) for k in ("stopped_in_prefill", "tokens", "prefill_pieces")}
    assert delta["stopped_in_prefill"] == 1 and delta["tokens"] == 0, delta
    assert delta["prefill_pieces"] < 9, delta  # not fed whole
