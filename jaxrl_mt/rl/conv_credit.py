"""Per-turn credit assignment for RL over whole conversations (issue 55, item 3).

Pure NumPy functions of ``[C, T]`` arrays; nothing here knows about models or tokens. A step has
``U`` problems with ``G`` conversations each (a group): conversation ``c`` of problem ``u`` is row
``u * G + c``, so ``C = U * G``. Conversation ``c`` has ``n_c`` assistant turns
(``1 <= n_c <= T``); turn ``k`` has a scalar reward ``rewards[c, k]``, and ``mask[c, :n_c]`` is
True (turns are a prefix of the row). Values of ``rewards`` where ``mask`` is False are ignored.

Two ways to turn the rewards into advantages, both normalised inside each group the way
:func:`jaxrl_mt.rl.grpo.group_advantages` does (mean over the group, unbiased ``ddof=1`` std,
``eps = 1e-4`` added to the std, division only under ``scale_rewards``; a set of one has std 0):

* ``"trajectory"``: one advantage per conversation, from its discounted return from the first
  turn, given to every turn of the conversation.
* ``"turn"``: per-turn GRPO (verl PR #6797): turn ``k``'s reward-to-go normalised over the
  group's conversations that reached turn ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CREDIT_MODES = ("trajectory", "turn")
EPS = 1e-4  # grpo.group_advantages' default eps (TRL's 1e-4)
DDOF = 1  # grpo.group_advantages' std: unbiased, as TRL's nanstd


def _check(rewards: np.ndarray, mask: np.ndarray, gamma: float, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``rewards [C, T]`` / ``mask [C, T]`` / ``gamma``; return float64 rewards (0 off mask), bool mask.

    Raises:
      ValueError: shapes differ or are not 2-D, a row of ``mask`` is not a non-empty prefix,
        ``gamma`` is outside [0, 1], or a reward under ``mask`` is not finite.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    mask = np.asarray(mask)
    if rewards.ndim != 2 or rewards.shape != mask.shape:
        raise ValueError(f"{where}: rewards and mask must both be [C, T], got {rewards.shape} and {mask.shape}")
    if mask.dtype != np.bool_:
        if not np.all((mask == 0) | (mask == 1)):
            raise ValueError(f"{where}: mask must be boolean (or 0/1)")
        mask = mask.astype(bool)
    if np.any(mask[:, 1:] & ~mask[:, :-1]):
        bad = int(np.nonzero(np.any(mask[:, 1:] & ~mask[:, :-1], axis=1))[0][0])
        raise ValueError(f"{where}: mask row {bad} is not a prefix (a turn after a missing one): {mask[bad]}")
    if mask.shape[1] == 0 or not np.all(mask[:, 0]):
        raise ValueError(f"{where}: every conversation needs at least one turn (mask[:, 0] must be True)")
    if not (np.isfinite(gamma) and 0.0 <= gamma <= 1.0):
        raise ValueError(f"{where}: gamma must be in [0, 1], got {gamma}")
    if not np.all(np.isfinite(rewards[mask])):
        raise ValueError(f"{where}: rewards must be finite where mask is True")
    return np.where(mask, rewards, 0.0), mask


def _check_groups(num_rows: int, group_size: int, where: str) -> None:
    """Raise ValueError unless ``group_size >= 1`` divides ``num_rows`` (``C``)."""
    if group_size < 1 or num_rows % group_size != 0:
        raise ValueError(
            f"{where}: the number of conversations C={num_rows} is not a multiple of group_size={group_size}"
        )


def _group_normalise(values: np.ndarray, present: np.ndarray, scale_rewards: bool, eps: float) -> np.ndarray:
    """Normalise ``values [U, G, ...]`` over axis 1 among the ``present`` entries (same shape).

    Mean over the present entries, std with ``ddof=1`` (0 when fewer than two are present, so a
    lone entry gets 0), as :func:`jaxrl_mt.rl.grpo.group_advantages`. Absent entries get 0.
    """
    count = present.sum(axis=1, keepdims=True)  # [U, 1, ...]
    mean = np.where(present, values, 0.0).sum(axis=1, keepdims=True) / np.maximum(count, 1)  # [U, 1, ...]
    dev = np.where(present, values - mean, 0.0)  # [U, G, ...]
    if not scale_rewards:
        return dev
    var = (dev**2).sum(axis=1, keepdims=True) / np.maximum(count - DDOF, 1)  # [U, 1, ...]
    std = np.where(count > DDOF, np.sqrt(var), 0.0)  # [U, 1, ...]
    return dev / (std + eps)  # [U, G, ...]


def _returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """Reward-to-go of checked ``rewards [C, T]`` (0 off the mask, so padding adds nothing)."""
    returns = np.zeros_like(rewards)  # [C, T]
    running = np.zeros(rewards.shape[0])  # [C]
    for k in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, k] + gamma * running
        returns[:, k] = running
    return returns


def discounted_returns(rewards: np.ndarray, mask: np.ndarray, gamma: float) -> np.ndarray:
    """Per-turn discounted reward-to-go.

    Args:
      rewards: ``[C, T]`` reward of turn ``k`` of conversation ``c`` (ignored where ``mask`` is False).
      mask: ``[C, T]`` bool, True for turns that exist; each row a non-empty prefix.
      gamma: discount in [0, 1].

    Returns:
      ``[C, T]`` float64 ``G[c, k] = sum_{j >= k, mask[c, j]} gamma**(j - k) * rewards[c, j]``;
      0 where ``mask`` is False.

    Raises:
      ValueError: for malformed inputs (see the module docstring's conventions).
    """
    rewards, mask = _check(rewards, mask, gamma, "discounted_returns")
    return np.where(mask, _returns(rewards, gamma), 0.0)


def trajectory_advantages(
    rewards: np.ndarray,
    mask: np.ndarray,
    group_size: int,
    *,
    gamma: float = 1.0,
    scale_rewards: bool = True,
    eps: float = EPS,
) -> np.ndarray:
    """Trajectory-level credit: one group-relative advantage per conversation, on all its turns.

    Args:
      rewards: ``[C, T]`` per-turn rewards, ``C = U * group_size``, consecutive groups.
      mask: ``[C, T]`` bool, True for turns that exist; each row a non-empty prefix.
      group_size: ``G``, conversations per problem.
      gamma: discount in [0, 1]; the return is ``R_c = discounted_returns(...)[c, 0]``.
      scale_rewards: divide by the group's std (plus ``eps``), as ``grpo.group_advantages``.
      eps: added to the std before dividing.

    Returns:
      ``[C, T]`` float64: ``A_c = (R_c - mean_group R) / (std_group R + eps)`` (std ``ddof=1``,
      0 for a group of one), or ``R_c - mean_group R`` without ``scale_rewards``, on every turn
      where ``mask`` is True; 0 elsewhere. At ``T = 1`` this is ``grpo.group_advantages``.

    Raises:
      ValueError: for malformed inputs or ``C`` not a multiple of ``group_size``.
    """
    rewards, mask = _check(rewards, mask, gamma, "trajectory_advantages")
    _check_groups(rewards.shape[0], group_size, "trajectory_advantages")
    totals = _returns(rewards, gamma)[:, 0].reshape(-1, group_size)  # [U, G]
    adv = _group_normalise(totals, np.ones_like(totals, dtype=bool), scale_rewards, eps).reshape(-1)  # [C]
    return np.where(mask, adv[:, None], 0.0)  # [C, T]


def turn_advantages(
    rewards: np.ndarray,
    mask: np.ndarray,
    group_size: int,
    *,
    gamma: float = 1.0,
    scale_rewards: bool = True,
    eps: float = EPS,
) -> np.ndarray:
    """Turn-level credit (verl PR #6797's per-turn GRPO): each turn's reward-to-go, group-relative.

    Args:
      rewards: ``[C, T]`` per-turn rewards, ``C = U * group_size``, consecutive groups.
      mask: ``[C, T]`` bool, True for turns that exist; each row a non-empty prefix.
      group_size: ``G``, conversations per problem.
      gamma: discount in [0, 1] of the reward-to-go ``G[c, k]`` (:func:`discounted_returns`).
      scale_rewards: divide by the std (plus ``eps``), as ``grpo.group_advantages``.
      eps: added to the std before dividing.

    Returns:
      ``[C, T]`` float64 ``A[c, k]``: ``G[c, k]`` minus the mean of ``G[., k]`` over the group's
      conversations that have a turn ``k``, divided (under ``scale_rewards``) by their std
      (``ddof=1``) plus ``eps``. A turn index that only one conversation of its group reached
      gets advantage 0: there is nothing to compare it with. 0 where ``mask`` is False.
      At ``T = 1`` this is ``grpo.group_advantages``.

    Raises:
      ValueError: for malformed inputs or ``C`` not a multiple of ``group_size``.
    """
    rewards, mask = _check(rewards, mask, gamma, "turn_advantages")
    _check_groups(rewards.shape[0], group_size, "turn_advantages")
    num_turns = rewards.shape[1]
    to_go = _returns(rewards, gamma).reshape(-1, group_size, num_turns)  # [U, G, T]
    present = mask.reshape(-1, group_size, num_turns)  # [U, G, T]
    return _group_normalise(to_go, present, scale_rewards, eps).reshape(-1, num_turns)  # [C, T]


def advantages(
    rewards: np.ndarray,
    mask: np.ndarray,
    group_size: int,
    *,
    credit: str,
    gamma: float = 1.0,
    scale_rewards: bool = True,
) -> np.ndarray:
    """Per-turn advantages ``[C, T]`` by the chosen credit assignment.

    Args:
      rewards: ``[C, T]`` per-turn rewards; mask: ``[C, T]`` bool prefix mask.
      group_size: ``G``, conversations per problem.
      credit: ``"trajectory"`` (:func:`trajectory_advantages`) or ``"turn"`` (:func:`turn_advantages`).
      gamma: discount in [0, 1].
      scale_rewards: divide by the group std (plus ``eps = 1e-4``).

    Returns:
      ``[C, T]`` float64 advantages, 0 where ``mask`` is False.

    Raises:
      ValueError: for an unknown ``credit`` (naming the valid ones) or malformed inputs.
    """
    if credit == "trajectory":
        return trajectory_advantages(rewards, mask, group_size, gamma=gamma, scale_rewards=scale_rewards)
    if credit == "turn":
        return turn_advantages(rewards, mask, group_size, gamma=gamma, scale_rewards=scale_rewards)
    raise ValueError(f"advantages: unknown credit {credit!r}; valid: {', '.join(CREDIT_MODES)}")


def turn_matrix(per_turn: Sequence[Sequence[float]], T: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Ragged per-conversation turn rewards to padded ``(rewards, mask)``.

    Args:
      per_turn: ``C`` sequences, conversation ``c``'s turn rewards (``1 <= len <= T``).
      T: number of columns; default the longest conversation.

    Returns:
      ``rewards [C, T]`` float64 (0 in the padding) and ``mask [C, T]`` bool (``mask[c, :n_c]``).

    Raises:
      ValueError: no conversations, an empty conversation, one longer than ``T``, or a
        non-finite reward.
    """
    rows = [np.asarray(row, dtype=np.float64).reshape(-1) for row in per_turn]
    if not rows:
        raise ValueError("turn_matrix: per_turn has no conversations")
    lengths = [len(row) for row in rows]
    if min(lengths) < 1:
        raise ValueError(f"turn_matrix: conversation {lengths.index(0)} has no turns")
    width = max(lengths) if T is None else T
    if max(lengths) > width:
        raise ValueError(f"turn_matrix: a conversation has {max(lengths)} turns, more than T={width}")
    if not all(np.all(np.isfinite(row)) for row in rows):
        raise ValueError("turn_matrix: rewards must be finite")
    mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]  # [C, T]
    rewards = np.zeros(mask.shape)  # [C, T]
    rewards[mask] = np.concatenate(rows)
    return rewards, mask
