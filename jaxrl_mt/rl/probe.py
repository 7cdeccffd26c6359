"""A fixed held-out probe evaluated during training, and the latent-capability filter's breakdown.

:class:`HeldoutProbe` answers a fixed subset of held-out problems greedily, as real conversations
(the policy answers every turn itself: FULL, MT-Add and MT-Refine), and returns the strict and
lenient accuracy of the last reply per scenario. The trainer calls it before training, every
``eval.probe_every`` steps and at the end (config ``eval.probe_source``), so the learning curves
show held-out multi-turn accuracy on problems no training item comes from.

:func:`filter_breakdown` says why the latent-capability filter kept or dropped each history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_mt.conversations import ConversationRun, run_conversations
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import DataError
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.rl.run_config import TrainConfig
from jaxrl_mt.sampling import SamplingConfig

__all__ = ["HeldoutProbe", "filter_breakdown", "make_probe"]


class HeldoutProbe:
    """Greedy last-reply accuracy on a fixed set of held-out conversations."""

    def __init__(self, source: str, *, limit: int, kinds: Sequence[str], max_new_tokens: int, every: int,
                 system: str | None = None, seed: int = 0):
        """Args:
          source: a source spec (``jaxrl_mt.data.load_source``), e.g. ``tasks:heldout.jsonl``.
          limit: the first ``limit`` problems of the source (0: all).
          kinds: scenario kinds to build from each problem (``full``, ``sharded``, ``mt_refine``).
          max_new_tokens: reply budget per turn.
          every: evaluate every this many steps (0: only before and after training).
          system: the system prompt (None: the template's default).
          seed: scenario seed (corruption of MT-Refine) and sampling seed.

        Raises:
          DataError: a bad source, or no conversation could be built.
        """
        tasks = load_source(source)
        tasks = tasks[:limit] if limit else tasks
        self.every, self.seed = every, seed
        self.sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
        self.plan: list[tuple[str, str, tuple[str, ...], str]] = []  # (task id, kind, turns, gold)
        for t in tasks:
            for kind in kinds:
                try:
                    s = build_scenario(t, kind, seed=seed)
                except DataError:
                    continue
                self.plan.append((t.task_id, s.kind, s.turns, s.answer))
        if not self.plan:
            raise DataError(f"probe source {source!r}: no conversation of kinds {list(kinds)}")
        self.system = system

    def due(self, done: int, total: int) -> bool:
        """Whether to evaluate after optimizer step ``done`` of ``total``."""
        return done == total or bool(self.every and done % self.every == 0)

    def __call__(self, sampler: Any) -> dict[str, float]:
        """``probe/<kind>_<mode>`` accuracies and ``probe/multi_turn_<mode>`` (all non-FULL kinds) of the
        policy ``sampler`` holds (the trainer's ``sampler.bound(params)``)."""
        runs = [ConversationRun(conv_id=f"{tid}|{kind}", system=self.system, user_turns=list(turns))
                for tid, kind, turns, _ in self.plan]
        run_conversations(sampler, runs, self.sampling, seed=self.seed)  # no kept caches: bounded memory
        out: dict[str, float] = {}
        for mode in ("strict", "lenient"):
            scores: dict[str, list[float]] = {}
            for (_, kind, _, gold), r in zip(self.plan, runs):
                scores.setdefault(kind, []).append(verify(r.turns[-1].assistant, gold, mode) if r.turns else 0.0)
            for kind, v in scores.items():
                out[f"probe/{kind}_{mode}"] = float(np.mean(v))
            multi = [x for k, v in scores.items() if k != "full" for x in v]
            if multi:
                out[f"probe/multi_turn_{mode}"] = float(np.mean(multi))
        return out


def make_probe(c: TrainConfig, system: str | None) -> HeldoutProbe | None:
    """The probe of a training config (``eval.probe_*`` fields), or None when ``probe_source`` is empty."""
    ev = c.eval
    if not ev.probe_source:
        return None
    kinds = [k.strip() for k in str(ev.probe_kinds).split(",") if k.strip()]
    return HeldoutProbe(ev.probe_source, limit=ev.probe_limit, kinds=kinds, max_new_tokens=ev.max_new_tokens,
                        every=ev.probe_every, system=system, seed=c.seed)


def filter_breakdown(kinds: Sequence[str], st_acc: Sequence[float], mt_acc: Sequence[float],
                     kept: Sequence[bool]) -> dict[str, int]:
    """Why each history was kept or dropped by the latent-capability filter (st_acc > mt_acc).

    Args:
      kinds: scenario kind of each history (``sharded`` = MT-Add, ``mt_refine``).
      st_acc, mt_acc: its single- and multi-turn accuracy over the filter's k samples.
      kept: whether it was kept.

    Returns:
      Counts: ``kept``, ``kept_<kind>``, ``dropped_never_solved`` (both 0),
      ``dropped_always_solved`` (both 1), ``dropped_equal`` (equal otherwise),
      ``dropped_multi_better`` (mt > st) and ``dropped_over_cap`` (st > mt, over the per-problem cap).
    """
    out: dict[str, int] = {"kept": 0, "dropped_never_solved": 0, "dropped_always_solved": 0, "dropped_equal": 0,
                           "dropped_multi_better": 0, "dropped_over_cap": 0}
    for kind, s, m, k in zip(kinds, st_acc, mt_acc, kept):
        if k:
            out["kept"] += 1
            out[f"kept_{kind}"] = out.get(f"kept_{kind}", 0) + 1
        elif s > m:
            out["dropped_over_cap"] += 1
        elif m > s:
            out["dropped_multi_better"] += 1
        elif s == 0:
            out["dropped_never_solved"] += 1
        elif s == 1:
            out["dropped_always_solved"] += 1
        else:
            out["dropped_equal"] += 1
    return out
