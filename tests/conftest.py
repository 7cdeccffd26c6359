"""Shared pytest setup: CPU backend, the embedded model loaded once per worker, a throwaway model
cache, the number of xdist workers.

XLA device-count flags are deliberately not set here: multi-device tests set them in their own
subprocesses, so the default run sees the single real CPU device.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports jax

import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Iterator  # noqa: E402

import pytest  # noqa: E402

MAX_WORKERS = 4  # xdist workers for `-n auto` (setup.cfg); each holds its own models and compiled programs


def _shared_compile_cache() -> str | None:
    """One JAX persistent compilation cache for this test run, shared by its xdist workers and the
    subprocesses they start (environment variables, set before jax is imported): a program one
    process compiled is read, not compiled again, by the others. The controller (or a run without
    workers) makes a fresh folder and removes it at the end, so every run starts cold, as CI does.
    JAXRL_MT_TEST_NO_XLA_CACHE=1 turns it off. Returns the folder this process made, if any."""
    if os.environ.get("JAXRL_MT_TEST_NO_XLA_CACHE") or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    path = tempfile.mkdtemp(prefix="jaxrl_mt-test-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return path


_OWN_CACHE = _shared_compile_cache()


def _fast_compiles() -> None:
    """XLA:CPU's LLVM back end at optimisation level 0 for this run and its subprocesses: the tests'
    programs are tiny and compiled once each, so compiling dominates them (tests/test_slots.py and
    tests/test_turns.py: 147 -> 100 s, CPU time -39%). The whole suite passes at either level (parity
    tests compare programs compiled alike, or against torch within tolerances); users' runs keep
    XLA's level. JAXRL_MT_TEST_XLA_OPT=default keeps it in the tests too."""
    if os.environ.get("JAXRL_MT_TEST_XLA_OPT") == "default":
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_backend_optimization_level=0").strip()


_fast_compiles()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Removes the run's compilation cache (in the process that made it)."""
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per CPU this process may run on, at most MAX_WORKERS
    ($PYTEST_XDIST_AUTO_NUM_WORKERS overrides)."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under xdist, the controller converts the embedded model into the user cache before any
    worker starts: two workers converting at once would each rename the other's folder away."""
    config = session.config
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        from jaxrl_mt.models.registry import DEFAULT_MODEL, resolve

        resolve(DEFAULT_MODEL)


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


@pytest.fixture(scope="session")
def tiny_chat_model_dir(tmp_path_factory: pytest.TempPathFactory, embedded_model) -> Path:
    """A tiny random-weight Llama (2 layers, width 32) with the embedded model's tokenizer and
    chat template, saved as an HF folder: real tokenization, fast forward passes."""
    import jax

    from jaxrl_mt.models.config import ModelConfig
    from jaxrl_mt.models.decoder import init_params
    from jaxrl_mt.models.hf_io import export_hf_folder

    cfg = ModelConfig(vocab_size=embedded_model.cfg.vocab_size, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, tie_word_embeddings=True,
                      max_position_embeddings=4096, bos_token_id=1, eos_token_id=(2,), pad_token_id=2)
    params = init_params(cfg, jax.random.PRNGKey(0), scale=0.5)
    out = tmp_path_factory.mktemp("tiny") / "tiny-chat-llama"
    return export_hf_folder(cfg, params, out, tokenizer=embedded_model.tokenizer)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (a full disk in miniature; needs root: skipped where mounting is refused)."""
    import subprocess

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture(scope="session")
def tiny_model(tiny_chat_model_dir):
    """The session's tiny random Llama with the embedded tokenizer and chat template, loaded once."""
    from jaxrl_mt.models.registry import load_model

    return load_model(str(tiny_chat_model_dir))


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs() -> Iterator[None]:
    """Drops jax's compiled programs after each test module. XLA:CPU maps memory for every program
    it keeps; one process running the whole suite otherwise reaches the kernel's map-count limit
    (vm.max_map_count, 65530) and the next compile segfaults (seen after ~1,100 tests)."""
    yield
    import jax

    jax.clear_caches()


@pytest.fixture
def scratch_strategies(monkeypatch: pytest.MonkeyPatch):
    """`strategies.STRATEGIES` with its built-ins loaded; what a test adds is gone after it (a strategy
    left behind shows up in another test's "known: ..." list, on the same xdist worker)."""
    from jaxrl_mt.strategies import STRATEGIES

    STRATEGIES.names()  # loads the built-ins before the snapshot
    monkeypatch.setattr(STRATEGIES, "_entries", dict(STRATEGIES._entries))
    return STRATEGIES
