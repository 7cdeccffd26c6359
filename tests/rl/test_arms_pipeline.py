"""SFT and DPO from filter samples to a gradient step, on the tiny chat model (real tokenizer and template).

Not parity (test_sft / test_dpo hold that): the pieces fit together, the loss at the start is what the formulas
say (DPO: log 2, the policy being the reference) and plain gradient steps lower it.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_mt.rl.dpo import dpo_objective, pair_logprobs, preference_batch
from jaxrl_mt.rl.histories import TrainItem
from jaxrl_mt.rl.sft import sft_loss, sft_rows
from jaxrl_mt.rl.sft_data import dpo_pairs, encode_target, filter_samples, sft_items


def _samples():
    items = [TrainItem(item_id=f"p{i}|sharded|0", task_id=f"p{i}", kind="sharded",
                       history=(("user", f"Tom has {i + 2} apples."), ("assistant", "OK.")),
                       last_user="He buys 4 more. How many now?", anchor_prompt="", merged_user="",
                       answer=str(i + 6)) for i in range(3)]
    st = [f"He has {i + 2} + 4 = {i + 6}. The answer is {i + 6}." for i in range(3)]
    mt = [f"He has {i + 3}. The answer is {i + 3}." for i in range(3)]
    return filter_samples(items, st, mt, k=1)


def _sgd(loss_fn, params, steps, lr):
    g = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    losses = []
    for _ in range(steps):
        (loss, m), grads = g(params)
        losses.append(float(loss))
        params = jax.tree_util.tree_map(lambda p, d: p - lr * d, params, grads)
    return losses, m


def test_dpo_from_filter_samples_to_gradient_steps(tiny_model):
    m, tok = tiny_model, tiny_model.tokenizer
    pairs = dpo_pairs(_samples())
    assert len(pairs) == 3
    enc = [(encode_target(tok, p.messages, p.chosen), encode_target(tok, p.messages, p.rejected)) for p in pairs]
    assert all(c[0] == r[0] for c, r in enc)  # one prompt per pair
    batch = preference_batch([c[0] for c, _ in enc], [c[1] for c, _ in enc], [r[1] for _, r in enc], m.pad_id)
    ref_c, ref_r = jax.jit(pair_logprobs, static_argnums=1)(m.params, m.cfg, *batch[:6])
    batch = batch._replace(ref_chosen=np.asarray(ref_c), ref_rejected=np.asarray(ref_r))
    losses, metrics = _sgd(lambda p: dpo_objective(p, m.cfg, batch), m.params, 4, 1.0)
    # policy = reference: logits 0 up to float32 sums of ~100 log-probs from two differently fused programs
    assert losses[0] == pytest.approx(np.log(2.0), abs=1e-5)
    assert losses[-1] < losses[0] - 1e-3 and float(metrics["rewards/margins"]) > 0
    assert float(metrics["rewards/accuracies"]) == 1.0


def test_sft_from_filter_samples_to_gradient_steps(tiny_model):
    m, tok = tiny_model, tiny_model.tokenizer
    items = sft_items(_samples())
    enc = [encode_target(tok, it.messages, it.target) for it in items]
    tokens, mask, target = sft_rows([p for p, _ in enc], [t for _, t in enc], m.pad_id)
    assert int(target.sum()) == sum(len(t) for _, t in enc)
    for i, (p, t) in enumerate(enc):
        assert tokens[i, len(p):len(p) + len(t)].tolist() == t and tok.decode(t).endswith("<|im_end|>")
    losses, metrics = _sgd(lambda p: sft_loss(p, m.cfg, tokens, mask, target), m.params, 4, 0.5)
    assert int(metrics["tokens"]) == int(target.sum())
    assert losses[-1] < losses[0] - 1e-3
