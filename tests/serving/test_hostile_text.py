"""A lone surrogate in a request field (issue 53 item 2): 400 JSON naming the field, from the real server.

Before, a surrogate in a message or a stop string was a plain-text 500 with a 50-line traceback in the
server's log (UTF-8 cannot encode it where the prompt is tokenised).
"""

from __future__ import annotations

import pytest

from jaxrl_mt.serving.protocol import RequestError, parse_chat_request
from tests.serving.fixtures import TINY_NAME
from tests.serving.test_hostile import post, server  # noqa: F401 (fixture)

HI = '[{"role": "user", "content": "hi"}]'
CASES = [
    (f'{{"model": "{TINY_NAME}", "messages": [{{"role": "user", "content": "\\ud800 The answer is 5."}}]}}',
     "messages[0].content"),
    (f'{{"model": "{TINY_NAME}", "messages": [{{"role": "user", "content": '
     '[{"type": "text", "text": "a\\udfff"}]}]}', "messages[0].content[0].text"),
    (f'{{"model": "{TINY_NAME}", "messages": {HI}, "stop": "\\ud800"}}', "stop"),
    (f'{{"model": "{TINY_NAME}", "messages": {HI}, "stop": ["ok", "x\\udc00"]}}', "stop[1]"),
    (f'{{"model": "\\ud800", "messages": {HI}}}', "model"),
]


@pytest.mark.parametrize("raw,field", CASES)
def test_a_lone_surrogate_is_refused_naming_the_field(raw, field):
    with pytest.raises(RequestError) as e:
        parse_chat_request(raw.encode())
    assert (e.value.status, e.value.param, e.value.code) == (400, field, "invalid_value")
    assert "lone surrogate" in e.value.message


def test_a_surrogate_pair_is_text():
    raw = f'{{"model": "{TINY_NAME}", "messages": [{{"role": "user", "content": "\\ud83d\\ude00"}}]}}'
    assert parse_chat_request(raw.encode()).messages[0]["content"] == "\U0001F600"


def test_the_server_answers_400_json_and_keeps_serving(server):  # noqa: F811
    for raw, field in CASES[:4]:
        status, err = post(server.url, raw.encode())
        assert status == 400 and err["error"]["param"] == field, (status, err)
    status, ok = post(server.url, f'{{"model": "{TINY_NAME}", "messages": {HI}, "max_tokens": 2}}'.encode())
    assert status == 200 and ok["choices"][0]["finish_reason"] in ("stop", "length")
