"""The held-out evaluation set of the RLSTA experiment, and its disjointness check against training.

    python -m experiments.heldout --out docs/results/heldout.jsonl --seed 0

Builds problems from sources whose surface templates are kept out of training: the ``heldout``
template set of ``jaxrl_mt.data.families`` (one- and two-step addition/subtraction; the training
presets draw from the ``train`` set only) and, optionally, GSM8K *test* problems (the shipped
sample; training uses no GSM8K test problem). Every problem is evaluated as FULL (single turn),
MT-Add (``sharded``: question first, then one fact per turn) and MT-Refine (``mt_refine``: facts
with wrong numbers, then one correction per turn), so ``n`` problems give ``2 n`` multi-turn
conversations. The file is a tasks JSONL (``jaxrl_mt.data.save_tasks_jsonl``), read with the
source spec ``tasks:FILE``; the scenarios are rebuilt from it deterministically (seeded corruption).

:func:`check_disjoint` proves that no held-out problem overlaps a training problem: disjoint task
ids, disjoint template ids, and no shared normalised text (full prompt, question or fact).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from jaxrl_mt.data.families import family_tasks, template_of
from jaxrl_mt.data.loaders import load_source, save_tasks_jsonl
from jaxrl_mt.data.records import ShardedTask

__all__ = ["DEFAULT_SIZES", "OverlapError", "build_heldout", "check_disjoint", "normalise"]

DEFAULT_SIZES = {"one_step": 240, "two_step": 80, "gsm8k": 0}
GSM8K_TEST = "gsm8k:@gsm8k/test_sample.jsonl"


class OverlapError(ValueError):
    """A held-out problem shares an id, a template or a text with a training problem."""


def normalise(text: str) -> str:
    """Lower case, punctuation dropped, whitespace collapsed."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def build_heldout(
    *,
    seed: int = 0,
    one_step: int = DEFAULT_SIZES["one_step"],
    two_step: int = DEFAULT_SIZES["two_step"],
    gsm8k: int = DEFAULT_SIZES["gsm8k"],
) -> list[ShardedTask]:
    """The held-out problems: ``one_step`` + ``two_step`` family problems (held-out templates) and
    the first ``gsm8k`` problems of the shipped GSM8K test sample that have at least one condition.

    A pure function of its arguments.
    """
    tasks = family_tasks("heldout", one_step, steps=1, seed=seed) + family_tasks(
        "heldout", two_step, steps=2, seed=seed
    )
    if gsm8k:
        tasks += [t for t in load_source(GSM8K_TEST) if t.conditions][:gsm8k]
    return tasks


def _texts(t: ShardedTask) -> set[str]:
    return {normalise(x) for x in (t.full_prompt, t.target, *t.conditions) if normalise(x)}


def check_disjoint(heldout: Sequence[ShardedTask], training: Iterable[ShardedTask]) -> dict[str, int]:
    """Raises OverlapError when a held-out problem overlaps a training problem.

    Checks: no shared task id; no shared template id (family problems); no shared normalised
    text among full prompts, questions and facts.

    Returns:
      ``{"n_heldout", "n_training", "n_texts_heldout", "n_texts_training"}``.
    """
    training = list(training)
    ids = {t.task_id for t in training}
    templates = {template_of(t) for t in training} - {""}
    texts: dict[str, str] = {}
    for t in training:
        for x in _texts(t):
            texts.setdefault(x, t.task_id)
    n_texts = 0
    for h in heldout:
        if h.task_id in ids:
            raise OverlapError(f"held-out task {h.task_id!r} is also a training task")
        if template_of(h) and template_of(h) in templates:
            raise OverlapError(f"held-out task {h.task_id!r} uses training template {template_of(h)!r}")
        for x in _texts(h):
            n_texts += 1
            if x in texts:
                raise OverlapError(f"held-out task {h.task_id!r} shares the text {x!r} with training task {texts[x]!r}")
    return {
        "n_heldout": len(heldout),
        "n_training": len(training),
        "n_texts_heldout": n_texts,
        "n_texts_training": len(texts),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="tasks JSONL to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one-step", type=int, default=DEFAULT_SIZES["one_step"])
    ap.add_argument("--two-step", type=int, default=DEFAULT_SIZES["two_step"])
    ap.add_argument("--gsm8k", type=int, default=DEFAULT_SIZES["gsm8k"], help="GSM8K test-sample problems to add")
    a = ap.parse_args(argv)
    tasks = build_heldout(seed=a.seed, one_step=a.one_step, two_step=a.two_step, gsm8k=a.gsm8k)
    save_tasks_jsonl(a.out, tasks)
    size = Path(a.out).stat().st_size
    print(
        f"wrote {len(tasks)} problems ({2 * len(tasks)} multi-turn conversations: MT-Add + MT-Refine) "
        f"to {a.out} ({size / 1024:.0f} KB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
