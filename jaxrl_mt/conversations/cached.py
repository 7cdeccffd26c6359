"""The KV-cache keeper of the lockstep runner: one `DecodeSession` row per conversation.

Used when the caller passes a session (SeDT inspects its tokens) or when the slot path cannot
run (a mesh over several processes); see the package doc for the cache's rules.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxrl_mt.chat import encode_prompt, encode_text
from jaxrl_mt.conversations.records import ConversationRun, _warn_once, turn_suffix
from jaxrl_mt.sampling import DecodeSession, GenerationResult, Sampler, SamplingConfig


class _CachedTurns:
    """The KV-cache side of `run_conversations`: one DecodeSession row per run."""

    def __init__(self, session: DecodeSession, runs: Sequence[ConversationRun]):
        self.session = session
        self.tokenizer = session.sampler.tokenizer
        self.row = {id(r): i for i, r in enumerate(runs)}
        self.runs = list(runs)
        self.seen: list[tuple[int, str] | None] = [None] * len(runs)  # (turns, last reply) when cached
        self.refilled: list[tuple[str, int]] = []  # (conv_id, turn index) re-prefilled: not prefix-preserving

    @classmethod
    def create(cls, sampler: Any, runs: Sequence[ConversationRun], session: DecodeSession | None
               ) -> "_CachedTurns | None":
        """The cache keeper, or None (with a warning, once) when reuse cannot be used."""
        if not runs:
            return None
        inner = getattr(sampler, "sampler", None)
        base = inner if isinstance(inner, Sampler) else sampler
        if session is None:
            if not isinstance(base, Sampler) or type(base).generate_ids is not Sampler.generate_ids:
                _warn_once("sampler", f"reuse_cache: {type(base).__name__} is not a plain Sampler (its generate_ids "
                                      "would be bypassed); using full re-prefill")
                return None
            if base.tokenizer is None or getattr(base.tokenizer, "chat_template", None) is None:
                return None  # the full path raises the chat error
            probe = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
            if turn_suffix(base.tokenizer, probe, "c", None) is None:
                _warn_once("template", "reuse_cache: the chat template does not render a reply verbatim and "
                                       "prefix-consistently; using full re-prefill")
                return None
            session = DecodeSession(base, len(runs), max_cells=getattr(sampler, "max_cells", None))
        elif session.n_rows != len(runs):
            raise ValueError(f"session has {session.n_rows} rows for {len(runs)} runs")
        keeper = cls(session, runs)
        keeper.release_done()
        return keeper

    def release_done(self) -> None:
        """Frees the caches of finished runs."""
        self.release([r for r in self.runs if r.done])

    def release(self, runs: Sequence[ConversationRun]) -> None:
        """Frees the caches of runs that will not be continued."""
        rows = [self.row[id(r)] for r in runs if self.row[id(r)] not in self.session.released]
        if rows:
            self.session.release(rows)

    def _segment(self, i: int, r: ConversationRun, u: str) -> list[int]:
        """The tokens to feed row i before its next reply."""
        s = self.session
        seen = self.seen[i]
        if s.tokens[i] and r.turns and seen == (len(r.turns), r.turns[-1].assistant):
            tail = turn_suffix(self.tokenizer, r.messages, u, r.system)
            if tail is not None:
                ids = encode_text(self.tokenizer, tail)
                pend = s.pending[i]
                # a stop token that ended the reply is replaced by the template's end-of-turn text
                return ([pend] if pend is not None and s.finish[i] != "stop" else []) + ids
            self.refilled.append((r.conv_id, len(r.turns)))
            _warn_once("suffix", f"reuse_cache: the chat template renders conversation {r.conv_id!r}'s cached turns "
                                 f"differently at turn {len(r.turns)} (not prefix-preserving, e.g. Qwen3 dropping an "
                                 "earlier think block); re-prefilling such conversations from scratch (logged once)")
        if s.tokens[i]:  # edited or inconsistent history: start the row over
            s.reset([i])
        return encode_prompt(self.tokenizer, r.messages + [{"role": "user", "content": u}], system=r.system)

    def answer(self, live: Sequence[ConversationRun], texts: Sequence[str], sampling: SamplingConfig,
               seed: int, seeds: Sequence[int]) -> tuple[GenerationResult, list[int]]:
        """One session step for the live runs; returns their results and context lengths."""
        s = self.session
        segments: list[list[int] | None] = [None] * s.n_rows
        rows = [self.row[id(r)] for r in live]
        for i, r, u in zip(rows, live, texts):
            segments[i] = self._segment(i, r, u)
        prompt_lens = [len(s.tokens[i]) + len(segments[i]) for i in rows]
        row_seeds = np.zeros(s.n_rows, np.uint32)
        row_seeds[rows] = seeds
        res = s.step(segments, sampling, seed=seed, row_seeds=row_seeds)
        for i, r in zip(rows, live):
            self.seen[i] = (len(r.turns) + 1, res.texts[i])
        pick = GenerationResult([res.tokens[i] for i in rows], [res.logprobs[i] for i in rows],
                                res.lengths[rows], [res.finish_reasons[i] for i in rows],
                                [res.texts[i] for i in rows], dict(res.stats))
        return pick, prompt_lens
