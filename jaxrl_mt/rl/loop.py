"""The RLSTA / GRPO training loop: data -> rollouts -> rewards -> advantages -> jitted step.

Everything a resumed run needs lives in `<workdir>`: `config.json`, the cached training items
(`histories.jsonl`, `train_items.jsonl`, `heldout.jsonl`), orbax checkpoints (params, optimizer
state, RNG key, step and the grain iterator state), `metrics.jsonl`, TensorBoard events, sample
tables, and at the end `summary.txt`, `curves.png` and the exported policy (`export/`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.pipeline import make_iterator
from jaxrl_mt.data.records import DataError, Scenario
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.models.hf_io import export_hf_folder
from jaxrl_mt.models.registry import Model, load_model
from jaxrl_mt.parallel import make_mesh, shard_batch, shard_params, shard_train_state, shard_train_step
from jaxrl_mt.rewards.anchor import anchor_reward, zero_anchor_for_wrong
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.rl.grpo import KL_ESTIMATORS, LOSS_TYPES, group_advantages
from jaxrl_mt.rl.histories import (TrainItem, accuracy_single_and_multi, build_histories, filter_items,
                                   load_items, save_items)
from jaxrl_mt.rl.metrics_log import MetricsLog, plot_curves, read_metrics
from jaxrl_mt.rl.optim import make_optimizer
from jaxrl_mt.rl.step import LossConfig, assemble_rollouts, completion_logprobs, make_train_step
from jaxrl_mt.sampling import Sampler, SamplingConfig, bucket
from jaxrl_mt.scoring import Scorer


class ConfigError(ValueError):
    """A configuration that cannot run; raised at start-up, before any model is loaded."""


class TrainingError(RuntimeError):
    """Training stopped (non-finite loss or gradient); the last good checkpoint is kept."""


# ----------------------------------------------------------------------------- config checks


def validate_config(c: Any) -> None:
    """Fails fast on values that cannot work (keys are checked by the locked ConfigDict)."""
    rl = c.rl
    checks = [
        (rl.alpha >= 0, f"rl.alpha must be >= 0, got {rl.alpha}"),
        (rl.group_size >= 2, f"rl.group_size (G) must be >= 2 for group-relative advantages, got {rl.group_size}"),
        (rl.batch_size >= 1, f"rl.batch_size must be >= 1, got {rl.batch_size}"),
        (rl.steps >= 1, f"rl.steps must be >= 1, got {rl.steps}"),
        (rl.mu >= 1, f"rl.mu must be >= 1, got {rl.mu}"),
        (rl.grad_accum >= 1 and (rl.batch_size * rl.group_size) % rl.grad_accum == 0,
         f"rl.grad_accum ({rl.grad_accum}) must divide batch_size * group_size ({rl.batch_size * rl.group_size})"),
        (rl.lr > 0, f"rl.lr must be > 0, got {rl.lr}"),
        (rl.beta >= 0, f"rl.beta must be >= 0, got {rl.beta}"),
        (rl.kl_estimator in KL_ESTIMATORS, f"rl.kl_estimator must be one of {KL_ESTIMATORS}, got {rl.kl_estimator!r}"),
        (rl.loss_type in LOSS_TYPES, f"rl.loss_type must be one of {LOSS_TYPES}, got {rl.loss_type!r}"),
        (rl.verifier_mode in ("strict", "lenient"), f"rl.verifier_mode must be strict|lenient, got {rl.verifier_mode!r}"),
        (rl.anchor_prompt in ("full", "merged"), f"rl.anchor_prompt must be full|merged, got {rl.anchor_prompt!r}"),
        (rl.temperature > 0, f"rl.temperature must be > 0 for GRPO rollouts, got {rl.temperature}"),
        (rl.max_new_tokens >= 1, f"rl.max_new_tokens must be >= 1, got {rl.max_new_tokens}"),
        (c.data.add_source or c.data.refine_source, "no data: set data.add_source and/or data.refine_source"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)
    wd = Path(c.workdir)
    try:
        wd.mkdir(parents=True, exist_ok=True)
        probe = wd / ".write_test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"workdir {str(wd)!r} is not writable ({e.strerror or e})") from None


def config_to_dict(c: Any) -> dict[str, Any]:
    return json.loads(c.to_json()) if hasattr(c, "to_json") else dict(c)


# ----------------------------------------------------------------------------- data


def load_tasks(specs: str, data: Any, *, max_turns: int = 0, require_each: bool = False) -> list[Any]:
    """Tasks with at least one condition from comma-separated source specs.

    Keeps at most `data.limit + data.heldout` per source (all when `data.limit` is 0) and, when
    `max_turns` is set, only problems of at most that many user turns (target + conditions).
    A bad source, or (with `require_each`) a source left empty, is a ConfigError.
    """
    tasks: list[Any] = []
    for spec in [s.strip() for s in specs.split(",") if s.strip()]:
        try:
            got = load_source(spec)
        except (DataError, OSError) as e:
            raise ConfigError(f"data source {spec!r}: {e}") from None
        got = [t for t in got if t.conditions and (not max_turns or len(t.conditions) + 1 <= max_turns)]
        if require_each and not got:
            raise ConfigError(f"empty dataset: source {spec!r} gave no usable problems")
        tasks += got[: data.limit + data.heldout] if data.limit else got
    return tasks


def load_scenarios(c: Any) -> tuple[list[Scenario], list[Scenario]]:
    """Training and held-out scenarios (MT-Add from add_source, MT-Refine from refine_source)."""
    train: list[Scenario] = []
    held: list[Scenario] = []
    for specs, kind in ((c.data.add_source, "sharded"), (c.data.refine_source, "mt_refine")):
        if not specs:
            continue
        tasks = load_tasks(specs, c.data, max_turns=c.data.max_turns, require_each=True)
        scen = []
        for t in tasks:
            try:
                scen.append(build_scenario(t, kind, seed=c.seed, shuffle=c.data.shuffle_shards))
            except DataError:
                continue  # e.g. an MT-Refine problem with no number to correct
        rng = np.random.default_rng(c.seed)
        scen = [scen[i] for i in rng.permutation(len(scen))]  # mix sources before the held-out split
        n_held = min(c.data.heldout, max(len(scen) - 1, 0))
        held += scen[len(scen) - n_held:]
        train += scen[: len(scen) - n_held]
    if not train:
        raise ConfigError("empty dataset: no training scenarios after the held-out split")
    return train, held


# ----------------------------------------------------------------------------- policy I/O


def load_policy(workdir: str | os.PathLike, step: int | None = None) -> Model:
    """The policy of a training run: its base model with the checkpoint's parameters."""
    wd = Path(workdir)
    cfg_path = wd / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{wd}: not a training workdir (no config.json)")
    conf = json.loads(cfg_path.read_text())
    model = load_model(conf["model"], param_dtype=conf.get("param_dtype", "float32"), dtype=conf.get("dtype", "float32"))
    ck = Checkpointer(wd / "checkpoints", read_only=True)
    if ck.latest_step() is None:
        raise FileNotFoundError(f"{wd}/checkpoints: no checkpoint")
    rl = conf["rl"]
    opt = make_optimizer(rl["lr"], schedule=rl["schedule"], warmup_steps=rl["warmup_steps"], total_steps=rl["steps"],
                         weight_decay=rl["weight_decay"], max_grad_norm=rl["max_grad_norm"] or None,
                         grad_accum_steps=rl["grad_accum"])
    target = {"params": model.params, "opt_state": opt.init(model.params), "rng": jax.random.PRNGKey(0)}
    state, _ = ck.restore(step, target=target)
    ck.close()
    model.params = state["params"]
    model.spec = f"workdir:{wd}"
    return model


# ----------------------------------------------------------------------------- trainer


class Trainer:
    """Runs one training job described by a config (see configs/rlsta.py)."""

    def __init__(self, c: Any, *, log: Callable[[str], None] | None = None):
        validate_config(c)
        self.c = c
        self.log = log or (lambda msg: print(msg, flush=True))
        self.wd = Path(c.workdir)
        self.is_main = jax.process_index() == 0
        self.system = c.system_prompt or None
        self._stop_signal: int | None = None
        self.train_scen, self.held_scen = self.load_data()  # fails fast on bad or empty data
        saved = self.wd / "config.json"
        conf = config_to_dict(c)
        if self.is_main:
            saved.write_text(json.dumps(conf, indent=2, sort_keys=True))
        self.model = load_model(c.model, param_dtype=c.param_dtype, dtype=c.dtype)
        self.tok = self.model.tokenizer
        self.mesh = self._make_mesh()
        if self.mesh is not None:
            self.model.params = shard_params(self.model.params, self.mesh)
        if c.ref_model and c.ref_model != c.model:
            ref = load_model(c.ref_model, param_dtype=c.param_dtype, dtype=c.dtype, with_tokenizer=False)
            if ref.cfg.vocab_size != self.model.cfg.vocab_size:
                raise ConfigError(f"ref_model {c.ref_model!r} has another vocabulary than {c.model!r}")
            self.ref_params = ref.params if self.mesh is None else shard_params(ref.params, self.mesh)
        else:
            self.ref_params = self.model.params  # immutable arrays: updates never touch them
        self.sampler = Sampler.from_model(self.model, max_batch=c.rl.max_batch, mesh=self.mesh)
        self.ref_scorer = Scorer(self.ref_params, self.model.cfg, pad_id=self.model.pad_id,
                                 batch_size=min(16, c.rl.batch_size * c.rl.group_size))
        rl = c.rl
        self.optimizer = make_optimizer(rl.lr, schedule=rl.schedule, warmup_steps=rl.warmup_steps, total_steps=rl.steps,
                                        weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm or None,
                                        grad_accum_steps=rl.grad_accum)
        self.lc = LossConfig(epsilon_low=rl.epsilon_low, epsilon_high=rl.epsilon_high, beta=rl.beta,
                             kl_estimator=rl.kl_estimator, loss_type=rl.loss_type, temperature=rl.temperature,
                             max_completion_length=rl.max_new_tokens, remat=rl.remat)
        self._steps: dict[int, Any] = {}
        self.metrics = MetricsLog(self.wd, enabled=self.is_main)

    # ------------------------------------------------------------------ stages

    def _make_mesh(self) -> Any:
        """The device mesh from `mesh_shape` ("data,fsdp,tensor"; "auto": all devices on data)."""
        spec = self.c.mesh_shape
        if spec == "auto":
            return make_mesh((-1, 1, 1)) if jax.device_count() > 1 else None
        try:
            shape = tuple(int(x) for x in spec.split(","))
        except ValueError:
            raise ConfigError(f"mesh_shape must be 'auto' or 'data,fsdp,tensor' integers, got {spec!r}") from None
        if len(shape) != 3:
            raise ConfigError(f"mesh_shape needs 3 entries (data, fsdp, tensor), got {spec!r}")
        try:
            return make_mesh(shape)
        except ValueError as e:
            raise ConfigError(f"mesh_shape {spec!r}: {e}") from None

    def load_data(self) -> tuple[list[Any], list[Any]]:
        """Training and held-out scenarios (before any model is loaded)."""
        return load_scenarios(self.c)

    def _items(self, name: str, scenarios: Sequence[Scenario], seed: int) -> list[TrainItem]:
        path = self.wd / name
        if path.exists():
            return load_items(path)
        h = self.c.history
        items = build_histories(self.sampler, scenarios,
                                SamplingConfig(max_new_tokens=h.max_new_tokens, temperature=h.temperature),
                                seed=seed, system=self.system)
        if self.is_main:
            save_items(path, items, {"n_items": len(items)})
        return items

    def prepare(self) -> tuple[list[TrainItem], list[TrainItem]]:
        """Histories for training and held-out scenarios, filtered training items (cached)."""
        c = self.c
        t0 = time.perf_counter()
        held = self._items("heldout.jsonl", self.held_scen, c.seed + 1) if self.held_scen else []
        items_path = self.wd / "train_items.jsonl"
        if items_path.exists():
            items = load_items(items_path)
        else:
            hist = self._items("histories.jsonl", self.train_scen, c.seed)
            if c.filter.enabled:
                st, mt = accuracy_single_and_multi(
                    self.sampler, hist, SamplingConfig(max_new_tokens=c.rl.max_new_tokens,
                                                       temperature=c.filter.temperature),
                    k=c.filter.k, seed=c.seed + 2, system=self.system, modes=(c.rl.verifier_mode,)
                )[c.rl.verifier_mode]
                items, stats = filter_items(hist, st, mt, cap=c.filter.cap_per_problem, seed=c.seed)
                self.log(f"filtering: kept {stats['n_kept']}/{stats['n_items']} histories "
                         f"(single-turn acc {stats['st_acc_mean']:.3f}, multi-turn acc {stats['mt_acc_mean']:.3f})")
                if not items:
                    raise ConfigError("latent-capability filtering kept no history (the policy is never better "
                                      "single-turn than multi-turn here); disable filter.enabled or use more data")
            else:
                items, stats = hist, {"n_items": len(hist), "n_kept": len(hist), "filter": "disabled"}
            if self.is_main:
                save_items(items_path, items, stats)
        if len(items) < self.c.rl.batch_size:
            raise ConfigError(f"empty dataset: {len(items)} training items < rl.batch_size {self.c.rl.batch_size}")
        self.log(f"data: {len(items)} training items, {len(held)} held-out ({time.perf_counter() - t0:.1f}s)")
        return items, held

    def evaluate(self, params: Any, held: Sequence[TrainItem]) -> dict[str, float]:
        """Greedy single-turn (full prompt) and multi-turn (history + last turn) accuracy."""
        if not held:
            return {}
        self.sampler.params = params
        acc = accuracy_single_and_multi(
            self.sampler, held, SamplingConfig(max_new_tokens=self.c.eval.max_new_tokens, temperature=0.0),
            k=1, seed=0, system=self.system, modes=("strict", "lenient"))
        out = {}
        for mode, (st, mt) in acc.items():
            out[f"eval/single_turn_acc_{mode}"] = float(np.mean(st))
            out[f"eval/multi_turn_acc_{mode}"] = float(np.mean(mt))
        return out

    # ------------------------------------------------------------------ rollouts and rewards

    def rollout(self, params: Any, items: Sequence[TrainItem], step: int) -> tuple[dict[str, np.ndarray], dict[str, float], list[dict]]:
        c, G = self.c.rl, self.c.rl.group_size
        self.sampler.params = params
        prompts = [encode_prompt(self.tok, it.messages, system=self.system) for it in items]
        rows = [p for p in prompts for _ in range(G)]
        t0 = time.perf_counter()
        res = self.sampler.generate_ids(rows, SamplingConfig(max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                                                             top_p=c.top_p),
                                        seed=jax.random.fold_in(jax.random.PRNGKey(self.c.seed), step))
        gen_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        reward, comps, cols = self.rewards(items, res)
        adv = np.asarray(group_advantages(jnp.asarray(reward, jnp.float32), G, scale_rewards=c.scale_rewards))
        P = bucket(max(len(p) for p in rows), 32)
        C = min(bucket(max(max(res.lengths), 1), 16), bucket(c.max_new_tokens, 16))
        batch = assemble_rollouts(rows, res.tokens, self.model.pad_id, P, C)
        batch["advantages"] = adv.astype(np.float32)
        if self.lc.beta > 0:
            batch["ref_logp"] = np.asarray(completion_logprobs(self.ref_params, self.model.cfg, batch["tokens"],
                                                               batch["token_mask"], prompt_len=P,
                                                               temperature=self.lc.temperature))
        if c.mu > 1:
            batch["old_logp"] = np.asarray(completion_logprobs(params, self.model.cfg, batch["tokens"],
                                                               batch["token_mask"], prompt_len=P,
                                                               temperature=self.lc.temperature))
        score_s = time.perf_counter() - t1
        lens = res.lengths.astype(np.float64)
        m = {"reward/total": float(reward.mean()), "reward/group_std": float(reward.reshape(-1, G).std(1).mean())}
        m.update({f"reward/{k}": float(np.mean(v)) for k, v in comps.items()})
        m.update({
            "completion/mean_length": float(lens.mean()), "completion/max_length": float(lens.max()),
            "completion/clipped_frac": float(np.mean([f == "length" for f in res.finish_reasons])),
            "perf/rollout_tokens_per_s": float(lens.sum() / max(gen_s, 1e-9)), "perf/rollout_s": gen_s,
            "perf/score_s": score_s,
        })
        samples = [{"item": items[i // G].item_id, "last_user": items[i // G].last_user, "completion": res.texts[i],
                    **{k: v[i] for k, v in cols.items()}, "R": f"{reward[i]:.3f}", "A": f"{adv[i]:+.2f}"}
                   for i in range(0, len(rows), G)]
        batch["_P"] = np.asarray(P)
        return batch, m, samples

    def rewards(self, items: Sequence[TrainItem], res: Any) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, list]]:
        """RLSTA reward R = R_v + alpha * R_s of each completion (rows grouped by item, G each).

        Returns the reward [N], its components (logged as reward/<name>) and sample-table columns.
        """
        c, G = self.c.rl, self.c.rl.group_size
        golds = [it.answer for it in items for _ in range(G)]
        strict = np.array([verify(t, g, "strict") for t, g in zip(res.texts, golds)])
        lenient = np.array([verify(t, g, "lenient") for t, g in zip(res.texts, golds)])
        rv = strict if c.verifier_mode == "strict" else lenient
        anchors = [(it.anchor_prompt if c.anchor_prompt == "full" else it.merged_user) for it in items for _ in range(G)]
        # R_s is computed even when alpha = 0 (the GRPO baseline) so that runs log the same curves.
        rs = anchor_reward(self.ref_scorer, self.tok, anchors, res.tokens, system=self.system)
        if c.zero_anchor_for_wrong:
            rs = zero_anchor_for_wrong(rs, rv, G)
        reward = rv + c.alpha * rs
        comps = {"verifier": rv, "anchor": rs, "verifier_strict": strict, "verifier_lenient": lenient}
        cols = {"gold": golds, "R_v": [f"{x:.0f}" for x in rv], "R_s": [f"{x:.3f}" for x in rs]}
        return reward, comps, cols

    def _train_step(self, P: int, params: Any, opt_state: Any):
        if P not in self._steps:
            fn = make_train_step(self.model.cfg, self.optimizer, self.lc, P)
            if self.mesh is not None:  # pin outputs to the partition rules (no drift, no recompiles)
                fn = shard_train_step(fn, self.mesh, params, opt_state)
            self._steps[P] = fn
        return self._steps[P]

    def update(self, params: Any, opt_state: Any, batch: dict[str, np.ndarray]) -> tuple[Any, Any, dict[str, float]]:
        c = self.c.rl
        P = int(batch.pop("_P"))
        step_fn = self._train_step(P, params, opt_state)
        n = batch["tokens"].shape[0]
        mb = n // c.grad_accum
        acc: dict[str, list[float]] = {}
        for _ in range(c.mu):
            for s in range(0, n, mb):
                micro = {k: v[s:s + mb] for k, v in batch.items()}
                if self.mesh is not None:
                    micro = dict(zip(micro, shard_batch(self.mesh, list(micro.values()))))
                params, opt_state, m = step_fn(params, opt_state, micro)
                m = jax.device_get(m)
                if not m["finite"]:
                    raise TrainingError(f"non-finite loss or gradient (loss={float(m['loss'])}, "
                                        f"grad_norm={float(m['grad_norm'])}); parameters were not updated")
                for k, v in m.items():
                    acc.setdefault(k, []).append(float(v))
        out = {f"train/{k}": float(np.mean(v)) for k, v in acc.items() if k != "finite"}
        return params, opt_state, out

    # ------------------------------------------------------------------ main loop

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop_signal = signum
        self.log(f"received {signal.Signals(signum).name}: will checkpoint after the current step and exit")

    def run(self) -> dict[str, Any]:
        """Trains to `rl.steps` (resuming from the latest checkpoint) and writes the outputs."""
        c = self.c
        items, held = self.prepare()
        it = make_iterator(items, batch_size=c.rl.batch_size, seed=c.seed, shuffle=True,
                           shard_index=jax.process_index(), shard_count=jax.process_count())
        params = self.model.params
        opt_state = self.optimizer.init(params)
        if self.mesh is not None:
            params, opt_state = shard_train_state(params, opt_state, self.mesh)
        rng = jax.random.PRNGKey(c.seed)
        ck = Checkpointer(self.wd / "checkpoints", max_to_keep=c.checkpoint.keep)
        start = 0
        latest = ck.latest_step()
        if latest is not None:
            state, extra = ck.restore(latest, target={"params": params, "opt_state": opt_state, "rng": rng})
            params, opt_state, rng = state["params"], state["opt_state"], state["rng"]
            it.set_state(extra["data_state"])
            start = int(extra["step"])
            self.metrics.truncate_after(start)
            self.log(f"resumed from {self.wd / 'checkpoints'} at step {start}")
        elif self.is_main:
            self.metrics.truncate_after(-1)
        evals: dict[str, dict[str, float]] = {}
        if start == 0 and held:
            evals["before"] = self.evaluate(params, held)
            self.metrics.scalars(0, evals["before"])
            self.log("eval before: " + _fmt(evals["before"]))
        old_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        last_saved = start
        try:
            bar = _progress(range(start, c.rl.steps), initial=start, total=c.rl.steps, enabled=self.is_main)
            for step in bar:
                t0 = time.perf_counter()
                batch_items = next(it)
                batch, m, samples = self.rollout(params, batch_items, step)
                params, opt_state, tm = self.update(params, opt_state, batch)
                m.update(tm)
                m["perf/step_s"] = time.perf_counter() - t0
                done = step + 1
                if done % c.log.every == 0 or done == c.rl.steps:
                    self.metrics.scalars(done, m)
                if c.log.samples_every and done % c.log.samples_every == 0:
                    self.metrics.samples(done, samples[: c.log.n_samples])
                if c.eval.every and done % c.eval.every == 0 and done < c.rl.steps and held:
                    self.metrics.scalars(done, self.evaluate(params, held))
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(R=f"{m['reward/total']:.3f}", s=f"{m['perf/step_s']:.1f}")
                if done % c.checkpoint.every == 0 or done == c.rl.steps or self._stop_signal is not None:
                    ck.save(done, {"params": params, "opt_state": opt_state, "rng": rng},
                            {"step": done, "data_state": it.get_state()}, force=True)
                    last_saved = done
                if self._stop_signal is not None:
                    ck.wait()
                    self.log(f"checkpoint saved at step {done}; exiting on signal")
                    raise SystemExit(128 + self._stop_signal)
        except TrainingError as e:
            ck.wait()
            raise TrainingError(f"step {step + 1}: {e}. Stopped; last good checkpoint: step {last_saved} "
                                f"in {self.wd / 'checkpoints'}") from None
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            ck.wait()
            ck.close()
        if held:
            evals["after"] = self.evaluate(params, held)
            self.metrics.scalars(c.rl.steps, evals["after"])
            self.log("eval after: " + _fmt(evals["after"]))
        self.metrics.close()
        summary = self.finish(params, evals)
        return summary

    def finish(self, params: Any, evals: dict[str, dict[str, float]]) -> dict[str, Any]:
        """Writes summary.txt, curves.png and the exported policy."""
        if not self.is_main:
            return {}
        rows = read_metrics(self.wd / "metrics.jsonl")
        train_rows = [r for r in rows if "reward/total" in r]
        keys = ["reward/total", "reward/verifier", "reward/anchor", "train/kl", "train/entropy",
                "train/clip_ratio/region_mean", "train/loss", "completion/mean_length", "perf/step_s"]
        plot_curves(self.wd / "metrics.jsonl", self.wd / "curves.png", keys)
        lines = [f"run: {self.wd}", f"method: {self.c.method}  model: {self.c.model}  steps: {self.c.rl.steps}"]
        for k in keys:
            vals = [r[k] for r in train_rows if isinstance(r.get(k), (int, float))]
            if vals:
                lines.append(f"{k:32s} first {vals[0]:.4g}  last {vals[-1]:.4g}  mean {np.mean(vals):.4g}")
        for when, ev in evals.items():
            lines.append(f"held-out {when}: " + _fmt(ev))
        export_dir = None
        if self.c.export:
            export_dir = export_hf_folder(self.model.cfg, params, self.wd / "export", tokenizer=self.tok)
            lines.append(f"exported policy: {export_dir}")
        (self.wd / "summary.txt").write_text("\n".join(lines) + "\n")
        self.log("\n".join(lines))
        return {"evals": evals, "export": str(export_dir) if export_dir else None, "metrics": train_rows}


def _fmt(d: dict[str, float]) -> str:
    return ", ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in d.items())


def _progress(it: Any, *, initial: int, total: int, enabled: bool) -> Any:
    if not enabled:
        return it
    try:
        from tqdm import tqdm

        return tqdm(it, initial=initial, total=total, desc="train", dynamic_ncols=True)
    except ImportError:
        return it
