"""DPO: the loss, rewards and gradients against TRL's sigmoid-DPO formulas worked in NumPy, and the sequence
log-probs against a transformers forward of a tiny random Llama.

TRL (``DPOTrainer.dpo_loss``, ``loss_type="sigmoid"``): logits = (pi_c - pi_r) - (ref_c - ref_r),
losses = -logsigmoid(beta * logits) * (1 - ls) - logsigmoid(-beta * logits) * ls, chosen_rewards =
beta * (pi_c - ref_c), rejected_rewards = beta * (pi_r - ref_r), all detached; logged as
rewards/chosen, rewards/rejected, rewards/accuracies (chosen > rejected), rewards/margins, logps/*.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.rl.dpo import dpo_loss, pair_logprobs

TOL = 1e-6


def _np_logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def _np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_dpo(pc, pr, rc, rr, beta, ls):
    """The TRL formulas in float64: loss, its gradient w.r.t. (pc, pr), the logged metrics."""
    z = beta * ((pc - pr) - (rc - rr))
    losses = -_np_logsigmoid(z) * (1 - ls) - _np_logsigmoid(-z) * ls
    dz = (-(1 - ls) * _np_sigmoid(-z) + ls * _np_sigmoid(z)) * beta / len(pc)  # d mean(losses) / d logits
    ch, rj = beta * (pc - rc), beta * (pr - rr)
    metrics = {"rewards/chosen": ch.mean(), "rewards/rejected": rj.mean(), "rewards/accuracies": (ch > rj).mean(),
               "rewards/margins": (ch - rj).mean(), "logps/chosen": pc.mean(), "logps/rejected": pr.mean()}
    return losses.mean(), dz, -dz, metrics


@pytest.mark.parametrize("beta,ls", [(0.1, 0.0), (0.5, 0.0), (0.1, 0.2)])
def test_loss_rewards_and_gradients_equal_trl_formulas(beta, ls):
    rng = np.random.default_rng(0)
    pc, pr, rc, rr = (rng.uniform(-30.0, -5.0, 8) for _ in range(4))
    f = lambda a, b, c, d: dpo_loss(a, b, c, d, beta=beta, label_smoothing=ls)  # noqa: E731
    args = [jnp.asarray(x, jnp.float32) for x in (pc, pr, rc, rr)]
    (loss, metrics), grads = jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True)(*args)
    want_loss, want_gc, want_gr, want_m = np_dpo(*(np.asarray(a, np.float64) for a in args), beta, ls)
    diffs = {"loss": abs(float(loss) - want_loss), "grad_c": np.max(np.abs(np.asarray(grads[0]) - want_gc)),
             "grad_r": np.max(np.abs(np.asarray(grads[1]) - want_gr))}
    diffs.update({k: abs(float(metrics[k]) - v) for k, v in want_m.items()})
    assert max(diffs.values()) < TOL, diffs
    assert not np.any(np.asarray(grads[2])) and not np.any(np.asarray(grads[3]))  # the reference is frozen
    assert 0.0 < want_m["rewards/accuracies"] < 1.0  # the accuracy check is not vacuous


def test_loss_hand_values():
    # equal policy and reference: logits 0, loss log 2, rewards 0, accuracy 0 (0 > 0 is false)
    z = jnp.array([-10.0, -20.0])
    loss, m = dpo_loss(z, z, z, z)
    assert float(loss) == pytest.approx(np.log(2.0), abs=1e-7)
    assert float(m["rewards/accuracies"]) == 0.0 and float(m["rewards/margins"]) == 0.0
    # one pair, pi_c - ref_c = 2, pi_r - ref_r = -3: logits 5, loss -logsigmoid(0.5) = 0.474077
    loss, m = dpo_loss(jnp.array([-8.0]), jnp.array([-13.0]), jnp.array([-10.0]), jnp.array([-10.0]))
    assert float(loss) == pytest.approx(0.4740770, abs=1e-6)
    assert float(m["rewards/chosen"]) == pytest.approx(0.2) and float(m["rewards/rejected"]) == pytest.approx(-0.3)
    assert float(m["rewards/margins"]) == pytest.approx(0.5) and float(m["rewards/accuracies"]) == 1.0
    with pytest.raises(ValueError, match="must all be"):
        dpo_loss(jnp.zeros(2), jnp.zeros(3), jnp.zeros(2), jnp.zeros(2))


# ------------------------------------------------------------------ log-probs against transformers


def _left_pad(rows, width):
    toks = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
        toks[i, width - len(r):], mask[i, width - len(r):] = r, True
    return toks, mask


def _right_pad(rows, width):
    toks = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
        toks[i, :len(r)], mask[i, :len(r)] = r, True
    return toks, mask


def hf_completion_logps(model, prompts, completions):
    """sum_t log p(y_t | prompt, y_<t) by a transformers forward of each unpadded row [prompt | completion]."""
    import torch

    out = []
    for p, c in zip(prompts, completions):
        ids = torch.tensor([list(p) + list(c)], dtype=torch.long)
        with torch.no_grad():
            logits = model(input_ids=ids).logits.double()
        lp = torch.log_softmax(logits[0, :-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        out.append(float(lp[len(p) - 1:].sum()))
    return np.array(out)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from jaxrl_mt.models.registry import load_model
    from tests.test_sampling import tiny_hf_llama

    folder = tmp_path_factory.mktemp("dpo_tiny")
    return tiny_hf_llama(folder, seed=3), load_model(str(folder), with_tokenizer=False)


def test_pair_logprobs_equal_transformers(tiny_pair):
    ref, ours = tiny_pair
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 97, n).tolist() for n in (5, 9, 2)]
    chosen = [rng.integers(3, 97, n).tolist() for n in (4, 1, 7)]
    rejected = [rng.integers(3, 97, n).tolist() for n in (6, 3, 2)]
    p, pm = _left_pad(prompts, 10)
    c, cm = _right_pad(chosen, 8)
    r, rm = _right_pad(rejected, 6)
    fn = jax.jit(pair_logprobs, static_argnames=("cfg", "chunk"))
    got_c, got_r = fn(ours.params, ours.cfg, p, pm, c, cm, r, rm, chunk=4)
    want_c, want_r = hf_completion_logps(ref, prompts, chosen), hf_completion_logps(ref, prompts, rejected)
    diff = max(np.max(np.abs(np.asarray(got_c) - want_c)), np.max(np.abs(np.asarray(got_r) - want_r)))
    assert diff < 1e-4, (diff, np.asarray(got_c), want_c, np.asarray(got_r), want_r)
    assert np.all(want_c < -1.0)  # real sums, not zeros
