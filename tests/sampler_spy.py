"""A real Sampler that records every ``generate_ids`` call (tests of the simulator and SeDT), and a spy on
the feeds of the slot path (``spy_feeds``)."""

from __future__ import annotations

import numpy as np

from jaxrl_mt.sampling import Sampler


def _seed_id(seed) -> int | tuple[int, ...]:
    """A hashable form of an int seed or a raw PRNG key array."""
    arr = np.asarray(seed)
    return int(arr) if arr.ndim == 0 else tuple(int(x) for x in arr.ravel())


class RecordingSampler(Sampler):
    """Records the prompts and seed of every ``generate_ids`` call, then generates as usual."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[tuple[list[list[int]], int | tuple[int, ...]]] = []

    @property
    def sizes(self) -> list[int]:
        """The batch size of every call, in order."""
        return [len(prompts) for prompts, _ in self.calls]

    def generate_ids(self, prompts, sampling, **kw):
        self.calls.append(([list(p) for p in prompts], _seed_id(kw.get("seed", 0))))
        return super().generate_ids(prompts, sampling, **kw)


def recording_sampler(model, *, max_batch: int = 4, **kw) -> RecordingSampler:
    """A RecordingSampler over ``model`` (chunks of ``max_batch`` rows)."""
    return RecordingSampler(model.params, model.cfg, model.tokenizer, eos_ids=model.eos_ids, pad_id=model.pad_id,
                            max_batch=max_batch, **kw)


def spy_feeds(monkeypatch) -> list:
    """Records every feed the slot path hands `Sampler.run_turns` (first ones and the hooks')."""
    feeds: list = []
    real = Sampler.run_turns

    def run_turns(self, first, sampling, advance, **kw):
        def spy(replies):
            out = advance(replies)
            feeds.extend(out)
            return out

        feeds.extend(first)
        return real(self, first, sampling, spy, **kw)

    monkeypatch.setattr(Sampler, "run_turns", run_turns)
    return feeds
