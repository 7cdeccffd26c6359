"""Tests of the LiC metrics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from jaxrl_mt.eval.metrics import (
    PERCENTILE_METHOD,
    aggregate,
    bootstrap_ci,
    paired_bootstrap_ci,
    first_answer_turn_stats,
    instruction_metrics,
    lic_ratio,
)


def binary(n_ones: int, n: int = 10) -> list[float]:
    return [1.0] * n_ones + [0.0] * (n - n_ones)


def test_percentile_method():
    assert PERCENTILE_METHOD == "linear"


# Linear percentiles of N = 10 sorted values x[0..9] (0-100 scale): the q-th percentile sits at
# position q/100 * 9, so p90 is at 8.1 -> x[8] + 0.1 * (x[9] - x[8]) and p10 at 0.9 ->
# x[0] + 0.9 * (x[1] - x[0]).
@pytest.mark.parametrize(
    "n_ones, p, a90, u90_10",
    [
        # 3 ones: x = [0]*7 + [100]*3. p90 = x[8] + 0.1*(x[9]-x[8]) = 100 + 0.1*0 = 100;
        # p10 = x[0] + 0.9*(x[1]-x[0]) = 0. U = 100 - 0 = 100.
        (3, 30.0, 100.0, 100.0),
        # 1 one: x = [0]*9 + [100]. p90 = x[8] + 0.1*(x[9]-x[8]) = 0 + 0.1*100 = 10 (interpolated;
        # "lower" or "nearest" would give 0); p10 = 0. U = 10.
        (1, 10.0, 10.0, 10.0),
        # 9 ones: x = [0] + [100]*9. p10 = x[0] + 0.9*(x[1]-x[0]) = 0 + 0.9*100 = 90; p90 = 100.
        # U = 100 - 90 = 10.
        (9, 90.0, 100.0, 10.0),
        # 2 ones: x = [0]*8 + [100]*2. p90 = x[8] + 0.1*0 = 100; p10 = 0. U = 100.
        (2, 20.0, 100.0, 100.0),
        (0, 0.0, 0.0, 0.0),
        (10, 100.0, 100.0, 0.0),
    ],
)
def test_instruction_metrics_binary_ten_runs(n_ones, p, a90, u90_10):
    m = instruction_metrics(binary(n_ones))
    assert m == {"P": pytest.approx(p), "A90": pytest.approx(a90),
                 "U90_10": pytest.approx(u90_10), "n": 10}


def test_instruction_metrics_continuous():
    # Sorted 0-100: [20, 40, 50, 90, 100], N = 5, positions at q/100 * 4.
    # p90 at 3.6 -> 90 + 0.6 * (100 - 90) = 96; p10 at 0.4 -> 20 + 0.4 * (40 - 20) = 28.
    # P = (20 + 40 + 50 + 90 + 100) / 5 = 300 / 5 = 60; U = 96 - 28 = 68.
    expected = {"P": pytest.approx(60.0), "A90": pytest.approx(96.0),
                "U90_10": pytest.approx(68.0), "n": 5}
    assert instruction_metrics([0.2, 0.5, 0.9, 0.4, 1.0]) == expected
    assert instruction_metrics([20, 50, 90, 40, 100]) == expected  # 0-100 input, detected
    assert instruction_metrics([20, 50, 90, 40, 100], scale=1) == expected


def test_instruction_metrics_scale_override_and_errors():
    # Scores 0/1 on a 0-100 scale: scale=1 keeps them as 0 and 1 points.
    assert instruction_metrics([0, 1], scale=1)["P"] == pytest.approx(0.5)
    assert instruction_metrics([0, 1])["P"] == pytest.approx(50.0)
    with pytest.raises(ValueError, match="outside"):
        instruction_metrics([0.5, 101])
    with pytest.raises(ValueError, match="outside"):
        instruction_metrics([-0.1])
    with pytest.raises(ValueError, match="non-empty"):
        instruction_metrics([])
    with pytest.raises(ValueError, match="scale"):
        instruction_metrics([1.0], scale=10)


def test_aggregate_means_over_instructions():
    scores = {"a": binary(3), "b": binary(1), "c": binary(9)}
    result = aggregate(scores)
    # P = (30 + 10 + 90) / 3; A90 = (100 + 10 + 100) / 3 = 70; U = (100 + 10 + 10) / 3 = 40.
    assert result == {
        "P": pytest.approx(130 / 3), "A90": pytest.approx(70.0), "U90_10": pytest.approx(40.0),
        "n_instructions": 3, "n_runs": 30,
    }


def test_aggregate_unequal_runs_and_shared_scale():
    # The scale is detected over all scores: one instruction above 1 puts all on 0-100.
    result = aggregate({"a": [0, 1], "b": [50, 100, 100]})
    # a: P 0.5, p90 = 0 + 0.9 * 1 = 0.9, p10 = 0.1 -> U 0.8.
    # b: sorted [50, 100, 100]: P 250/3; p90 at 1.8 -> 100; p10 at 0.2 -> 50 + 0.2*50 = 60; U 40.
    assert result["P"] == pytest.approx((0.5 + 250 / 3) / 2)
    assert result["A90"] == pytest.approx((0.9 + 100) / 2)
    assert result["U90_10"] == pytest.approx((0.8 + 40) / 2)
    assert result["n_runs"] == 5
    with pytest.raises(ValueError, match="no instructions"):
        aggregate({})
    with pytest.raises(ValueError, match="instruction 'x'"):
        aggregate({"x": [2.0, -1.0]})


def test_lic_ratio():
    assert lic_ratio(30.0, 60.0) == 0.5
    assert lic_ratio(0.0, 60.0) == 0.0
    assert math.isnan(lic_ratio(10.0, 0.0))
    with pytest.raises(ValueError, match="p_full"):
        lic_ratio(1.0, -1.0)
    with pytest.raises(ValueError, match="p_scenario"):
        lic_ratio(float("nan"), 1.0)


def test_bootstrap_two_point_distribution():
    # Two instructions with P 0 and 100: a replicate mean is 0, 50 or 100 with probability
    # 1/4, 1/2, 1/4, so the 2.5% and 97.5% quantiles of 4000 replicates are 0 and 100.
    scores = {"zero": binary(0), "full": binary(10)}
    assert bootstrap_ci(scores, "P", n_boot=4000) == (0.0, 100.0)


def test_paired_bootstrap_by_hand():
    # after - before per instruction: +100 on "a", 0 on "b" (the extra "only" is not in both: ignored).
    # A replicate's mean difference is 0, 50 or 100 with probability 1/4, 1/2, 1/4 -> (0, 100).
    before = {"a": binary(0), "b": binary(10), "only": binary(0)}
    after = {"a": binary(10), "b": binary(10)}
    assert paired_bootstrap_ci(before, after, "P", n_boot=4000) == (0.0, 100.0)
    # the same shift on every instruction is a certain +20, however different the instructions are;
    # unpaired intervals of the two sides would overlap widely
    rng = np.random.default_rng(0)
    base = {f"i{k}": (rng.random(10) < rng.random()).astype(float).tolist() for k in range(20)}
    shifted = {k: [1.0 if j < 2 else x for j, x in enumerate(sorted(v))] for k, v in base.items()}
    diffs = [100 * (np.mean(shifted[k]) - np.mean(base[k])) for k in base]
    lo, hi = paired_bootstrap_ci(base, shifted, "P", scale=100)
    assert min(diffs) <= lo <= np.mean(diffs) <= hi <= max(diffs)
    assert paired_bootstrap_ci(base, base, "P", scale=100) == (0.0, 0.0)
    with pytest.raises(ValueError, match="no instruction"):
        paired_bootstrap_ci({"x": binary(1)}, {"y": binary(1)})
    with pytest.raises(ValueError, match="unknown metric"):
        paired_bootstrap_ci(before, after, "Q")


def test_bootstrap_constant_and_deterministic():
    scores = {f"i{k}": binary(3) for k in range(5)}
    assert bootstrap_ci(scores, "P") == pytest.approx((30.0, 30.0))
    assert bootstrap_ci(scores, "U90_10") == pytest.approx((100.0, 100.0))
    rng = np.random.default_rng(1)
    varied = {f"i{k}": rng.random(10).tolist() for k in range(30)}
    assert bootstrap_ci(varied, seed=3) == bootstrap_ci(varied, seed=3)
    assert bootstrap_ci(varied, seed=3) != bootstrap_ci(varied, seed=4)
    lo, hi = bootstrap_ci(varied, "A90")
    assert lo <= aggregate(varied)["A90"] <= hi


def test_bootstrap_matches_scipy_percentile_bootstrap():
    rng = np.random.default_rng(0)
    scores = {f"i{k}": rng.random(8).tolist() for k in range(40)}
    per_instruction_p = [100 * np.mean(v) for v in scores.values()]
    ref = scipy.stats.bootstrap(
        (per_instruction_p,), np.mean, n_resamples=20000, confidence_level=0.9,
        method="percentile", rng=np.random.default_rng(0),
    ).confidence_interval
    lo, hi = bootstrap_ci(scores, "P", n_boot=20000, alpha=0.1)
    # Same estimator, different random draws: agreement to Monte-Carlo error (~0.1 points).
    assert lo == pytest.approx(ref.low, abs=0.3)
    assert hi == pytest.approx(ref.high, abs=0.3)


def test_bootstrap_errors():
    with pytest.raises(ValueError, match="'Q'"):
        bootstrap_ci({"a": [1.0]}, metric="Q")
    with pytest.raises(ValueError, match="alpha"):
        bootstrap_ci({"a": [1.0]}, alpha=1.5)


def test_first_answer_turn_stats():
    stats = first_answer_turn_stats([1, 2, 2, None, 4, None])
    assert stats == {
        "n": 6,
        "n_answered": 4,
        "mean": pytest.approx(2.25),  # (1 + 2 + 2 + 4) / 4
        "median": pytest.approx(2.0),  # median of [1, 2, 2, 4]
        "histogram": {1: 1, 2: 2, 4: 1},
        "frac_never": pytest.approx(2 / 6),
    }
    assert list(stats["histogram"]) == [1, 2, 4]


def test_first_answer_turn_stats_edge_cases():
    never = first_answer_turn_stats([None, None])
    assert math.isnan(never["mean"]) and math.isnan(never["median"])
    assert never["frac_never"] == 1.0 and never["histogram"] == {}
    assert first_answer_turn_stats([np.int64(3)])["mean"] == 3.0
    with pytest.raises(ValueError, match=r"turns\[1\]=0"):
        first_answer_turn_stats([1, 0])
    with pytest.raises(ValueError, match=r"turns\[0\]=2.5"):
        first_answer_turn_stats([2.5])
    with pytest.raises(ValueError, match="no conversations"):
        first_answer_turn_stats([])
