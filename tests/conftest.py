"""Shared pytest setup: CPU backend, the embedded model loaded once, a throwaway model cache.

XLA device-count flags are deliberately not set here: multi-device tests set them in their own
subprocesses, so the default run sees the single real CPU device.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports jax

from pathlib import Path  # noqa: E402
from typing import Iterator  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def embedded_model():
    """`builtin:smollm2-135m-instruct` in fp32, loaded once per session from the user cache."""
    from jaxrl_mt.models.registry import DEFAULT_MODEL, load_model

    return load_model(DEFAULT_MODEL)


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Points $JAXRL_MT_CACHE at an empty temporary folder (forces a fresh conversion)."""
    cache = tmp_path / "jaxrl_mt_cache"
    cache.mkdir()
    monkeypatch.setenv("JAXRL_MT_CACHE", str(cache))
    yield cache
