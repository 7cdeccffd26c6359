"""Evaluating a model behind an OpenAI-compatible endpoint: ``--config.model=http:URL#MODEL``.

The conversations are planned, judged, scored and written exactly as for a local model; only the
assistant's replies come from the endpoint (``jaxrl_mt.remote.RemoteSampler``: one batch of
concurrent requests per turn). The endpoint settings are the config's ``http`` section
(``eval_config.HttpSection``: the file's ``http_*`` keys and ``api_key_env``), shared by an ``http:``
judge and user simulator; the API key is read from the environment variable named by
``api_key_env`` and is never stored (configs keep the variable's name only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrl_mt.backends import make_backend
from jaxrl_mt.conversations import ConversationRun, FixedOrderUser, UserPolicy, run_conversations
from jaxrl_mt.eval.eval_config import HttpSection
from jaxrl_mt.eval.simulator import EvalError, Judge, TurnScorer, run_scored
from jaxrl_mt.remote import RemoteSampler
from jaxrl_mt.sampling import SamplingConfig

__all__ = ["check_http_config", "http_backend_kw", "is_http", "remote_sampler", "simulate_remote"]


def is_http(spec: object) -> bool:
    """Whether a model/judge/user-simulator spec names an HTTP endpoint."""
    return isinstance(spec, str) and spec.startswith("http:")


def check_http_config(model: str, strategy: str, http: HttpSection) -> None:
    """Checks the endpoint settings (their types are checked when the config is built) and an ``http:``
    model spec (evaluated with the ``plain`` strategy only).

    Raises:
      EvalError: ``config field 'name': ...`` for the first bad value.
    """
    http.check()
    if not is_http(model):
        return
    url, _, name = model[len("http:"):].partition("#")
    if not url.startswith(("http://", "https://")) or not name:
        raise EvalError(f"config field 'model': {model!r}: expected 'http:URL#MODEL', e.g. "
                        "'http:http://127.0.0.1:8000/v1#my-model'")
    if strategy != "plain":
        raise EvalError(f"config field 'strategy': {strategy!r} needs the model's weights; a model behind "
                        "an endpoint can only be evaluated with 'plain'")


def http_backend_kw(spec: str, http: HttpSection) -> dict[str, Any]:
    """``HTTPBackend`` keyword arguments of the endpoint settings for an ``http:`` spec ({} otherwise)."""
    return http.backend_kw() if is_http(spec) else {}


def remote_sampler(model: str, http: HttpSection) -> RemoteSampler:
    """The evaluated assistant of an ``http:URL#MODEL`` model spec."""
    return RemoteSampler(make_backend(model, **http_backend_kw(model, http)))


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
