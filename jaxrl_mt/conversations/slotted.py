"""The slot path of `run_conversations`: each conversation holds a slot of the engine across its turns.

Conversations proceed apart (`sampling.turns.run_turns`): when a reply ends, its conversation's
hooks run at once (`on_turn` on the replies that ended together, then the user policy and the
`FinalTurn` hook), and its next turn is appended to its slot's cache. The cache is reused only
where it is exact: the next prompt is rendered and tokenised whole, as without the cache, and
when the token ids held in the slot (the earlier prompt and the reply's tokens but its last) are
its prefix, only the rest is fed; otherwise (a reply that re-tokenises otherwise, a reply edited
by `on_turn`, a template that rewrites earlier turns, e.g. Qwen3's think blocks) the conversation
starts over in its slot with its whole prompt. So the model conditions on exactly the tokens of
the full re-render, and a conversation's turn samples with its row seed (`row_seed`): its
transcript equals the lockstep runner's without the cache (up to the rounding of other shapes).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.conversations.records import (SEED_STRIDE, ConversationRun, FinalTurn, TurnCallback, TurnRecord,
                                            UserPolicy, _answer_held, _next_turns, _warn_once, row_seed)
from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.sampling.turns import Feed, Reply


def slot_sampler(sampler: Any) -> Sampler | None:
    """The plain `Sampler` with a chat template behind `sampler` (itself or a wrapper's `.sampler`), or
    None (the lockstep path then runs, without a cache). On a mesh over several processes every
    process runs every conversation (`Sampler.run_turns`)."""
    inner = getattr(sampler, "sampler", None)
    base = inner if isinstance(inner, Sampler) else sampler
    if not isinstance(base, Sampler) or type(base).generate_ids is not Sampler.generate_ids:
        return None
    return base if base.tokenizer is not None and getattr(base.tokenizer, "chat_template", None) else None


class _Turns:
    """The hooks of one call, run per batch of replies that ended together."""

    def __init__(self, sampler: Sampler, runs: Sequence[ConversationRun], max_new: int, user: UserPolicy,
                 on_turn: TurnCallback | None, max_turns: int | None, progress: Callable[[int, int], None] | None,
                 final_turn: FinalTurn | None):
        self.sampler, self.runs, self.user, self.on_turn = sampler, list(runs), user, on_turn
        self.max_new = max_new
        self.max_turns, self.progress, self.final_turn = max_turns, progress, final_turn
        self.held: dict[int, str] = {}  # id(run) -> its held user message
        self.answered = [0] * len(runs)  # turns answered in this call, per run
        self.reached = 0  # turns any run reached (progress: a new turn index)
        self.asked: dict[int, str] = {}  # run -> the user message of its turn in flight
        self.ids: dict[int, list[int]] = {}  # run -> the token ids in its slot's cache
        self.refills = 0  # turns prefilled whole although a cache was held

    def feeds(self, idx: Sequence[int]) -> list[Feed]:
        """The next feeds of runs `idx` (those with a user message, not held)."""
        active = [i for i in idx if not self.runs[i].done]
        live, texts = _next_turns(self.user, [self.runs[i] for i in active], self.final_turn, self.held)
        pos = {id(self.runs[i]): i for i in active}
        out = []
        for r, u in zip(live, texts):
            i = pos[id(r)]
            self.asked[i] = u
            out.append(self._feed(i, r, u))
        return out

    def _feed(self, i: int, r: ConversationRun, u: str) -> Feed:
        """Run i's next feed: the new tokens of its re-rendered prompt when its cache holds the rest
        exactly, else the whole prompt (its cache dropped)."""
        full = encode_prompt(self.sampler.tokenizer, r.messages + [{"role": "user", "content": u}], system=r.system)
        ctx = self.sampler.cfg.max_position_embeddings
        if len(full) + self.max_new > ctx:  # as `Sampler.generate_ids` refuses it on the lockstep path
            raise ValueError(f"conversation {r.conv_id!r}: prompt of {len(full)} tokens + {self.max_new} new tokens "
                             f"exceeds the model context ({ctx})")
        held = self.ids.get(i)
        if held is not None and len(full) > len(held) and full[:len(held)] == held:
            self.ids[i] = full
            return Feed(i, full[len(held):], row_seed(r))
        if held is not None:
            self.refills += 1
            _warn_once("retokenised", f"reuse_cache: conversation {r.conv_id!r}'s cached tokens differ from its "
                                      f"re-rendered prompt at turn {len(r.turns)} (a reply that re-tokenises "
                                      "otherwise, an edited reply, or a template that rewrites earlier turns); such "
                                      "turns are prefilled whole (logged once)")
        self.ids[i] = full
        return Feed(i, full, row_seed(r), fresh=True)

    def advance(self, replies: list[Reply]) -> list[Feed]:
        """Records the replies, runs the hooks, and returns the next feeds of the runs that go on."""
        runs = [self.runs[rep.conv] for rep in replies]
        texts = self.sampler.decode_texts([rep.tokens for rep in replies], [rep.finish for rep in replies])
        for r, rep, text in zip(runs, replies, texts):
            r.turns.append(TurnRecord(index=len(r.turns), user=self.asked.pop(rep.conv), assistant=text,
                                      tokens=list(rep.tokens), logprobs=[float(x) for x in rep.logprobs],
                                      finish_reason=rep.finish, prompt_tokens=rep.context))
            self.ids[rep.conv] = self.ids[rep.conv] + rep.tokens[:-1]  # the last token is not in the cache
            self.answered[rep.conv] += 1
        if self.progress and max(self.answered) > self.reached:
            self.reached = max(self.answered)
            self.progress(self.reached, sum(1 for r in self.runs if not r.done and id(r) not in self.held))
        if self.on_turn:
            self.on_turn(runs)
        more = [rep.conv for rep in replies if self.max_turns is None or self.answered[rep.conv] < self.max_turns]
        return self.feeds(more)


def run_on_slots(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *, seed: int,
                 user: UserPolicy, on_turn: TurnCallback | None, max_turns: int | None,
                 progress: Callable[[int, int], None] | None, final_turn: FinalTurn | None) -> None:
    """`run_conversations` on the slot engine (arguments as there); updates the runs in place."""
    hooks = _Turns(sampler, runs, sampling.max_new_tokens, user, on_turn, max_turns, progress, final_turn)
    first = hooks.feeds(range(len(runs))) if max_turns is None or max_turns > 0 else []
    if first and progress:
        progress(0, len(first))
    if first:
        sampler.run_turns(first, sampling, hooks.advance, seed=seed)
    if hooks.held and final_turn is not None:
        k = max(hooks.answered, default=0)  # the lockstep runner's turn count
        _answer_held(final_turn, [r for r in runs if id(r) in hooks.held], hooks.held, seed + SEED_STRIDE * k, k,
                     on_turn, progress)
