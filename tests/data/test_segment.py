"""Rule-based and LLM segmenters."""

from __future__ import annotations

import http.server
import json
import threading
import warnings
from pathlib import Path

import pytest

from jaxrl_mt.backends import HTTPBackend
from jaxrl_mt.data.loaders import asset_path, load_gsm8k
from jaxrl_mt.data.numbers import number_list, number_set
from jaxrl_mt.data.segment import LLMSegmenter, parse_json_list, segment_rule_based, split_sentences

NATALIA = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)


@pytest.mark.parametrize(
    "question, target, conditions",
    [
        (
            NATALIA,
            "How many clips did Natalia sell altogether in April and May?",
            ("Natalia sold clips to 48 of her friends in April.", "She sold half as many clips in May."),
        ),
        (  # leading "If ..., what ...?" clause moves into a condition
            "Gillian's phone bill is usually $50 a month. If the monthly bill increases by 10%, what will be her "
            "phone bill for the entire next year?",
            "What will be her phone bill for the entire next year?",
            ("Gillian's phone bill is usually $50 a month.", "The monthly bill increases by 10%."),
        ),
        (  # trailing "... if ...?" clause
            "Julia's internet speed is 20 MBps. How many songs can she download in half an hour if the size per "
            "song is 5MB?",
            "How many songs can she download in half an hour?",
            ("Julia's internet speed is 20 MBps.", "The size per song is 5MB."),
        ),
        (  # abbreviations, decimals, thousands commas, ';' and ', and' / ' and ' clauses
            "Mr. Lee buys 3 pens at $1.50 each; he also buys a notebook for $2.25. Mrs. Lee has 1,200 stamps "
            "and she gives away 350 stamps. How much did Mr. Lee spend?",
            "How much did Mr. Lee spend?",
            ("Mr. Lee buys 3 pens at $1.50 each.", "He also buys a notebook for $2.25.", "Mrs. Lee has 1,200 stamps.",
             "She gives away 350 stamps."),
        ),
        (  # "and a pencil" is not a clause: no split
            "He buys a hat for $10 and a pencil for $2. How much did he spend?",
            "How much did he spend?",
            ("He buys a hat for $10 and a pencil for $2.",),
        ),
        (  # no question mark: the imperative sentence is the target
            "Tom has 4 apples. Calculate how many apples Tom has after buying 6 more.",
            "Calculate how many apples Tom has after buying 6 more.",
            ("Tom has 4 apples.",),
        ),
    ],
)
def test_rule_based_hand_written(question, target, conditions):
    assert segment_rule_based(question) == (target, conditions)


def test_split_sentences_keeps_abbreviations_and_decimals():
    assert split_sentences("Mr. Smith paid $3.50 at 5 p.m. on Monday.  He left! Did he?") == [
        "Mr. Smith paid $3.50 at 5 p.m. on Monday.",
        "He left!",
        "Did he?",
    ]


def test_cap_merges_neighbours_and_keeps_numbers():
    q = " ".join(f"Box {i} holds {i + 10} balls." for i in range(1, 15)) + " How many balls are there in all?"
    target, conds = segment_rule_based(q, max_shards=10)
    assert target == "How many balls are there in all?"
    assert 1 + len(conds) == 10
    assert " ".join(conds) == " ".join(f"Box {i} holds {i + 10} balls." for i in range(1, 15))
    assert len(segment_rule_based(q, max_shards=4)[1]) == 3
    with pytest.raises(ValueError):
        segment_rule_based(q, max_shards=1)


@pytest.mark.parametrize("split", ["train", "test"])
def test_numbers_kept_on_shipped_gsm8k(split):
    for line in asset_path(f"gsm8k/{split}_sample.jsonl").read_text().splitlines():
        q = json.loads(line)["question"]
        target, conds = segment_rule_based(q)
        assert 1 + len(conds) <= 10
        assert sorted(number_list(q)) == sorted(number_list("\n".join([target, *conds]))), q


# --------------------------------------------------------------------------- LLM segmenter
# A real OpenAI-compatible HTTP server on 127.0.0.1 with canned replies, reached through
# jaxrl_mt.backends.HTTPBackend: what is tested is the segmenter's prompting, parsing and checks.


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        srv.requests.append(body)
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        text = body["messages"][-1]["content"]
        table = srv.rephrase if text.startswith("Below is a JSON list of shards") else srv.segment
        reply = next((v for k, v in table.items() if k in text), "sorry, I cannot help")
        out = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.requests, srv.segment, srv.rephrase = [], {}, {}
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def _backend(srv) -> HTTPBackend:
    return HTTPBackend(f"http://127.0.0.1:{srv.server_address[1]}/v1", "canned", api_key="", max_retries=0, timeout=10)


Q_GOOD = "Ann has 3 cats and 2 dogs. How many pets does she have?"
Q_BAD = "Bo buys 4 pens at $2 each. How much does he pay?"


def test_llm_segmenter_parses_validates_and_falls_back(server):
    server.segment.update({
        "Ann has 3 cats": '```json\n["How many pets does Ann have?", "Ann has 3 cats", "Ann has 2 dogs"]\n```',
        "Bo buys 4 pens": '["How much does Bo pay?", "Bo buys 4 pens"]',  # drops "$2": invalid
    })
    server.rephrase.update({
        "Ann has 3 cats": 'Sure! ["so how many pets does Ann have?", "she has 3 cats", "oh and 2 dogs"]',
        "Bo buys 4 pens": '["what does Bo pay?", "he buys 4 pens at $2 each"]',
    })
    seg = LLMSegmenter(_backend(server), max_new_tokens=300)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = seg.segment([Q_GOOD, Q_BAD])
    assert len(server.requests) == 4  # two steps, two questions each
    assert all(r["model"] == "canned" and r["max_tokens"] == 300 and r["temperature"] == 0.0 for r in server.requests)
    assert server.requests[0]["messages"][0]["role"] == "system"
    assert out[0] == ("so how many pets does Ann have?", ("she has 3 cats", "oh and 2 dogs"))
    # the rule-based fallback ("How much does he pay?", ("Bo buys 4 pens at $2 each.",)) is rephrased
    assert out[1] == ("what does Bo pay?", ("he buys 4 pens at $2 each",))
    assert seg.fallbacks == 1
    assert any("question 1 invalid" in str(x.message) and "'2'" in str(x.message) for x in w)


def test_llm_segmenter_bad_rephrase_keeps_segmentation(server):
    server.segment["Ann has 3 cats"] = '["How many pets?", "Ann has 3 cats", "Ann has 2 dogs"]'
    server.rephrase["Ann has 3 cats"] = '["how many pets?", "she has three cats and 2 dogs"]'  # wrong length
    with pytest.warns(UserWarning, match="rephrasing of question 0 invalid"):
        out = LLMSegmenter(_backend(server)).segment([Q_GOOD])
    assert out == [("How many pets?", ("Ann has 3 cats", "Ann has 2 dogs"))]


def test_llm_segmenter_spec_without_rephrase_and_not_json(server):
    spec = f"http:http://127.0.0.1:{server.server_address[1]}/v1#canned"
    with pytest.warns(UserWarning, match="no JSON list"):
        out = LLMSegmenter(spec, rephrase=False).segment([Q_GOOD])
    assert out == [segment_rule_based(Q_GOOD)]
    assert len(server.requests) == 1


def test_llm_segmenter_too_many_shards(server):
    shards = ["Q?"] + [f"fact {i}" for i in range(12)] + ["Ann has 3 cats and 2 dogs"]
    server.segment["Ann has 3 cats"] = json.dumps(shards)
    with pytest.warns(UserWarning, match="expected 2..10 shards, got 14"):
        LLMSegmenter(_backend(server), rephrase=False).segment([Q_GOOD])


def test_load_gsm8k_with_llm_segmenter(server, tmp_path):
    server.segment["Ann has 3 cats"] = '["How many pets does Ann have?", "Ann has 3 cats", "Ann has 2 dogs"]'
    p = tmp_path / "g.jsonl"
    p.write_text(json.dumps({"question": Q_GOOD, "answer": "3 + 2 = 5\n#### 5"}) + "\n")
    (t,) = load_gsm8k(p, segmenter=LLMSegmenter(_backend(server), rephrase=False))
    assert (t.target, t.conditions, t.answer) == ("How many pets does Ann have?", ("Ann has 3 cats", "Ann has 2 dogs"),
                                                  "5")
    assert t.meta["segmenter"] == "LLMSegmenter" and t.full_prompt == Q_GOOD


def test_parse_json_list():
    assert parse_json_list('noise ["a", "b"] trailing') == ["a", "b"]
    with pytest.raises(ValueError):
        parse_json_list("{}")


def test_numbers_helpers():
    got = number_set("It costs $1,200.50 or 8.00 dollars, .5 kg and 3/4 of 10%.")
    assert got == {"1200.5", "8", "0.5", "3", "4", "10"}
    assert number_list("a 120-page book, 2nd time, x2") == ["120", "2"]
    assert Path(asset_path("README.md")).exists()
