"""The training loop: data -> the objective's batch -> jitted steps over its micro-batches, for every method.

The loop is the same for every method; a method brings a recipe (``rl.recipe.Recipe``, registered
in ``rl.recipe.METHODS``: ``jaxrl_mt.rl.multiturn.MultiTurnData`` for RLSTA and GRPO,
``jaxrl_mt.rl.icpo.ICPOData``, ...), whose hooks the loop calls unconditionally, its objective
(``rl.objective``: GRPO's rollout -> rewards -> advantages, or SFT's / DPO's fixed-target rows,
and the loss; one update path for all), and a reward, a pure function of (items, generations)
registered by name (``jaxrl_mt.rewards.registry``; the config's ``reward``, default the method's own).

Everything a resumed run needs lives in `<workdir>`: `config.json`, the cached training items
(`histories.jsonl`, `train_items.jsonl`, `heldout.jsonl`), orbax checkpoints (params, optimizer
state, step and the grain iterator state: `rl.state.TrainState`), `metrics.jsonl`, TensorBoard events, sample
tables, and at the end `summary.txt`, `curves.png` and the exported policy (`export/`).

Multi-process runs (`jax.distributed`, one global mesh over every process's devices): each
process draws its own batches (grain shards the training items by process), samples, scores and
rewards its own rows, and feeds them to the one jitted train step as per-process rows of a global
batch (`rl.batch.place`); every process must feed the same number of rows. Bucketed shapes
(prompt and completion lengths) are agreed with `parallel.agree_max`. Histories and filtering
(stage 1/2, once per run) are split over the processes, each on a process-local copy of the
policy, and gathered so that every process holds the same items; process 0 writes the caches and
a resumed run reads process 0's copy. The held-out evaluation is split over the processes
(contiguous blocks) and reported as the item-weighted global mean. Logged metrics are means over
processes (`completion/max_length`: the max). Checkpoints are written by every process (orbax);
`metrics.jsonl`, samples, `summary.txt`, curves and the export by process 0 only.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.data.pipeline import make_iterator
from jaxrl_mt.data.records import DataError
from jaxrl_mt.parallel import agree_max_many, check_same_rows, mean_over_processes, spans_processes
from jaxrl_mt.rewards.registry import RewardEnv, make_reward
from jaxrl_mt.models.lora import save_peft
from jaxrl_mt.rl.adapters import Trainable, lora_config, lora_forward
from jaxrl_mt.rl.best import BestKeeper
from jaxrl_mt.rl.data import load_scenarios, load_tasks, validate_config
from jaxrl_mt.rl.histories import TrainItem
from jaxrl_mt.rl.metrics_log import MetricsLog, PhaseClock, format_phases
from jaxrl_mt.rl.optim import optimizer_from_config
from jaxrl_mt.rl.outputs import fmt_metrics, write_outputs
from jaxrl_mt.rl.policy_io import load_policy
from jaxrl_mt.rl.probe import make_probe
from jaxrl_mt.rl.batch import place
from jaxrl_mt.rl.objective import Footprint, Objective
from jaxrl_mt.rl.recipe import METHODS, ConfigError, Recipe, RecipeEnv
from jaxrl_mt.rl.rollout import RolloutEngine, grouped_layout
from jaxrl_mt.rl.run_config import ConfigLike, TrainConfig, typed_config
from jaxrl_mt.rl.setup import check_micro_batch, load_policy_model, make_mesh, reference
from jaxrl_mt.rl.state import TrainState, fresh_state, restore_state, save_state
from jaxrl_mt.rl.step import choose_remat, loss_config, make_train_step
from jaxrl_mt.rl.memory_plan import MemoryPlan
from jaxrl_mt.rl.workdir import NonFiniteUpdate, check_resume_config, last_good
from jaxrl_mt.workdir_lock import hold_workdir
from jaxrl_mt.sampling import Sampler
from jaxrl_mt.scoring import Scorer

__all__ = ["ConfigError", "StepInfo", "TrainConfig", "Trainer", "TrainingError", "load_policy",
           "load_scenarios", "load_tasks", "validate_config"]


class TrainingError(RuntimeError):
    """Training stopped (non-finite loss or gradient); the last good checkpoint is kept."""


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a hook sees after an optimizer step."""

    state: TrainState  # after the step (state.step = steps done)
    metrics: dict[str, float]  # the step's metrics (global means)
    samples: list[dict]  # sample-table rows of the step
    held: Sequence[TrainItem]  # the held-out items
    checkpointer: Checkpointer
    data_iter: Any  # the training data iterator (its state goes into checkpoints)


# ----------------------------------------------------------------------------- trainer


class Trainer:
    """Runs one training job described by a config (see configs/rlsta.py): the loop, for every method."""

    def __init__(self, c: ConfigLike, *, log: Callable[[str], None] | None = None):
        """Args:
          c: the run's config (a ConfigDict of configs/*.py, or a ``TrainConfig``): typed and
            validated here, once; the loop reads only the frozen result.
          log: where progress lines go (default: stdout); process 0 only.
        """
        self.c = c = typed_config(c)
        validate_config(c)
        self.wd = Path(c.workdir)
        self.is_main = jax.process_index() == 0
        log = log or (lambda msg: print(msg, flush=True))
        self.log = log if self.is_main else (lambda msg: None)  # process 0 logs
        self.system = c.system_prompt or None
        self._stop_signal: int | None = None
        self.data: Recipe = METHODS.get(c.method)()
        self.lock = hold_workdir(self.wd, what="trainer", log=self.log, enabled=self.is_main)  # one live writer
        # a resumed workdir: changed data or optimizer-structure fields are refused before config.json is written
        self.resumed_config = check_resume_config(c, write=self.is_main, log=self.log)
        self.train_scen, self.held_scen = self.data.load(c)  # fails fast on bad or empty data
        self.mesh = make_mesh(c)
        self.model = load_policy_model(c, self.mesh)
        self.tok = self.model.tokenizer
        self.multi = spans_processes(self.mesh)  # one global mesh over several processes
        check_micro_batch(c, self.mesh)
        lora = lora_config(c)  # LoRA: the train state holds adapters; the policy is base + adapters
        self.trainable = Trainable(self.model.params, lora, lora_forward(c)) if lora is not None else Trainable()
        self.ref_params, self.ref_cfg = reference(c, self.model, self.mesh, copy=lora is None)
        # a step's rollout has one row count (batch x G): pad it to a multiple of 8, not the next power of two
        self.sampler = Sampler.from_model(self.model, max_batch=c.rl.max_batch, mesh=self.mesh, row_multiple=8)
        self.env = RecipeEnv(config=c, workdir=self.wd, is_main=self.is_main, multi=self.multi, system=self.system,
                             sampler=self.sampler, mesh=self.mesh, log=self.log, ref_params=self.ref_params,
                             ref_cfg=self.ref_cfg)
        # the kept and exported checkpoint: the best held-out (or probe) metric, eval.select or the method's
        select = c.eval.selection() or self.data.select
        self.best = BestKeeper(self.wd, *select, write=self.is_main, log=self.log) if select else None
        self.optimizer = optimizer_from_config(c.rl)
        self.lc = loss_config(c.rl)
        self.plan = MemoryPlan(self.wd, chunk=self.lc.chunk, log=self.log, write=self.is_main,
                               agree=agree_max_many)  # resumed: the first start's choices
        self._steps: dict[int | str, Any] = {}  # the objective's jitted step of each memory-plan bucket
        self.ref_scorer = Scorer(self.ref_params, self.ref_cfg, pad_id=self.model.pad_id,
                                 batch_size=min(16, c.rl.rows), mesh=self.mesh)
        self.clock = PhaseClock(self.model.cfg)  # each step's phases (rl.metrics_log): the reward's scorer is counted
        self.objective: Objective = self.data.objective(self.env, self._rollout_engine)
        self.metrics = MetricsLog(self.wd, enabled=self.is_main)
        try:  # the fixed held-out probe (eval.probe_source; None when unset)
            self.probe = make_probe(c, self.system)
        except (DataError, OSError) as e:
            raise ConfigError(f"eval.probe_source: {e}") from None

    def _rollout_engine(self) -> RolloutEngine:
        """The rollout's frozen environment: sampler, reward (with the reference's scorer), shapes."""
        c, rl = self.c, self.c.rl
        ro, lo, name = rl.rollout, rl.loss, c.reward_name
        scorer = self.clock.count(self.ref_scorer)  # the anchor's seconds and tokens (rl.metrics_log.PhaseClock)
        reward_fn = make_reward(name, RewardEnv(c, ro.group_size, self.tok, self.system, scorer))
        return RolloutEngine(
            sampler=self.sampler, reward_fn=reward_fn, reward_name=name, ref_params=self.ref_params,
            ref_cfg=self.ref_cfg, policy_cfg=self.model.cfg, tokenizer=self.tok, pad_id=self.model.pad_id, lc=self.lc,
            group_size=ro.group_size, max_new_tokens=rl.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
            scale_rewards=lo.scale_rewards, grad_accum=rl.grad_accum, mu=lo.mu, seed=c.seed, system=self.system,
            mesh=self.mesh, grouped=self._grouped())

    def prepare(self) -> tuple[list[TrainItem], list[TrainItem]]:
        """Training and held-out items of the method's data recipe (cached in the workdir)."""
        return self.data.prepare(self.env, self.train_scen, self.held_scen)

    def evaluate(self, params: Any, held: Sequence[TrainItem]) -> dict[str, float]:
        """The method's held-out metrics of `params`."""
        return self.data.evaluate(self.env, params, held)

    # ------------------------------------------------------------------ the update

    def _grouped(self) -> bool:
        """Whether rollouts prompt once per group (`rl.rollout.grouped_layout`), with or without a mesh."""
        rl = self.c.rl
        return grouped_layout(rl.batch_size, rl.rollout.group_size, rl.grad_accum, self.mesh)

    def _remat(self, key: int | str, footprint: Footprint) -> bool | str:
        """`rl.remat` for the steps of memory-plan bucket `key` (`Objective.plan`), the first start's
        choice on a resume (`rl.memory_plan`)."""
        return self.plan.remat(key, self.c.rl.remat, lambda: self._auto_remat(key, footprint))

    def _auto_remat(self, key: int | str, footprint: Footprint) -> bool | str:
        """Under "auto": the cheapest remat whose estimated activations for a micro-batch of `footprint`
        fit (`rl.step.choose_remat`), the same on every process (the most conservative choice)."""
        prompts, group, P, C = footprint
        order = [False, "dots", True]
        choice = agree_max_many([order.index(choose_remat(self.model.cfg, prompts, group, P, C))])[0]
        self.log(f"rl.remat auto: prompt bucket {key}, {prompts} prompts x {group} rows each -> {order[choice]!r}")
        return order[choice]

    def _train_step(self, batch: Any, params: Any, opt_state: Any) -> Any:
        """The objective's jitted step for `batch`'s memory-plan bucket (`Objective.plan`: GRPO's prompt
        bucket, SFT's / DPO's row lengths); its remat, shardings and donation (params and optimizer
        state, updated in place) are decided here, once per bucket."""
        key, footprint = self.objective.plan(batch)
        if key not in self._steps:
            lc = dataclasses.replace(self.lc, remat=self._remat(key, footprint))
            self._steps[key] = make_train_step(self.model.cfg, self.optimizer, lc, mesh=self.mesh,
                                               state=(params, opt_state), donate=True,
                                               loss=self.trainable.loss(self.objective.loss))
        return self._steps[key]

    def update(self, state: TrainState, batch: Any) -> tuple[TrainState, dict[str, float]]:
        """The objective's passes (GRPO: ``rl.mu``) over the batch's ``rl.grad_accum`` micro-batches of
        rows: the next state and the train/* means."""
        obj = self.objective
        params, opt_state = state.params, state.opt_state
        step_fn = self._train_step(batch, params, opt_state)
        n = batch.rows
        mb = n // self.c.rl.grad_accum
        check_same_rows(n, "train batch")  # one global micro-batch: the same number of rows on every process
        acc: dict[str, list[float]] = {}
        for i in range(obj.passes):
            for s in range(0, n, mb):
                micro = obj.micro(place(self.mesh, batch.slice_rows(s, mb)), step=state.step, inner=i, index=s // mb)
                params, opt_state = self._micro_step(step_fn, params, opt_state, self.trainable.batch(micro), acc)
        out = {f"train/{k}": float(np.mean(v)) for k, v in acc.items() if k != "finite"}
        return TrainState(params, opt_state, state.step + 1), out

    @staticmethod
    def _micro_step(step_fn: Any, params: Any, opt_state: Any, micro: Any, acc: dict[str, list[float]]
                    ) -> tuple[Any, Any]:
        params, opt_state, m = step_fn(params, opt_state, micro)
        m = jax.device_get(m)
        if not m["finite"]:
            raise TrainingError(f"non-finite loss or gradient (loss={float(m['loss'])}, "
                                f"grad_norm={float(m['grad_norm'])}); parameters were not updated")
        for k, v in m.items():
            acc.setdefault(k, []).append(float(v))
        return params, opt_state

    # ------------------------------------------------------------------ main loop

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop_signal = signum
        self.log(f"received {signal.Signals(signum).name}: will checkpoint after the current step and exit")

    def _start_state(self, it: Any, ck: Checkpointer) -> TrainState:
        """The state at step 0, or restored from the newest checkpoint that restores."""
        state = fresh_state(self.trainable.initial(self.model.params, self.c.seed), self.optimizer, self.mesh)
        old_opt = None if self.resumed_config is None else optimizer_from_config(self.resumed_config.rl)
        restored = restore_state(ck, state, it, log=self.log, recipe=self.data,  # the stored optimizer's, if allowed
                                 stored_opt_state=None if old_opt is None else old_opt.init(state.params))
        if restored is None:
            if self.is_main:
                self.metrics.truncate_after(-1)
            return state
        self.metrics.truncate_after(restored.step)
        self.log(f"resumed from {self.wd / 'checkpoints'} at step {restored.step}")
        return restored

    def _log_hook(self, info: StepInfo) -> None:
        """Metrics rows (``log.every``, the last step) and the sample table (``log.samples_every``)."""
        c, done = self.c, info.state.step
        if done % c.log.every == 0 or done == c.rl.steps:
            self.metrics.scalars(done, info.metrics)
            self.log(format_phases(done, info.metrics))
        if c.log.samples_every and done % c.log.samples_every == 0:
            self.metrics.samples(done, info.samples[: c.log.n_samples])

    def _eval_hook(self, info: StepInfo) -> None:
        """The method's held-out metrics every ``eval.every`` steps and the probe when due."""
        c, done = self.c, info.state.step
        if c.eval.every and done % c.eval.every == 0 and done < c.rl.steps and info.held:
            ev = self.evaluate(self.trainable.policy(info.state.params), info.held)
            self.metrics.scalars(done, ev)
            if self.best is not None:
                self.best.offer(done, info.state.params, ev)
        if self.probe is not None and self.probe.due(done, c.rl.steps):
            probed = self.probe(self.sampler.bound(self.trainable.policy(info.state.params)))
            self.metrics.scalars(done, probed)
            if self.best is not None:  # eval.select may name a probe metric
                self.best.offer(done, info.state.params, probed)

    def _checkpoint_hook(self, info: StepInfo) -> None:
        """A checkpoint every ``checkpoint.every`` steps, at the last step and on a stop signal."""
        done = info.state.step
        if done % self.c.checkpoint.every == 0 or done == self.c.rl.steps or self._stop_signal is not None:
            save_state(info.checkpointer, info.state, info.data_iter, self.data)  # refuses a non-finite state

    def _eval_phase(self, when: str, step: int, params: Any, held: Sequence[TrainItem],
                    evals: dict[str, dict[str, float]]) -> None:
        evals[when] = self.evaluate(self.trainable.policy(params), held)
        self.metrics.scalars(step, evals[when])
        if self.best is not None:
            self.best.offer(step, params, evals[when])
        self.log(f"eval {when}: " + fmt_metrics(evals[when]))

    def train_step(self, state: TrainState, items: Sequence[TrainItem]) -> tuple[TrainState, dict[str, float],
                                                                                  list[dict]]:
        """One step: the objective's batch (GRPO: a rollout), the update; the step's metrics (global means
        across processes)."""
        t0 = time.perf_counter()
        self.clock.start()
        items, pre = self.data.step_items(self.env, items, state.step)  # RLAAR's curriculum picks its samples
        batch, m, samples = self.objective.batch(lambda: self.trainable.policy(state.params), items, state.step)
        t1 = time.perf_counter()
        state, tm = self.update(state, batch)
        update_s = time.perf_counter() - t1
        m = {**pre, **m, **tm, "perf/step_s": time.perf_counter() - t0}
        m.update(self.clock.phases(m, batch, update_s=update_s, passes=self.objective.passes))
        # global means (train/* are already global: the same on every process)
        m = mean_over_processes(m, max_keys=("completion/max_length", "perf/peak_memory_gib"))
        self.data.observe(m)  # a recipe whose state follows the training (RLAAR's curriculum)
        return state, m, samples

    def run(self) -> dict[str, Any]:
        """Trains to `rl.steps` (resuming from the latest checkpoint) and writes the outputs."""
        c = self.c
        items, held = self.prepare()
        it = make_iterator(items, batch_size=c.rl.batch_size, seed=c.seed, shuffle=True,
                           shard_index=jax.process_index(), shard_count=jax.process_count())
        ck = Checkpointer(self.wd / "checkpoints", max_to_keep=c.checkpoint.keep)
        state = self._start_state(it, ck)
        start = state.step
        evals: dict[str, dict[str, float]] = {}
        if start == 0 and held:
            self._eval_phase("before", 0, state.params, held, evals)
        if start == 0 and self.probe is not None:
            self.metrics.scalars(0, self.probe(self.sampler.bound(self.trainable.policy(state.params))))
        old_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        step = start
        hooks = (self._log_hook, self._eval_hook, self._checkpoint_hook)
        try:
            bar = _progress(range(start, c.rl.steps), initial=start, total=c.rl.steps, enabled=self.is_main)
            for _ in bar:
                step = state.step  # the failing step of an error below is step + 1
                state, m, samples = self.train_step(state, next(it))
                info = StepInfo(state, m, samples, held, ck, it)
                for hook in hooks:
                    hook(info)
                if hasattr(bar, "set_postfix"):
                    shown = {"R": f"{m['reward/total']:.3f}"} if "reward/total" in m else {}
                    bar.set_postfix(**shown, loss=f"{m['train/loss']:.4g}", s=f"{m['perf/step_s']:.1f}")
                if self._stop_signal is not None:
                    ck.wait()
                    self.log(f"checkpoint saved at step {state.step}; exiting on signal")
                    raise SystemExit(128 + self._stop_signal)
        except (TrainingError, NonFiniteUpdate) as e:
            ck.wait()
            raise TrainingError(f"step {step + 1}: {e}. Stopped; {last_good(ck)}") from None
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            ck.wait()
            ck.close()
        if held:
            self._eval_phase("after", c.rl.steps, state.params, held, evals)
        self.metrics.close()
        params, note = state.params, None
        if self.best is not None and (kept := self.best.params(like=state.params)) is not None:
            params, note = kept, (f"exported: the best checkpoint, step {self.best.info['step']} "
                                  f"({self.best.metric} {self.best.info['value']:.4f})")
        if self.trainable.lora is not None and self.is_main and c.export:  # the adapter alone, PEFT's format
            save_peft(self.wd / "adapter", jax.device_get(params), self.trainable.lora, base_model=c.model)
        return write_outputs(c, self.model.cfg, self.tok, self.trainable.policy(params), evals, multi=self.multi,
                             is_main=self.is_main, log=self.log, note=note)


def _progress(it: Any, *, initial: int, total: int, enabled: bool) -> Any:
    if not enabled:
        return it
    try:
        from tqdm import tqdm

        return tqdm(it, initial=initial, total=total, desc="train", dynamic_ncols=True)
    except ImportError:
        return it
