"""The local JAX model as a ChatBackend (user simulator, judge, LLM segmenter, ...)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.models.registry import DEFAULT_MODEL, Model, load_model
from jaxrl_mt.sampling import DEFAULT_MAX_CHUNK_CELLS, LengthSortedSampler, Sampler, SamplingConfig


class LocalBackend:
    """Answers batches of chat conversations with the JAX sampler, in length-sorted chunks whose
    prefill memory stays under ``max_cells`` (rows x prompt bucket x (prompt + new-token bucket)):
    a judge prompt holding a whole conversation is long, and 32 such rows at once once needed 10 GB."""

    def __init__(self, model: str | Model = DEFAULT_MODEL, *, seed: int = 0, max_batch: int | None = 32,
                 max_cells: int = DEFAULT_MAX_CHUNK_CELLS):
        self.model = load_model(model) if isinstance(model, str) else model
        self.sampler = Sampler.from_model(self.model, max_batch=max_batch)
        self._chunked = LengthSortedSampler(self.sampler, max_cells)
        self.seed = seed
        self.calls = 0

    def chat(self, conversations: Sequence[Sequence[Mapping[str, str]]], *, max_new_tokens: int = 256,
             temperature: float = 0.0) -> list[str]:
        """One reply per conversation (greedy when temperature is 0)."""
        if not conversations:
            return []
        self.calls += 1
        prompts = [encode_prompt(self.sampler.tokenizer, list(c)) for c in conversations]
        res = self._chunked.generate_ids(prompts, SamplingConfig(max_new_tokens=max_new_tokens,
                                                                 temperature=temperature),
                                         seed=self.seed + self.calls)
        return list(res.texts or [])

    def __repr__(self) -> str:
        return f"LocalBackend({self.model.spec!r})"


def backend_from_model(model: Model, **kw: Any) -> LocalBackend:
    """A LocalBackend sharing an already loaded model."""
    return LocalBackend(model, **kw)
