"""Per-turn credit assignment over whole conversations (jaxrl_mt.rl.conv_credit), values worked by hand.

The example (issue 55): U = 2 problems, G = 3 conversations each, up to T = 3 turns.

    row  problem  turns  rewards
    c0   0        3      [ 1.0,  1.0,  1.0]
    c1   0        2      [ 1.0,  0.5]
    c2   0        3      [ 1.0, -0.5, -0.5]
    c3   1        1      [ 1.0]
    c4   1        3      [ 0.3,  0.2, -0.5]
    c5   1        2      [ 0.0, -1.0]

Turn 2 of problem 0 is reached by two conversations (c0, c2), turn 2 of problem 1 by one (c4).
grpo.group_advantages' std is unbiased (ddof = 1) and its eps is 1e-4; the expected values use both.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.rl import conv_credit, grpo

G = 3
EPS = 1e-4
PER_TURN = [
    [1.0, 1.0, 1.0],
    [1.0, 0.5],
    [1.0, -0.5, -0.5],
    [1.0],
    [0.3, 0.2, -0.5],
    [0.0, -1.0],
]


@pytest.fixture
def example() -> tuple[np.ndarray, np.ndarray]:
    return conv_credit.turn_matrix(PER_TURN)


def test_grpo_conventions_used_here():
    # The hand values below assume grpo's ddof = 1 and eps = 1e-4: returns 1, 0, -1 -> std 1 (ddof 1).
    adv = np.asarray(grpo.group_advantages(jnp.asarray([1.0, 0.0, -1.0]), 3))
    np.testing.assert_allclose(adv, [1 / (1 + EPS), 0.0, -1 / (1 + EPS)], rtol=1e-6)
    assert conv_credit.EPS == EPS and conv_credit.DDOF == 1


def test_turn_matrix(example):
    rewards, mask = example
    np.testing.assert_array_equal(
        mask,
        [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]],
    )
    np.testing.assert_array_equal(
        rewards,
        [[1, 1, 1], [1, 0.5, 0], [1, -0.5, -0.5], [1, 0, 0], [0.3, 0.2, -0.5], [0, -1, 0]],
    )
    wide_r, wide_m = conv_credit.turn_matrix([[1.0], [2.0, 3.0]], T=4)
    np.testing.assert_array_equal(wide_r, [[1, 0, 0, 0], [2, 3, 0, 0]])
    np.testing.assert_array_equal(wide_m, [[1, 0, 0, 0], [1, 1, 0, 0]])
    assert wide_m.dtype == np.bool_


def test_discounted_returns_gamma_1(example):
    rewards, mask = example
    # reward-to-go, summed from the back:
    # c0: G2 = 1, G1 = 1 + 1 = 2, G0 = 1 + 2 = 3
    # c1: G1 = 0.5, G0 = 1 + 0.5 = 1.5, G2 = 0 (no turn 2)
    # c2: G2 = -0.5, G1 = -0.5 - 0.5 = -1, G0 = 1 - 1 = 0
    # c3: G0 = 1
    # c4: G2 = -0.5, G1 = 0.2 - 0.5 = -0.3, G0 = 0.3 - 0.3 = 0
    # c5: G1 = -1, G0 = 0 - 1 = -1
    expected = [[3, 2, 1], [1.5, 0.5, 0], [0, -1, -0.5], [1, 0, 0], [0, -0.3, -0.5], [-1, -1, 0]]
    np.testing.assert_allclose(conv_credit.discounted_returns(rewards, mask, 1.0), expected, atol=1e-12)


def test_discounted_returns_gamma_half(example):
    rewards, mask = example
    # G_k = r_k + 0.5 * G_{k+1}:
    # c0: G2 = 1, G1 = 1 + 0.5 = 1.5, G0 = 1 + 0.75 = 1.75
    # c1: G1 = 0.5, G0 = 1 + 0.25 = 1.25
    # c2: G2 = -0.5, G1 = -0.5 - 0.25 = -0.75, G0 = 1 - 0.375 = 0.625
    # c3: G0 = 1
    # c4: G2 = -0.5, G1 = 0.2 - 0.25 = -0.05, G0 = 0.3 - 0.025 = 0.275
    # c5: G1 = -1, G0 = 0 - 0.5 = -0.5
    expected = [[1.75, 1.5, 1], [1.25, 0.5, 0], [0.625, -0.75, -0.5], [1, 0, 0], [0.275, -0.05, -0.5], [-0.5, -1, 0]]
    np.testing.assert_allclose(conv_credit.discounted_returns(rewards, mask, 0.5), expected, atol=1e-12)


def test_discounted_returns_gamma_0_is_the_turn_reward(example):
    rewards, mask = example
    np.testing.assert_array_equal(conv_credit.discounted_returns(rewards, mask, 0.0), rewards)


def test_trajectory_advantages_unscaled(example):
    rewards, mask = example
    # returns R (gamma 1): problem 0: 3, 1.5, 0 -> mean 1.5 -> 1.5, 0, -1.5
    #                      problem 1: 1, 0, -1 -> mean 0 -> 1, 0, -1
    # every existing turn of a conversation gets its A_c, padding 0
    expected = [[1.5, 1.5, 1.5], [0, 0, 0], [-1.5, -1.5, -1.5], [1, 0, 0], [0, 0, 0], [-1, -1, 0]]
    adv = conv_credit.trajectory_advantages(rewards, mask, G, scale_rewards=False)
    np.testing.assert_allclose(adv, expected, atol=1e-12)


def test_trajectory_advantages_scaled(example):
    rewards, mask = example
    # problem 0: deviations 1.5, 0, -1.5 -> std (ddof 1) = sqrt((2.25 + 0 + 2.25) / 2) = 1.5
    #            (ddof 0 would be sqrt(4.5 / 3) = 1.2247...)
    # problem 1: deviations 1, 0, -1 -> std (ddof 1) = sqrt(2 / 2) = 1 (ddof 0: sqrt(2/3))
    a0 = 1.5 / (1.5 + EPS)
    a1 = 1.0 / (1.0 + EPS)
    expected = [[a0, a0, a0], [0, 0, 0], [-a0, -a0, -a0], [a1, 0, 0], [0, 0, 0], [-a1, -a1, 0]]
    adv = conv_credit.trajectory_advantages(rewards, mask, G)
    np.testing.assert_allclose(adv, expected, rtol=1e-12, atol=1e-12)


def test_trajectory_advantages_discounted(example):
    rewards, mask = example
    # R = G[:, 0] at gamma 0.5: problem 0: 1.75, 1.25, 0.625 (mean 3.625 / 3)
    #                           problem 1: 1, 0.275, -0.5 (mean 0.775 / 3)
    m0, m1 = 3.625 / 3, 0.775 / 3
    a = [1.75 - m0, 1.25 - m0, 0.625 - m0, 1 - m1, 0.275 - m1, -0.5 - m1]
    expected = np.asarray(a)[:, None] * mask
    adv = conv_credit.trajectory_advantages(rewards, mask, G, gamma=0.5, scale_rewards=False)
    np.testing.assert_allclose(adv, expected, atol=1e-12)


def test_turn_advantages_unscaled(example):
    rewards, mask = example
    # reward-to-go (gamma 1) per turn, normalised over the conversations that reached the turn:
    # problem 0, turn 0: 3, 1.5, 0 (mean 1.5)       -> 1.5, 0, -1.5
    #            turn 1: 2, 0.5, -1 (mean 0.5)      -> 1.5, 0, -1.5
    #            turn 2: c0 1, c2 -0.5 (mean 0.25)  -> 0.75, -, -0.75 (c1 has no turn 2)
    # problem 1, turn 0: 1, 0, -1 (mean 0)          -> 1, 0, -1
    #            turn 1: c4 -0.3, c5 -1 (mean -0.65) -> -, 0.35, -0.35
    #            turn 2: c4 only (mean -0.5)        -> -, 0, - (nothing to compare with)
    expected = [[1.5, 1.5, 0.75], [0, 0, 0], [-1.5, -1.5, -0.75], [1, 0, 0], [0, 0.35, 0], [-1, -0.35, 0]]
    adv = conv_credit.turn_advantages(rewards, mask, G, scale_rewards=False)
    np.testing.assert_allclose(adv, expected, atol=1e-12)


def test_turn_advantages_scaled(example):
    rewards, mask = example
    # std (ddof 1) of each turn's present reward-to-go:
    # problem 0 turn 0 and turn 1: deviations 1.5, 0, -1.5 -> sqrt(4.5 / 2) = 1.5
    #           turn 2 (two reached it): deviations 0.75, -0.75 -> sqrt(2 * 0.5625 / 1) = 0.75 * sqrt(2)
    # problem 1 turn 0: deviations 1, 0, -1 -> 1
    #           turn 1 (two): deviations 0.35, -0.35 -> 0.35 * sqrt(2)
    #           turn 2 (one): std 0 and deviation 0 -> 0
    a00 = 1.5 / (1.5 + EPS)
    a02 = 0.75 / (0.75 * math.sqrt(2) + EPS)  # ~ 1 / sqrt(2)
    a10 = 1.0 / (1.0 + EPS)
    a11 = 0.35 / (0.35 * math.sqrt(2) + EPS)
    expected = [
        [a00, a00, a02],
        [0, 0, 0],
        [-a00, -a00, -a02],
        [a10, 0, 0],
        [0, a11, 0],
        [-a10, -a11, 0],
    ]
    adv = conv_credit.turn_advantages(rewards, mask, G)
    np.testing.assert_allclose(adv, expected, rtol=1e-12, atol=1e-12)
    assert adv[4, 2] == 0.0  # the lone turn: 0 although its reward-to-go is -0.5


def test_turn_advantages_discounted(example):
    rewards, mask = example
    # reward-to-go at gamma 0.5 (see test_discounted_returns_gamma_half):
    # problem 0, turn 0: 1.75, 1.25, 0.625 (mean 3.625 / 3)
    #            turn 1: 1.5, 0.5, -0.75 (mean 1.25 / 3)
    #            turn 2: c0 1, c2 -0.5 (mean 0.25) -> 0.75, -0.75
    # problem 1, turn 0: 1, 0.275, -0.5 (mean 0.775 / 3)
    #            turn 1: c4 -0.05, c5 -1 (mean -0.525) -> 0.475, -0.475
    #            turn 2: c4 alone -> 0
    m00, m01, m10 = 3.625 / 3, 1.25 / 3, 0.775 / 3
    expected = [
        [1.75 - m00, 1.5 - m01, 0.75],
        [1.25 - m00, 0.5 - m01, 0],
        [0.625 - m00, -0.75 - m01, -0.75],
        [1 - m10, 0, 0],
        [0.275 - m10, 0.475, 0],
        [-0.5 - m10, -0.475, 0],
    ]
    adv = conv_credit.turn_advantages(rewards, mask, G, gamma=0.5, scale_rewards=False)
    np.testing.assert_allclose(adv, expected, atol=1e-12)


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_first_turn_of_turn_credit_is_trajectory_credit(example, scale, gamma):
    # every conversation has turn 0, and G[c, 0] = R_c: the two agree on column 0
    rewards, mask = example
    turn = conv_credit.turn_advantages(rewards, mask, G, gamma=gamma, scale_rewards=scale)
    traj = conv_credit.trajectory_advantages(rewards, mask, G, gamma=gamma, scale_rewards=scale)
    np.testing.assert_allclose(turn[:, 0], traj[:, 0], atol=1e-12)


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("group_size", [1, 3])
def test_single_turn_parity_with_grpo(scale, group_size):
    # T = 1 for every row: both credits are grpo.group_advantages on the same rewards
    # (the third group is all equal: std 0 -> advantages 0)
    r = np.asarray([1.0, 0.3, -0.5, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    rewards, mask = conv_credit.turn_matrix([[x] for x in r])
    ref = np.asarray(grpo.group_advantages(jnp.asarray(r, jnp.float32), group_size, scale_rewards=scale))
    for fn in (conv_credit.turn_advantages, conv_credit.trajectory_advantages):
        adv = fn(rewards, mask, group_size, scale_rewards=scale)
        assert adv.shape == (9, 1)
        np.testing.assert_allclose(adv[:, 0], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("gamma", [1.0, 0.5, 0.0])
def test_masked_positions_get_zero_and_padding_is_ignored(example, scale, gamma):
    rewards, mask = example
    junk = np.where(mask, rewards, np.nan)  # NaN padding
    junk[1, 2], junk[3, 1] = 1e6, -7.0  # and large values
    for fn in (conv_credit.turn_advantages, conv_credit.trajectory_advantages):
        clean = fn(rewards, mask, G, gamma=gamma, scale_rewards=scale)
        dirty = fn(junk, mask, G, gamma=gamma, scale_rewards=scale)
        np.testing.assert_array_equal(dirty, clean)
        assert np.all(dirty[~mask] == 0.0)
    returns = conv_credit.discounted_returns(junk, mask, gamma)
    assert np.all(returns[~mask] == 0.0) and np.all(np.isfinite(returns))


def test_advantages_dispatch(example):
    rewards, mask = example
    for credit, fn in (("trajectory", conv_credit.trajectory_advantages), ("turn", conv_credit.turn_advantages)):
        got = conv_credit.advantages(rewards, mask, G, credit=credit, gamma=0.5, scale_rewards=False)
        np.testing.assert_array_equal(got, fn(rewards, mask, G, gamma=0.5, scale_rewards=False))
    with pytest.raises(ValueError, match="unknown credit 'token'; valid: trajectory, turn"):
        conv_credit.advantages(rewards, mask, G, credit="token", gamma=1.0, scale_rewards=True)


def _bad(example, **change):
    rewards, mask = example
    args = {"rewards": rewards, "mask": mask, "group_size": G, "gamma": 1.0} | change
    return args


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mask": np.ones((6, 2), bool)}, r"must both be \[C, T\]"),
        ({"rewards": np.zeros(6), "mask": np.ones(6, bool)}, r"must both be \[C, T\]"),
        ({"group_size": 4}, "C=6 is not a multiple of group_size=4"),
        ({"group_size": 0}, "not a multiple of group_size=0"),
        ({"mask": np.array([[1, 0, 1]] + [[1, 1, 1]] * 5, bool)}, "mask row 0 is not a prefix"),
        ({"mask": np.array([[1, 1, 1]] * 5 + [[0, 0, 0]], bool)}, "at least one turn"),
        ({"mask": np.full((6, 3), 2)}, "mask must be boolean"),
        ({"gamma": -0.1}, r"gamma must be in \[0, 1\]"),
        ({"gamma": 1.5}, r"gamma must be in \[0, 1\]"),
        ({"gamma": float("nan")}, r"gamma must be in \[0, 1\]"),
        ({"rewards": np.full((6, 3), np.inf)}, "rewards must be finite"),
    ],
)
def test_invalid_inputs(example, change, message):
    args = _bad(example, **change)
    for fn in (conv_credit.trajectory_advantages, conv_credit.turn_advantages):
        with pytest.raises(ValueError, match=message):
            fn(args["rewards"], args["mask"], args["group_size"], gamma=args["gamma"])
    if "group_size" not in change:
        with pytest.raises(ValueError, match=message):
            conv_credit.discounted_returns(args["rewards"], args["mask"], args["gamma"])


@pytest.mark.parametrize(
    "per_turn, T, message",
    [
        ([], None, "no conversations"),
        ([[1.0], []], None, "conversation 1 has no turns"),
        ([[1.0, 2.0, 3.0]], 2, "3 turns, more than T=2"),
        ([[1.0, float("nan")]], None, "must be finite"),
    ],
)
def test_turn_matrix_errors(per_turn, T, message):
    with pytest.raises(ValueError, match=message):
        conv_credit.turn_matrix(per_turn, T)
