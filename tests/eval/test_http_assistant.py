"""`--config.model=http:URL#MODEL`: the evaluated assistant behind an OpenAI-compatible endpoint.

Round trip: our own server (``jaxrl_mt.serve``) on the session's tiny model answers the
evaluation; greedy transcripts equal the in-process evaluation's line for line. Faults: a real
faulty server on 127.0.0.1 (connection refused, 500s, timeouts, garbage JSON) ends the command
with one line and exit status 2, or is retried through; a resumed run neither loses nor
duplicates a transcript line; the API key never reaches a file or the log.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

from jaxrl_mt.backends import BackendError
from jaxrl_mt.evaluate import evaluate
from tests.eval.test_evaluate_cli import read_transcripts, tiny_config
from tests.eval.test_simulator import SYSTEM, counting_sampler
from tests.serving.fixtures import TINY_NAME, tiny_server  # noqa: F401  (fixture)


def by_id(records):
    return {r["conv_id"]: r for r in records}


def test_round_trip_through_our_server_equals_in_process(tmp_path, tiny_model, tiny_server):  # noqa: F811
    local = evaluate(tiny_config(tmp_path / "local", temperature=0.0, reuse_cache=False), model=tiny_model,
                     sampler=counting_sampler(tiny_model, max_batch=8), log=lambda s: None)
    logs: list[str] = []
    remote = evaluate(tiny_config(tmp_path / "http", temperature=0.0, model=f"http:{tiny_server.url}#{TINY_NAME}",
                                  http_concurrency=16), log=logs.append)
    want = by_id(read_transcripts(tmp_path / "local" / "transcripts.jsonl"))
    got = by_id(read_transcripts(tmp_path / "http" / "transcripts.jsonl"))
    assert len(want) == remote["n_generated"] == 32
    assert got == want  # every field of every turn: texts, finish reasons, token counts, verdicts, scores
    assert sum(len(r["turns"]) for r in got.values()) > 32  # multi-turn conversations were exercised
    for kind, s in local["report"]["scenarios"].items():
        assert remote["report"]["scenarios"][kind]["P"] == s["P"]
    assert remote["report"]["model"] == f"http:{tiny_server.url}#{TINY_NAME}"
    stats = remote["report"]["this_invocation"]["assistant_http"]
    assert stats["requests"] == sum(len(r["turns"]) for r in got.values()) and stats.get("retries", 0) == 0
    batching = tiny_server.service.batcher.summary()
    assert batching["max_rows"] > 1  # concurrent requests shared sampler calls
    assert set(re.findall(r'"conv_id": "([^"]+)"', (tmp_path / "http" / "report.html").read_text())) == set(got)

    # The official client asks our server the second turn of a few conversations: the transcripts' replies.
    client = openai.OpenAI(base_url=tiny_server.url, api_key="unused", max_retries=0)
    for rec in [r for r in want.values() if r["n_turns"] > 1][:3]:
        messages = [{"role": "system", "content": SYSTEM}]
        for t in rec["turns"][:2]:
            messages.append({"role": "user", "content": t["user"]})
            reply = client.chat.completions.create(model=TINY_NAME, messages=messages, temperature=0, max_tokens=4)
            assert reply.choices[0].message.content == t["assistant"]
            assert reply.usage.completion_tokens == t["new_tokens"] and reply.usage.prompt_tokens == t["prompt_tokens"]
            messages.append({"role": "assistant", "content": t["assistant"]})


# --------------------------------------------------------------------------- a faulty endpoint


def fake_reply(body: dict) -> dict:
    """A deterministic assistant: alternates a question and a (wrong) answer attempt."""
    n = sum(m["role"] == "assistant" for m in body["messages"])
    text = "The answer is 12345." if n % 2 else "Could you tell me more?"
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 20 + 7 * n, "completion_tokens": 6, "total_tokens": 26 + 7 * n}}


def http_config(workdir, url, **kw):
    base = dict(model=f"http:{url}#fake", temperature=0.0, http_retries=2, http_backoff=0.01, http_timeout=2.0,
                scenarios=("full", "sharded", "recap"))
    return tiny_config(workdir, **{**base, **kw})


@pytest.fixture
def fault_server():
    from tests.test_backends import FakeOpenAIServer

    servers = []

    def start(script):
        servers.append(FakeOpenAIServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_transient_faults_are_retried_and_key_never_stored(tmp_path, fault_server, monkeypatch, capsys):
    secret = "sk-test-SECRET-0123456789"
    monkeypatch.setenv("EVAL_TEST_KEY", secret)
    clean = fault_server(lambda number, body: (200, {}, fake_reply(body)))
    evaluate(http_config(tmp_path / "clean", clean.url), log=lambda s: None)
    seen: dict[str, int] = {}
    kinds = ("http500", "garbage", "timeout", "http429")

    def faulty(number, body):  # the first attempt of every distinct request fails, each in its own way
        key = json.dumps(body["messages"])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            return 200, {}, fake_reply(body)
        kind = kinds[len(seen) % len(kinds)]
        if kind == "timeout":
            import time
            time.sleep(1.5)  # past the client timeout, with room for a loaded host
            return 200, {}, fake_reply(body)
        if kind == "garbage":
            return 200, {}, b'{"choices": [{"message": nothing like JSON'
        return (500 if kind == "http500" else 429), {}, {"error": {"message": kind}}

    server = fault_server(faulty)
    logs: list[str] = []
    out = evaluate(http_config(tmp_path / "faulty", server.url, http_timeout=1.0, api_key_env="EVAL_TEST_KEY"),
                   log=logs.append)
    assert by_id(read_transcripts(tmp_path / "faulty" / "transcripts.jsonl")) == \
        by_id(read_transcripts(tmp_path / "clean" / "transcripts.jsonl"))
    stats = out["report"]["this_invocation"]["assistant_http"]
    # every distinct request failed once (identical runs repeat requests); a loaded host may add a timeout
    assert len(seen) > 0 and stats["retries"] >= len(seen) and stats.get("failures", 0) == 0
    assert stats["requests"] == sum(r["n_turns"] for r in read_transcripts(tmp_path / "faulty" / "transcripts.jsonl"))
    assert all(r["headers"]["Authorization"] == f"Bearer {secret}" for r in server.requests)
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "faulty").iterdir())
    assert "EVAL_TEST_KEY" in written and secret not in written  # the variable's name only
    assert secret not in "\n".join(logs) + capsys.readouterr().err


@pytest.mark.parametrize("fault,message", [
    ("http500", r"HTTP 500 after 3 attempts: upstream exploded$"),
    ("timeout", r"connection failed after 3 attempts: timed out \(0.2 s\)$"),
    ("garbage", r"invalid reply after 3 attempts: reply lacks choices\[0\]\.message\.content: b'\{\"oops\"'$"),
])
def test_persistent_fault_is_one_clear_error(tmp_path, fault_server, fault, message):
    import time

    def script(number, body):
        if fault == "timeout":
            time.sleep(0.5)
        return {"http500": (500, {}, {"error": {"message": "upstream\nexploded"}}),
                "timeout": (200, {}, fake_reply(body)), "garbage": (200, {}, b'{"oops"')}[fault]

    server = fault_server(script)
    with pytest.raises(BackendError) as info:
        evaluate(http_config(tmp_path, server.url, http_timeout=0.2, scenarios=("full",)), log=lambda s: None)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"HTTP backend {server.url}: ")
    assert __import__("re").search(message, text), text


def test_deadline_ends_a_turn_that_never_answers(tmp_path, fault_server):
    import threading
    import time

    release = threading.Event()
    server = fault_server(lambda number, body: (release.wait(10), (200, {}, fake_reply(body)))[1])
    start = time.monotonic()
    with pytest.raises(BackendError, match=r"batch deadline of 1 s passed with \d+ of \d+ requests unanswered"):
        evaluate(http_config(tmp_path, server.url, http_timeout=30.0, http_deadline=1.0, http_concurrency=2),
                 log=lambda s: None)
    assert time.monotonic() - start < 3.0  # not 30 s per request
    release.set()


def test_resume_after_a_failed_run_loses_and_duplicates_nothing(tmp_path, fault_server):
    clean = fault_server(lambda number, body: (200, {}, fake_reply(body)))
    evaluate(http_config(tmp_path / "clean", clean.url), log=lambda s: None)
    want = by_id(read_transcripts(tmp_path / "clean" / "transcripts.jsonl"))
    broken = {"on": True}

    def script(number, body):  # goes down for good after its first 14 requests, until "repaired"
        if broken["on"] and number > 14:
            return 503, {}, {"error": {"message": "down"}}
        return 200, {}, fake_reply(body)

    server = fault_server(script)
    path = tmp_path / "run" / "transcripts.jsonl"
    with pytest.raises(BackendError, match="HTTP 503 after 3 attempts: down"):
        evaluate(http_config(tmp_path / "run", server.url), log=lambda s: None)
    first = read_transcripts(path)
    assert 0 < len(first) < len(want)  # the conversations finished before the failure were kept
    broken["on"] = False
    out = evaluate(http_config(tmp_path / "run", server.url), log=lambda s: None)
    lines = read_transcripts(path)
    assert out["n_resumed"] == len(first) and out["n_generated"] == len(want) - len(first)
    assert sorted(r["conv_id"] for r in lines) == sorted(want)  # each conversation exactly once
    assert by_id(lines) == want


def test_cli_connection_refused_is_one_line_and_exit_2(tmp_path):
    import socket
    import subprocess
    import sys

    from tests.eval.test_evaluate_cli import CONFIG, ROOT

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    cmd = [sys.executable, "-m", "jaxrl_mt.evaluate", f"--config={CONFIG}:cpu", f"--config.model=http:{url}#m",
           f"--config.workdir={tmp_path}", "--config.dataset=synthetic:1", "--config.scenarios=full",
           "--config.runs=1", "--config.http_retries=1", "--config.http_backoff=0.01", "--config.plots=False"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr
    assert errors == [f"error: HTTP backend {url}: connection failed after 2 attempts: [Errno 111] Connection refused"]
    assert "Traceback" not in proc.stderr
