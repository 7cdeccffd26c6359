"""SeDT's ablations: the annotated prompt with its relevance replaced, answered on the same history.

Each ablation rewrites SeDT's :class:`~jaxrl_mt.sedt.annotate.Annotation` of a conversation
(the signals ``sem``, ``lex``, ``pos`` already computed, so no second embedding call) and keeps
everything else of the prompt (header, shards, anchor, answer instruction):

- ``semantic_only`` / ``lexical_only`` / ``positional_only``: rel = that one signal (weights
  (1, 0, 0), (0, 1, 0), (0, 0, 1) in :func:`~jaxrl_mt.sedt.annotate.relevance`, so the
  last-shard floor still applies), then return-to-go and labels from it as SeDT does.
- ``uniform``: every turn the same relevance, the conversation's mean SeDT relevance (so
  rtg[0] = sum(rel) is SeDT's own and only its spread over the turns is lost); no turn is
  strictly above the mean, so every label is UNCERTAIN (SeDT's rule on equal values).
- ``random_rtg``: SeDT's labels and relevance, but the return-to-go numbers are
  ``returns_to_go(u)`` of seeded random u ~ U[0, 1) per turn: non-increasing values printed
  with 2 decimals like SeDT's, so the prompt differs from SeDT's only in those numbers.

The ablation arms are answered without the self-correction (they compare with SeDT's first
answer, ``sharded+sedt (no correction)``).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Sequence

import numpy as np

from jaxrl_mt.conversations import ConversationRun, TurnRecord
from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.sedt.annotate import (ABLATIONS, UNCERTAIN, Annotation, SeDTConfig, format_prompt,
                                    labels_from_relevance, relevance, returns_to_go)
from jaxrl_mt.sedt.final_turn import final_prompt_ids

SIGNAL_WEIGHTS = {  # ablation -> (w_sem, w_lex, w_pos)
    "semantic_only": (1.0, 0.0, 0.0),
    "lexical_only": (0.0, 1.0, 0.0),
    "positional_only": (0.0, 0.0, 1.0),
}


def ablated_relevance(ann: Annotation, name: str, cfg: SeDTConfig) -> np.ndarray:
    """The relevance [T] of ablation ``name`` (not ``random_rtg``, which keeps SeDT's).

    Raises:
      ValueError: an unknown name, or ``random_rtg``.
    """
    if name in SIGNAL_WEIGHTS:
        w_sem, w_lex, w_pos = SIGNAL_WEIGHTS[name]
        one = dataclasses.replace(cfg, w_sem=w_sem, w_lex=w_lex, w_pos=w_pos)
        return relevance(np.asarray(ann.sem), np.asarray(ann.lex), np.asarray(ann.pos), one)
    if name == "uniform":
        return np.full(len(ann.rel), float(np.mean(ann.rel)))
    raise ValueError(f"ablated_relevance: expected one of {', '.join(map(repr, ABLATIONS[:4]))}, got {name!r}")


def random_returns_to_go(n: int, rng: np.random.Generator) -> np.ndarray:
    """Random return-to-go [n]: ``returns_to_go`` of u ~ U[0, 1) per turn (non-increasing, in [0, n))."""
    return returns_to_go(rng.uniform(0.0, 1.0, size=n))


def ablate(ann: Annotation, name: str, cfg: SeDTConfig, rng: np.random.Generator | None = None) -> Annotation:
    """SeDT's annotation of a conversation under ablation ``name`` (see the module docstring).

    Args:
      ann: SeDT's annotation (signals, relevance, return-to-go, labels).
      name: one of ``ABLATIONS``.
      cfg: the SeDT config (its last-shard floor applies to the single-signal arms).
      rng: the random numbers of ``random_rtg`` (required there).

    Raises:
      ValueError: an unknown name, or ``random_rtg`` without ``rng``.
    """
    f = lambda a: tuple(float(x) for x in a)  # noqa: E731
    if name == "random_rtg":
        if rng is None:
            raise ValueError("ablate: 'random_rtg' needs a random generator")
        return dataclasses.replace(ann, rtg=f(random_returns_to_go(len(ann.shards), rng)))
    rel = ablated_relevance(ann, name, cfg)  # [T]
    labels = (UNCERTAIN,) * len(rel) if name == "uniform" else labels_from_relevance(rel)
    return dataclasses.replace(ann, rel=f(rel), rtg=f(returns_to_go(rel)), labels=labels)


def ablation_rng(seed: int, conv_id: str) -> np.random.Generator:
    """The random generator of one conversation's ``random_rtg`` numbers (the final turn's seed, its id)."""
    return np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(conv_id.encode("utf-8"))])


def ablation_final_turn(sampler: Sampler, runs: Sequence[ConversationRun], final_users: Sequence[str],
                        sampling: SamplingConfig, *, base: Sequence[Annotation], name: str, cfg: SeDTConfig,
                        seed: int = 0) -> list[dict[str, Any]]:
    """Answers each run's final turn with ablation ``name`` of SeDT's prompt, ONE sampler call at ``seed``.

    The prompt is built and truncated as SeDT's (``format_prompt``, ``cfg.keep_history``, the
    domain's answer instruction); there is no self-correction.

    Args:
      sampler: the policy's sampler.
      runs: conversations whose earlier turns are done (their final turn not yet appended).
      final_users: each run's final user message.
      sampling: sampling settings.
      base: SeDT's annotation of each run (``sedt_final_turn``'s ``info["annotation"]``).
      name: one of ``ABLATIONS``.
      cfg: the SeDT config.
      seed: sampler seed (SeDT's); ``random_rtg`` draws per run from ``ablation_rng(seed, conv_id)``.

    Returns:
      Per run, ``{"name", "prompt", "annotation"}`` (also stored in ``turn.info["ablation"]``).
    """
    if not len(runs) == len(final_users) == len(base):
        raise ValueError(f"ablation_final_turn: {len(runs)} runs, {len(final_users)} final messages and "
                         f"{len(base)} annotations")
    if name not in ABLATIONS:
        raise ValueError(f"ablation_final_turn: unknown ablation {name!r}; expected one of "
                         f"{', '.join(map(repr, ABLATIONS))}")
    if not runs:
        return []
    anns = [ablate(a, name, cfg, ablation_rng(seed, r.conv_id)) for a, r in zip(base, runs)]
    msgs = [format_prompt(a, cfg.answer_format(r.meta.get("domain", "math"))) for a, r in zip(anns, runs)]
    prompts = [final_prompt_ids(sampler, r, m, cfg.keep_history, sampling.max_new_tokens) for r, m in zip(runs, msgs)]
    res = sampler.generate_ids(prompts, sampling, seed=seed)
    infos = []
    for i, (r, u) in enumerate(zip(runs, final_users)):
        info = {"name": name, "prompt": msgs[i], "annotation": anns[i].to_json()}
        r.turns.append(TurnRecord(index=len(r.turns), user=u, assistant=res.texts[i], tokens=list(res.tokens[i]),
                                  logprobs=[float(x) for x in res.logprobs[i]], finish_reason=res.finish_reasons[i],
                                  prompt_tokens=len(prompts[i]), info={"ablation": info}))
        infos.append(info)
    return infos
