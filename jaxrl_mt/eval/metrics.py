"""Lost-in-Conversation metrics: performance P, aptitude A90 and unreliability U90-10.

Each instruction is simulated N times. Per instruction, on a 0-100 scale:

- ``P`` = mean score over the N runs,
- ``A90`` = 90th percentile of the N scores (what the model does on a good run),
- ``U90_10`` = 90th minus 10th percentile (how far apart good and bad runs are).

The reported figures are the means of these over instructions. Percentiles use
``np.percentile(..., method=PERCENTILE_METHOD)`` (linear interpolation between order statistics:
the q-th percentile of sorted ``x[0..N-1]`` sits at position ``q / 100 * (N - 1)``).

Scores may be given in [0, 1] (e.g. binary correctness) or [0, 100]; ``scale=None`` detects which
for the whole call (all scores <= 1 means [0, 1]).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "METRICS",
    "PERCENTILE_METHOD",
    "aggregate",
    "bootstrap_ci",
    "paired_bootstrap_ci",
    "percentile_ci",
    "percentile_interval",
    "first_answer_turn_stats",
    "instruction_metrics",
    "last_reply_correct",
    "lic_ratio",
    "scores_by_task",
]

PERCENTILE_METHOD = "linear"  # np.percentile method for A90 and U90-10
METRICS = ("P", "A90", "U90_10")


def _as_scores(values: Sequence[float], where: str) -> np.ndarray:
    scores = np.asarray(values, dtype=np.float64)  # [N]
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"{where}: expected a non-empty list of scores, got shape {scores.shape}")
    bad = scores[~np.isfinite(scores) | (scores < 0) | (scores > 100)]
    if bad.size:
        raise ValueError(f"{where}: score {bad[0]!r} is outside [0, 100]")
    return scores


def _resolve_scale(arrays: Sequence[np.ndarray], scale: float | None) -> float:
    """Factor that maps the scores onto 0-100 (100 for [0, 1] scores, 1 for [0, 100])."""
    if scale is not None:
        if scale not in (1, 100):
            raise ValueError(f"scale must be None, 1 or 100, got {scale!r}")
        return float(scale)
    return 100.0 if max(float(a.max()) for a in arrays) <= 1.0 else 1.0


def _per_instruction(scores: np.ndarray) -> tuple[float, float, float]:
    """(P, A90, U90_10) of one instruction's 0-100 scores ``[N]``."""
    p10, p90 = np.percentile(scores, [10, 90], method=PERCENTILE_METHOD)
    return float(scores.mean()), float(p90), float(p90 - p10)


def instruction_metrics(scores: Sequence[float], scale: float | None = None) -> dict:
    """P, A90 and U90-10 of one instruction's N runs.

    Args:
      scores: ``N`` run scores in [0, 1] or [0, 100].
      scale: 100 if the scores are in [0, 1], 1 if already 0-100, None to detect.

    Returns:
      ``{"P", "A90", "U90_10"}`` on a 0-100 scale, and ``"n"`` (= N).
    """
    array = _as_scores(scores, "instruction_metrics")
    array = array * _resolve_scale([array], scale)
    p, a90, u90_10 = _per_instruction(array)
    return {"P": p, "A90": a90, "U90_10": u90_10, "n": int(array.size)}


def _metric_table(
    scores_by_instruction: Mapping[str, Sequence[float]], scale: float | None
) -> tuple[np.ndarray, int]:
    """Per-instruction metrics ``[I, 3]`` (columns as ``METRICS``) and the total run count."""
    if not scores_by_instruction:
        raise ValueError("no instructions to aggregate")
    arrays = [_as_scores(v, f"instruction {k!r}") for k, v in scores_by_instruction.items()]
    factor = _resolve_scale(arrays, scale)
    table = np.array([_per_instruction(a * factor) for a in arrays])  # [I, 3]
    return table, sum(a.size for a in arrays)


def aggregate(
    scores_by_instruction: Mapping[str, Sequence[float]], scale: float | None = None
) -> dict:
    """LiC metrics averaged over instructions.

    Args:
      scores_by_instruction: instruction id -> its N run scores (N may differ per instruction).
      scale: 100 if the scores are in [0, 1], 1 if already 0-100, None to detect over all scores.

    Returns:
      ``{"P", "A90", "U90_10"}`` (0-100), ``"n_instructions"`` and ``"n_runs"`` (total runs).
    """
    table, n_runs = _metric_table(scores_by_instruction, scale)
    means = table.mean(axis=0)  # [3]
    result = {name: float(v) for name, v in zip(METRICS, means)}
    result.update(n_instructions=int(table.shape[0]), n_runs=int(n_runs))
    return result


def lic_ratio(p_scenario: float, p_full: float) -> float:
    """Performance retained in a scenario relative to FULL: ``p_scenario / p_full``.

    Returns nan when ``p_full`` is 0 (no reference performance to lose).

    Raises:
      ValueError: for negative or non-finite inputs.
    """
    for name, value in (("p_scenario", p_scenario), ("p_full", p_full)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"lic_ratio: {name}={value!r} must be a finite non-negative number")
    return float("nan") if p_full == 0 else p_scenario / p_full


def bootstrap_ci(
    scores_by_instruction: Mapping[str, Sequence[float]],
    metric: str = "P",
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    scale: float | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of an aggregate metric, resampling instructions.

    Each replicate draws I instructions with replacement and averages their per-instruction
    metric; the interval is the ``alpha/2`` and ``1 - alpha/2`` quantiles of the replicates.

    Args:
      scores_by_instruction: instruction id -> its N run scores.
      metric: one of ``METRICS`` ("P", "A90", "U90_10").
      n_boot: number of bootstrap replicates.
      alpha: 1 - confidence level.
      seed: seed of the numpy generator.
      scale: as in ``aggregate``.

    Returns:
      ``(lo, hi)`` on the 0-100 scale.
    """
    table, _ = _metric_table(scores_by_instruction, scale)
    return percentile_ci(table[:, _metric_column(metric, n_boot, alpha)], n_boot, alpha, seed)


def paired_bootstrap_ci(
    before: Mapping[str, Sequence[float]],
    after: Mapping[str, Sequence[float]],
    metric: str = "P",
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    scale: float | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``metric(after) - metric(before)``, paired.

    Each replicate draws the instructions both sides hold, with replacement, and averages the
    per-instruction differences, so both sides always see the same instructions.

    Args:
      before, after: instruction id -> its N run scores (the ids both hold are used).
      metric, n_boot, alpha, seed, scale: as in ``bootstrap_ci``.

    Returns:
      ``(lo, hi)`` of the difference on the 0-100 scale.
    """
    common = sorted(set(before) & set(after))
    if not common:
        raise ValueError("paired_bootstrap_ci: no instruction is in both score sets")
    col = _metric_column(metric, n_boot, alpha)
    b, _ = _metric_table({k: before[k] for k in common}, scale)
    a, _ = _metric_table({k: after[k] for k in common}, scale)
    return percentile_ci(a[:, col] - b[:, col], n_boot, alpha, seed)


def _metric_column(metric: str, n_boot: int, alpha: float) -> int:
    """The column of `metric` in the metric table, after checking the bootstrap settings."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")
    if n_boot < 1 or not 0 < alpha < 1:
        raise ValueError(f"bootstrap_ci: need n_boot >= 1 and 0 < alpha < 1, got {n_boot}, {alpha}")
    return METRICS.index(metric)


def percentile_ci(values: np.ndarray, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` [I]: `n_boot` resamples of its entries
    with replacement, the ``alpha/2`` and ``1 - alpha/2`` quantiles of their means."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(n_boot, values.size))  # [B, I]
    return percentile_interval(values[idx].mean(axis=1), alpha)


def percentile_interval(replicates: np.ndarray, alpha: float = 0.05) -> tuple[float, float]:
    """The ``alpha/2`` and ``1 - alpha/2`` quantiles of bootstrap `replicates` [B] (`percentile_ci`'s interval)."""
    lo, hi = np.percentile(replicates, [100 * alpha / 2, 100 * (1 - alpha / 2)], method=PERCENTILE_METHOD)
    return float(lo), float(hi)


def first_answer_turn_stats(turns: Sequence[int | None]) -> dict:
    """Statistics of the turn at which each conversation first gave an answer attempt.

    Args:
      turns: per conversation, the 1-based turn of the first answer attempt, or None if the
        model never answered.

    Returns:
      ``{"n", "n_answered", "mean", "median"}`` (mean and median over answered conversations,
      nan if none), ``"histogram"`` (turn -> count, ascending turns) and ``"frac_never"``.
    """
    if len(turns) == 0:
        raise ValueError("first_answer_turn_stats: no conversations")
    answered = []
    for i, turn in enumerate(turns):
        if turn is None:
            continue
        if isinstance(turn, bool) or not isinstance(turn, (int, np.integer)) or turn < 1:
            raise ValueError(f"first_answer_turn_stats: turns[{i}]={turn!r} is not a turn >= 1")
        answered.append(int(turn))
    hist: dict[int, int] = {}
    for turn in sorted(answered):
        hist[turn] = hist.get(turn, 0) + 1
    nan = float("nan")
    return {
        "n": len(turns),
        "n_answered": len(answered),
        "mean": float(np.mean(answered)) if answered else nan,
        "median": float(np.median(answered)) if answered else nan,
        "histogram": hist,
        "frac_never": (len(turns) - len(answered)) / len(turns),
    }


def last_reply_correct(rec: Mapping[str, Any]) -> float:
    """Strict correctness (0/1) of a conversation's last reply; 0 for a conversation without turns."""
    if not rec["turns"]:
        return 0.0
    last = rec["turns"][-1]
    return float(last.get("correct_strict", last.get("correct", 0.0)))


def scores_by_task(records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per instruction, in run order: the conversations' scores and their last replies' strict correctness."""
    by_task: dict[str, list[float]] = defaultdict(list)
    last_by_task: dict[str, list[float]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: (r["task_id"], r["run"])):
        by_task[rec["task_id"]].append(float(rec["score"]))
        last_by_task[rec["task_id"]].append(last_reply_correct(rec))
    return by_task, last_by_task
