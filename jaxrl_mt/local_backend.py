"""The local JAX model as a ChatBackend (user simulator, judge, LLM segmenter, ...)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from jaxrl_mt.models.registry import DEFAULT_MODEL, Model, load_model
from jaxrl_mt.sampling import Sampler, SamplingConfig


class LocalBackend:
    """Answers batches of chat conversations with one batched call of the JAX sampler."""

    def __init__(self, model: str | Model = DEFAULT_MODEL, *, seed: int = 0, max_batch: int | None = 32):
        self.model = load_model(model) if isinstance(model, str) else model
        self.sampler = Sampler.from_model(self.model, max_batch=max_batch)
        self.seed = seed
        self.calls = 0

    def chat(self, conversations: Sequence[Sequence[Mapping[str, str]]], *, max_new_tokens: int = 256,
             temperature: float = 0.0) -> list[str]:
        """One reply per conversation (greedy when temperature is 0)."""
        if not conversations:
            return []
        self.calls += 1
        res = self.sampler.generate([list(c) for c in conversations],
                                    SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature),
                                    seed=self.seed + self.calls)
        return list(res.texts or [])

    def __repr__(self) -> str:
        return f"LocalBackend({self.model.spec!r})"


def backend_from_model(model: Model, **kw: Any) -> LocalBackend:
    """A LocalBackend sharing an already loaded model."""
    return LocalBackend(model, **kw)
