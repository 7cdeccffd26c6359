"""SeDT's batched final turn, its strategy for the LiC simulator, and the user API (``respond``).

The earlier turns of a batch run in ``run_conversations``' loop (KV cache kept in a slot with
``reuse_cache``, the plain seed stream); :class:`FinalTurnHold` is its ``final_turn`` hook, which holds back each
conversation's final planned turn; :func:`sedt_final_turn` answers all held turns with one
embedding call, one sampler call for the annotated prompts and one for the corrections.
Importing this module registers the ``"sedt"`` strategy (``jaxrl_mt.strategies``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.conversations import ConversationRun, TurnRecord, UserPolicy, run_conversations
from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.sedt.annotate import (Annotation, Embedder, SeDTConfig, annotate_batch, correction_prompt, coverage,
                                    format_prompt, guard_replace, make_embedder, restate_prompt, should_trigger)
from jaxrl_mt.strategies import STRATEGIES

log = logging.getLogger(__name__)


def final_prompt_ids(sampler: Sampler, run: ConversationRun, message: str, keep_history: bool,
                     budget: int) -> list[int]:
    """The final prompt's ids (history + ``message``); the history is dropped when it would not fit the context."""
    msgs = (run.messages if keep_history else []) + [{"role": "user", "content": message}]
    ids = encode_prompt(sampler.tokenizer, msgs, system=run.system)
    if keep_history and len(ids) + budget > sampler.cfg.max_position_embeddings:
        return final_prompt_ids(sampler, run, message, False, budget)
    return ids


def sedt_final_turn(sampler: Sampler, runs: Sequence[ConversationRun], final_users: Sequence[str],
                    sampling: SamplingConfig, *, cfg: SeDTConfig | None = None, embed: Embedder | None = None,
                    seed: int = 0) -> list[dict[str, Any]]:
    """Answers the final user turn of each run with SeDT and appends it as a TurnRecord.

    One embedding call for all turns, one sampler call for the SeDT answers, one for the
    corrections of the triggered runs.

    Args:
      sampler: the policy's sampler (with a tokenizer).
      runs: conversations whose earlier turns are done (``run.turns``).
      final_users: each run's final user message.
      sampling: sampling settings of both calls.
      cfg: the SeDT config; embed: the semantic encoder (default ``make_embedder(cfg, sampler)``).
      seed: sampler seed (the corrections use seed + 1).

    Returns:
      Per run, the record stored in ``turn.info["sedt"]``: ``prompt``, ``annotation``,
      ``triggered``, ``original`` (the SeDT answer before correction), ``correction`` (or None),
      ``coverage_original``, ``coverage_correction``, ``guard`` (the guard mode), ``replaced``.
      The appended TurnRecord keeps the user's own final message as ``user``; its ``assistant``
      is the chosen answer.
    """
    return _final_turn(sampler, runs, final_users, sampling, cfg or SeDTConfig(), embed, seed)[1]


def _final_turn(sampler: Sampler, runs: Sequence[ConversationRun], final_users: Sequence[str],
                sampling: SamplingConfig, cfg: SeDTConfig, embed: Embedder | None, seed: int
                ) -> tuple[list[Annotation], list[dict[str, Any]]]:
    if len(runs) != len(final_users):
        raise ValueError(f"sedt_final_turn: {len(runs)} runs but {len(final_users)} final messages")
    if not runs:
        return [], []
    embed = embed or make_embedder(cfg, sampler)
    domains = [r.meta.get("domain", "math") for r in runs]
    anns = annotate_batch(embed, [[t.user for t in r.turns] + [u] for r, u in zip(runs, final_users)], domains, cfg)
    msgs = [format_prompt(a, cfg.answer_format(d)) for a, d in zip(anns, domains)]
    prompts = [final_prompt_ids(sampler, r, m, cfg.keep_history, sampling.max_new_tokens) for r, m in zip(runs, msgs)]
    res = sampler.generate_ids(prompts, sampling, seed=seed)
    trig = [i for i, a in enumerate(anns) if should_trigger(a, cfg)]
    corr: dict[int, tuple[str, list[int], np.ndarray, str]] = {}
    if trig:
        cps = [encode_prompt(sampler.tokenizer, [{"role": "user", "content": correction_prompt(
            anns[i], res.texts[i], cfg.answer_format(domains[i]))}], system=runs[i].system) for i in trig]
        cres = sampler.generate_ids(cps, sampling, seed=seed + 1)
        for j, i in enumerate(trig):
            corr[i] = (cres.texts[j], list(cres.tokens[j]), cres.logprobs[j], cres.finish_reasons[j])
    infos = []
    for i, (r, u, a) in enumerate(zip(runs, final_users, anns)):
        text, toks, lps, fin = res.texts[i], list(res.tokens[i]), res.logprobs[i], res.finish_reasons[i]
        words = a.confirmed_words
        info = {"prompt": msgs[i], "annotation": a.to_json(), "triggered": i in corr, "original": text,
                "correction": None, "coverage_original": coverage(text, words), "coverage_correction": None,
                "guard": cfg.guard, "replaced": False}
        if i in corr:
            ctext = corr[i][0]
            info.update(correction=ctext, coverage_correction=coverage(ctext, words),
                        replaced=guard_replace(text, ctext, words, guard=cfg.guard))
            if info["replaced"]:
                text, toks, lps, fin = corr[i]
        r.turns.append(TurnRecord(index=len(r.turns), user=u, assistant=text, tokens=toks,
                                  logprobs=[float(x) for x in lps], finish_reason=fin,
                                  prompt_tokens=len(prompts[i]), info={"sedt": info}))
        infos.append(info)
    s = summarize(infos)
    log.info("SeDT final turn: %d conversations, trigger rate %.3f, %d replaced", s["n"], s["trigger_rate"],
             s["replaced"])
    return anns, infos


def restate_final_turn(sampler: Sampler, runs: Sequence[ConversationRun], final_users: Sequence[str],
                       sampling: SamplingConfig, *, cfg: SeDTConfig | None = None, seed: int = 0
                       ) -> list[dict[str, Any]]:
    """The control of SeDT's final turn: every shard restated, no relevance annotation, no correction.

    The final message is :func:`restate_prompt` (SeDT's prompt minus the return-to-go, labels and
    "Use every CONFIRMED message"), built and truncated like SeDT's (``cfg.keep_history``, the
    same anchor and answer instruction) and answered with ONE sampler call at ``seed``.

    Returns:
      Per run, ``{"prompt": the restated message}`` (also stored in ``turn.info["restate"]``).
    """
    cfg = cfg or SeDTConfig()
    if len(runs) != len(final_users):
        raise ValueError(f"restate_final_turn: {len(runs)} runs but {len(final_users)} final messages")
    if not runs:
        return []
    domains = [r.meta.get("domain", "math") for r in runs]
    msgs = [restate_prompt([t.user for t in r.turns] + [u], cfg.anchor(d), cfg.answer_format(d))
            for r, u, d in zip(runs, final_users, domains)]
    prompts = [final_prompt_ids(sampler, r, m, cfg.keep_history, sampling.max_new_tokens) for r, m in zip(runs, msgs)]
    res = sampler.generate_ids(prompts, sampling, seed=seed)
    infos = []
    for i, (r, u) in enumerate(zip(runs, final_users)):
        info = {"prompt": msgs[i]}
        r.turns.append(TurnRecord(index=len(r.turns), user=u, assistant=res.texts[i], tokens=list(res.tokens[i]),
                                  logprobs=[float(x) for x in res.logprobs[i]], finish_reason=res.finish_reasons[i],
                                  prompt_tokens=len(prompts[i]), info={"restate": info}))
        infos.append(info)
    return infos


def summarize(infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Trigger and replacement counts of SeDT final turns (``turn.info["sedt"]`` records)."""
    n = len(infos)
    trig = sum(bool(i["triggered"]) for i in infos)
    rep = sum(bool(i["replaced"]) for i in infos)
    return {"n": n, "triggered": trig, "trigger_rate": trig / n if n else 0.0, "replaced": rep,
            "replacement_rate": rep / n if n else 0.0, "replaced_of_triggered": rep / trig if trig else 0.0}


# --------------------------------------------------------------------------- the evaluator strategy


class GivenUser:
    """A user policy that returns already fetched messages, once each (by run identity)."""

    def __init__(self, runs: Sequence[ConversationRun], texts: Sequence[str]):
        self.text = {id(r): t for r, t in zip(runs, texts)}

    def next_user_turns(self, runs: Sequence[ConversationRun]) -> list[str | None]:
        return [self.text.pop(id(r), None) for r in runs]


def _is_final(run: ConversationRun, cfg: SeDTConfig) -> bool:
    planned = int(run.meta.get("n_planned", len(run.user_turns)))
    return planned >= cfg.min_turns and len(run.turns) + 1 >= planned


class FinalTurnHold:
    """The ``final_turn`` hook of ``run_conversations``: holds back each conversation's final turn.

    A run whose next message is its final planned turn (``meta["n_planned"]``, else its number
    of planned user turns), and that has at least ``cfg.min_turns`` planned, is held. The held
    runs, their messages and the seed of their turn are kept (``runs``, ``messages``, ``seed``)
    and handed to ``answer_fn`` when one is given (SeDT's final turn); without it they stay
    unanswered for the caller.
    """

    def __init__(self, cfg: SeDTConfig, answer_fn: Callable[[Sequence[ConversationRun], Sequence[str], int], Any]
                 | None = None):
        self.cfg, self.answer_fn = cfg, answer_fn
        self.runs: list[ConversationRun] = []
        self.messages: list[str] = []
        self.seed: int | None = None

    def holds(self, run: ConversationRun) -> bool:
        return _is_final(run, self.cfg)

    def answer(self, runs: Sequence[ConversationRun], messages: Sequence[str], seed: int) -> None:
        self.runs, self.messages, self.seed = list(runs), list(messages), seed
        if self.answer_fn is not None:
            self.answer_fn(runs, messages, seed)


def run_until_final(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *,
                    cfg: SeDTConfig | None = None, seed: int = 0, user: UserPolicy | None = None,
                    on_turn: Callable[[Sequence[ConversationRun]], None] | None = None,
                    progress: Callable[[int, int], None] | None = None, reuse_cache: bool = False
                    ) -> tuple[list[ConversationRun], list[str], int]:
    """Advances the runs with ``run_conversations`` up to their final turn, which is held back.

    Returns:
      ``(held runs, their final user messages, the seed of their final turn)``; runs that ended
      earlier are not held.
    """
    hold = FinalTurnHold(cfg or SeDTConfig())
    run_conversations(sampler, runs, sampling, seed=seed, user=user, on_turn=on_turn, progress=progress,
                      reuse_cache=reuse_cache, final_turn=hold)
    return hold.runs, hold.messages, seed if hold.seed is None else hold.seed


def sedt_strategy(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *, seed: int = 0,
                  user: UserPolicy | None = None, on_turn: Callable[[Sequence[ConversationRun]], None] | None = None,
                  progress: Callable[[int, int], None] | None = None, reuse_cache: bool = False,
                  config: SeDTConfig | None = None, embed: Embedder | None = None) -> list[ConversationRun]:
    """The ``"sedt"`` strategy of the LiC simulator (same signature as ``run_conversations``).

    Earlier turns are answered by ``run_conversations`` (KV cache kept in a slot with
    ``reuse_cache``, the plain seed stream); every conversation's final turn is held
    (:class:`FinalTurnHold`) and answered by :func:`sedt_final_turn` in one batch, after which
    ``on_turn`` sees them. Conversations that end before their final turn (e.g. the ``lic``
    protocol's stop at a correct answer) are never rewritten. Suits SHARDED, MT-Refine, AtR and
    AiwR (and any multi-turn kind); single-turn kinds (FULL, CONCAT) are answered plainly.
    """
    cfg = config or SeDTConfig()

    def answer(held: Sequence[ConversationRun], finals: Sequence[str], final_seed: int) -> None:
        sedt_final_turn(sampler, held, finals, sampling, cfg=cfg, embed=embed, seed=final_seed)

    return run_conversations(sampler, runs, sampling, seed=seed, user=user, on_turn=on_turn, progress=progress,
                             reuse_cache=reuse_cache, final_turn=FinalTurnHold(cfg, answer))


def make_strategy(config: SeDTConfig, embed: Embedder | None = None) -> Callable[..., list[ConversationRun]]:
    """A strategy function with a given SeDT config (for ``STRATEGIES.add``)."""
    def strategy(sampler, runs, sampling, **kw):
        return sedt_strategy(sampler, runs, sampling, config=config, embed=embed, **kw)
    return strategy


# --------------------------------------------------------------------------- user API


@dataclasses.dataclass(frozen=True)
class SeDTResult:
    """SeDT's answer to one conversation."""

    text: str  # the chosen answer
    original: str  # the SeDT answer before self-correction
    correction: str | None  # the verifier call's answer (None: not triggered)
    replaced: bool  # the correction replaced the original
    annotation: Annotation  # the (R̂, label, shard) view of the user turns
    prompt: str  # the annotated final message the model got


def respond(sampler: Sampler, conversations: Sequence[Sequence[Mapping[str, str]]], *, domain: str = "math",
            sampling: SamplingConfig | None = None, config: SeDTConfig | None = None, seed: int = 0,
            system: str | None = None, embed: Embedder | None = None) -> list[SeDTResult]:
    """Answers the last user message of each conversation with SeDT (batched).

    Args:
      sampler: the model's sampler (with a tokenizer).
      conversations: chat messages ``{"role": "user"|"assistant", "content": str}``, users and
        assistants alternating, starting and ending with a user message.
      domain: picks the goal anchor (``"math"``, ``"code"``, else the default anchor).
      sampling, config, seed, system, embed: as in :func:`sedt_final_turn`.

    Raises:
      ValueError: ``conversation i, message j: ...`` for a malformed conversation.
    """
    runs, finals = [], []
    for i, conv in enumerate(conversations):
        if not conv:
            raise ValueError(f"conversation {i}: empty")
        for j, m in enumerate(conv):
            want = "user" if j % 2 == 0 else "assistant"
            if not isinstance(m, Mapping) or m.get("role") != want or not isinstance(m.get("content"), str):
                raise ValueError(f"conversation {i}, message {j}: expected a {want!r} message with string content, "
                                 f"got {m!r}")
        if len(conv) % 2 == 0:
            raise ValueError(f"conversation {i}, message {len(conv) - 1}: the last message must be the user's")
        turns = [TurnRecord(index=k, user=conv[2 * k]["content"], assistant=conv[2 * k + 1]["content"], tokens=[],
                            logprobs=[], finish_reason="stop", prompt_tokens=0) for k in range(len(conv) // 2)]
        runs.append(ConversationRun(conv_id=str(i), system=system, user_turns=[conv[2 * k]["content"]
                                    for k in range(len(conv) // 2 + 1)], meta={"domain": domain}, turns=turns))
        finals.append(conv[-1]["content"])
    anns, infos = _final_turn(sampler, runs, finals, sampling or SamplingConfig(), config or SeDTConfig(), embed, seed)
    return [SeDTResult(text=r.turns[-1].assistant, original=f["original"], correction=f["correction"],
                       replaced=f["replaced"], annotation=a, prompt=f["prompt"])
            for r, a, f in zip(runs, anns, infos)]


STRATEGIES.add("sedt", sedt_strategy)
