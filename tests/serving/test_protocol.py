"""Request validation and response bodies of the chat-completions wire format (no server)."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.serving.protocol import MAX_N, ChatRequest, Choice, RequestError, completion_body, parse_chat_request


def parse(**fields) -> ChatRequest:
    return parse_chat_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}))


def error_of(raw) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_chat_request(raw if isinstance(raw, bytes) else json.dumps(raw).encode())
    return info.value


def test_defaults_and_every_field():
    assert parse() == ChatRequest(model="m", messages=({"role": "user", "content": "hi"},))
    r = parse(temperature=0, top_p=0.5, max_tokens=7, stop="\n", seed=3, n=2, stream=True,
              stream_options={"include_usage": True}, frequency_penalty=0, user="someone")
    assert (r.temperature, r.top_p, r.max_tokens, r.stop, r.seed, r.n, r.stream, r.include_usage) == \
        (0.0, 0.5, 7, ("\n",), 3, 2, True, True)
    assert parse(max_completion_tokens=9, max_tokens=3).max_tokens == 9  # the newer name wins
    msgs = [{"role": "developer", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert parse(messages=msgs).messages == ({"role": "system", "content": "sys"}, {"role": "user", "content": "ab"})


@pytest.mark.parametrize("raw,status,needle", [
    (b"{not json", 400, "malformed JSON body"),
    (b"\xff\xfe", 400, "malformed JSON body"),
    ([1, 2], 400, "must be a JSON object"),
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "'model': a model name"),
    ({"model": "m", "messages": []}, 400, "'messages': expected a non-empty list"),
    ({"model": "m", "messages": ["hi"]}, 400, "'messages[0]': expected an object"),
    ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, 400, "'messages[0].role': unsupported role"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, 400, "'messages[0].content'"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "'messages[0].content[0]': only text"),
])
def test_malformed_bodies(raw, status, needle):
    e = error_of(raw)
    assert e.status == status and needle in e.message and e.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("field,value,needle", [
    ("max_tokens", -1, "'max_tokens': -1 is out of range [1, inf]"),
    ("max_tokens", 0, "'max_tokens': 0 is out of range"),
    ("max_tokens", 2.5, "'max_tokens': expected an integer"),
    ("temperature", -0.1, "'temperature': -0.1 is out of range [0, 2]"),
    ("temperature", "hot", "'temperature': expected a number"),
    ("top_p", 0, "'top_p': 0 is out of range (0, 1]"),
    ("n", MAX_N + 1, f"'n': {MAX_N + 1} is out of range [1, {MAX_N}]"),
    ("n", True, "'n': expected an integer"),
    ("stop", ["a", ""], "'stop': expected a non-empty string"),
    ("stop", ["a"] * 5, "'stop'"),
    ("stream", "yes", "'stream': expected true or false"),
    ("seed", 1.5, "'seed': expected an integer"),
])
def test_bad_values_name_the_field(field, value, needle):
    e = error_of({"model": "m", "messages": [{"role": "user", "content": "x"}], field: value})
    assert e.status == 400 and needle in e.message and e.param == field


def test_completion_body_usage():
    body = completion_body("chatcmpl-1", "m", [Choice("a", "stop", 3), Choice("b", "length", 5)], 11)
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 8, "total_tokens": 19}
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["choices"][1] == {"index": 1, "message": {"role": "assistant", "content": "b"}, "logprobs": None,
                                  "finish_reason": "length"}


@pytest.mark.parametrize("raw,param,needle", [
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "temperature", "NaN"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": -Infinity}', "top_p", "-Infinity"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 1e999}', "top_p", "1e999"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x", "w": [1, NaN]}]}', "messages[0].w[1]", "NaN"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "frequency_penalty": Infinity}',
     "frequency_penalty", "Infinity"),  # an ignored field: still not JSON
])
def test_non_finite_numbers_are_refused_naming_the_field(raw, param, needle):
    e = error_of(raw)
    assert (e.status, e.param, e.code) == (400, param, "invalid_value")
    assert e.message == f"'{param}': {needle} is not a JSON number (JSON has no NaN or Infinity)"


def test_deep_nesting_is_malformed_json_not_a_crash():
    e = error_of(b"[" * 100_000)
    assert (e.status, e.code, e.message) == (400, "invalid_json", "malformed JSON body: nested too deeply")
    assert parse(temperature=1e300 / 1e300).temperature == 1.0  # finite floats still parse
