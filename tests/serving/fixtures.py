"""A server on the session's tiny chat model, shared by the serving and HTTP-assistant tests."""

from __future__ import annotations

import pytest


TINY_NAME = "tiny"


@pytest.fixture(scope="session")
def tiny_server(tiny_model):  # noqa: F811
    """``python -m jaxrl_mt.serve``'s server on the tiny model, on 127.0.0.1 (one prompt bucket: 256)."""
    from jaxrl_mt.serving.server import ServerThread, build_service

    service = build_service(tiny_model, names=[TINY_NAME], max_batch=8, min_prompt_bucket=256)
    with ServerThread(service) as server:
        yield server
