"""`run_conversations`: the batched multi-turn runner (see the package doc)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from jaxrl_mt.chat import with_system
from jaxrl_mt.conversations.slotted import run_on_slots, slot_sampler
from jaxrl_mt.conversations.records import (ConversationRun, FinalTurn, FixedOrderUser, TurnCallback, TurnRecord,
                                            SEED_STRIDE, UserPolicy, _answer_held, _next_turns, _warn_once, row_seed)
from jaxrl_mt.sampling import Sampler, SamplingConfig


def run_conversations(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *,
                      seed: int = 0, user: UserPolicy | None = None,
                      on_turn: TurnCallback | None = None, max_turns: int | None = None,
                      progress: Callable[[int, int], None] | None = None, reuse_cache: bool = False,
                      final_turn: FinalTurn | None = None) -> list[ConversationRun]:
    """Advances all conversations turn by turn (see the package doc: on the slot engine, each
    conversation's cache kept, or in lockstep with one batched sampler call per turn).

    Args:
      sampler: the policy's sampler (with a tokenizer), or a wrapper of one with a ``.sampler``
        attribute (``LengthSortedSampler``), or any sampler with the protocol's ``answer(chats,
        sampling, seed=, row_seeds=) -> (result, prompt_lens)`` (e.g.
        ``jaxrl_mt.remote.RemoteSampler`` for a model behind an API).
      runs: the conversations (fresh, or partly run: they continue from their last turn).
      sampling: sampling settings for every assistant turn.
      seed: base seed; conversation r's turn t samples with fold_in(key(seed), row_seed(r, t))
        (`row_seed`), whatever else is in its batch; a `FinalTurn` hook after k turns gets
        seed + SEED_STRIDE k.
      user: the user policy (default: FixedOrderUser).
      on_turn: called after every turn with the runs that just got a reply; it may set
        `run.done`/`run.stop_reason` (e.g. LiC stops at the first correct answer) and fill
        `turn.info`.
      max_turns: stop after this many turns in total.
      progress: called as progress(turn_index, n_active).
      reuse_cache: keep each conversation's KV cache across turns in a slot of the decode engine
        and prefill only the new tokens (`slotted`, see the package doc); `TurnRecord.prompt_tokens`
        is the context length either way. It needs a `Sampler` (or a wrapper's ``.sampler``) with a
        chat template whose `generate_ids` is not overridden, on one process or a mesh over several
        (every process then runs every conversation, with the same hooks). Any other sampler (a
        subclass overriding `generate_ids`, which is honoured that way; a sampler of messages
        behind an API) runs the lockstep loop WITHOUT a cache, every turn prefilled whole, with
        one warning. A conversation whose cached tokens differ from its re-rendered prompt (e.g.
        a reply edited by `on_turn`) is prefilled whole at that turn.
      final_turn: a hook that holds back turns (`FinalTurn.holds`, asked for every run that got a
        next user message); a held run stops there (its slot is freed) and after the other turns
        `FinalTurn.answer` gets all held runs at once, with the seed of the next turn;
        `progress` and `on_turn` see that batch like any other turn.

    Returns:
      The same run objects, updated in place.
    """
    user = user or FixedOrderUser()
    base = slot_sampler(sampler) if reuse_cache else None
    if base is not None:  # conversations proceed apart, each holding a slot across its turns
        run_on_slots(base, runs, sampling, seed=seed, user=user, on_turn=on_turn, max_turns=max_turns,
                     progress=progress, final_turn=final_turn)
        return _finish(runs)
    if reuse_cache and runs:
        _warn_no_cache(sampler)
    held: dict[int, str] = {}  # id(run) -> its held user message
    k = 0
    while True:
        active = [r for r in runs if not r.done and id(r) not in held]
        if not active or (max_turns is not None and k >= max_turns):
            break
        live, texts = _next_turns(user, active, final_turn, held)
        if not live:
            break
        if progress:
            progress(k, len(live))
        _answer(sampler, live, texts, sampling, seed)
        if on_turn:
            on_turn(live)
        k += 1
    if held and final_turn is not None:
        _answer_held(final_turn, [r for r in runs if id(r) in held], held, seed + SEED_STRIDE * k, k, on_turn,
                     progress)
    return _finish(runs)


def _warn_no_cache(sampler: Any) -> None:
    """The one warning of `reuse_cache` on a sampler that cannot keep caches (none for a `Sampler`
    without a chat template: the lockstep loop raises the chat error)."""
    inner = getattr(sampler, "sampler", None)
    base = inner if isinstance(inner, Sampler) else sampler
    if isinstance(base, Sampler) and type(base).generate_ids is Sampler.generate_ids:
        return
    _warn_once("sampler", f"reuse_cache: {type(base).__name__} cannot keep caches on the slot engine (not a Sampler, "
                          "or its generate_ids is overridden, which is honoured); every turn is prefilled whole")


def _finish(runs: Sequence[ConversationRun]) -> list[ConversationRun]:
    """The runs, those whose planned user turns are all answered marked done."""
    for r in runs:
        if not r.done and len(r.turns) >= len(r.user_turns):
            r.done, r.stop_reason = True, r.stop_reason or "no_more_turns"
    return list(runs)


def _answer(sampler: Sampler, live: Sequence[ConversationRun], texts: Sequence[str], sampling: SamplingConfig,
            seed: int) -> None:
    """One batched sampler call for the live runs, each prompt re-rendered whole; appends their turns."""
    seeds = [row_seed(r) for r in live]
    # one answer method, a local model's or one behind an API (`jaxrl_mt.remote`)
    chats = [with_system(r.messages + [{"role": "user", "content": u}], r.system) for r, u in zip(live, texts)]
    res, prompt_lens = sampler.answer(chats, sampling, seed=seed, row_seeds=seeds)
    for i, (r, u) in enumerate(zip(live, texts)):
        r.turns.append(TurnRecord(index=len(r.turns), user=u, assistant=res.texts[i],
                                  tokens=list(res.tokens[i]), logprobs=[float(x) for x in res.logprobs[i]],
                                  finish_reason=res.finish_reasons[i], prompt_tokens=prompt_lens[i]))
