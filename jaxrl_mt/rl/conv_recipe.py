"""The data recipe of RL over whole simulated conversations (``method = "rlsta_conv"``).

RLSTA, GRPO, ICPO and RLAAR train the last turn of histories generated beforehand; this method
trains the policy inside the conversation it is graded on: every step plays G LiC SHARDED
conversations per problem with the policy itself (the user reveals one shard per turn), rewards
every assistant turn (``rewards.conversation``) and trains every turn's reply
(``rl.conv_objective``). Its items are the problems (``ShardedTask``); the held-out problems
(``data.heldout`` per source, never trained on) are scored with LiC's metrics, P, A90 and U90-10 of
FULL and SHARDED over ``rlsta_conv.probe_runs`` sampled conversations each, before, during
(``eval.every``) and after training.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_mt.data.records import ShardedTask
from jaxrl_mt.eval.judging import make_judge
from jaxrl_mt.eval.metrics import instruction_metrics
from jaxrl_mt.eval.simulator import plan_runs, simulate
from jaxrl_mt.eval.user_sim import make_user
from jaxrl_mt.rl.data import load_tasks
from jaxrl_mt.rl.recipe import METHODS, ConfigError, Recipe, RecipeEnv
from jaxrl_mt.rl.run_config import TrainConfig
from jaxrl_mt.sampling import SamplingConfig

__all__ = ["ConversationData", "lic_metrics", "split_tasks"]

PROBE_KINDS = ("full", "sharded")


def split_tasks(tasks: Sequence[ShardedTask], heldout: int, seed: int) -> tuple[list[ShardedTask], list[ShardedTask]]:
    """(train, held): a seeded shuffle of the problems, the last ``heldout`` held out (at most half)."""
    order = np.random.default_rng(seed).permutation(len(tasks))
    shuffled = [tasks[i] for i in order]
    n_held = min(heldout, len(shuffled) // 2)
    return shuffled[: len(shuffled) - n_held], shuffled[len(shuffled) - n_held:]


def lic_metrics(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``eval/lic_<kind>_{P,A90,U90_10}``: LiC's metrics per scenario, each the mean over problems of
    one problem's runs (``eval.metrics.instruction_metrics``, 0-100)."""
    by: dict[tuple[str, str], list[float]] = {}
    for r in records:
        by.setdefault((r["kind"], r["task_id"]), []).append(float(r["score"]))
    out: dict[str, float] = {}
    for kind in sorted({k for k, _ in by}):
        per = [instruction_metrics(v, scale=100) for (k, _), v in sorted(by.items()) if k == kind]
        for name in ("P", "A90", "U90_10"):
            out[f"eval/lic_{kind}_{name}"] = float(np.mean([p[name] for p in per]))
    return out


def _save(path: Any, tasks: Sequence[ShardedTask]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks), encoding="utf-8")
    tmp.replace(path)


def _load(path: Any) -> list[ShardedTask]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [ShardedTask.from_json(json.loads(line), where=f"{path}:{n}") for n, line in enumerate(lines, 1)
            if line.strip()]


@METHODS.register("rlsta_conv")
class ConversationData(Recipe):
    """The recipe of ``method = "rlsta_conv"`` (see the module doc)."""

    def load(self, c: TrainConfig) -> tuple[list[ShardedTask], list[ShardedTask]]:
        """The problems of ``data.add_source`` split into training and held-out ones."""
        if c.rl.loss.loss_type not in ("dapo", "bnpo", "token_mean"):
            raise ConfigError(f"method 'rlsta_conv' pads a step's turn rows with empty rows: rl.loss_type must "
                              f"normalise by tokens ('dapo', 'bnpo' or 'token_mean'), got {c.rl.loss.loss_type!r}")
        tasks = load_tasks(c.data.add_source, c.data)
        if not tasks:
            raise ConfigError("empty dataset: no problem with a condition to reveal in data.add_source")
        train, held = split_tasks(tasks, c.data.heldout, c.seed)
        if len(train) < c.rl.batch_size:
            raise ConfigError(f"empty dataset: {len(train)} training problems < rl.batch_size {c.rl.batch_size}")
        return train, held

    def prepare(self, env: RecipeEnv, train: Sequence[ShardedTask], held: Sequence[ShardedTask]
                ) -> tuple[list[ShardedTask], list[ShardedTask]]:
        """The problems as loaded, cached in the workdir (a resumed run reads the cache)."""
        if env.multi:
            raise ConfigError("method 'rlsta_conv' runs in one process (a mesh within it is fine)")
        path, held_path = env.workdir / "train_tasks.jsonl", env.workdir / "heldout_tasks.jsonl"
        if path.exists() and held_path.exists():
            return _load(path), _load(held_path)
        if env.is_main:
            _save(path, train)
            _save(held_path, held)
        env.log(f"data: {len(train)} problems to converse on, {len(held)} held out")
        return list(train), list(held)

    def evaluate(self, env: RecipeEnv, params: Any, held: Sequence[ShardedTask]) -> dict[str, float]:
        """LiC's P, A90 and U90-10 of FULL and SHARDED on the held-out problems (sampled conversations)."""
        if not held:
            return {}
        c, s = env.config, env.config.rlsta_conv
        t0 = time.perf_counter()
        runs, _ = plan_runs(held, PROBE_KINDS, s.probe_runs, seed=c.seed, system=env.system)
        sampling = SamplingConfig(max_new_tokens=c.eval.max_new_tokens, temperature=s.probe_temperature)
        records = simulate(env.policy_sampler(params), runs, sampling, judge=make_judge(s.judge),
                           protocol="lic", verifier_mode="strict", seed=c.seed)
        return {**lic_metrics(records), "eval/seconds": time.perf_counter() - t0}

    def objective(self, env: RecipeEnv, rollout: Any) -> Any:
        """GRPO's loss on the turns of the policy's own conversations (``rl.conv_objective``)."""
        from jaxrl_mt.rl.conv_objective import ConversationLog, ConversationObjective

        c, s = env.config, env.config.rlsta_conv
        log = ConversationLog(env.workdir / "conversations.jsonl") if env.is_main else None
        return ConversationObjective(rollout(), batch_size=c.rl.batch_size, seed=c.seed, settings=s,
                                     judge=make_judge(s.judge), user=make_user(s.user),
                                     verifier_mode=c.rl.verifier_mode, log=log)
