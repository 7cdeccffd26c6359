"""Training seeds: models named ``<arm>_s<N>`` are seeds of one arm, summarised with a two-level bootstrap.

An arm with at least two seeds (``grpo_s0``, ``grpo_s1``, ``grpo_s2`` -> ``grpo``) is reported as the
mean over its seeds of each seed's mean over problems, with each seed's value, the standard deviation
over seeds (``ddof = 1``) and a 95% CI from a two-level percentile bootstrap: each replicate resamples
the problems with replacement (the same problems for every seed: they answered the same problems), then
the seeds with replacement, and takes the mean over the resampled seeds and problems. So the CI counts
both the problems' and the seeds' variation; a one-level bootstrap over problems of the seed-averaged
scores counts only the first.

A difference between two arms (or an arm and a single model: an arm of one seed) is paired by problem:
each replicate draws one set of problems for both sides and resamples each side's seeds on its own.
The problems are those every model of both sides answered.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from experiments.analysis import CI_LEVEL
from jaxrl_mt.eval.metrics import percentile_interval

__all__ = ["SEED_NAME", "bootstrap_seeds", "bootstrap_seeds_diff", "mean_curve", "seed_groups", "seeds_section",
           "two_level_replicates", "units"]

SEED_NAME = re.compile(r"(?P<arm>.+)_s(?P<seed>\d+)")
Scores = Mapping[str, Mapping[str, float]]  # model name -> task id -> score


def seed_groups(names: Sequence[str]) -> dict[str, list[str]]:
    """Arm -> its ``<arm>_s<N>`` model names (in `names` order), for the arms with at least two seeds."""
    groups: dict[str, list[str]] = {}
    for n in names:
        m = SEED_NAME.fullmatch(n)
        if m:
            groups.setdefault(m.group("arm"), []).append(n)
    return {arm: ms for arm, ms in groups.items() if len(ms) >= 2}


def units(names: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``[(label, model names)]`` in order of first appearance: an arm of `seed_groups` as ``<arm>_s*``
    with its seeds, every other model alone under its name."""
    groups = seed_groups(names)
    member = {n: arm for arm, ms in groups.items() for n in ms}
    out: list[tuple[str, list[str]]] = []
    for n in names:
        arm = member.get(n)
        if arm is None:
            out.append((n, [n]))
        elif groups[arm][0] == n:  # the arm's place: its first seed's
            out.append((f"{arm}_s*", groups[arm]))
    return out


def _matrix(scores: Scores, models: Sequence[str], tasks: Sequence[str]) -> np.ndarray:
    """Scores ``[seeds, problems]`` of `models` on `tasks`."""
    return np.array([[scores[m][t] for t in tasks] for m in models], np.float64)


def _common(scores: Scores, models: Sequence[str]) -> list[str]:
    """The tasks every one of `models` holds, sorted."""
    return sorted(set.intersection(*(set(scores[m]) for m in models)))


def two_level_replicates(sides: Sequence[tuple[float, np.ndarray]], n_boot: int, seed: int) -> np.ndarray:
    """Two-level bootstrap replicates of a sum of signed arm means.

    Each replicate draws P problem indices with replacement (one draw for every side: the sides are
    paired by problem), then for each side S seed indices with replacement, and adds ``sign`` times the
    mean over the drawn seeds and problems. The problem indices are drawn first, by the call
    ``jaxrl_mt.eval.metrics.percentile_ci`` makes, so one side of one seed replicates its bootstrap.

    Args:
      sides: ``(sign, scores [S, P])`` per side, all on the same P problems (columns in one order).
      n_boot: number of replicates.
      seed: seed of the numpy generator.

    Returns:
      ``[n_boot]`` replicates.
    """
    rng = np.random.default_rng(seed)
    n_problems = sides[0][1].shape[1]
    pidx = rng.integers(0, n_problems, size=(n_boot, n_problems))  # [B, P]
    out = np.zeros(n_boot)
    for sign, mat in sides:
        per_seed = mat[:, pidx].mean(axis=2).T  # [B, S]: each seed's mean over the resampled problems
        sidx = rng.integers(0, mat.shape[0], size=(n_boot, mat.shape[0]))  # [B, S]
        out += sign * np.take_along_axis(per_seed, sidx, axis=1).mean(axis=1)
    return out


def bootstrap_seeds(scores: Scores, *, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Mean over seeds and problems of seed model -> task -> score (0-1), on the tasks all seeds hold.

    Returns:
      ``{"mean", "lo", "hi", "n", "n_seeds", "std", "seeds"}``: the two-level bootstrap CI, n problems,
      the standard deviation over the seeds' means (nan for one seed) and ``{model: its mean}``. With
      one seed, mean, lo and hi are ``analysis.bootstrap_mean``'s for the same ``n_boot`` and ``seed``.
    """
    models = list(scores)
    tasks = _common(scores, models)
    if not tasks:
        nan = float("nan")
        return {"mean": nan, "lo": nan, "hi": nan, "n": 0, "n_seeds": len(models), "std": nan, "seeds": {}}
    mat = _matrix(scores, models, tasks)
    per_seed = mat.mean(axis=1)
    lo, hi = percentile_interval(two_level_replicates([(1.0, mat)], n_boot, seed), 1 - CI_LEVEL)
    return {"mean": float(per_seed.mean()), "lo": lo, "hi": hi, "n": len(tasks), "n_seeds": len(models),
            "std": float(per_seed.std(ddof=1)) if len(models) > 1 else float("nan"),
            "seeds": {m: float(v) for m, v in zip(models, per_seed)}}


def bootstrap_seeds_diff(a: Scores, b: Scores, *, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """``mean(b) - mean(a)`` of two arms (model -> task -> score each), paired by problem, seeds
    resampled per side (see the module docstring).

    Returns:
      ``{"diff", "lo", "hi", "n", "excludes_zero", "n_seeds"}`` (``n_seeds`` = ``[len(a), len(b)]``).
      With one seed a side, diff, lo and hi equal ``analysis.bootstrap_paired``'s up to rounding.
    """
    tasks = _common({**a, **b}, [*a, *b])
    if not tasks:
        nan = float("nan")
        return {"diff": nan, "lo": nan, "hi": nan, "n": 0, "excludes_zero": False, "n_seeds": [len(a), len(b)]}
    ma, mb = _matrix(a, list(a), tasks), _matrix(b, list(b), tasks)
    lo, hi = percentile_interval(two_level_replicates([(-1.0, ma), (1.0, mb)], n_boot, seed), 1 - CI_LEVEL)
    return {"diff": float(mb.mean() - ma.mean()), "lo": lo, "hi": hi, "n": len(tasks),
            "excludes_zero": bool(lo > 0 or hi < 0), "n_seeds": [len(a), len(b)]}


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> list[list[float]]:
    """The mean of ``[[step, value], ...]`` curves at the steps every one of them logged, by step."""
    if not curves:
        return []
    by_step = [{s: float(v) for s, v in c} for c in curves]
    steps = sorted(set.intersection(*(set(d) for d in by_step)))
    return [[s, float(np.mean([d[s] for d in by_step]))] for s in steps]


def seeds_section(scores: Mapping[str, Scores], names: Sequence[str], runs: Mapping[str, Any],
                  curve_keys: Sequence[str], *, n_boot: int, seed: int) -> dict[str, Any]:
    """The report's ``seeds`` part ({} without an arm of two seeds).

    Args:
      scores: model -> column -> task -> strict score (the columns reported per arm).
      names: the models in report order.
      runs: model -> its run section (``report["runs"]``; ``curves`` key -> points).
      curve_keys: the training curves averaged over an arm's runs (``curves``: key -> mean curve,
        ``curve_runs``: the seeds with a run folder).
      n_boot, seed: the bootstrap's replicates and seed.

    Returns:
      ``{"groups": {arm: {"models", "strict": {column: bootstrap_seeds}, "curves", "curve_runs"}},
      "pairs": {"B - A": {column: bootstrap_seeds_diff}}}``, pairs over `units` with an arm on a side.
    """
    groups = seed_groups(names)
    if not groups:
        return {}
    cols = list(next(iter(scores.values())))
    out: dict[str, Any] = {"groups": {}, "pairs": {}}
    for arm, models in groups.items():
        with_runs = [m for m in models if m in runs]
        out["groups"][arm] = {
            "models": models,
            "strict": {k: bootstrap_seeds({m: scores[m][k] for m in models}, n_boot=n_boot, seed=seed) for k in cols},
            "curve_runs": with_runs,
            "curves": {key: mean_curve([runs[m]["curves"][key] for m in with_runs])
                       for key in curve_keys if with_runs and all(key in runs[m]["curves"] for m in with_runs)},
        }
    for (la, ma), (lb, mb) in itertools.combinations(units(names), 2):
        if len(ma) > 1 or len(mb) > 1:
            out["pairs"][f"{lb} - {la}"] = {
                k: bootstrap_seeds_diff({m: scores[m][k] for m in ma}, {m: scores[m][k] for m in mb},
                                        n_boot=n_boot, seed=seed) for k in cols}
    return out
