"""Seeds of a training arm: grouping ``<arm>_s<N>`` models, the two-level bootstrap, mean curves."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import analysis as A
from experiments import seeds as S

ISSUE35 = ["base", "rlsta_s0", "rlsta_s1", "rlsta_s2", "grpo_s0", "grpo_s1", "grpo_s2", "grpo_full_s0", "rlsta_nv_s0",
           "sft_s0", "sedt"]


def _scores(rows: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """model -> task ("p0", "p1", ...) -> score, from a row of scores per model."""
    return {m: {f"p{i}": float(v) for i, v in enumerate(row)} for m, row in rows.items()}


def test_seed_groups_and_units() -> None:
    assert S.seed_groups(ISSUE35) == {"rlsta": ["rlsta_s0", "rlsta_s1", "rlsta_s2"],
                                      "grpo": ["grpo_s0", "grpo_s1", "grpo_s2"]}  # grpo_full_s0: one seed
    assert S.units(ISSUE35) == [("base", ["base"]), ("rlsta_s*", ["rlsta_s0", "rlsta_s1", "rlsta_s2"]),
                                ("grpo_s*", ["grpo_s0", "grpo_s1", "grpo_s2"]), ("grpo_full_s0", ["grpo_full_s0"]),
                                ("rlsta_nv_s0", ["rlsta_nv_s0"]), ("sft_s0", ["sft_s0"]), ("sedt", ["sedt"])]
    assert S.seed_groups(["base", "grpo_exp", "rlsta_exp", "rlsta_a05"]) == {}


def test_one_seed_is_the_one_level_bootstrap() -> None:
    rng = np.random.default_rng(7)
    a = _scores({"a_s0": rng.integers(0, 2, 30).tolist()})
    b = _scores({"b_s0": rng.integers(0, 2, 30).tolist()})
    got, one = S.bootstrap_seeds(a, n_boot=400, seed=3), A.bootstrap_mean(a["a_s0"], n_boot=400, seed=3)
    assert (got["mean"], got["lo"], got["hi"], got["n"]) == (one["mean"], one["lo"], one["hi"], one["n"])
    assert got["lo"] < got["mean"] < got["hi"] and got["n_seeds"] == 1 and math.isnan(got["std"])
    d = S.bootstrap_seeds_diff(a, b, n_boot=400, seed=3)
    p = A.bootstrap_paired(a["a_s0"], b["b_s0"], n_boot=400, seed=3)
    assert d["lo"] < d["hi"] and d["n"] == 30 and d["n_seeds"] == [1, 1]
    for k in ("diff", "lo", "hi"):
        assert d[k] == pytest.approx(p[k], abs=1e-12)


def test_two_seeds_two_problems_by_hand() -> None:
    """Seed 0 scores [1, 0], seed 1 [1, 1]. Problems (p0, p0): every seed 1 -> 1; (p1, p1): seeds
    (0, 0) -> 0, (1, 1) -> 1, mixed -> 0.5; p0 and p1: seed 0 twice -> 0.5, seed 1 twice -> 1, mixed ->
    0.75. So a replicate is 0 with probability 1/4 * 1/4, 0.5 with 1/4 * 1/2 + 1/2 * 1/4, 0.75 with
    1/2 * 1/2 and 1 with the rest (7/16): the 2.5% and 97.5% quantiles are 0 and 1."""
    s = _scores({"a_s0": [1, 0], "a_s1": [1, 1]})
    got = S.bootstrap_seeds(s, n_boot=4000, seed=0)
    assert got["mean"] == 0.75 and got["seeds"] == {"a_s0": 0.5, "a_s1": 1.0} and got["n"] == 2
    assert got["std"] == pytest.approx(math.sqrt(0.125))  # sample sd of 0.5 and 1
    assert (got["lo"], got["hi"]) == (0.0, 1.0)
    reps = S.two_level_replicates([(1.0, np.array([[1.0, 0.0], [1.0, 1.0]]))], 20000, 1)
    values, counts = np.unique(reps, return_counts=True)
    assert values.tolist() == [0.0, 0.5, 0.75, 1.0]
    assert counts / reps.size == pytest.approx([1 / 16, 1 / 4, 1 / 4, 7 / 16], abs=0.012)
    # one level over the seed-averaged scores [1, 0.5] only reaches 0.5, never 0
    assert A.bootstrap_mean({"p0": 1.0, "p1": 0.5}, n_boot=4000)["lo"] == 0.5


def test_a_difference_whose_seeds_disagree_is_wider_than_the_one_level_ci() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, 60).astype(float)  # the single model
    y = np.clip(x + (rng.random(60) < 0.3), 0, 1)  # an arm that fixes about 30% of the problems
    base = _scores({"base": x})
    agree = _scores({"a_s0": y, "a_s1": y})
    disagree = _scores({"a_s0": y, "a_s1": x})  # seed 1 learned nothing
    avg = {t: (disagree["a_s0"][t] + disagree["a_s1"][t]) / 2 for t in disagree["a_s0"]}
    one = A.bootstrap_paired(base["base"], avg, n_boot=1000)
    two = S.bootstrap_seeds_diff(base, disagree, n_boot=1000)
    assert two["diff"] == pytest.approx(one["diff"]) and two["n_seeds"] == [1, 2]
    assert two["lo"] < one["lo"] and two["hi"] > one["hi"]
    assert two["lo"] == 0.0 and not two["excludes_zero"]  # both seeds drawn as seed 1 (1/4): no gain at all
    assert one["excludes_zero"]
    same = S.bootstrap_seeds_diff(base, agree, n_boot=1000)  # identical seeds: nothing to add
    ref = A.bootstrap_paired(base["base"], agree["a_s0"], n_boot=1000)
    assert (same["lo"], same["hi"]) == pytest.approx((ref["lo"], ref["hi"]), abs=1e-12)


def test_arms_with_different_problems_use_the_common_ones() -> None:
    a = {"a_s0": {"p0": 1.0, "p1": 0.0, "p2": 1.0}, "a_s1": {"p0": 0.0, "p1": 0.0}}
    got = S.bootstrap_seeds(a, n_boot=50)
    assert got["n"] == 2 and got["seeds"] == {"a_s0": 0.5, "a_s1": 0.0} and got["mean"] == 0.25
    d = S.bootstrap_seeds_diff({"b": {"p1": 1.0, "p2": 1.0}}, a, n_boot=50)
    assert d["n"] == 1 and d["diff"] == -1.0  # p1 only: 0 - 1
    assert S.bootstrap_seeds_diff({"b": {"q": 1.0}}, a)["n"] == 0


def test_mean_curve_at_the_common_steps() -> None:
    assert S.mean_curve([[[0, 0.0], [12, 0.1], [24, 0.2]], [[0, 0.1], [12, 0.3]]]) == [[0, 0.05], [12, 0.2]]
    assert S.mean_curve([[[0, 0.5]]]) == [[0, 0.5]] and S.mean_curve([]) == []


def test_seeds_section_groups_pairs_and_curves() -> None:
    cols = {"full": [1, 0, 1, 1], "multi": [0, 0, 1, 0]}
    scores = {m: {k: {f"p{i}": float(v) for i, v in enumerate(row)} for k, row in cols.items()}
              for m in ("base", "a_s0", "a_s1", "b")}
    scores["a_s1"]["full"] = {"p0": 0.0, "p1": 0.0, "p2": 1.0, "p3": 1.0}
    runs = {"a_s0": {"curves": {"probe/multi_turn_strict": [[0, 0.0], [12, 0.5]]}},
            "a_s1": {"curves": {"probe/multi_turn_strict": [[0, 0.25], [12, 0.25]], "train/kl": [[1, 0.1]]}}}
    got = S.seeds_section(scores, ["base", "a_s0", "a_s1", "b"], runs, ["probe/multi_turn_strict", "eval/x"],
                          n_boot=100, seed=0)
    g = got["groups"]["a"]
    assert g["models"] == ["a_s0", "a_s1"] and g["curve_runs"] == ["a_s0", "a_s1"]
    assert g["strict"]["full"]["seeds"] == {"a_s0": 0.75, "a_s1": 0.5} and g["strict"]["full"]["mean"] == 0.625
    assert g["curves"] == {"probe/multi_turn_strict": [[0, 0.125], [12, 0.375]]}  # eval/x: logged by no run
    assert list(got["pairs"]) == ["a_s* - base", "b - a_s*"]  # b - base has no arm: the model pairs hold it
    assert got["pairs"]["a_s* - base"]["full"]["diff"] == -0.125 and got["pairs"]["b - a_s*"]["multi"]["diff"] == 0
    assert S.seeds_section(scores, ["base", "a_s0", "b"], runs, [], n_boot=10, seed=0) == {}
