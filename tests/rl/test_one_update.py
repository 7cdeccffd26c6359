"""One update path for every objective: SFT and DPO under gradient accumulation, the batch pytrees, placement.

The optimizer is plain SGD (lr 1, in ``optax.MultiSteps`` as the run's own under ``rl.grad_accum``),
so the change of the parameters is the gradient the step applied.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.rl.dpo import preference_batch
from jaxrl_mt.rl.loop import Trainer
from jaxrl_mt.rl.objective import SupervisedObjective, place
from jaxrl_mt.rl.sft import SftBatch, sft_rows, target_tokens
from jaxrl_mt.rl.state import fresh_state
from jaxrl_mt.rl.step import LossConfig, make_train_step
from jaxrl_mt.rl.supervised import DPOData
from tests.rl.test_supervised import _config


def _update(kind: str, model_dir: Path, wd: Path, grad_accum: int) -> tuple[dict, dict[str, float]]:
    """The parameter change and the train/* metrics of one step on the first 4 training rows."""
    c = _config(kind, model_dir, wd, steps=1)
    c.rl.batch_size, c.rl.grad_accum, c.rl.remat = 4, grad_accum, False
    t = Trainer(c)
    assert isinstance(t.objective, SupervisedObjective)
    sgd = optax.sgd(1.0)
    t.optimizer = sgd if grad_accum == 1 else optax.MultiSteps(sgd, grad_accum).gradient_transformation()
    items, _ = t.prepare()
    state = fresh_state(t.trainable.initial(t.model.params, c.seed), t.optimizer, t.mesh)
    before = jax.tree_util.tree_map(np.array, state.params)  # the step donates the parameters
    state, m, _ = t.train_step(state, items[:4])
    assert state.step == 1 and not {k for k in m if k.startswith("reward/")}
    delta = jax.tree_util.tree_map(lambda new, old: np.asarray(new) - old, state.params, before)
    return delta, {k: v for k, v in m.items() if k.startswith("train/")}


def _moved_by_the_same_update(d1: dict, d2: dict) -> None:
    flat1, flat2 = jax.tree_util.tree_leaves(d1), jax.tree_util.tree_leaves(d2)
    scale = max(float(np.abs(x).max()) for x in flat1)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(flat1, flat2))
    assert scale > 1e-3  # the step moved the parameters
    assert diff <= 1e-6 * scale, (diff, scale)


def test_sft_with_grad_accum_2_gives_the_update_of_grad_accum_1(tiny_chat_model_dir, tmp_path):
    """Through the trainer: the step-level token normaliser makes the two half-batches' mean gradient the
    batch's (the rows hold 13 to 16 target tokens each: a per-micro-batch mean would weigh them otherwise)."""
    (d1, m1), (d2, m2) = (_update("sft", tiny_chat_model_dir, tmp_path / f"k{k}", k) for k in (1, 2))
    _moved_by_the_same_update(d1, d2)
    assert m2["train/loss"] == pytest.approx(m1["train/loss"], rel=1e-6)  # the step's token mean


def test_dpo_with_grad_accum_2_gives_the_update_of_grad_accum_1():
    """The DPO objective's compiled step over the pairs' row slices (as ``Trainer.update`` runs it), on a
    small-vocabulary model: the mean over pairs needs no normaliser when the micro-batches hold as many."""
    cfg = ModelConfig(vocab_size=97, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=8, tie_word_embeddings=True, pad_token_id=0)
    params = init_params(cfg, jax.random.PRNGKey(1), scale=0.5)
    rng = np.random.default_rng(0)
    ids = lambda *lens: [rng.integers(3, 97, n).tolist() for n in lens]  # noqa: E731
    batch = preference_batch(ids(5, 3, 7, 4), ids(4, 6, 2, 5), ids(3, 5, 6, 2), pad_id=0)
    batch = batch._replace(ref_chosen=rng.normal(size=4).astype(np.float32),
                           ref_rejected=rng.normal(size=4).astype(np.float32))
    env = SimpleNamespace(config=SimpleNamespace(dpo=SimpleNamespace(beta=0.1, label_smoothing=0.0)))
    deltas, losses = [], []
    for k in (1, 2):
        objective = SupervisedObjective(DPOData(), env, grad_accum=k)
        opt = optax.sgd(1.0) if k == 1 else optax.MultiSteps(optax.sgd(1.0), k).gradient_transformation()
        step = make_train_step(cfg, opt, LossConfig(chunk=8), loss=objective.loss)
        p, o, seen = jax.tree_util.tree_map(jnp.array, params), opt.init(params), []
        mb = batch.rows // k
        for s in range(0, batch.rows, mb):
            p, o, m = step(p, o, place(None, batch.slice_rows(s, mb)))
            seen.append(float(m["loss"]))
        assert objective.plan(batch) == ("dpo:7x6", (4 // k, 2, 7, 6))  # micro-batch pairs x 2, P, C
        deltas.append(jax.tree_util.tree_map(lambda a, b: np.asarray(a) - np.asarray(b), p, params))
        losses.append(np.mean(seen))
    _moved_by_the_same_update(*deltas)
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_sft_rows_carry_the_step_normaliser_and_slice_as_rows():
    tokens, mask, target = sft_rows([[1, 2, 3], [1, 2]], [[7, 8], [9, 9, 9]], pad_id=0, width=8)
    n = target_tokens(mask, target)
    assert n == 5  # every target token has a real token before it
    b = SftBatch(tokens, mask, target, np.full(2, n / 2, np.float32))
    half = b.slice_rows(1, 1)
    assert b.rows == 2 and half.rows == 1 and half.num_items.tolist() == [2.5]
    np.testing.assert_array_equal(half.tokens, tokens[1:])
    assert b.footprint() == (2, 1, 0, 8)
    assert target_tokens(mask, np.ones_like(mask)) == int(mask.sum()) - 2  # a row's first token is never counted
    placed = place(None, b)  # no mesh: the same rows, not copied
    assert type(placed) is SftBatch
    assert all(x is y for x, y in zip(jax.tree_util.tree_leaves(placed), jax.tree_util.tree_leaves(b)))


def test_preference_pairs_slice_as_rows():
    b = preference_batch([[1, 2], [3]], [[4], [5, 6, 7]], [[8, 8], [9]], pad_id=0, prompt_len=4, completion_len=4)
    assert b.rows == 2 and b.footprint() == (2, 2, 4, 4)
    s = b.slice_rows(1, 1)
    assert type(s) is type(b) and s.rows == 1
    for whole, part in zip(b, s):
        np.testing.assert_array_equal(part, whole[1:2])
