"""A model behind an OpenAI-compatible endpoint, as the sampler of ``run_conversations``.

A local ``Sampler`` takes token ids; a remote model has its own tokenizer and chat template, so
``RemoteSampler`` answers messages (``answer``, the method a local ``Sampler`` has too, which
``run_conversations`` calls) and answers a whole turn with one ``HTTPBackend.complete`` call
(requests sent concurrently, retried, bounded by the backend's deadline). The result has the
layout of a local ``GenerationResult``: texts, finish reasons and, since token ids do not come
back over the API, ``usage.completion_tokens`` placeholder ids (-1) per reply, so that token
counts in transcripts mean the same thing as for a local model. Prompt lengths are the server's
``usage.prompt_tokens`` (0 when it reports none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_mt.backends import HTTPBackend
from jaxrl_mt.sampling import GenerationResult, SamplingConfig

__all__ = ["UNKNOWN_TOKEN", "RemoteSampler"]

UNKNOWN_TOKEN = -1  # placeholder id of a generated token whose id the API does not return


class RemoteSampler:
    """Answers batches of conversations through an OpenAI-compatible endpoint."""

    def __init__(self, backend: HTTPBackend):
        """Args:
          backend: the endpoint (its deadline bounds each turn).
        """
        self.backend = backend
        self.calls = 0

    def __repr__(self) -> str:
        return f"RemoteSampler({self.backend!r})"

    def answer(self, conversations: Sequence[Sequence[Mapping[str, str]]], sampling: SamplingConfig, *,
               seed: int = 0, row_seeds: Sequence[int] | None = None) -> tuple[GenerationResult, list[int]]:
        """One reply per conversation (system message included by the caller): the sampler protocol's
        answer method, as `Sampler.answer`.

        Args:
          conversations: the chats to continue, each ending with a user message.
          sampling: ``max_new_tokens``, ``temperature`` and ``top_p`` become the request's fields
            (``top_p`` only when < 1); ``top_k`` has no OpenAI field and is refused.
          seed: sent as the request's ``seed`` (the same for every request of the call).
          row_seeds: not sent: an OpenAI request has one ``seed`` (a local model's rows draw with
            their own keys).

        Returns:
          ``(result, prompt_lens)`` as ``run_conversations`` uses them.

        Raises:
          ValueError: ``top_k`` is set.
          BackendError: the endpoint failed for good or the call passed its deadline.
        """
        sampling.validate()
        if sampling.top_k:
            raise ValueError(f"top_k={sampling.top_k}: an OpenAI-compatible endpoint has no top_k field")
        self.calls += 1
        replies = self.backend.complete(conversations, max_new_tokens=sampling.max_new_tokens,
                                        temperature=sampling.temperature,
                                        top_p=sampling.top_p if sampling.top_p < 1 else None, seed=int(seed))
        counts = [r.completion_tokens or 0 for r in replies]
        result = GenerationResult(
            tokens=[[UNKNOWN_TOKEN] * c for c in counts],
            logprobs=[np.zeros(c, np.float32) for c in counts],
            lengths=np.asarray(counts, np.int64),
            finish_reasons=[r.finish_reason for r in replies],
            texts=[r.text for r in replies],
            stats={"new_tokens": float(sum(counts)), "requests": float(len(replies))},
        )
        return result, [r.prompt_tokens or 0 for r in replies]

    def summary(self) -> dict[str, Any]:
        """Calls made and the backend's request counters."""
        return {"calls": self.calls, **{k: int(v) for k, v in sorted(self.backend.stats.items())}}
