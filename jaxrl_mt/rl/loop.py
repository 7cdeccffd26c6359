"""The RLSTA / GRPO training loop: data -> rollouts -> rewards -> advantages -> jitted step.

Everything a resumed run needs lives in `<workdir>`: `config.json`, the cached training items
(`histories.jsonl`, `train_items.jsonl`, `heldout.jsonl`), orbax checkpoints (params, optimizer
state, RNG key, step and the grain iterator state), `metrics.jsonl`, TensorBoard events, sample
tables, and at the end `summary.txt`, `curves.png` and the exported policy (`export/`).

Multi-process runs (`jax.distributed`, one global mesh over every process's devices): each
process draws its own batches (grain shards the training items by process), samples, scores and
rewards its own rows, and feeds them to the one jitted train step as per-process rows of a global
batch (`parallel.put_rows`); every process must feed the same number of rows. Bucketed shapes
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
from jaxrl_mt.checkpointing import Checkpointer, check_writable
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.pipeline import make_iterator
from jaxrl_mt.data.records import DataError, Scenario
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.models.hf_io import export_hf_folder
from jaxrl_mt.models.registry import Model, load_model
from jaxrl_mt.parallel import (agree_max, agree_max_many, allgather_json, broadcast_json, check_same_rows,
                               fetch_rows, local_copy, local_mesh, make_mesh, mean_over_processes, process_block,
                               gather_to_host, put_replicated, put_rows, rows_multiple, shard_params, shard_train_state,
                               shard_train_step, spans_processes)
from jaxrl_mt.rewards.anchor import anchor_contexts, anchor_reward, zero_anchor_for_wrong
from jaxrl_mt.rewards.answer_stats import answer_stats
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.rl.grpo import KL_ESTIMATORS, LOSS_TYPES, group_advantages
from jaxrl_mt.rl.histories import (TrainItem, accuracy_single_and_multi, build_histories, filter_items,
                                   load_items, save_items)
from jaxrl_mt.rl.metrics_log import MetricsLog, held_out_before, plot_curves, read_metrics
from jaxrl_mt.rl.optim import make_optimizer
from jaxrl_mt.rl.probe import filter_breakdown, make_probe
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
        check_writable(wd)  # a uniquely named probe: every process of a multi-host run checks at once
    except OSError as e:
        cause = e.__cause__ or e
        raise ConfigError(f"workdir {str(wd)!r} is not writable ({getattr(cause, 'strerror', None) or cause})") from None


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
        self.wd = Path(c.workdir)
        self.is_main = jax.process_index() == 0
        log = log or (lambda msg: print(msg, flush=True))
        self.log = log if self.is_main else (lambda msg: None)  # process 0 logs
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
                                 batch_size=min(16, c.rl.batch_size * c.rl.group_size), mesh=self.mesh)
        self.multi = spans_processes(self.mesh)  # one global mesh over several processes
        micro_rows = c.rl.batch_size * c.rl.group_size // c.rl.grad_accum
        if self.multi and micro_rows % rows_multiple(self.mesh):
            raise ConfigError(f"train micro-batch of {micro_rows} rows per process (rl.batch_size * rl.group_size "
                              f"/ rl.grad_accum) is not a multiple of {rows_multiple(self.mesh)}, this process's "
                              "share of the mesh's data x fsdp shards")
        rl = c.rl
        self.optimizer = make_optimizer(rl.lr, schedule=rl.schedule, warmup_steps=rl.warmup_steps, total_steps=rl.steps,
                                        weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm or None,
                                        grad_accum_steps=rl.grad_accum)
        self.lc = LossConfig(epsilon_low=rl.epsilon_low, epsilon_high=rl.epsilon_high, beta=rl.beta,
                             kl_estimator=rl.kl_estimator, loss_type=rl.loss_type, temperature=rl.temperature,
                             max_completion_length=rl.max_new_tokens, remat=rl.remat)
        self._steps: dict[int, Any] = {}
        self._local_sampler: Sampler | None = None  # multi-process data preparation (see _prep_sampler)
        self.metrics = MetricsLog(self.wd, enabled=self.is_main)
        try:  # the fixed held-out probe (eval.probe_source; None when unset)
            self.probe = make_probe(c, self.system)
        except (DataError, OSError) as e:
            raise ConfigError(f"eval.probe_source: {e}") from None
        if self.probe is not None and self.multi:
            raise ConfigError("eval.probe_source is not supported in a multi-process run")

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

    # ------------------------------------------------------------------ multi-process helpers

    def _cached(self, path: Path) -> list[TrainItem] | None:
        """The items cached at `path`, or None; multi-process: process 0's file, sent to every process."""
        if not self.multi:
            return load_items(path) if path.exists() else None
        got = broadcast_json([it.to_json() for it in load_items(path)] if self.is_main and path.exists() else None)
        return None if got is None else [TrainItem.from_json(d) for d in got]

    def _prep_sampler(self) -> Sampler:
        """The sampler of the data-preparation stages: the policy's, or (multi-process) a sampler on
        a process-local copy of the policy, so that each process works on its block alone."""
        if not self.multi:
            return self.sampler
        if self._local_sampler is None:
            s = self.sampler
            self._local_sampler = Sampler(local_copy(self.model.params, self.mesh), s.cfg, s.tokenizer,
                                          eos_ids=s.eos_ids, pad_id=s.pad_id, max_batch=s.max_batch,
                                          mesh=local_mesh(self.mesh))
        return self._local_sampler

    def _per_process(self, fn: Callable[[Sequence[Any]], list[Any]], seq: Sequence[Any]) -> list[Any]:
        """fn(seq): multi-process, each process maps its contiguous block and the JSON-able results
        are gathered in order (the same list on every process)."""
        if not self.multi:
            return fn(seq)
        lo, hi = process_block(len(seq))
        mine = fn(seq[lo:hi]) if hi > lo else []
        return [x for part in allgather_json(mine) for x in part]

    def _items(self, name: str, scenarios: Sequence[Scenario], seed: int) -> list[TrainItem]:
        path = self.wd / name
        cached = self._cached(path)
        if cached is not None:
            return cached
        h = self.c.history
        sampling = SamplingConfig(max_new_tokens=h.max_new_tokens, temperature=h.temperature)
        sampler = self._prep_sampler()
        items = self._per_process(
            lambda sc: [it.to_json() for it in build_histories(sampler, sc, sampling, seed=seed, system=self.system)],
            scenarios)
        items = [TrainItem.from_json(d) for d in items]
        if self.is_main:
            save_items(path, items, {"n_items": len(items)})
        return items

    def prepare(self) -> tuple[list[TrainItem], list[TrainItem]]:
        """Histories for training and held-out scenarios, filtered training items (cached)."""
        c = self.c
        t0 = time.perf_counter()
        held = self._items("heldout.jsonl", self.held_scen, c.seed + 1) if self.held_scen else []
        items_path = self.wd / "train_items.jsonl"
        items = self._cached(items_path)
        if items is None:
            hist = self._items("histories.jsonl", self.train_scen, c.seed)
            if c.filter.enabled:
                sampler = self._prep_sampler()

                def acc(block: Sequence[TrainItem]) -> list[list[float]]:  # [n, 2] (st, mt) per item
                    st, mt = accuracy_single_and_multi(
                        sampler, block, SamplingConfig(max_new_tokens=c.rl.max_new_tokens,
                                                       temperature=c.filter.temperature),
                        k=c.filter.k, seed=c.seed + 2, system=self.system, modes=(c.rl.verifier_mode,)
                    )[c.rl.verifier_mode]
                    return [[float(a), float(b)] for a, b in zip(st, mt)]

                both = np.asarray(self._per_process(acc, hist), np.float64).reshape(-1, 2)  # [n, 2]
                st, mt = both[:, 0], both[:, 1]
                items, stats = filter_items(hist, st, mt, cap=c.filter.cap_per_problem, seed=c.seed)
                kept_ids = {it.item_id for it in items}
                stats.update(filter_breakdown([h.kind for h in hist], st, mt, [h.item_id in kept_ids for h in hist]))
                self.log("filtering breakdown: " + ", ".join(f"{k}={v}" for k, v in stats.items()
                                                            if k.startswith(("kept", "dropped"))))
                self.log(f"filtering: kept {stats['n_kept']}/{stats['n_items']} histories "
                         f"(single-turn acc {stats['st_acc_mean']:.3f}, multi-turn acc {stats['mt_acc_mean']:.3f})")
                if not items:
                    raise ConfigError("latent-capability filtering kept no history (the policy is never better "
                                      "single-turn than multi-turn here); disable filter.enabled or use more data")
            else:
                items, stats = hist, {"n_items": len(hist), "n_kept": len(hist), "filter": "disabled"}
            if self.is_main:
                save_items(items_path, items, stats)
        self._local_sampler = None  # frees the process-local copy of the policy
        if len(items) < self.c.rl.batch_size:
            raise ConfigError(f"empty dataset: {len(items)} training items < rl.batch_size {self.c.rl.batch_size}")
        self.log(f"data: {len(items)} training items, {len(held)} held-out ({time.perf_counter() - t0:.1f}s)")
        return items, held

    def evaluate(self, params: Any, held: Sequence[TrainItem]) -> dict[str, float]:
        """Greedy single-turn (full prompt) and multi-turn (history + last turn) accuracy.

        Multi-process: each process evaluates its contiguous block of `held` (padded with repeats
        to the largest block, since the sampler call is collective) and the result is the
        item-weighted mean over processes: the accuracy over all held-out items.
        """
        if not held:
            return {}
        self.sampler.params = params
        mine = list(held)
        if self.multi:
            lo, hi = process_block(len(held))
            mine = list(held[lo:hi])
            size = agree_max(len(mine))
            mine = (mine + [mine[-1] if mine else held[0]] * size)[:size]
            n_mine = hi - lo
        acc = accuracy_single_and_multi(
            self.sampler, mine, SamplingConfig(max_new_tokens=self.c.eval.max_new_tokens, temperature=0.0),
            k=1, seed=0, system=self.system, modes=("strict", "lenient"))
        out = {}
        for mode, (st, mt) in acc.items():
            if self.multi:
                st, mt = st[:n_mine], mt[:n_mine]
            out[f"eval/single_turn_acc_{mode}"] = float(np.mean(st)) if len(st) else 0.0
            out[f"eval/multi_turn_acc_{mode}"] = float(np.mean(mt)) if len(mt) else 0.0
        if self.multi:
            out = mean_over_processes(out, weight=n_mine)
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
        if self.multi:  # one train-step program: every process uses the largest buckets
            P, C = agree_max_many([P, C])
        batch = assemble_rollouts(rows, res.tokens, self.model.pad_id, P, C)
        batch["advantages"] = adv.astype(np.float32)
        if self.lc.beta > 0:
            batch["ref_logp"] = self._completion_logprobs(self.ref_params, batch, P)
        if c.mu > 1:
            batch["old_logp"] = self._completion_logprobs(params, batch, P)
        score_s = time.perf_counter() - t1
        lens = res.lengths.astype(np.float64)
        m = {"reward/total": float(reward.mean()), "reward/group_std": float(reward.reshape(-1, G).std(1).mean())}
        m.update({f"reward/{k}": float(np.mean(v)) for k, v in comps.items()})
        m.update(answer_stats(res.texts, [it.answer for it in items for _ in range(G)]))
        m.update({
            "completion/mean_length": float(lens.mean()), "completion/max_length": float(lens.max()),
            "completion/clipped_frac": float(np.mean([f == "length" for f in res.finish_reasons])),
            "perf/rollout_tokens_per_s": float(lens.sum() / max(gen_s, 1e-9)), "perf/rollout_s": gen_s,
            "perf/score_s": score_s,
        })
        samples = [{"item": items[i // G].item_id, "last_user": items[i // G].last_user, "completion": res.texts[i],
                    **{k: v[i] for k, v in cols.items()}, "R": f"{reward[i]:.3f}", "A": f"{adv[i]:+.2f}"}
                   for i in range(0, len(rows), G)]
        return batch, m, samples

    def _completion_logprobs(self, params: Any, batch: dict[str, np.ndarray], P: int) -> np.ndarray:
        """Log-probs [N, C] of this process's completions (per-process rows of a global batch)."""
        tokens, mask = batch["tokens"], batch["token_mask"]
        if not self.multi:
            return np.asarray(completion_logprobs(params, self.model.cfg, tokens, mask, prompt_len=P,
                                                  temperature=self.lc.temperature))
        out = completion_logprobs(params, self.model.cfg, *put_rows(self.mesh, [tokens, mask]), prompt_len=P,
                                  temperature=self.lc.temperature)
        return np.asarray(fetch_rows(out))[: len(tokens)]

    def anchor(self, anchors: Sequence[str], completions: Sequence[Sequence[int]]) -> np.ndarray:
        """R_s [N] of each completion under its anchor prompt (0 for an empty completion).

        Multi-process the scorer call is collective, so every process calls it, even with no
        non-empty completion (`anchor_reward` would skip the call).
        """
        if not self.multi:
            return anchor_reward(self.ref_scorer, self.tok, anchors, completions, system=self.system)
        ctx = anchor_contexts(self.tok, anchors, system=self.system)
        nonempty = [i for i, c in enumerate(completions) if len(c)]
        out = np.zeros(len(completions), np.float64)
        r = self.ref_scorer.score([ctx[i] for i in nonempty], [list(completions[i]) for i in nonempty])
        out[nonempty] = r.geo_mean
        return out

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
        rs = self.anchor(anchors, res.tokens)
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
        P = batch["tokens"].shape[1] - batch["completion_mask"].shape[1]  # prompt bucket of the rollout
        step_fn = self._train_step(P, params, opt_state)
        n = batch["tokens"].shape[0]
        mb = n // c.grad_accum
        if self.multi:  # one global micro-batch: the same number of rows on every process, no padding
            check_same_rows(n, "train batch")
        acc: dict[str, list[float]] = {}
        for _ in range(c.mu):
            for s in range(0, n, mb):
                micro = {k: v[s:s + mb] for k, v in batch.items()}
                if self.mesh is not None:  # one process: shard_batch; several: per-process rows
                    micro = dict(zip(micro, put_rows(self.mesh, list(micro.values()), pad=False)))
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
        if self.multi:  # orbax saves global arrays: the key, the same on every process, replicated
            rng = put_replicated(self.mesh, rng)
        ck = Checkpointer(self.wd / "checkpoints", max_to_keep=c.checkpoint.keep)
        start = 0
        latest = ck.latest_step()
        if latest is not None:
            state, extra = ck.restore(target={"params": params, "opt_state": opt_state, "rng": rng},
                                      on_skip=self.log)  # the newest step that restores
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
        if start == 0 and self.probe is not None:
            self.metrics.scalars(0, self.probe(self.sampler, params))
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
                if self.multi:  # global means (train/* are already global: the same on every process)
                    m = mean_over_processes(m, max_keys=("completion/max_length",))
                done = step + 1
                if done % c.log.every == 0 or done == c.rl.steps:
                    self.metrics.scalars(done, m)
                if c.log.samples_every and done % c.log.samples_every == 0:
                    self.metrics.samples(done, samples[: c.log.n_samples])
                if c.eval.every and done % c.eval.every == 0 and done < c.rl.steps and held:
                    self.metrics.scalars(done, self.evaluate(params, held))
                if self.probe is not None and self.probe.due(done, c.rl.steps):
                    self.metrics.scalars(done, self.probe(self.sampler, params))
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
        """Writes summary.txt, curves.png and the exported policy (process 0)."""
        if self.multi and self.c.export:  # collective: every process takes part in gathering the weights
            params = gather_to_host(params)
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
        if "before" not in evals and (before := held_out_before(rows)):
            evals = {"before": before, **evals}  # a resumed run did not evaluate "before": it is in the log
        for when, ev in evals.items():
            lines.append(f"held-out {when}: " + _fmt(ev))
        export_dir = None
        (self.wd / "summary.txt").write_text("\n".join(lines) + "\n")  # before the export, which may fail
        if self.c.export:  # atomic; a failure is one ExportError line, the previous export is kept
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
