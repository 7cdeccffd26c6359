"""SeDT: a training-free fix for multi-turn conversations (inference only).

Before the final turn, the flat history of user turns is rewritten as annotated tuples
``(return-to-go, label, shard)`` that tell the model which past turns matter; a weak
conversation's answer is then checked by a second ("verifier") call and replaced only when the
correction demonstrably covers more of the confirmed content.

The math (pure functions, one conversation of T user turns):

- ``sem[t]`` = (cos(e_t, e_anchor) + 1) / 2 with e = pooled hidden states of the project's scorer
  (``jaxrl_mt.scoring.embed_texts``, the same ``Scorer.score`` the RLSTA anchor reward uses), or
  max(cos, 0) with ``sem_map="clip"``. The anchor is a task-typed goal sentence (per domain).
- ``lex[t]`` = Jaccard overlap of content words (lower-cased words and numbers, stop words removed)
  of turn t and the anchor.
- ``pos[t]`` = 1 - |t - c| / (c + 1), c = (T - 1) / 2: an inverted U, 1 at the middle turn and
  symmetric about it (T=5: 1/3, 2/3, 1, 2/3, 1/3; T=1: 1).
- ``rel[t]`` = w_sem sem + w_lex lex + w_pos pos (weights >= 0 summing to 1, so rel is in [0, 1]);
  then the last-shard guarantee rel[T-1] = max(rel[T-1], last_shard_floor).
- ``rtg[t]`` = sum_{s >= t} rel[s] (non-increasing in t); label CONFIRMED iff rel[t] > mean(rel),
  else UNCERTAIN.

Prompt format of the final turn (``format_prompt``; the final user message the model sees, the
history itself is left out unless ``keep_history``)::

    Here is everything I told you, one message per line as (return-to-go, label, message).
    Return-to-go is how relevant that message and all later ones are to the task (higher
    means more); CONFIRMED messages are key facts, UNCERTAIN ones may matter less.
    (2.41, CONFIRMED, "How many clips did Natalia sell altogether in April and May?")
    (1.62, UNCERTAIN, "Natalia sold clips to 48 of her friends in April.")
    (0.80, CONFIRMED, "She sold half as many clips in May.")
    Task: Compute the final numeric answer to the word problem. Use every CONFIRMED message.
    Solve it step by step and end with "The answer is <number>."

Each line is ``(rtg with 2 decimals, LABEL, message as a JSON string)``, in conversation order.

Self-correction: triggered when the final shard is weak (rel[T-1] / max(rel) < trigger_last_rel)
or most turns are uncertain (fraction UNCERTAIN > trigger_uncertain_frac), and only when the
CONFIRMED turns have content words. A verifier prompt (``correction_prompt``) writes a new
answer; the guard (``guard_replace``, mode ``SeDTConfig.guard``) decides whether it replaces the
original:

- ``"no_answer"`` (default): only if the original holds no number at all
  (``jaxrl_mt.rewards.verifier.find_numbers`` finds none), the correction holds one, and the
  correction's coverage of CONFIRMED content words is strictly larger than the original's.
- ``"coverage"`` (the method's rule, kept as an ablation): only the coverage condition.

A "hurt case" is a replacement that is wrong where the original was right. Under the default
guard it is impossible by construction: a response without a number scores 0 under the strict
and the lenient verifier for every gold answer, so the replaced answer was already wrong (see
:func:`guard_replace`; proven in ``tests/test_sedt.py``). The evaluation
(``jaxrl_mt.eval.sedt_eval``) still counts hurt cases, so the ``"coverage"`` ablation's show up.

Batching: for a batch of conversations, ONE embedding call (``Scorer.score``) for all turns and
anchors, ONE sampler call for the SeDT final turns and ONE for all corrections.

Layout: ``annotate`` (config, the pure math above, prompts, the guard, embeddings),
``final_turn`` (the batched final turn, the strategy, ``respond``) and ``ablations`` (the
evaluation's ablation arms: one signal alone, uniform relevance, random return-to-go); every
name is importable from ``jaxrl_mt.sedt``.

Integration: the earlier turns run in ``jaxrl_mt.conversations.run_conversations``' loop like
any strategy's (same KV cache reuse, same seed stream as ``"plain"``); SeDT is its
``final_turn`` hook (:class:`FinalTurnHold`), which holds back each conversation's final planned
turn and answers all of them in one batch. Importing this module registers the ``"sedt"``
strategy in ``jaxrl_mt.strategies``, so ``--config.strategy=sedt`` in
``python -m jaxrl_mt.evaluate`` uses :func:`sedt_strategy` with the default :class:`SeDTConfig`
(``make_strategy`` builds one with another config). For a user's own conversation, see
:func:`respond`.
"""

from __future__ import annotations

from jaxrl_mt.conversations import SEED_STRIDE
from jaxrl_mt.sedt.annotate import (ABLATIONS, CONFIRMED, DEFAULT_ANCHORS, DEFAULT_ANSWER_FORMATS, GUARDS,
                                    PROMPT_HEADER, RESTATE_HEADER, STOP_WORDS, UNCERTAIN, Annotation, Embedder,
                                    SeDTConfig, annotate, annotate_batch,
                                    content_words, correction_prompt, coverage, format_prompt, guard_replace, jaccard,
                                    labels_from_relevance, make_embedder, positional_weights, relevance, restate_prompt,
                                    returns_to_go, scorer_embedder, sem_from_cosine, should_trigger,
                                    with_answer_format)
from jaxrl_mt.sedt.final_turn import (FinalTurnHold, GivenUser, SeDTResult, final_prompt_ids, make_strategy, respond,
                                      restate_final_turn, run_until_final, sedt_final_turn, sedt_strategy, summarize)
from jaxrl_mt.sedt.ablations import (SIGNAL_WEIGHTS, ablate, ablated_relevance, ablation_final_turn, ablation_rng,
                                     random_returns_to_go)

__all__ = [
    "ABLATIONS",
    "CONFIRMED",
    "DEFAULT_ANCHORS",
    "DEFAULT_ANSWER_FORMATS",
    "GUARDS",
    "PROMPT_HEADER",
    "RESTATE_HEADER",
    "SIGNAL_WEIGHTS",
    "STOP_WORDS",
    "SEED_STRIDE",
    "UNCERTAIN",
    "Annotation",
    "Embedder",
    "FinalTurnHold",
    "GivenUser",
    "SeDTConfig",
    "SeDTResult",
    "ablate",
    "ablated_relevance",
    "ablation_final_turn",
    "ablation_rng",
    "annotate",
    "annotate_batch",
    "content_words",
    "correction_prompt",
    "coverage",
    "final_prompt_ids",
    "format_prompt",
    "guard_replace",
    "jaccard",
    "labels_from_relevance",
    "make_embedder",
    "make_strategy",
    "positional_weights",
    "random_returns_to_go",
    "relevance",
    "respond",
    "restate_final_turn",
    "restate_prompt",
    "returns_to_go",
    "run_until_final",
    "sedt_final_turn",
    "scorer_embedder",
    "sedt_strategy",
    "sem_from_cosine",
    "should_trigger",
    "summarize",
    "with_answer_format",
]
