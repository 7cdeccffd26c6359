"""The OpenAI-compatible server on the tiny chat model, driven by the official ``openai`` client.

Greedy replies equal the in-process sampler's; streaming, ``n``, ``seed`` and ``stop`` behave as
the API says; every bad request gets its status and the server keeps serving; concurrent
requests share sampler calls without changing their replies; a client that leaves mid-stream is
dropped from its batch.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.sampling import Sampler, SamplingConfig
from tests.serving.fixtures import TINY_NAME, tiny_server  # noqa: F401  (fixture)


def chat(text: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


@pytest.fixture(scope="module")
def client(tiny_server):  # noqa: F811
    return openai.OpenAI(base_url=tiny_server.url, api_key="unused", max_retries=0, timeout=120)


def post_raw(url: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/chat/completions", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_and_greedy_reply_equal_the_sampler(client, tiny_model):  # noqa: F811
    assert [m.id for m in client.models.list()] == [TINY_NAME]
    assert client.models.retrieve(TINY_NAME).id == TINY_NAME
    r = client.chat.completions.create(model=TINY_NAME, messages=chat("What is 2+2?"), temperature=0, max_tokens=12)
    sampler = Sampler.from_model(tiny_model, min_prompt_bucket=256)
    prompt = encode_prompt(tiny_model.tokenizer, chat("What is 2+2?"))
    want = sampler.generate_ids([prompt], SamplingConfig(max_new_tokens=12, temperature=0.0))
    (choice,) = r.choices
    assert choice.message.content == want.texts[0] and choice.message.role == "assistant"
    assert choice.finish_reason == want.finish_reasons[0]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), len(want.tokens[0]))
    assert r.object == "chat.completion" and r.model == TINY_NAME and r.id.startswith("chatcmpl-")


def test_stream_carries_the_same_reply(client):
    kw = dict(model=TINY_NAME, messages=chat("Name a colour."), temperature=0, max_tokens=12)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole.choices[0].message.content and finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_n_seed_and_stop(client):
    kw = dict(model=TINY_NAME, messages=chat("Tell me a story."), temperature=1.0, max_tokens=12, n=4)
    a = client.chat.completions.create(**kw, seed=11)
    b = client.chat.completions.create(**kw, seed=11)
    c = client.chat.completions.create(**kw, seed=12)
    texts = [ch.message.content for ch in a.choices]
    assert [ch.index for ch in a.choices] == [0, 1, 2, 3] and len(set(texts)) == 4  # n different samples
    assert [ch.message.content for ch in b.choices] == texts  # same seed, same replies
    assert [ch.message.content for ch in c.choices] != texts
    assert a.usage.completion_tokens == 4 * 12 or any(ch.finish_reason == "stop" for ch in a.choices)
    greedy = client.chat.completions.create(model=TINY_NAME, messages=chat("Tell me a story."), temperature=0,
                                            max_tokens=12).choices[0].message.content
    stop = greedy[4:7]
    cut = client.chat.completions.create(model=TINY_NAME, messages=chat("Tell me a story."), temperature=0,
                                         max_tokens=12, stop=[stop, "never-there"]).choices[0]
    assert stop and cut.message.content == greedy[:greedy.find(stop)] and cut.finish_reason == "stop"


def test_bad_requests_get_their_status_and_the_server_keeps_serving(client, tiny_server):  # noqa: F811
    def still_serving():
        r = client.chat.completions.create(model=TINY_NAME, messages=chat("ok?"), temperature=0, max_tokens=2)
        assert r.choices[0].finish_reason in ("stop", "length")

    status, body = post_raw(tiny_server.url, b'{"model": "tiny", "messages": [')
    assert status == 400 and body["error"]["code"] == "invalid_json" and "malformed JSON" in body["error"]["message"]
    still_serving()
    assert post_raw(tiny_server.url, b'[1, 2]')[0] == 400
    with pytest.raises(openai.NotFoundError) as e404:
        client.chat.completions.create(model="gpt-9", messages=chat("hi"))
    assert e404.value.status_code == 404 and e404.value.code == "model_not_found"
    still_serving()
    with pytest.raises(openai.BadRequestError, match=r"'max_tokens': -5 is out of range"):
        client.chat.completions.create(model=TINY_NAME, messages=chat("hi"), max_tokens=-5)
    still_serving()
    with pytest.raises(openai.BadRequestError) as overflow:
        client.chat.completions.create(model=TINY_NAME, messages=chat("word " * 5000), max_tokens=10)
    assert overflow.value.code == "context_length_exceeded"
    assert "maximum context length is 4096 tokens" in overflow.value.message
    still_serving()
    with pytest.raises(openai.BadRequestError, match=r"context length"):  # fits, but not with the reply budget
        client.chat.completions.create(model=TINY_NAME, messages=chat("hi"), max_tokens=4090)
    for bad, field in ((dict(messages=[]), "'messages'"), (dict(messages=[{"role": "tool", "content": "x"}]),
                                                            "'messages[0].role'"),
                       (dict(messages=chat("hi"), temperature=3), "'temperature'"),
                       (dict(messages=chat("hi"), n=0), "'n'"), (dict(messages=chat("hi"), stop=["a"] * 5), "'stop'")):
        with pytest.raises(openai.BadRequestError, match=re.escape(field)):
            client.chat.completions.create(model=TINY_NAME, **bad)
    with urllib.request.urlopen(tiny_server.url.replace("/v1", "/health"), timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok"}
    with pytest.raises(urllib.error.HTTPError) as nf:
        urllib.request.urlopen(tiny_server.url + "/completions", timeout=10)
    assert nf.value.code == 404 and "error" in json.loads(nf.value.read())
    still_serving()


def test_concurrent_requests_share_calls_and_keep_their_replies(client, tiny_server):  # noqa: F811
    prompts = [f"Question number {i}: what is {i} + {i}?" for i in range(8)]
    alone = [client.chat.completions.create(model=TINY_NAME, messages=chat(p), temperature=0, max_tokens=8)
             .choices[0].message.content for p in prompts]
    spells = tiny_server.service.batcher.stats["spells"]
    together: list[str | None] = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def ask(i):
        barrier.wait()
        together[i] = client.chat.completions.create(model=TINY_NAME, messages=chat(prompts[i]), temperature=0,
                                                     max_tokens=8).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    deadline = time.monotonic() + 30
    while not tiny_server.service.batcher.idle and time.monotonic() < deadline:  # the spell's counters are final
        time.sleep(0.01)
    assert tiny_server.service.batcher.stats["spells"] - spells < len(prompts)  # some requests shared a spell


def test_client_leaving_mid_stream_is_dropped(tiny_model):  # noqa: F811
    from jaxrl_mt.serving.server import ServerThread, build_service

    service = build_service(tiny_model, names=[TINY_NAME], max_batch=8, window_ms=800, min_prompt_bucket=256)
    body = json.dumps({"model": TINY_NAME, "messages": chat("hi"), "max_tokens": 4, "temperature": 0,
                       "stream": True}).encode()
    with ServerThread(service) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            got = b""
            while b"data: " not in got:
                got += sock.recv(4096)
        assert b" 200 OK" in got.split(b"\r\n")[0] and b"text/event-stream" in got
        deadline = time.monotonic() + 10
        while service.batcher.stats["cancelled"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        r = client.chat.completions.create(model=TINY_NAME, messages=chat("still there?"), temperature=0, max_tokens=4)
        assert r.choices[0].message.content is not None
        stats = service.batcher.summary()
    assert stats["cancelled"] == 1 and stats["jobs"] == 1  # the one who left never reached the sampler
