"""The rollout of RL over whole simulated conversations: G LiC conversations per problem, turn rows.

A step's problems (``ShardedTask``) each get G conversations (a group) of the LiC SHARDED
scenario: the user reveals the question, then one condition per turn (``FixedOrderUser``, or an
LLM user simulator), and the policy answers every turn on the slot engine with its KV cache kept
across turns. The conversations are run by the LiC evaluation's own runner
(``eval.simulator.plan_runs`` + ``simulate``, protocol ``lic``: a conversation ends at its first
correct answer attempt, or when its shards are exhausted): a rollout's transcripts are the
evaluation's on the same problems, seed and temperature (tests/rl/test_conv_rollout.py).

Each assistant turn becomes one training row (:func:`turn_rows`): its prompt is the turn's whole
rendered chat (system, earlier user and assistant turns, the new user message: exactly the
tokens the policy conditioned on, as the slot runner re-renders them) and its completion is the
reply's sampled token ids. User and template tokens are only ever in a row's prompt, so they
never carry a loss term. The turn's :class:`TurnItem` holds what the per-turn reward needs
(``rewards.conversation``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.conversations import ConversationRun, UserPolicy
from jaxrl_mt.data.records import ShardedTask
from jaxrl_mt.data.scenarios import join_shards
from jaxrl_mt.eval.judging import Judge
from jaxrl_mt.eval.simulator import plan_runs, simulate
from jaxrl_mt.sampling import SamplingConfig

__all__ = ["ConvRollout", "TurnItem", "plan_conversations", "run_conversation_groups", "step_seed", "turn_rows"]

KIND = "sharded"  # the LiC scenario the conversations play


@dataclasses.dataclass(frozen=True)
class TurnItem:
    """One assistant turn of a rollout, as the per-turn reward sees it.

    Attributes:
      item_id: ``"{conv_id}|{turn}"``.
      conv: the conversation's row in the step (problem u, conversation c: u * G + c).
      turn: 0-based turn index.
      answer: the problem's gold answer.
      revealed: the single-turn prompt made of the shards revealed so far (``join_shards``).
      complete: every shard is revealed by this turn.
      last: the conversation's last turn.
      label: the answer-attempt judge's response type of the reply.
      attempt: the judge called the reply an answer attempt.
      domain: the problem's domain.
    """

    item_id: str
    conv: int
    turn: int
    answer: str
    revealed: str
    complete: bool
    last: bool
    label: str
    attempt: bool
    domain: str = "math"


@dataclasses.dataclass(frozen=True)
class ConvRollout:
    """A step's conversations and their turn rows (conversation-major, turns in order)."""

    runs: list[ConversationRun]  # U x G conversations, group-major
    records: list[dict[str, Any]]  # the LiC transcript records (``eval.simulator.transcript_record``)
    items: list[TurnItem]  # one per assistant turn
    prompts: list[list[int]]  # each turn's rendered prompt ids
    completions: list[list[int]]  # each turn's sampled reply ids
    seconds: float  # wall time of the conversations


def step_seed(seed: int, step: int) -> int:
    """The sampling and scenario seed of step ``step`` of a run seeded ``seed`` (distinct per step)."""
    return int(seed) * 1_000_003 + int(step)


def plan_conversations(tasks: Sequence[ShardedTask], group_size: int, *, seed: int,
                       system: str | None) -> list[ConversationRun]:
    """G SHARDED conversations per problem, group-major (``plan_runs``: conversation c of problem u is
    row u * G + c, ``conv_id`` ``"{task_id}|sharded|{c}"``).

    Raises:
      ValueError: a problem that cannot make a SHARDED conversation (no condition).
    """
    runs, skipped = plan_runs(tasks, [KIND], group_size, seed=seed, system=system)
    if skipped:
        raise ValueError(f"problem {skipped[0]['task_id']!r} cannot be played as a conversation: "
                         f"{skipped[0]['reason']}")
    return runs


def run_conversation_groups(sampler: Any, tasks: Sequence[ShardedTask], group_size: int,
                            sampling: SamplingConfig, *, judge: Judge, verifier_mode: str, seed: int,
                            system: str | None, user: UserPolicy | None = None,
                            progress: Callable[[int, int], None] | None = None) -> ConvRollout:
    """Plays G conversations per problem with the LiC evaluation's runner and cuts them into turn rows.

    Args:
      sampler: the policy's sampler (on the parameters to roll out: ``Sampler.bound``).
      tasks: the step's U problems.
      group_size: G.
      sampling: the assistant's sampling settings (every turn).
      judge: the answer-attempt judge (``eval.judging.make_judge``).
      verifier_mode: ``strict`` or ``lenient``.
      seed: the step's seed (``step_seed``): the scenarios' and the sampling's, as an evaluation's
        ``seed``.
      system: the system prompt.
      user: the user policy (default: fixed order).
      progress: ``progress(turn_index, n_active)``.

    Returns:
      The conversations, their records and turn rows.
    """
    runs = plan_conversations(tasks, group_size, seed=seed, system=system)
    t0 = time.perf_counter()
    records = simulate(sampler, runs, sampling, judge=judge, protocol="lic", verifier_mode=verifier_mode,
                       user=user, seed=seed, progress=progress)
    seconds = time.perf_counter() - t0
    items, prompts, completions = turn_rows(sampler.tokenizer, runs)
    return ConvRollout(runs, records, items, prompts, completions, seconds)


def turn_rows(tokenizer: Any, runs: Sequence[ConversationRun]
              ) -> tuple[list[TurnItem], list[list[int]], list[list[int]]]:
    """Every assistant turn of ``runs`` as a row: (items, prompt ids, reply ids), conversation-major.

    A turn's prompt is its chat rendered whole (the runner's re-render: the earlier replies as
    their decoded texts), so the row's completion is scored under exactly what it was sampled from.
    """
    items: list[TurnItem] = []
    prompts: list[list[int]] = []
    completions: list[list[int]] = []
    for i, run in enumerate(runs):
        messages = run.messages
        planned = len(run.user_turns)
        for k, t in enumerate(run.turns):
            chat = messages[: 2 * k] + [{"role": "user", "content": t.user}]
            prompts.append(encode_prompt(tokenizer, chat, system=run.system))
            completions.append(list(t.tokens))
            shards = run.user_turns[: k + 1]
            items.append(TurnItem(
                item_id=f"{run.conv_id}|{k}", conv=i, turn=k, answer=str(run.meta["answer"]),
                revealed=join_shards(shards[0], shards[1:]), complete=k + 1 >= planned,
                last=k == len(run.turns) - 1, label=str(t.info.get("label", "")),
                attempt=bool(t.info.get("answer_attempt", False)), domain=str(run.meta.get("domain", "math"))))
    return items, prompts, completions
