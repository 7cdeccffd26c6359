"""The LLM user simulator and the LLM judge through HTTPBackend against a real local server.

The server is an ``http.server`` on 127.0.0.1 returning canned OpenAI-style chat completions,
computed from each request by a test-supplied function.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jaxrl_mt.backends import BackendError, HTTPBackend
from jaxrl_mt.conversations import FixedOrderUser, TurnRecord
from jaxrl_mt.data import synthetic_tasks
from jaxrl_mt.eval.simulator import Judge, make_judge, plan_runs, simulate
from jaxrl_mt.eval.user_sim import (
    FREE_ORDER_KINDS,
    LLMUserSimulator,
    check_user_turn,
    make_user,
    parse_sim_reply,
)
from jaxrl_mt.sampling import SamplingConfig
from tests.eval.test_simulator import SYSTEM, counting_sampler


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(payload)
        status, content = self.server.respond(payload)
        if status == 200:
            body = {"choices": [{"message": {"role": "assistant", "content": content}}]}
        else:
            body = {"error": {"message": content}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture
def server():
    """A local OpenAI-style server; set ``server.respond = fn(payload) -> (status, content)``."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.requests = []
    srv.respond = lambda payload: (200, "")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield srv
    srv.shutdown()
    srv.server_close()


_CAND_RE = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)


def candidates_of(payload) -> list[tuple[int, str]]:
    """The shards offered in a user-simulator request: ``[(id, text)]``."""
    text = payload["messages"][-1]["content"]
    block = text.split("Shards available now:\n", 1)[1]
    return [(int(i), s) for i, s in _CAND_RE.findall(block)]


def rephrase_last(payload):
    """A well-behaved simulator: reveals the LAST offered shard, rephrased, numbers kept."""
    i, shard = candidates_of(payload)[-1]
    return 200, f"SHARD: {i}\nMESSAGE: hey, one more thing: {shard[0].lower()}{shard[1:]}"


# --------------------------------------------------------------------------- pure checks


def test_parse_sim_reply():
    assert parse_sim_reply("SHARD: 3\nMESSAGE: Oh and she buys 5 more.") == (3, "Oh and she buys 5 more.")
    assert parse_sim_reply("shard [2]\nmessage: \"hi 4\"") == (2, "hi 4")
    assert parse_sim_reply("She buys 5 more.") == (None, "She buys 5 more.")
    assert parse_sim_reply("Shard id: 4\nShe buys 5 more.") == (4, "She buys 5 more.")


def test_check_user_turn_by_hand():
    cands = {1: "Liam starts with 23 stickers.", 2: "On the first day, Liam buys 2 more stickers.",
             3: "On the second day, the number becomes 3 times as large."}
    gold = "75"
    assert check_user_turn("btw he begins with 23 stickers", 1, cands, gold) == ("ok", 1)
    # No id, but the numbers identify exactly one shard.
    assert check_user_turn("he buys 2 more on day one", None, cands, gold) == ("ok", 2)
    # A wrong id: resolved from the numbers as well.
    assert check_user_turn("he buys 2 more on day one", 7, cands, gold) == ("ok", 2)
    assert check_user_turn("he buys some more", None, cands, gold) == ("unknown_shard", None)
    assert check_user_turn("   ", 1, cands, gold) == ("empty", None)
    assert check_user_turn("he starts with 23 and buys 2 more", 1, cands, gold) == ("new_numbers", 1)
    assert check_user_turn("he starts with some stickers", 1, cands, gold) == ("missing_numbers", 1)
    assert check_user_turn("23 stickers at first, so 75 in the end", 1, cands, gold) == ("answer_leak", 1)
    assert check_user_turn("23 stickers. The answer is 23", 1, cands, gold) == ("answers_for_assistant", 1)
    # The gold number inside the revealed shard itself is not a leak.
    assert check_user_turn("she had 75 before", 4, {4: "She had 75 at first."}, gold) == ("ok", 4)


# --------------------------------------------------------------------------- through HTTP


def _runs(kind="sharded", n=2):
    runs, _ = plan_runs(synthetic_tasks(1, steps=2), [kind], n, system=SYSTEM)
    return runs


def test_user_sim_over_http_reveals_one_shard_per_turn(server, tiny_model):  # noqa: F811
    server.respond = rephrase_last
    backend = HTTPBackend(server.url, "sim", max_retries=0)
    sim = LLMUserSimulator(backend)
    runs = _runs("sharded", 2)
    sampler = counting_sampler(tiny_model)
    recs = simulate(sampler, runs, SamplingConfig(max_new_tokens=3), judge=Judge(), protocol="final_turn",
                    verifier_mode="strict", user=sim, seed=0)
    shards = runs[0].user_turns  # target + 3 conditions
    assert sampler.sizes == [2, 2, 2, 2]
    # Turn 1 verbatim; then one chat call per turn for both conversations (2 requests each).
    assert sim.stats["calls"] == 3 and len(server.requests) == 6
    assert sim.summary()["fallback"] == 0 and sim.stats["ok"] == 6
    for rec in recs:
        users = [t["user"] for t in rec["turns"]]
        assert users[0] == shards[0]
        # The simulator chose the last offered shard each time: reverse order, rephrased.
        assert users[1:] == [f"hey, one more thing: {s[0].lower()}{s[1:]}" for s in reversed(shards[1:])]
        assert [t["user_unit"] for t in rec["turns"]] == [0, 3, 2, 1]
        assert [t["user_check"] for t in rec["turns"]] == ["first_turn", "ok", "ok", "ok"]
    # The prompt follows the LiC rules and offers only unrevealed shards.
    sys_prompt = server.requests[0]["messages"][0]["content"]
    assert "at most one shard per message" in sys_prompt and "never answer on behalf of the assistant" in sys_prompt
    assert [c for c, _ in candidates_of(server.requests[-1])] == [2]
    assert "sharded" in FREE_ORDER_KINDS


def test_user_sim_falls_back_on_leaks_and_new_numbers(server):
    """Bad simulated turns are replaced by the verbatim shard and counted by reason."""
    replies = iter(["SHARD: 2\nMESSAGE: starts with 23, and the total is 75 in the end",  # leak
                    "SHARD: 3\nMESSAGE: he buys 2 more and 9 more",  # new number
                    "SHARD: 9\nMESSAGE: lovely weather"])  # no shard
    server.respond = lambda payload: (200, next(replies))
    sim = LLMUserSimulator(HTTPBackend(server.url, "sim", max_retries=0, max_workers=1), free_order_kinds=())
    run = _runs("sharded", 1)[0]
    run.meta["kind"] = "recap"  # fixed order: only the next planned unit is offered
    out = []
    for k in range(4):
        msg = sim.next_user_turns([run])[0]
        out.append(msg)
        run.turns.append(TurnRecord(index=k, user=msg, assistant="ok", tokens=[1], logprobs=[0.0],
                                    finish_reason="stop", prompt_tokens=5))
    assert out == run.user_turns  # every simulated turn failed its check: verbatim shards
    assert [s["reason"] for s in run.meta["user_sim"]] == ["first_turn", "answer_leak", "new_numbers",
                                                          "unknown_shard"]
    assert sim.summary() == {"answer_leak": 1, "calls": 3, "fallback": 3, "new_numbers": 1, "simulated": 3,
                             "unknown_shard": 1}
    assert sim.next_user_turns([run]) == [None]  # everything revealed


def test_user_sim_http_retries_then_fails_with_status(server):
    server.respond = lambda payload: (503, "overloaded")
    sim = make_user(f"http:{server.url}#sim", max_retries=2, backoff=0.01)
    run = _runs("sharded", 1)[0]
    run.meta["user_sim"] = [{"unit": 0, "reason": "first_turn", "fallback": False}]
    run.turns.append(TurnRecord(index=0, user="u", assistant="a", tokens=[1], logprobs=[0.0],
                                finish_reason="stop", prompt_tokens=3))
    with pytest.raises(BackendError, match=r"HTTP 503 after 3 attempts: overloaded"):
        sim.next_user_turns([run])
    assert len(server.requests) == 3  # first attempt + 2 retries


def test_make_user_specs():
    assert isinstance(make_user("fixed"), FixedOrderUser)
    with pytest.raises(ValueError, match="unknown backend kind 'gpt'"):
        make_user("gpt:4")


def test_llm_judge_over_http(server):
    def judge(payload):
        reply = payload["messages"][0]["content"].split("<reply>\n", 1)[1]
        if "answer is" in reply:
            return 200, "Category: answer_attempt"
        if "?" in reply:
            return 200, "**Category:** Clarification"
        return 200, "I am not sure."  # names no category: rule-based fallback

    server.respond = judge
    j = make_judge(f"http:{server.url}#judge", max_retries=0)
    labels = j.classify(["So the answer is 12.", "How many apples are there?", "We add them up first.", ""],
                        ["q"] * 4, ["math"] * 4)
    assert labels == ["answer_attempt", "clarification", "discussion", "missing"]
    assert j.stats == {"llm": 2, "fallback": 1, "empty": 1}
    assert len(server.requests) == 3  # the empty reply is not sent
    assert server.requests[0]["temperature"] == 0.0 and server.requests[0]["model"] == "judge"


def test_llm_judge_drives_lic_stopping(server, tiny_model):  # noqa: F811
    """An HTTP judge calling every reply an answer attempt: lic scores each run on its last turn."""
    server.respond = lambda payload: (200, "Category: answer_attempt")
    runs = _runs("sharded", 2)
    recs = simulate(counting_sampler(tiny_model), runs, SamplingConfig(max_new_tokens=3), judge=make_judge(
        f"http:{server.url}#judge", max_retries=0), protocol="lic", verifier_mode="strict")
    for rec in recs:
        assert all(t["label"] == "answer_attempt" for t in rec["turns"])
        assert rec["first_answer_turn"] == 1
        if rec["stop_reason"] == "correct_answer":  # a random model essentially never gets here
            assert rec["score"] == 1.0
        else:
            assert rec["n_turns"] == 4 and rec["scored_turn"] == 4 and rec["score"] == rec["turns"][-1]["correct"]

