"""Evaluating a model behind an OpenAI-compatible endpoint: ``--config.model=http:URL#MODEL``.

The conversations are planned, judged, scored and written exactly as for a local model; only the
assistant's replies come from the endpoint (``jaxrl_mt.remote.RemoteSampler``: one batch of
concurrent requests per turn). The endpoint settings are config fields (``http_*``, ``api_key_env``),
shared by an ``http:`` judge and user simulator; the API key is read from the environment
variable named by ``api_key_env`` and is never stored (configs keep the variable's name only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrl_mt.backends import make_backend
from jaxrl_mt.conversations import ConversationRun, FixedOrderUser, UserPolicy, run_conversations
from jaxrl_mt.eval.eval_config import EvalConfig
from jaxrl_mt.eval.simulator import EvalError, Judge, TurnScorer, run_scored
from jaxrl_mt.remote import RemoteSampler
from jaxrl_mt.sampling import SamplingConfig

__all__ = ["check_http_config", "http_backend_kw", "is_http", "remote_sampler", "simulate_remote"]


def is_http(spec: object) -> bool:
    """Whether a model/judge/user-simulator spec names an HTTP endpoint."""
    return isinstance(spec, str) and spec.startswith("http:")


def check_http_config(c: EvalConfig) -> None:
    """Checks the HTTP fields of a typed config (their types are checked when it is built) and an
    ``http:`` model spec.

    Raises:
      EvalError: ``config field 'name': ...`` for the first bad value.
    """
    checks = (("http_concurrency", c.http_concurrency >= 1), ("http_timeout", c.http_timeout > 0),
              ("http_retries", c.http_retries >= 0), ("http_backoff", c.http_backoff >= 0),
              ("http_deadline", c.http_deadline >= 0))
    for name, ok in checks:
        if not ok:
            raise EvalError(f"config field '{name}': bad value {getattr(c, name)!r}")
    if not is_http(c.model):
        return
    url, _, name = c.model[len("http:"):].partition("#")
    if not url.startswith(("http://", "https://")) or not name:
        raise EvalError(f"config field 'model': {c.model!r}: expected 'http:URL#MODEL', e.g. "
                        "'http:http://127.0.0.1:8000/v1#my-model'")
    if c.strategy != "plain":
        raise EvalError(f"config field 'strategy': {c.strategy!r} needs the model's weights; a model behind "
                        "an endpoint can only be evaluated with 'plain'")


def http_backend_kw(spec: str, c: EvalConfig) -> dict[str, Any]:
    """``HTTPBackend`` keyword arguments from the typed config for an ``http:`` spec ({} otherwise)."""
    if not is_http(spec):
        return {}
    return {"max_workers": c.http_concurrency, "timeout": c.http_timeout, "max_retries": c.http_retries,
            "backoff": c.http_backoff, "deadline": c.http_deadline or None, "api_key_env": c.api_key_env}


def remote_sampler(c: EvalConfig) -> RemoteSampler:
    """The evaluated assistant of an ``http:URL#MODEL`` config."""
    return RemoteSampler(make_backend(c.model, **http_backend_kw(c.model, c)))


def simulate_remote(sampler: RemoteSampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *,
                    judge: Judge, protocol: str, verifier_mode: str, user: UserPolicy | None = None, seed: int = 0,
                    sink: Callable[[list[dict[str, Any]]], None] | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    tasks: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``simulator.simulate`` for a remote assistant: same runner, scorer and records.

    The context is the endpoint's business (a prompt it cannot take fails the request), and there
    is no KV cache to keep between turns.

    Returns:
      One transcript record per finished run, in the order of ``runs``.
    """
    def answer(scorer: TurnScorer) -> None:
        run_conversations(sampler, runs, sampling, seed=seed, user=user or FixedOrderUser(), on_turn=scorer,
                          progress=progress)

    return run_scored(runs, answer, judge=judge, protocol=protocol, verifier_mode=verifier_mode, sink=sink,
                      tasks=tasks)
