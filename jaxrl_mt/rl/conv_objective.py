"""The objective of RL over whole conversations: a step's conversations, per-turn rewards, credit, one batch.

``ConversationObjective.batch`` plays G LiC conversations per problem with the policy
(``rl.conv_rollout``), rewards every assistant turn with the run's registered reward
(``rewards.conversation``: one generation per turn item), turns the per-turn rewards into
advantages (``rl.conv_credit``: the conversation's return normalised in its group, or each turn's
reward-to-go normalised over the group's conversations at the same turn index) and packs every
turn as one row of a ``TrainExample`` (its whole rendered chat as the prompt, its reply as the
completion, ``group = 1``). The loss is GRPO's (``rl.step.loss_fn``) on the one update path of
``rl.loop.Trainer``: user and template tokens sit in the prompts and carry no loss term.

A step holds a varying number of turns: the rows are padded to a bucket (a power of two, a
multiple of ``rl.grad_accum``) with empty rows (no completion token: no loss, no gradient), which
is why the loss must normalise by tokens (``rl.loss_type`` ``dapo``, ``bnpo`` or ``token_mean``;
checked at start-up).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_mt.batching import bucket
from jaxrl_mt.eval.judging import Judge
from jaxrl_mt.parallel import agree_max_many, allgather_ints
from jaxrl_mt.rewards.answer_stats import answer_stats
from jaxrl_mt.rewards.conversation import TurnGenerations
from jaxrl_mt.rewards.registry import check_output
from jaxrl_mt.rl.conv_credit import advantages, turn_matrix
from jaxrl_mt.rl.conv_rollout import ConvRollout, run_conversation_groups, step_seed
from jaxrl_mt.rl.example import TrainExample, assemble_example
from jaxrl_mt.rl.objective import Footprint, GRPOObjective
from jaxrl_mt.rl.rollout import example_logprobs
from jaxrl_mt.rl.step import dapo_num_items
from jaxrl_mt.sampling import SamplingConfig

__all__ = ["ConversationObjective", "TOKEN_NORMALISED", "turn_example"]

TOKEN_NORMALISED = ("dapo", "bnpo", "token_mean")  # losses that empty padding rows leave unchanged


def turn_example(rollout: ConvRollout, adv: np.ndarray, pad_id: int, rows: int, max_new: int) -> TrainExample:
    """The turns as ``rows`` rows (the rest: empty rows, completion mask 0, advantage 0), one prompt each.

    Args:
      rollout: the step's conversations and turn rows.
      adv: [n_turns] each turn's advantage.
      pad_id: the padding id.
      rows: the row bucket (>= the turns).
      max_new: the reply budget (the completion bucket's cap).
    """
    n = len(rollout.prompts)
    prompts = list(rollout.prompts) + [[pad_id]] * (rows - n)
    comps = list(rollout.completions) + [[]] * (rows - n)
    P = bucket(max(len(p) for p in prompts), 32)
    C = min(bucket(max(max((len(c) for c in comps), default=1), 1), 16), bucket(max_new, 16))
    P, C = agree_max_many([P, C])
    full = np.zeros(rows, np.float32)
    full[:n] = adv
    return assemble_example(prompts, comps, pad_id, P, C, group=1, advantages=full)


@dataclasses.dataclass(frozen=True)
class ConversationObjective(GRPOObjective):
    """GRPO's loss on the turns of the policy's own conversations (see the module doc).

    ``engine`` (``rl.rollout.RolloutEngine``) brings the sampler, the reward (``rlsta_conv``), the
    reference model and the loss settings; ``settings`` is the config's ``rlsta_conv`` section.
    """

    settings: Any = None  # run_config.ConvSection
    judge: Judge | None = None  # the answer-attempt judge
    user: Any = None  # the user policy (None: fixed order)
    verifier_mode: str = "lenient"
    log: ConversationLog | None = None  # the conversations of every step (process 0)

    def batch(self, policy: Callable[[], Any], items: Sequence[Any], step: int
              ) -> tuple[Any, dict[str, float], list[dict]]:
        e, s = self.engine, self.settings
        params = policy()
        sampling = SamplingConfig(max_new_tokens=e.max_new_tokens, temperature=e.temperature, top_p=e.top_p)
        user = self.user if not s.max_turns else _Capped(self.user, s.max_turns)
        ro = run_conversation_groups(e.sampler.bound(params), items, e.group_size, sampling, judge=self.judge,
                                     verifier_mode=self.verifier_mode, seed=step_seed(self.seed, step),
                                     system=e.system, user=user)
        e.sampler.release_decode_weights()
        t1 = time.perf_counter()
        out = check_output(e.reward_fn(ro.items, TurnGenerations(_texts(ro), ro.completions)), len(ro.items),
                           f"reward {e.reward_name!r}")
        per_conv: list[list[float]] = [[] for _ in ro.runs]
        for it, r in zip(ro.items, out.rewards):
            per_conv[it.conv].append(float(r))
        # a conversation stopped before its first turn (its first prompt leaves no room for a reply) has
        # no row: it counts in its group as one turn of reward 0
        rewards, mask = turn_matrix([r or [0.0] for r in per_conv])
        A = advantages(rewards, mask, e.group_size, credit=s.credit, gamma=s.gamma, scale_rewards=e.scale_rewards)
        adv = np.array([A[it.conv, it.turn] for it in ro.items], np.float32)
        rows = _row_bucket(len(ro.items), e.grad_accum)
        ex = turn_example(ro, adv, e.pad_id, rows, e.max_new_tokens)
        if e.lc.loss_type == "dapo":
            tokens = int(ex.completion_mask.sum())
            ex = ex.replace(num_items=dapo_num_items(ex.completion_mask, e.grad_accum,
                                                     int(allgather_ints([tokens]).sum())))
        if e.lc.beta > 0:
            ex = ex.replace(ref_logp=example_logprobs(e, e.ref_params, e.ref_cfg, ex))
        if e.mu > 1:
            ex = ex.replace(old_logp=example_logprobs(e, params, e.policy_cfg, ex))
        if self.log is not None:
            self.log.write(step + 1, ro, out, adv)
        m = _metrics(ro, out, rewards, mask, e.group_size)
        m["perf/score_s"] = time.perf_counter() - t1  # the reward's anchor pass and the reference's
        return ex, m, _samples(ro, out.rewards, adv, e.group_size)

    def plan(self, batch: Any) -> tuple[int | str, Footprint]:
        """Bucket: the prompt length and the row count; footprint: a micro-batch's rows at their lengths."""
        C = int(batch.completion_tokens.shape[1])
        return f"conv:{batch.rows}x{batch.prompt_len}", (batch.rows // self.engine.grad_accum, 1, batch.prompt_len, C)


class ConversationLog:
    """``conversations.jsonl``: one line per conversation of every step, its LiC transcript record (each
    turn's user message and reply apart) with each turn's reward, components and advantage.

    A resumed run first drops the lines of the steps after its checkpoint (the killed step's), so the
    file holds each step's conversations once.
    """

    def __init__(self, path: Path):
        self.path, self._resumed = Path(path), False

    def write(self, step: int, ro: ConvRollout, out: Any, adv: np.ndarray) -> None:
        """Appends step ``step``'s (1-based) conversations."""
        if not self._resumed:
            self._resumed = True
            if self.path.exists():
                keep = [x for x in self.path.read_text(encoding="utf-8").splitlines()
                        if x.strip() and _step_of(x) < step]
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
                tmp.replace(self.path)
        recs = [dict(r, step=step) for r in ro.records]
        for i, it in enumerate(ro.items):
            turn = recs[it.conv]["turns"][it.turn] = dict(recs[it.conv]["turns"][it.turn])
            turn.update(reward=float(out.rewards[i]), advantage=float(adv[i]),
                        **{f"r_{k}": float(v[i]) for k, v in out.components.items()})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in recs))


def _step_of(line: str) -> int:
    """The step of a log line (a line cut by a crash: past every step, dropped)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62


class _Capped:
    """A user policy that ends a conversation after ``max_turns`` assistant turns."""

    def __init__(self, user: Any, max_turns: int):
        from jaxrl_mt.conversations import FixedOrderUser

        self.user, self.max_turns = user or FixedOrderUser(), max_turns

    def next_user_turns(self, runs: Sequence[Any]) -> list[str | None]:
        nexts = self.user.next_user_turns(runs)
        return [None if len(r.turns) >= self.max_turns else u for r, u in zip(runs, nexts)]


def _row_bucket(n: int, grad_accum: int) -> int:
    """Rows of a step of n turns: a power of two, a multiple of ``grad_accum``."""
    return -(-bucket(max(n, 1), 1) // grad_accum) * grad_accum


def _texts(ro: ConvRollout) -> list[str]:
    return [t.assistant for run in ro.runs for t in run.turns]


def _metrics(ro: ConvRollout, out: Any, rewards: np.ndarray, mask: np.ndarray, G: int) -> dict[str, float]:
    """The step's rollout metrics: rewards per component, returns, turns, lengths, the LiC scores."""
    returns = (rewards * mask).sum(1)
    lens = np.array([len(c) for c in ro.completions] or [0], np.float64)
    m = {"reward/total": float(np.mean(out.rewards)), "reward/return": float(returns.mean()),
         "reward/return_group_std": float(returns.reshape(-1, G).std(1).mean()),
         "conv/turns": float(mask.sum(1).mean()), "conv/score": float(np.mean([r["score"] for r in ro.records])),
         "completion/mean_length": float(lens.mean()), "completion/max_length": float(lens.max()),
         "completion/clipped_frac": float(np.mean([t.finish_reason == "length" for r in ro.runs for t in r.turns])),
         "perf/rollout_s": ro.seconds, "perf/rollout_tokens_per_s": float(lens.sum() / max(ro.seconds, 1e-9))}
    m.update({f"reward/{k}": float(np.mean(v)) for k, v in out.components.items()})
    m.update(answer_stats(_texts(ro), [it.answer for it in ro.items]))
    return m


def _samples(ro: ConvRollout, rewards: np.ndarray, adv: np.ndarray, G: int) -> list[dict]:
    """The turns of each group's first conversation, for the sample table."""
    return [{"item": it.item_id, "last_user": ro.runs[it.conv].turns[it.turn].user,
             "completion": ro.runs[it.conv].turns[it.turn].assistant, "R": f"{r:.3f}", "A": f"{a:+.2f}"}
            for it, r, a in zip(ro.items, rewards, adv) if it.conv % G == 0]
