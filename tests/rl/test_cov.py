"""Clip-Cov and KL-Cov (``grpo_loss(loss_variant=...)``) on a batch worked by hand, and against a NumPy
transcription of verl's ``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov`` on random data.

The hand batch: N = 2 rows, T = 3, the last token of row 1 is padding (n = 5 valid tokens).
A = [2, -2]: token-weighted mean (3 * 2 - 2 * 2) / 5 = 0.4, centred 1.6 and -2.4.
logp = [[-0.1, -2.1, -1.1], [-3.1, -0.1, pad]]: mean -6.5 / 5 = -1.3, centred [[1.2, -0.8, 0.2], [-1.8, 1.2]].
cov = [[1.92, -1.28, 0.32], [4.32, -2.88]]: Clip-Cov's candidates (1 < cov < 5) are (0, 0) and (1, 0);
KL-Cov's largest is (1, 0), then (0, 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.rl import cov as covmod
from jaxrl_mt.rl.grpo import grpo_loss

LOGP = np.array([[-0.1, -2.1, -1.1], [-3.1, -0.1, -9.0]], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
ADV = np.array([2.0, -2.0], np.float32)
COV = np.array([[1.92, -1.28, 0.32], [4.32, -2.88, 0.0]])


def _loss(variant, old=None, key=None, cov=covmod.DEFAULT_COV, **kw):
    def f(lp):
        return grpo_loss(lp, None if old is None else jnp.asarray(old), None, jnp.asarray(ADV), jnp.asarray(MASK),
                         loss_type="token_mean", loss_variant=variant, cov=cov, key=key, **kw)
    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(LOGP))
    return float(loss), metrics, np.asarray(grad)


def test_covariance_by_hand():
    c = np.asarray(covmod.token_covariance(jnp.asarray(LOGP), jnp.asarray(ADV), jnp.asarray(MASK)))
    np.testing.assert_allclose(c[MASK > 0], COV[MASK > 0], atol=1e-6)
    assert int(covmod.selection_count(jnp.asarray(MASK), 2e-4)) == 1  # max(floor(0.001), 1)
    assert int(covmod.selection_count(jnp.asarray(MASK), 0.5)) == 2  # floor(2.5)


def test_clip_cov_detaches_one_random_candidate_and_its_gradient_is_zero():
    seen = set()
    for seed in range(16):
        loss, m, grad = _loss("clip_cov", key=jax.random.PRNGKey(seed))
        sel = (grad == 0) & (MASK > 0)
        (pos,) = [tuple(int(x) for x in p) for p in np.argwhere(sel)]  # exactly one valid token detached
        assert pos in {(0, 0), (1, 0)}
        seen.add(pos)
        # on-policy: per-token loss -A, gradient -A / 5 on the others, exactly 0 on the detached one and the pad
        want = np.where(MASK > 0, -ADV[:, None] / 5.0, 0.0)
        want[pos] = 0.0
        assert grad[pos] == 0.0 and grad[1, 2] == 0.0
        np.testing.assert_allclose(grad, want, atol=1e-7)
        # (0, 0) detached: (-2 - 2 + 2 + 2) / 5 = 0; (1, 0) detached: (-6 + 2) / 5 = -0.8 (none: -0.4)
        assert loss == pytest.approx(0.0 if pos == (0, 0) else -0.8, abs=1e-6)
        assert float(m["cov/selected_frac"]) == pytest.approx(0.2)
    assert seen == {(0, 0), (1, 0)}  # the choice is random
    plain, _, _ = _loss("clip")
    assert plain == pytest.approx(-0.4, abs=1e-6)


def test_clip_cov_never_picks_a_token_already_clipped():
    old = LOGP.copy()
    old[1, 0] += 1.0  # ratio e^-1 < 0.8 with A = -2: the PPO clip is active, (1, 0) is no candidate
    for seed in range(8):
        loss, _, grad = _loss("clip_cov", old=old, key=jax.random.PRNGKey(seed))
        assert grad[0, 0] == 0.0 and grad[1, 0] == 0.0  # (0, 0) detached; (1, 0) clipped (zero gradient too)
        # row 0: 0, -2, -2; row 1: -min(-2 e^-1, -1.6) = 1.6, then 2: (-4 + 1.6 + 2) / 5 = -0.08
        assert loss == pytest.approx(-0.08, abs=1e-6)


def test_kl_cov_by_hand():
    old = LOGP.copy()
    old[1, 0] -= 0.5  # the largest-cov token: logp - old = 0.5
    old[0, 1] -= 1.0  # ratio e with A = 2: clipped in plain GRPO (-2.4), not in KL-Cov (-2e)
    loss, m, grad = _loss("kl_cov", old=old)  # default kl_cov_ratio 2e-3: one token, (1, 0)
    e, rh = np.e, np.exp(0.5)
    want = (-2.0 - 2.0 * e - 2.0 + (2.0 * rh + 1.0 * 0.5) + 2.0) / 5.0  # = -1.0617
    assert loss == pytest.approx(want, abs=1e-6)
    assert float(m["cov/selected_frac"]) == pytest.approx(0.2)
    g = np.array([[-0.4, -0.4 * e, -0.4], [(2.0 * rh + 1.0) / 5.0, 0.4, 0.0]])  # d/dlogp: -A ratio + coef sign
    np.testing.assert_allclose(grad, g, atol=1e-6)
    # two tokens (ratio 0.5: floor(2.5)), coefficient 0.1: (0, 0) is penalised too, |logp - old| = 0 there
    loss2, _, grad2 = _loss("kl_cov", old=old, cov=covmod.CovConfig(kl_cov_ratio=0.5, ppo_kl_coef=0.1))
    assert loss2 == pytest.approx((-2.0 - 2.0 * e - 2.0 + (2.0 * rh + 0.05) + 2.0) / 5.0, abs=1e-6)
    assert grad2[0, 0] == pytest.approx(-0.4, abs=1e-7)  # sign(0) = 0: no push at ratio 1
    assert grad2[1, 0] == pytest.approx((2.0 * rh + 0.1) / 5.0, abs=1e-6)


def test_variant_errors_and_default_unchanged():
    with pytest.raises(ValueError, match="needs key"):
        _loss("clip_cov")
    with pytest.raises(ValueError, match="unknown loss_variant"):
        _loss("entropy")
    base = grpo_loss(jnp.asarray(LOGP), None, None, jnp.asarray(ADV), jnp.asarray(MASK), loss_type="token_mean")[0]
    assert float(base) == pytest.approx(_loss("clip")[0], abs=0)


# ------------------------------------------------------------------ NumPy transcription of verl (float64)


def _verl_cov(logp, adv, mask):
    a = np.broadcast_to(adv[:, None], logp.shape)
    v = mask > 0
    return (a - a[v].mean()) * (logp - logp[v].mean())


def verl_kl_cov(old, logp, adv, mask, kl_cov_ratio, ppo_kl_coef):
    """compute_policy_loss_kl_cov, loss_agg_mode token-mean."""
    a = np.broadcast_to(adv[:, None], logp.shape)
    neg = logp - old
    ratio = np.exp(neg)
    pg = -a * ratio
    pg_kl = -a * ratio + ppo_kl_coef * np.abs(neg)
    valid_idx = np.nonzero((mask > 0).reshape(-1))[0]
    c = _verl_cov(logp, adv, mask).reshape(-1)[valid_idx]
    k = max(1, int(len(c) * kl_cov_ratio))
    top = valid_idx[np.argsort(-c, kind="stable")[:k]]
    pg = pg.reshape(-1).copy()
    pg[top] = pg_kl.reshape(-1)[top]
    pg = pg.reshape(logp.shape)
    return (pg * mask).sum() / mask.sum()


def verl_clip_cov_candidates(old, logp, adv, mask, eps, lb, ub):
    """compute_policy_loss_clip_cov's candidate set (before its torch.randperm choice) and clip_num."""
    a = np.broadcast_to(adv[:, None], logp.shape)
    ratio = np.exp(logp - old)
    pg1, pg2 = -a * ratio, -a * np.clip(ratio, 1 - eps, 1 + eps)
    c = _verl_cov(logp, adv, mask)
    c[mask == 0] = -np.inf
    c[(pg2 > pg1) & (mask > 0)] = -np.inf
    return (c < ub) & (c > lb) & (mask > 0), max(int(2e-4 * mask.sum()), 1)


def _random_batch(seed, n=16, t=64):
    rng = np.random.default_rng(seed)
    logp = rng.normal(-2.0, 2.0, (n, t)).astype(np.float32)
    old = (logp + rng.normal(0, 0.3, (n, t))).astype(np.float32)
    adv = rng.normal(0, 1.5, n).astype(np.float32)
    lens = rng.integers(t // 2, t + 1, n)
    mask = (np.arange(t)[None] < lens[:, None]).astype(np.float32)
    return logp, old, adv, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_cov_matches_verl_transcription(seed):
    logp, old, adv, mask = _random_batch(seed)
    for ratio, coef in ((2e-3, 1.0), (0.05, 0.1)):
        got = grpo_loss(jnp.asarray(logp), jnp.asarray(old), None, jnp.asarray(adv), jnp.asarray(mask),
                        loss_type="token_mean", loss_variant="kl_cov",
                        cov=covmod.CovConfig(kl_cov_ratio=ratio, ppo_kl_coef=coef))[0]
        want = verl_kl_cov(old.astype(np.float64), logp.astype(np.float64), adv.astype(np.float64), mask, ratio, coef)
        assert float(got) == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clip_cov_selects_among_verl_candidates(seed):
    logp, old, adv, mask = _random_batch(seed, n=32, t=256)  # ~6000 valid tokens: clip_num 1
    cand, num = verl_clip_cov_candidates(old.astype(np.float64), logp.astype(np.float64), adv.astype(np.float64),
                                         mask, 0.2, 1.0, 5.0)
    assert cand.sum() > 10
    a = jnp.asarray(adv)[:, None]
    ratio = jnp.exp(jnp.asarray(logp) - jnp.asarray(old))
    clipped = -jnp.clip(ratio, 0.8, 1.2) * a > -ratio * a
    sel = np.asarray(covmod.clip_cov_select(jnp.asarray(logp), jnp.asarray(adv), jnp.asarray(mask), clipped,
                                            covmod.CovConfig(clip_cov_ratio=2e-4), jax.random.PRNGKey(seed)))
    assert sel.sum() == num and not (sel & ~cand).any()
    bigger = np.asarray(covmod.clip_cov_select(jnp.asarray(logp), jnp.asarray(adv), jnp.asarray(mask), clipped,
                                               covmod.CovConfig(clip_cov_ratio=1e-2), jax.random.PRNGKey(seed)))
    assert bigger.sum() == min(int(1e-2 * mask.sum()), cand.sum()) and not (bigger & ~cand).any()


def test_variants_jit_with_a_traced_key_and_counts():
    logp, old, adv, mask = _random_batch(4, n=8, t=32)

    @jax.jit
    def f(lp, key):
        return grpo_loss(lp, jnp.asarray(old), None, jnp.asarray(adv), jnp.asarray(mask), loss_type="dapo",
                         loss_variant="clip_cov", cov=covmod.CovConfig(clip_cov_ratio=0.05), key=key)

    (loss, m), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp), jax.random.PRNGKey(0))
    n_sel = int(round(float(m["cov/selected_frac"]) * mask.sum()))
    zero_valid = int(((np.asarray(grad) == 0) & (mask > 0)).sum())
    assert 1 <= n_sel <= int(0.05 * mask.sum()) and zero_valid >= n_sel  # clipped tokens have zero gradient too
    assert np.isfinite(float(loss))


def test_settings_from_a_config_and_their_checks(tmp_path):
    from configs.rlsta import get_config
    from jaxrl_mt.rl.data import validate_config
    from jaxrl_mt.rl.recipe import ConfigError
    from jaxrl_mt.rl.step import loss_config

    c = get_config("cpu")
    c.workdir = str(tmp_path / "wd")
    with c.rl.unlocked():  # a config written before the Cov fields: their defaults
        for k in ("loss_variant", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef"):
            del c.rl[k]
    lc = loss_config(validate_config(c).rl)
    assert (lc.loss_variant, lc.cov) == ("clip", covmod.DEFAULT_COV)
    with c.rl.unlocked():
        c.rl.loss_variant, c.rl.kl_cov_ratio = "kl_cov", 0.01
    lc = loss_config(validate_config(c).rl)
    assert (lc.loss_variant, lc.cov) == ("kl_cov", covmod.CovConfig(kl_cov_ratio=0.01))
    for field, value, msg in (("loss_variant", "kl", "rl.loss_variant must be one of"),
                              ("kl_cov_ratio", 0.0, "rl.kl_cov_ratio must be in"),
                              ("clip_cov_lb", 6.0, "rl.clip_cov_lb")):
        bad = get_config("cpu")
        bad.workdir = c.workdir
        with bad.rl.unlocked():
            setattr(bad.rl, field, value)
        with pytest.raises(ConfigError, match=msg):
            validate_config(bad)
