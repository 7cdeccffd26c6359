"""GRPO math against a NumPy transcription of TRL 1.16's GRPOTrainer formulas."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.rl import grpo

B, G, T = 3, 4, 7
N = B * G


# ---------------------------------------------------------------------------------------------
# NumPy transcription of TRL 1.16 (trl/trainer/grpo_trainer.py, trl/trainer/utils.py), float64.
# ---------------------------------------------------------------------------------------------
def np_nanstd(x: np.ndarray, axis: int) -> np.ndarray:
    """trl.trainer.utils.nanstd: nanmean of squared deviations times count / (count - 1)."""
    mean = np.nanmean(x, axis=axis, keepdims=True)
    variance = np.nanmean((x - mean) ** 2, axis=axis, keepdims=True)
    count = np.sum(~np.isnan(x), axis=axis, keepdims=True)
    variance = variance * (count / (count - 1))
    return np.sqrt(variance).squeeze(axis)


def np_advantages(rewards: np.ndarray, num_generations: int, scale: bool) -> np.ndarray:
    """GRPOTrainer._generate_and_score_completions, sum_then_normalize, scale_rewards group/none."""
    mean_grouped_rewards = np.nanmean(rewards.reshape(-1, num_generations), axis=1)
    mean_grouped_rewards = np.repeat(mean_grouped_rewards, num_generations)
    std_rewards = np_nanstd(rewards.reshape(-1, num_generations), axis=1)
    std_rewards = np.repeat(std_rewards, num_generations)
    advantages = rewards - mean_grouped_rewards
    if scale:
        advantages = advantages / (std_rewards + 1e-4)
    return advantages


def np_loss(logp, old, ref, adv, mask, *, eps_low, eps_high, beta, est, loss_type, max_len):
    """GRPOTrainer._compute_loss, importance_sampling_level='token', 1 accumulation step."""
    advantages = adv[:, None]
    old_per_token_logps = logp if old is None else old
    log_ratio = logp - old_per_token_logps
    coef_1 = np.exp(log_ratio)
    if est == "k3":
        per_token_kl = np.exp(ref - logp) - (ref - logp) - 1
    else:
        per_token_kl = logp - ref
    coef_2 = np.clip(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -np.minimum(coef_1 * advantages, coef_2 * advantages)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / np.maximum(mask.sum(-1), 1.0)).mean()
    elif loss_type in ("bnpo", "token_mean"):
        loss = (per_token_loss * mask).sum() / max(mask.sum(), 1.0)
    else:
        loss = (per_token_loss * mask).sum() / (per_token_loss.shape[0] * max_len)

    def global_masked_mean(x):
        return (x * mask).sum() / max(mask.sum(), 1.0)

    is_low_clipped = (coef_1 < 1 - eps_low) & (advantages < 0)
    is_high_clipped = (coef_1 > 1 + eps_high) & (advantages > 0)
    is_region_clipped = is_low_clipped | is_high_clipped
    metrics = {
        "kl": global_masked_mean(per_token_kl),
        "clip_ratio/low_mean": global_masked_mean(is_low_clipped.astype(float)),
        "clip_ratio/high_mean": global_masked_mean(is_high_clipped.astype(float)),
        "clip_ratio/region_mean": global_masked_mean(is_region_clipped.astype(float)),
        "ratio_mean": global_masked_mean(coef_1),
    }
    return loss, metrics


def make_inputs(seed: int, empty_row: bool = False):
    """Random [N, T] log-probs with ragged masks; old log-probs put ratios inside and outside
    the clip range for both advantage signs."""
    rng = np.random.default_rng(seed)
    logp = np.log(rng.uniform(0.05, 1.0, size=(N, T)))
    old = logp + rng.normal(0.0, 0.35, size=(N, T))
    ref = logp + rng.normal(0.0, 0.5, size=(N, T))
    lengths = rng.integers(1, T + 1, size=N)
    lengths[0] = T
    if empty_row:
        lengths[1] = 0
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float64)
    rewards = rng.normal(size=N)
    adv = np_advantages(rewards, G, True)
    return logp, old, ref, adv, mask


def f32(x):
    return None if x is None else jnp.asarray(x, jnp.float32)


# ---------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------
def test_group_advantages_hand_values():
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # [8], two groups of 4
    adv = grpo.group_advantages(rewards, 4)
    std = np.sqrt((4 * 0.25) / 3)  # unbiased: sum of squares 1.0 over G - 1 = 3
    a = 0.5 / (std + 1e-4)
    np.testing.assert_allclose(np.asarray(adv), [a, -a, -a, a, 0, 0, 0, 0], rtol=1e-6, atol=1e-7)
    unscaled = grpo.group_advantages(rewards, 4, scale_rewards=False)
    np.testing.assert_allclose(np.asarray(unscaled), [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0], atol=1e-7)


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("group_size", [2, 4, 8])
def test_group_advantages_match_trl_transcription(scale, group_size):
    rewards = np.random.default_rng(group_size).normal(size=4 * group_size) * 3.0
    ours = grpo.group_advantages(f32(rewards), group_size, scale_rewards=scale)
    np.testing.assert_allclose(np.asarray(ours), np_advantages(rewards, group_size, scale), atol=1e-5, rtol=1e-5)


def test_group_advantages_jit_and_errors():
    rewards = jnp.arange(6.0)
    jitted = jax.jit(grpo.group_advantages, static_argnums=(1, 2))
    np.testing.assert_allclose(jitted(rewards, 3, True), grpo.group_advantages(rewards, 3), atol=1e-6)
    with pytest.raises(ValueError, match="not a multiple of group_size=4"):
        grpo.group_advantages(rewards, 4)
    with pytest.raises(ValueError, match=r"1-D \[N\]"):
        grpo.group_advantages(rewards.reshape(2, 3), 3)


# ---------------------------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------------------------
def test_frac_zero_std_hand_values():
    # groups of 3: [1, 1, 1] equal, [0, 1, 0] not, [0.25, 0.25, 0.25] equal, [0, 0, 1e-3] not -> 2 / 4
    r = jnp.array([1, 1, 1, 0, 1, 0, 0.25, 0.25, 0.25, 0, 0, 1e-3], jnp.float32)
    assert float(grpo.frac_zero_std(r, 3)) == 0.5
    assert float(grpo.frac_zero_std(r, 12)) == 0.0 and float(grpo.frac_zero_std(r, 1)) == 1.0
    # an all-equal group has zero advantages; any other group does not
    adv = np.asarray(grpo.group_advantages(r, 3)).reshape(4, 3)
    assert [bool(np.all(a == 0)) for a in adv] == [True, False, True, False]


def test_per_token_kl_values():
    logp = jnp.array([[-1.0, -2.0]])  # [1, 2]
    ref = jnp.array([[-1.5, -1.0]])  # [1, 2]
    np.testing.assert_allclose(grpo.per_token_kl(logp, ref, "k1"), [[0.5, -1.0]], atol=1e-7)
    # k3: exp(d) - d - 1 with d = ref - logp = [-0.5, 1.0]
    want = [[np.exp(-0.5) + 0.5 - 1, np.exp(1.0) - 1.0 - 1]]
    np.testing.assert_allclose(grpo.per_token_kl(logp, ref, "k3"), want, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown estimator 'k2'; valid: k1, k3"):
        grpo.per_token_kl(logp, ref, "k2")


# ---------------------------------------------------------------------------------------------
# Loss: parity with the transcription
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "token_mean", "dr_grpo"])
@pytest.mark.parametrize("est", ["k1", "k3"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("on_policy", [False, True])
def test_loss_matches_trl_transcription(loss_type, est, beta, on_policy):
    seed = 10 * grpo.LOSS_TYPES.index(loss_type) + (est == "k3")
    logp, old, ref, adv, mask = make_inputs(seed, empty_row=loss_type == "grpo")
    if on_policy:
        old = None
    kw = dict(eps_low=0.2, eps_high=0.28, beta=beta, est=est, loss_type=loss_type, max_len=10)
    want_loss, want_metrics = np_loss(logp, old, ref, adv, mask, **kw)
    fn = jax.jit(
        functools.partial(
            grpo.grpo_loss,
            epsilon_low=0.2,
            epsilon_high=0.28,
            beta=beta,
            kl_estimator=est,
            loss_type=loss_type,
            max_completion_length=10,
        )
    )
    loss, metrics = fn(f32(logp), f32(old), f32(ref), f32(adv), f32(mask))
    np.testing.assert_allclose(float(loss), want_loss, atol=1e-5, rtol=1e-5)
    assert set(metrics) == set(want_metrics)
    for k, v in want_metrics.items():
        np.testing.assert_allclose(float(metrics[k]), v, atol=1e-5, rtol=1e-5, err_msg=k)
    if not on_policy:  # the case exercises both sides of the clip range for both signs of A
        assert want_metrics["clip_ratio/low_mean"] > 0 and want_metrics["clip_ratio/high_mean"] > 0
        ratio = np.exp(logp - old)
        inside = (ratio > 0.8) & (ratio < 1.28) & (mask > 0)
        assert inside.sum() > 0 and ((~inside) & (mask > 0)).sum() > 0


def test_loss_without_ref_and_bool_mask():
    logp, old, ref, adv, mask = make_inputs(seed=3)
    loss, metrics = grpo.grpo_loss(f32(logp), f32(old), None, f32(adv), jnp.asarray(mask > 0))
    kw = dict(eps_low=0.2, eps_high=0.2, beta=0.0, est="k3", loss_type="grpo", max_len=T)
    want, _ = np_loss(logp, old, ref, adv, mask, **kw)
    np.testing.assert_allclose(float(loss), want, atol=1e-5, rtol=1e-5)
    assert "kl" not in metrics


def test_dr_grpo_defaults_to_t():
    logp, old, ref, adv, mask = make_inputs(seed=4)
    loss, _ = grpo.grpo_loss(f32(logp), f32(old), f32(ref), f32(adv), f32(mask), loss_type="dr_grpo")
    kw = dict(eps_low=0.2, eps_high=0.2, beta=0.0, est="k3", loss_type="dr_grpo", max_len=T)
    want, _ = np_loss(logp, old, ref, adv, mask, **kw)
    np.testing.assert_allclose(float(loss), want, atol=1e-5, rtol=1e-5)


def test_per_token_advantages_broadcast_equivalently():
    logp, old, ref, adv, mask = make_inputs(seed=5)
    a, _ = grpo.grpo_loss(f32(logp), f32(old), f32(ref), f32(adv), f32(mask), beta=0.1)
    b, _ = grpo.grpo_loss(f32(logp), f32(old), f32(ref), f32(np.repeat(adv[:, None], T, 1)), f32(mask), beta=0.1)
    np.testing.assert_allclose(float(a), float(b), atol=1e-7)


# ---------------------------------------------------------------------------------------------
# mu = 1 and gradients
# ---------------------------------------------------------------------------------------------
def test_on_policy_loss_is_minus_mean_advantage():
    """With old = logp every ratio is 1, so the per-token loss is -A (TRL docs, mu = 1)."""
    logp, _, ref, adv, mask = make_inputs(seed=6)
    loss, metrics = grpo.grpo_loss(f32(logp), None, f32(ref), f32(adv), f32(mask))
    np.testing.assert_allclose(float(loss), -adv.mean(), atol=1e-6)  # ~0: A sums to 0 per group
    lengths = mask.sum(-1)
    loss_bnpo, _ = grpo.grpo_loss(f32(logp), None, None, f32(adv), f32(mask), loss_type="bnpo")
    np.testing.assert_allclose(float(loss_bnpo), -(adv * lengths).sum() / lengths.sum(), atol=1e-6)
    assert float(metrics["ratio_mean"]) == 1.0 and float(metrics["clip_ratio/region_mean"]) == 0.0
    explicit, _ = grpo.grpo_loss(f32(logp), f32(logp), f32(ref), f32(adv), f32(mask))
    np.testing.assert_allclose(float(loss), float(explicit), atol=1e-7)


def hand_grad(logp, old, ref, adv, mask, *, eps_low, eps_high, beta, est, loss_type, max_len):
    """d loss / d logp by hand: the surrogate's gradient is -A * ratio unless the clip is
    active (A > 0 and ratio > 1 + eps_high, or A < 0 and ratio < 1 - eps_low), where it is 0;
    the KL adds beta * (1 - exp(ref - logp)) for k3 and beta for k1."""
    a = adv[:, None]
    ratio = np.exp(logp - (logp if old is None else old))
    clipped = ((a > 0) & (ratio > 1 + eps_high)) | ((a < 0) & (ratio < 1 - eps_low))
    g = np.where(clipped, 0.0, -a * ratio)
    if beta:
        g = g + beta * ((1.0 - np.exp(ref - logp)) if est == "k3" else 1.0)
    if loss_type == "grpo":
        w = 1.0 / (logp.shape[0] * np.maximum(mask.sum(-1, keepdims=True), 1.0))
    elif loss_type in ("bnpo", "token_mean"):
        w = 1.0 / max(mask.sum(), 1.0)
    else:
        w = 1.0 / (logp.shape[0] * max_len)
    return g * mask * w


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("est", ["k1", "k3"])
@pytest.mark.parametrize("on_policy", [False, True])
def test_gradient_matches_hand_derivation(loss_type, est, on_policy):
    logp, old, ref, adv, mask = make_inputs(seed=11)
    if on_policy:
        old = None
    kw = dict(eps_low=0.2, eps_high=0.28, beta=0.05, est=est, loss_type=loss_type, max_len=9)

    def f(lp):
        return grpo.grpo_loss(
            lp, f32(old), f32(ref), f32(adv), f32(mask), epsilon_low=0.2, epsilon_high=0.28,
            beta=0.05, kl_estimator=est, loss_type=loss_type, max_completion_length=9,
        )[0]

    got = np.asarray(jax.grad(f)(f32(logp)))
    want = hand_grad(logp, old, ref, adv, mask, **kw)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)


def test_hand_gradient_matches_finite_differences_of_transcription():
    """Checks the hand derivation itself, in float64, on a small case with clipped tokens."""
    logp, old, ref, adv, mask = make_inputs(seed=12)
    kw = dict(eps_low=0.2, eps_high=0.28, beta=0.05, est="k3", loss_type="grpo", max_len=T)
    want = hand_grad(logp, old, ref, adv, mask, **kw)
    h = 1e-6
    fd = np.zeros_like(logp)
    for i in range(N):
        for t in range(T):
            up, down = logp.copy(), logp.copy()
            up[i, t] += h
            down[i, t] -= h
            plus, minus = np_loss(up, old, ref, adv, mask, **kw)[0], np_loss(down, old, ref, adv, mask, **kw)[0]
            fd[i, t] = (plus - minus) / (2 * h)
    np.testing.assert_allclose(fd, want, atol=1e-8)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------
def test_loss_errors():
    logp, old, ref, adv, mask = (f32(x) for x in make_inputs(seed=7))
    with pytest.raises(ValueError, match="unknown loss_type 'cispo'; valid: grpo, bnpo, token_mean, dr_grpo, dapo"):
        grpo.grpo_loss(logp, old, ref, adv, mask, loss_type="cispo")
    with pytest.raises(ValueError, match="unknown kl_estimator 'k2'"):
        grpo.grpo_loss(logp, old, ref, adv, mask, kl_estimator="k2")
    with pytest.raises(ValueError, match="beta=0.1 needs ref_logp"):
        grpo.grpo_loss(logp, old, None, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="advantages has shape"):
        grpo.grpo_loss(logp, old, ref, adv[:-1], mask)
    with pytest.raises(ValueError, match="old_logp has shape"):
        grpo.grpo_loss(logp, old[:, :-1], ref, adv, mask)


def test_dapo_is_the_token_mean_of_the_whole_step():
    """TRL's "dapo": sum(loss * mask) / num_items, num_items = the step's tokens / micro-batches, so the average
    over micro-batches (optax.MultiSteps) is the token mean of the whole batch; per micro-batch bnpo is not."""
    logp, old, ref, adv, mask = (f32(x) for x in make_inputs(seed=11))
    mask = mask.at[:6].set(mask[:6] * (jnp.arange(T) < 2))  # micro-batch 1 much shorter than micro-batch 2
    kw = dict(beta=0.04, loss_type="dapo")
    whole_bnpo, _ = grpo.grpo_loss(logp, old, ref, adv, mask, beta=0.04, loss_type="bnpo")
    alone, _ = grpo.grpo_loss(logp, old, ref, adv, mask, **kw)  # one micro-batch: dapo = bnpo
    np.testing.assert_allclose(float(alone), float(whole_bnpo), rtol=1e-6)
    k, tokens = 2, float(mask.sum())
    parts = [grpo.grpo_loss(logp[s], old[s], ref[s], adv[s], mask[s], num_items=tokens / k, **kw)[0]
             for s in (slice(0, 6), slice(6, N))]
    np.testing.assert_allclose(float(np.mean(parts)), float(whole_bnpo), rtol=1e-5)
    per_micro_bnpo = [grpo.grpo_loss(logp[s], old[s], ref[s], adv[s], mask[s], beta=0.04, loss_type="bnpo")[0]
                      for s in (slice(0, 6), slice(6, N))]
    assert abs(float(np.mean(per_micro_bnpo)) - float(whole_bnpo)) > 1e-3  # the difference dapo makes
    # by hand on one row: per-token loss -A (on policy, beta 0) summed over 3 tokens, divided by num_items = 6
    one = jnp.ones((1, 3))
    got, _ = grpo.grpo_loss(one * -1.0, None, None, jnp.array([0.5]), one, loss_type="dapo", num_items=6.0)
    assert float(got) == pytest.approx(-0.5 * 3 / 6)


# ---------------------------------------------------------------------------------------------
# Live TRL (optional: needs torch + trl; slow because importing trl takes ~7 s)
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_grad_match_live_trl(loss_type, beta):
    torch = pytest.importorskip("torch")
    trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    from collections import defaultdict
    from types import SimpleNamespace

    from accelerate import Accelerator
    from trl.trainer.utils import nanstd

    logp, old, ref, adv, mask = make_inputs(seed=21)
    # advantages: TRL's own nanstd on the same rewards
    rewards = np.random.default_rng(0).normal(size=N)
    rt = torch.tensor(rewards)
    mean_t = rt.view(-1, G).mean(1).repeat_interleave(G)
    std_t = nanstd(rt.view(-1, G), dim=1).repeat_interleave(G)
    trl_adv = ((rt - mean_t) / (std_t + 1e-4)).numpy()
    np.testing.assert_allclose(np.asarray(grpo.group_advantages(f32(rewards), G)), trl_adv, atol=1e-5)

    trainer = object.__new__(trl_grpo.GRPOTrainer)
    logp_t = torch.tensor(logp, requires_grad=True)
    trainer.__dict__.update(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        beta=beta, loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, use_vllm=False,
        current_gradient_accumulation_steps=1, max_completion_length=9, _entropy_bonus_enabled=False,
        aux_loss_enabled=False, _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=2),
        accelerator=Accelerator(cpu=True),
        model=torch.nn.Linear(1, 1).train(),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp_t, torch.zeros_like(logp_t), None),
    )
    inputs = {
        "prompt_ids": torch.zeros(N, 1, dtype=torch.long), "prompt_mask": torch.ones(N, 1, dtype=torch.long),
        "completion_ids": torch.zeros(N, T, dtype=torch.long), "completion_mask": torch.tensor(mask),
        "advantages": torch.tensor(adv), "old_per_token_logps": torch.tensor(old),
        "ref_per_token_logps": torch.tensor(ref),
        # dapo: the generation batch's completion tokens (here two accumulation windows' worth plus 6)
        "num_items_in_batch": torch.tensor(2.0 * mask.sum() + 6.0),
    }
    num_items = (2.0 * mask.sum() + 6.0) / 2  # TRL: num_items_in_batch / processes * accumulation / steps_per_gen
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()

    def f(lp):
        return grpo.grpo_loss(lp, f32(old), f32(ref), f32(adv), f32(mask), epsilon_low=0.2, epsilon_high=0.28,
                              beta=beta, loss_type=loss_type, max_completion_length=9,
                              num_items=num_items if loss_type == "dapo" else None)

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(f32(logp))
    np.testing.assert_allclose(float(loss), trl_loss.item(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), logp_t.grad.numpy(), atol=1e-6, rtol=1e-5)
    logged = trainer._metrics["train"]
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        np.testing.assert_allclose(float(metrics[key]), logged[key][0], atol=1e-6)
    if beta:
        np.testing.assert_allclose(float(metrics["kl"]), logged["kl"][0], atol=1e-5, rtol=1e-5)
