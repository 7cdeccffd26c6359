"""Issue 32, failure 8: a failing judge or user-simulator endpoint is one line naming which endpoint failed."""

from __future__ import annotations

import socket

import pytest

from jaxrl_mt.backends import BackendError
from jaxrl_mt.eval.simulator import make_judge
from jaxrl_mt.eval.user_sim import make_user


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_error_line_names_the_role_and_model_of_the_failed_endpoint() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    kw = {"max_retries": 0, "timeout": 2.0, "api_key_env": ""}
    judge = make_judge(f"http:{url}#judge-model", **kw)
    user = make_user(f"http:{url}#sim-model", **kw)
    chat = [[{"role": "user", "content": "hello"}]]
    # before: both were "HTTP backend URL: connection failed ...", whichever of the two had failed
    with pytest.raises(BackendError) as info:
        judge.backend.chat(chat, max_new_tokens=4)
    assert str(info.value).startswith(f"HTTP backend {url} (judge, model judge-model): connection failed after 1 "
                                      "attempts: ")
    with pytest.raises(BackendError) as info:
        user.backend.chat(chat, max_new_tokens=4)
    assert str(info.value).startswith(f"HTTP backend {url} (user simulator, model sim-model): connection failed ")
    assert "\n" not in str(info.value)
