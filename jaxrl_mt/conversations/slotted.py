"""The slot path of `run_conversations`: each conversation holds a slot of the engine across its turns.

Conversations proceed apart (`sampling.turns.run_turns`): when a reply ends, its conversation's
hooks run at once (`on_turn` on the replies that ended together, then the user policy and the
`FinalTurn` hook), and its next turn is appended to its slot's cache: the reply's last token
(unless a stop token ended it) and the template text up to the next generation prompt
(`turn_suffix`), checked per conversation and turn as in the lockstep path; where the check fails
the conversation starts over in its slot with its whole prompt. A conversation's turn samples with
its row seed (`row_seed`), so its transcript does not depend on the schedule: it equals the
lockstep runner's (up to the rounding of another batch and summation order).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from jaxrl_mt.chat import encode_prompt, encode_text
from jaxrl_mt.conversations.records import (SEED_STRIDE, ConversationRun, FinalTurn, TurnCallback, TurnRecord,
                                            UserPolicy, _answer_held, _next_turns, _warn_once, row_seed, turn_suffix)
from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.sampling.turns import Feed, Reply


def slot_sampler(sampler: Any) -> Sampler | None:
    """The plain one-process `Sampler` behind `sampler` (itself or a wrapper's `.sampler`) whose chat
    template keeps a reply verbatim and prefix-consistently, or None (the lockstep path then runs)."""
    inner = getattr(sampler, "sampler", None)
    base = inner if isinstance(inner, Sampler) else sampler
    if not isinstance(base, Sampler) or type(base).generate_ids is not Sampler.generate_ids or base.engine.multi:
        return None
    if base.tokenizer is None or getattr(base.tokenizer, "chat_template", None) is None:
        return None
    probe = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    return base if turn_suffix(base.tokenizer, probe, "c", None) is not None else None


class _Turns:
    """The hooks of one call, run per batch of replies that ended together."""

    def __init__(self, sampler: Sampler, runs: Sequence[ConversationRun], user: UserPolicy,
                 on_turn: TurnCallback | None, max_turns: int | None, progress: Callable[[int, int], None] | None,
                 final_turn: FinalTurn | None):
        self.sampler, self.runs, self.user, self.on_turn = sampler, list(runs), user, on_turn
        self.max_turns, self.progress, self.final_turn = max_turns, progress, final_turn
        self.held: dict[int, str] = {}  # id(run) -> its held user message
        self.answered = [0] * len(runs)  # turns answered in this call, per run
        self.reached = 0  # turns any run reached (progress: a new turn index)
        self.asked: dict[int, str] = {}  # run -> the user message of its turn in flight
        self.last: dict[int, tuple[Reply, str]] = {}  # run -> its last reply and that reply's text

    def feeds(self, idx: Sequence[int], ended: bool = False) -> list[Feed]:
        """The next feeds of runs `idx` (those with a user message, not held); `ended`: their replies
        just ended, their caches hold them."""
        active = [i for i in idx if not self.runs[i].done]
        live, texts = _next_turns(self.user, [self.runs[i] for i in active], self.final_turn, self.held)
        pos = {id(self.runs[i]): i for i in active}
        out = []
        for r, u in zip(live, texts):
            i = pos[id(r)]
            self.asked[i] = u
            out.append(self._feed(i, r, u, self.last.get(i) if ended else None))
        return out

    def _feed(self, i: int, r: ConversationRun, u: str, last: tuple[Reply, str] | None) -> Feed:
        """Run i's next feed: its turn suffix after its cached reply, or its whole prompt."""
        tok = self.sampler.tokenizer
        if last is not None and r.turns and r.turns[-1].assistant == last[1]:  # the reply as cached (not edited)
            tail = turn_suffix(tok, r.messages, u, r.system)
            if tail is not None:
                rep = last[0]  # a stop token that ended the reply is replaced by the template's end-of-turn text
                return Feed(i, ([rep.pending] if rep.finish != "stop" else []) + encode_text(tok, tail), row_seed(r))
            _warn_once("suffix", f"reuse_cache: the chat template renders conversation {r.conv_id!r}'s cached "
                                 f"turns differently at turn {len(r.turns)} (not prefix-preserving, e.g. Qwen3 "
                                 "dropping an earlier think block); re-prefilling such conversations from scratch "
                                 "(logged once)")
        return Feed(i, encode_prompt(tok, r.messages + [{"role": "user", "content": u}], system=r.system), row_seed(r),
                    fresh=True)

    def advance(self, replies: list[Reply]) -> list[Feed]:
        """Records the replies, runs the hooks, and returns the next feeds of the runs that go on."""
        runs = [self.runs[rep.conv] for rep in replies]
        texts = self.sampler.decode_texts([rep.tokens for rep in replies], [rep.finish for rep in replies])
        for r, rep, text in zip(runs, replies, texts):
            r.turns.append(TurnRecord(index=len(r.turns), user=self.asked.pop(rep.conv), assistant=text,
                                      tokens=list(rep.tokens), logprobs=[float(x) for x in rep.logprobs],
                                      finish_reason=rep.finish, prompt_tokens=rep.context))
            self.last[rep.conv] = (rep, text)
            self.answered[rep.conv] += 1
        if self.progress and max(self.answered) > self.reached:
            self.reached = max(self.answered)
            self.progress(self.reached, sum(1 for r in self.runs if not r.done and id(r) not in self.held))
        if self.on_turn:
            self.on_turn(runs)
        more = [rep.conv for rep in replies if self.max_turns is None or self.answered[rep.conv] < self.max_turns]
        return self.feeds(more, ended=True)


def run_on_slots(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *, seed: int,
                 user: UserPolicy, on_turn: TurnCallback | None, max_turns: int | None,
                 progress: Callable[[int, int], None] | None, final_turn: FinalTurn | None) -> None:
    """`run_conversations` on the slot engine (arguments as there); updates the runs in place."""
    hooks = _Turns(sampler, runs, user, on_turn, max_turns, progress, final_turn)
    first = hooks.feeds(range(len(runs))) if max_turns is None or max_turns > 0 else []
    if first and progress:
        progress(0, len(first))
    if first:
        sampler.run_turns(first, sampling, hooks.advance, seed=seed)
    if hooks.held and final_turn is not None:
        k = max(hooks.answered, default=0)  # the lockstep runner's turn count
        _answer_held(final_turn, [r for r in runs if id(r) in hooks.held], hooks.held, seed + SEED_STRIDE * k, k,
                     on_turn, progress)
