"""SFT and DPO as training methods (``method = "sft" | "dpo"``): RLSTA's Table 1 baselines.

The data come from the same multi-turn histories as RLSTA's (``rl.multiturn``): for every history
the policy samples ``filter.k`` responses to the clean full single-turn prompt and ``filter.k``
to the last turn given the history (the latent-capability filter's samples, same seed and
temperature; with ``filter.enabled`` only the histories the filter keeps are used). Then

* SFT: the history + last user turn as the prompt, the first correct single-turn response as the
  target, the loss on target tokens only (``rl.sft.sft_loss``);
* DPO: chosen = that correct single-turn response, rejected = the model's first wrong multi-turn
  response; TRL's sigmoid loss against the frozen reference (``rl.dpo``).

The rows are split by problem into training and validation (``sft.val_fraction`` /
``dpo.val_fraction``); the validation loss is the method's held-out metric, and the trainer keeps
the checkpoint with the lowest one (``SELECT``) and exports it. Rows are cached in the workdir
(``train_rows.jsonl``, ``val_rows.jsonl``), the filter's samples too (``filter_texts.jsonl``); the
histories as RLSTA's (``histories.jsonl``).

Several processes run as one: the histories and the filter's samples are split over the
processes (``rl.multiturn.per_process``, each on a process-local copy of the policy) and
gathered; cached rows are process 0's files; each process trains on its own rows of the step
(the global batch, ``rl.batch.place``; SFT's normaliser counts every process's tokens, DPO's
reference log-probs are scored on the mesh); the validation loss is computed by every process
on all validation rows.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import jax
import numpy as np

from jaxrl_mt.batching import bucket, fine_bucket
from jaxrl_mt.rl.data import load_scenarios, load_tasks
from jaxrl_mt.rl.dpo import dpo_objective, pair_logprobs, preference_batch
from jaxrl_mt.rl.histories import TrainItem, filter_items, load_texts, save_texts, single_and_multi_texts, texts_key
from jaxrl_mt.rl.batch import place
from jaxrl_mt.rl.multiturn import answered_histories, local_sampler, per_process
from jaxrl_mt.rl.recipe import METHODS, ConfigError, RecipeEnv, SupervisedRecipe
from jaxrl_mt.rl.run_config import DPOSection, SFTSection, TrainConfig
from jaxrl_mt.parallel import agree_max, agree_max_many, allgather_ints, broadcast_json, fetch_rows, process_block
from jaxrl_mt.rl.sft import SftBatch, sft_objective, sft_rows, target_tokens
from jaxrl_mt.rl.step import LossConfig, loss_config
from jaxrl_mt.rl.sft_data import DpoPair, SftItem, dpo_pairs, encode_target, filter_samples, sft_items, \
    solution_items, split_validation
from jaxrl_mt.sampling import SamplingConfig

__all__ = ["DPOData", "FILTER_TEXTS", "SFTData", "SELECT"]

SELECT = ("eval/val_loss", "min")  # the checkpoint kept and exported: the lowest validation loss
FILTER_TEXTS = "filter_texts.jsonl"  # the filter's samples, cached (reused by a run with the same key)
LENGTH_QUANTUM = 32  # row lengths are bucketed (multiples of this, powers of two past 512) to bound recompiles


def _write_rows(path: Path, rows: Sequence[Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in rows))
    os.replace(tmp, path)


def _load_texts(path: Path, key: dict[str, Any], hist: Sequence[TrainItem], k: int) -> dict[str, Any]:
    """The filter's cached samples at ``path`` for ``key``: ``{"texts": [st, mt] or None, "file"}``, or
    ``{"error"}`` for a damaged file (every process raises it: ``prepare`` is collective)."""
    try:
        texts = load_texts(path, key, hist, k=k) if path.is_file() else None
    except ValueError as e:
        return {"error": str(e)}
    return {"texts": None if texts is None else list(texts), "file": path.is_file()}


def _read_rows(path: Path, cls: type, text: str | None = None) -> list[Any]:
    """The rows of ``path`` (or of ``text``, that file's contents read elsewhere)."""
    out = []
    for n, line in enumerate((path.read_text() if text is None else text).splitlines(), 1):
        try:
            d = json.loads(line)
            out.append(cls(**{**d, "messages": tuple(tuple(m) for m in d["messages"])}))
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"{path}:{n}: not a {cls.__name__} row ({type(e).__name__}: {e})") from None
    return out


class _Supervised(SupervisedRecipe):
    """Shared by SFT and DPO: histories -> filter samples -> rows -> train / validation split."""

    row_cls: ClassVar[type] = SftItem
    select = SELECT

    def __init__(self) -> None:
        self._eval_fn: Callable[..., Any] | None = None  # the jitted loss of the validation rows

    def load(self, c: TrainConfig) -> tuple[list[Any], list[Any]]:
        """Training and held-out scenarios (RLSTA's: ``rl.data.load_scenarios``)."""
        return load_scenarios(c)

    def _section(self, c: TrainConfig) -> SFTSection | DPOSection:
        return getattr(c, self.name)

    def prepare(self, env: RecipeEnv, train: Sequence[Any], held: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """Training and validation rows (cached); ``held`` scenarios are not used (the validation
        rows are a split of the training problems' histories, by problem)."""
        c = env.config
        paths = env.workdir / "train_rows.jsonl", env.workdir / "val_rows.jsonl"
        # process 0's files, sent to every process (the identity on one process)
        texts = broadcast_json([p.read_text() for p in paths] if env.is_main and all(p.exists() for p in paths)
                               else None)
        if texts is not None:
            return _read_rows(paths[0], self.row_cls, texts[0]), _read_rows(paths[1], self.row_cls, texts[1])
        rows, origin = self.all_rows(env, train)
        tr, val = split_validation(rows, self._section(c).val_fraction, c.seed)
        if len(tr) < c.rl.batch_size:
            raise ConfigError(f"empty dataset: {len(tr)} {self.name} training rows < rl.batch_size "
                              f"{c.rl.batch_size} (from {origin})")
        if env.is_main:
            _write_rows(paths[0], tr)
            _write_rows(paths[1], val)
        epochs = c.rl.steps * c.rl.batch_size / len(tr)
        env.log(f"data: {len(tr)} {self.name} training rows, {len(val)} validation rows "
                f"(from {origin}); rl.steps={c.rl.steps} x rl.batch_size={c.rl.batch_size} "
                f"is {epochs:.2f} epochs")
        return tr, val

    def all_rows(self, env: RecipeEnv, train: Sequence[Any]) -> tuple[list[Any], str]:
        """Every row before the validation split, and where they came from (for the log)."""
        hist = answered_histories(env, "histories.jsonl", train, env.config.seed)
        return self._rows(env, hist), f"{len(hist)} histories"

    def _rows(self, env: RecipeEnv, hist: list[TrainItem]) -> list[Any]:
        """The filter's samples of every history, the filter applied when enabled, the method's rows."""
        c = env.config
        st, mt = self._filter_texts(env, hist)
        samples = filter_samples(hist, st, mt, k=c.filter.k, mode=c.rl.verifier_mode)
        if c.filter.enabled:
            st_acc = np.array([np.mean(s.st_correct) for s in samples])
            mt_acc = np.array([np.mean(s.mt_correct) for s in samples])
            kept, _ = filter_items(hist, st_acc, mt_acc, cap=c.filter.cap_per_problem, seed=c.seed)
            ids = {it.item_id for it in kept}
            samples = [s for s in samples if s.item.item_id in ids]
        return self.make_rows(samples)

    def _filter_texts(self, env: RecipeEnv, hist: list[TrainItem]) -> tuple[list[str], list[str]]:
        """The filter's samples (``single_and_multi_texts``), cached in ``<workdir>/filter_texts.jsonl``.

        The cache is read only when its key (model, seed, k, temperature, budget, system prompt and
        the histories' digest) is this run's; another run's file copied in (SFT's, for DPO) is
        reused the same way, so the two arms train on the same draws without sampling them twice.
        """
        c = env.config
        seed, k = c.seed + 2, c.filter.k
        sampling = SamplingConfig(max_new_tokens=c.rl.max_new_tokens, temperature=c.filter.temperature)
        key = texts_key(hist, model=c.model, seed=seed, k=k, temperature=sampling.temperature,
                        max_new_tokens=sampling.max_new_tokens, system=env.system)
        path = env.workdir / FILTER_TEXTS
        got = broadcast_json(_load_texts(path, key, hist, k) if env.is_main else None)  # process 0's file
        if "error" in got:  # a damaged cache (a half-written line): one line naming file:line, exit 2
            raise ConfigError(f"{got['error']}; delete the file to sample again")
        if got["texts"] is not None:
            env.log(f"data: the filter's samples from {path}")
            return got["texts"][0], got["texts"][1]
        if got["file"]:
            env.log(f"data: {path} was written with other settings; sampling again")
        sampler = local_sampler(env)  # several processes: each samples its block of histories alone
        first = process_block(len(hist))[0]  # the block's draws are those of one call over all histories

        def texts(block: Sequence[TrainItem]) -> list[list[list[str]]]:  # [n, 2, k]: each history's st, mt
            st, mt = single_and_multi_texts(sampler, block, sampling, k=k, seed=seed, system=env.system,
                                            first=first, total=len(hist))
            return [[st[i * k:(i + 1) * k], mt[i * k:(i + 1) * k]] for i in range(len(block))]

        both = per_process(env, texts, hist)
        st, mt = [t for b in both for t in b[0]], [t for b in both for t in b[1]]
        if env.is_main:
            save_texts(path, key, hist, st, mt, k=k)
        return st, mt

    @abc.abstractmethod
    def make_rows(self, samples: Sequence[Any]) -> list[Any]:
        """The method's rows (``row_cls``) from the filter's samples of every history."""

    def evaluate(self, env: RecipeEnv, params: Any, held: Sequence[Any]) -> dict[str, float]:
        """The validation loss (and the method's metrics), as a mean over the validation rows."""
        if not held:
            return {}
        n = env.config.rl.batch_size
        if self._eval_fn is None:
            loss, lc = self.loss(env), dataclasses.replace(loss_config(env.config.rl), remat=False)
            self._eval_fn = jax.jit(lambda p, cfg, batch: loss(p, cfg, lc, batch), static_argnums=1)
        fn = self._eval_fn
        sums: dict[str, float] = {}
        for s in range(0, len(held), n):
            block = list(held[s:s + n])
            _, m = fn(params, env.sampler.cfg, self.batch(env, block))
            for k, v in self.weighted(jax.device_get(m), len(block)).items():
                sums[k] = sums.get(k, 0.0) + v
        return self.finish_eval(sums, len(held))

    @abc.abstractmethod
    def weighted(self, m: dict[str, Any], rows: int) -> dict[str, float]:
        """The sums a validation block of ``rows`` rows adds, from its loss metrics ``m``."""

    @abc.abstractmethod
    def finish_eval(self, sums: dict[str, float], rows: int) -> dict[str, float]:
        """The ``eval/*`` metrics from the sums over all ``rows`` validation rows."""


@METHODS.register("sft")
class SFTData(_Supervised):
    """``method = "sft"``: the correct single-turn response appended to the history, as the target."""

    name = "sft"
    row_cls = SftItem

    def load(self, c: TrainConfig) -> tuple[list[Any], list[Any]]:
        """RLSTA's scenarios; with ``sft.targets = "solution"`` the add_source tasks themselves."""
        if c.sft.targets != "solution":
            return super().load(c)
        tasks = load_tasks(c.data.add_source, c.data, require_each=True)
        if not tasks:
            raise ConfigError("empty dataset: sft.targets='solution' needs data.add_source tasks")
        return tasks, []

    def all_rows(self, env: RecipeEnv, train: Sequence[Any]) -> tuple[list[Any], str]:
        if env.config.sft.targets != "solution":
            return super().all_rows(env, train)
        return solution_items(train), f"{len(train)} problems' worked solutions, single-turn"

    def make_rows(self, samples: Sequence[Any]) -> list[SftItem]:
        return sft_items(samples)

    def batch(self, env: RecipeEnv, rows: Sequence[SftItem]) -> SftBatch:
        """The rows, each carrying the step's target tokens / ``rl.grad_accum`` (the loss's normaliser)."""
        enc = [encode_target(env.sampler.tokenizer, r.messages, r.target, system=env.system) for r in rows]
        width = agree_max(fine_bucket(max(len(p) + len(t) for p, t in enc), LENGTH_QUANTUM))  # one shape everywhere
        tokens, mask, target = sft_rows([p for p, _ in enc], [t for _, t in enc], env.sampler.pad_id, width=width)
        n = target_tokens(mask, target)
        n = int(allgather_ints([n]).sum())  # the step's tokens over every process
        num_items = np.full(len(rows), max(n, 1) / env.config.rl.grad_accum, np.float32)
        return SftBatch(tokens, mask, target, num_items)

    def loss(self, env: RecipeEnv) -> Callable[..., Any]:
        return _sft

    def weighted(self, m: dict[str, Any], rows: int) -> dict[str, float]:
        return {"nll_sum": float(m["nll_sum"]), "tokens": float(m["tokens"])}

    def finish_eval(self, sums: dict[str, float], rows: int) -> dict[str, float]:
        return {"eval/val_loss": sums["nll_sum"] / max(sums["tokens"], 1.0), "eval/val_tokens": sums["tokens"]}


@METHODS.register("dpo")
class DPOData(_Supervised):
    """``method = "dpo"``: chosen = the correct single-turn response, rejected = the wrong multi-turn one."""

    name = "dpo"
    row_cls = DpoPair

    def make_rows(self, samples: Sequence[Any]) -> list[DpoPair]:
        return dpo_pairs(samples)

    def batch(self, env: RecipeEnv, rows: Sequence[DpoPair]) -> Any:
        """The pairs with the frozen reference's log-prob sums filled in."""
        tok = env.sampler.tokenizer
        enc = [(encode_target(tok, r.messages, r.chosen, system=env.system),
                encode_target(tok, r.messages, r.rejected, system=env.system)) for r in rows]
        prompts, chosen, rejected = [c[0] for c, _ in enc], [c[1] for c, _ in enc], [r[1] for _, r in enc]
        p_len, c_len = agree_max_many([bucket(max(map(len, prompts)), LENGTH_QUANTUM),  # one shape everywhere
                                       bucket(max(map(len, chosen + rejected)), LENGTH_QUANTUM)])
        b = preference_batch(prompts, chosen, rejected, env.sampler.pad_id, prompt_len=p_len, completion_len=c_len)
        # on the mesh, this process's rows of the global batch (``rl.batch.place``), read back as its rows
        ref = fetch_rows(_pair_logprobs_jit(env.ref_params, env.ref_cfg, *place(env.mesh, tuple(b[:6]), pad=True)))
        return b._replace(ref_chosen=np.asarray(ref[0])[:len(rows)], ref_rejected=np.asarray(ref[1])[:len(rows)])

    def loss(self, env: RecipeEnv) -> Callable[..., Any]:
        d = env.config.dpo
        return functools.partial(_dpo, beta=d.beta, label_smoothing=d.label_smoothing)

    def weighted(self, m: dict[str, Any], rows: int) -> dict[str, float]:
        return {k: float(m[k]) * rows for k in ("loss", "rewards/accuracies", "rewards/margins")}

    def finish_eval(self, sums: dict[str, float], rows: int) -> dict[str, float]:
        return {"eval/val_loss": sums["loss"] / rows, "eval/val_accuracy": sums["rewards/accuracies"] / rows,
                "eval/val_margin": sums["rewards/margins"] / rows}


@functools.partial(jax.jit, static_argnums=1)
def _pair_logprobs_jit(params: Any, cfg: Any, *arrays: Any) -> tuple[jax.Array, jax.Array]:
    return pair_logprobs(params, cfg, *arrays)


def _sft(params: Any, cfg: Any, lc: LossConfig, batch: SftBatch) -> tuple[jax.Array, dict[str, jax.Array]]:
    return sft_objective(params, cfg, batch, chunk=lc.chunk, remat=lc.remat)


def _dpo(params: Any, cfg: Any, lc: LossConfig, batch: Any, *, beta: float, label_smoothing: float
         ) -> tuple[jax.Array, dict[str, jax.Array]]:
    loss, m = dpo_objective(params, cfg, batch, beta=beta, label_smoothing=label_smoothing, chunk=lc.chunk,
                            remat=lc.remat)
    return loss, {**m, "loss": loss}
