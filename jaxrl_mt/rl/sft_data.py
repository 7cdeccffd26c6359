"""SFT items and DPO pairs from the latent-capability filter's samples (RLSTA's Table 1 baselines).

RLSTA: "we construct training pairs by appending the correct single-turn response to the
multi-turn history, and utilize the model's original erroneous response as the negative sample
for DPO". The filter (``rl.histories.single_and_multi_texts``) samples, for every history, k
single-turn responses to the clean full prompt and k re-samples of the last turn given the
history; :func:`filter_samples` keeps them with their verdicts, and

* :func:`sft_items`: history + last user turn as the prompt, the first correct single-turn response
  as the target;
* :func:`dpo_pairs`: the same prompt, chosen = that correct single-turn response, rejected = the
  first wrong multi-turn response (the model's own answer on the history);
* :func:`split_validation`: a held-out split by problem (no problem in both), deterministic by seed;
* :func:`encode_target`: prompt ids and the target's ids (its content and end-of-turn marker).

Everything here is a pure function of its arguments (no model).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxrl_mt.chat import ChatError, encode_conversation, encode_prompt
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.rl.histories import TrainItem
from jaxrl_mt.rl.run_config import ConfigError


@dataclasses.dataclass(frozen=True)
class FilterSample:
    """One history with the filter's k single-turn and k multi-turn responses and their verdicts."""

    item: TrainItem
    st_texts: tuple[str, ...]  # [k] responses to the clean full single-turn prompt
    st_correct: tuple[bool, ...]  # [k] their verdicts
    mt_texts: tuple[str, ...]  # [k] responses to the last turn given the history
    mt_correct: tuple[bool, ...]  # [k] their verdicts


@dataclasses.dataclass(frozen=True)
class SftItem:
    """A prompt (history + last user turn) and its target response."""

    item_id: str
    task_id: str
    messages: tuple[tuple[str, str], ...]  # ((role, content), ...) ending with the last user turn
    target: str


@dataclasses.dataclass(frozen=True)
class DpoPair:
    """A prompt, its chosen (correct single-turn) and rejected (wrong multi-turn) responses."""

    item_id: str
    task_id: str
    messages: tuple[tuple[str, str], ...]
    chosen: str
    rejected: str


def filter_samples(items: Sequence[TrainItem], st_texts: Sequence[str], mt_texts: Sequence[str], *, k: int,
                   mode: str = "strict") -> list[FilterSample]:
    """Groups the filter's texts by item and verifies them against each item's gold answer.

    Args:
      items: ``N`` histories.
      st_texts: ``[N * k]`` single-turn responses, k consecutive per item (``single_and_multi_texts``).
      mt_texts: ``[N * k]`` multi-turn responses, likewise.
      k: samples per item.
      mode: the verifier mode (``"strict"`` or ``"lenient"``).

    Returns:
      ``N`` samples, in the items' order.

    Raises:
      ValueError: text counts that are not ``N * k``.
    """
    n = len(items)
    if len(st_texts) != n * k or len(mt_texts) != n * k:
        raise ValueError(f"filter_samples: {len(st_texts)} / {len(mt_texts)} texts for {n} items x k={k}")
    out = []
    for i, it in enumerate(items):
        st, mt = tuple(st_texts[i * k:(i + 1) * k]), tuple(mt_texts[i * k:(i + 1) * k])
        out.append(FilterSample(it, st, tuple(verify(t, it.answer, mode) > 0 for t in st), mt,
                                tuple(verify(t, it.answer, mode) > 0 for t in mt)))
    return out


def _first(texts: Sequence[str], verdicts: Sequence[bool], want: bool) -> str | None:
    return next((t for t, v in zip(texts, verdicts) if v == want), None)


def _messages(item: TrainItem) -> tuple[tuple[str, str], ...]:
    return tuple(item.history) + (("user", item.last_user),)


def sft_items(samples: Sequence[FilterSample]) -> list[SftItem]:
    """One SFT item per sample with a correct single-turn response (the first one), in order."""
    out = []
    for s in samples:
        target = _first(s.st_texts, s.st_correct, True)
        if target is not None:
            out.append(SftItem(s.item.item_id, s.item.task_id, _messages(s.item), target))
    return out


def solution_items(tasks: Sequence[Any]) -> list[SftItem]:
    """One single-turn SFT item per task: its full prompt as the only user turn, its worked solution
    (metadata ``solution``, e.g. :func:`jaxrl_mt.data.arith.arith_tasks`') as the target.

    Raises:
      ConfigError: a task without a ``solution``, named by its id.
    """
    out = []
    for t in tasks:
        target = t.meta.get("solution")
        if not isinstance(target, str) or not target.strip():
            raise ConfigError(f"task {t.task_id!r}: sft.targets='solution' needs a worked solution in its "
                              "metadata ('solution'); arith:... sources have one")
        out.append(SftItem(t.task_id, t.task_id, (("user", t.full_prompt),), target))
    return out


def dpo_pairs(samples: Sequence[FilterSample]) -> list[DpoPair]:
    """One pair per sample with a correct single-turn and a wrong multi-turn response (the first of each)."""
    out = []
    for s in samples:
        chosen, rejected = _first(s.st_texts, s.st_correct, True), _first(s.mt_texts, s.mt_correct, False)
        if chosen is not None and rejected is not None:
            out.append(DpoPair(s.item.item_id, s.item.task_id, _messages(s.item), chosen, rejected))
    return out


def split_validation(rows: Sequence[Any], fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    """Train and validation rows, split by problem (``task_id``), deterministic by seed.

    Args:
      rows: items with a ``task_id`` (``SftItem``, ``DpoPair``, ``TrainItem``).
      fraction: share of the problems held out (at least one problem when ``fraction > 0`` and
        there are two or more; never all of them).
      seed: the split's seed.

    Returns:
      ``(train, validation)``, each in the input order.

    Raises:
      ValueError: ``fraction`` outside [0, 1).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"split_validation: fraction must be in [0, 1), got {fraction}")
    tasks = sorted({r.task_id for r in rows})
    n_val = 0 if fraction == 0 or len(tasks) < 2 else min(max(int(round(fraction * len(tasks))), 1), len(tasks) - 1)
    order = np.random.default_rng(seed).permutation(len(tasks))
    held = {tasks[i] for i in order[:n_val]}
    return [r for r in rows if r.task_id not in held], [r for r in rows if r.task_id in held]


def encode_target(tokenizer: Any, messages: Sequence[tuple[str, str]], response: str, *,
                  system: str | None = None) -> tuple[list[int], list[int]]:
    """Prompt ids (with the generation header) and the response's ids (content and end-of-turn marker).

    Args:
      tokenizer: a tokenizer with a chat template.
      messages: ``((role, content), ...)`` ending with a user turn.
      response: the assistant response appended as the target.
      system: the run's system prompt.

    Returns:
      ``(prompt_ids, target_ids)``; ``prompt_ids + target_ids`` is a prefix of the rendered
      conversation with the response (only the template's trailing newline after the end-of-turn
      marker is left out).

    Raises:
      ChatError: a template whose rendering of the prompt is not a token prefix of the conversation's.
    """
    msgs = [{"role": r, "content": c} for r, c in messages]
    prompt = encode_prompt(tokenizer, msgs, system=system)
    ids, amask = encode_conversation(tokenizer, msgs + [{"role": "assistant", "content": response}], system=system)
    if ids[:len(prompt)] != prompt:
        raise ChatError("encode_target: the prompt's tokens are not a prefix of the conversation's")
    target = [t for i, (t, m) in enumerate(zip(ids, amask)) if m and i >= len(prompt)]
    return prompt, target
