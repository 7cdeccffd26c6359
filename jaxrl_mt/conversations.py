"""The batched multi-turn runner shared by RL history generation, LiC evaluation and SeDT.

All conversations of a batch advance in lockstep: at turn k every still-active conversation gets
its next user message from a user policy, then ONE batched sampler call answers all of them.
Nobody loops over conversations one at a time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.sampling import Sampler, SamplingConfig


@dataclasses.dataclass
class TurnRecord:
    """One exchange of a conversation."""

    index: int  # 0-based turn number
    user: str  # the user message of this turn
    assistant: str  # the model's reply
    tokens: list[int]  # reply token ids (as generated)
    logprobs: list[float]  # their log-probs under the sampling distribution
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int  # length of the rendered prompt of this turn
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # judge verdicts etc.


@dataclasses.dataclass
class ConversationRun:
    """A conversation being (or having been) simulated."""

    conv_id: str  # unique id (task id, scenario kind, run index)
    system: str | None  # system prompt, or None for the template's default
    user_turns: list[str]  # planned user turns (a fixed-order policy reveals them in order)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    turns: list[TurnRecord] = dataclasses.field(default_factory=list)
    done: bool = False  # no further turns (all revealed, or stopped by a callback)
    stop_reason: str = ""  # why it ended

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat so far: user/assistant messages (the system prompt is added at render time)."""
        out: list[dict[str, str]] = []
        for t in self.turns:
            out += [{"role": "user", "content": t.user}, {"role": "assistant", "content": t.assistant}]
        return out


class UserPolicy(Protocol):
    """Produces the next user message of each active conversation (None ends it)."""

    def next_user_turns(self, runs: Sequence[ConversationRun]) -> list[str | None]: ...


class FixedOrderUser:
    """Reveals each conversation's planned `user_turns` in order, verbatim."""

    def next_user_turns(self, runs: Sequence[ConversationRun]) -> list[str | None]:
        return [r.user_turns[len(r.turns)] if len(r.turns) < len(r.user_turns) else None for r in runs]


TurnCallback = Callable[[Sequence[ConversationRun]], None]


def run_conversations(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *,
                      seed: int = 0, user: UserPolicy | None = None,
                      on_turn: TurnCallback | None = None, max_turns: int | None = None,
                      progress: Callable[[int, int], None] | None = None) -> list[ConversationRun]:
    """Advances all conversations turn by turn with one batched sampler call per turn.

    Args:
      sampler: the policy's sampler (with a tokenizer).
      runs: the conversations (fresh, or partly run: they continue from their last turn).
      sampling: sampling settings for every assistant turn.
      seed: base seed; turn k uses seed + k, so results do not depend on batch composition order
        only through the seed (the batch itself is fixed).
      user: the user policy (default: FixedOrderUser).
      on_turn: called after every turn with the runs that just got a reply; it may set
        `run.done`/`run.stop_reason` (e.g. LiC stops at the first correct answer) and fill
        `turn.info`.
      max_turns: stop after this many turns in total.
      progress: called as progress(turn_index, n_active).

    Returns:
      The same run objects, updated in place.
    """
    user = user or FixedOrderUser()
    k = 0
    while True:
        active = [r for r in runs if not r.done]
        if not active or (max_turns is not None and k >= max_turns):
            break
        nexts = user.next_user_turns(active)
        live: list[ConversationRun] = []
        texts: list[str] = []
        for r, nxt in zip(active, nexts):
            if nxt is None:
                r.done, r.stop_reason = True, r.stop_reason or "no_more_turns"
            else:
                live.append(r)
                texts.append(nxt)
        if not live:
            break
        if progress:
            progress(k, len(live))
        prompts = [encode_prompt(sampler.tokenizer, r.messages + [{"role": "user", "content": u}], system=r.system)
                   for r, u in zip(live, texts)]
        res = sampler.generate_ids(prompts, sampling, seed=seed + 1000003 * k)
        for i, (r, u) in enumerate(zip(live, texts)):
            r.turns.append(TurnRecord(index=len(r.turns), user=u, assistant=res.texts[i],
                                      tokens=list(res.tokens[i]), logprobs=[float(x) for x in res.logprobs[i]],
                                      finish_reason=res.finish_reasons[i], prompt_tokens=len(prompts[i])))
        if on_turn:
            on_turn(live)
        k += 1
    for r in runs:
        if not r.done and len(r.turns) >= len(r.user_turns):
            r.done, r.stop_reason = True, r.stop_reason or "no_more_turns"
    return list(runs)


def final_turn_prompts(tokenizer: Any, runs: Sequence[ConversationRun], last_user: Sequence[str]) -> list[list[int]]:
    """Token ids of each history plus one more user message, ready for a rollout."""
    return [encode_prompt(tokenizer, r.messages + [{"role": "user", "content": u}], system=r.system)
            for r, u in zip(runs, last_user)]


def new_tokens_total(runs: Sequence[ConversationRun]) -> int:
    """Number of assistant tokens generated across runs."""
    return int(np.sum([len(t.tokens) for r in runs for t in r.turns]))
