"""Optimizer and schedule: hand-worked values, a NumPy AdamW reference, clipping, accumulation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_mt.rl import optim


# ---------------------------------------------------------------------------------------------
# Schedules (lr = 1.0, warmup 2, total 10, worked by hand)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "schedule, want",
    [
        # warmup 0, 0.5, then 1.0 forever
        ("constant", {0: 0.0, 1: 0.5, 2: 1.0, 5: 1.0, 50: 1.0}),
        # decays over 8 steps after warmup: 1 - (s - 2) / 8
        ("linear", {0: 0.0, 1: 0.5, 2: 1.0, 4: 0.75, 6: 0.5, 9: 0.125, 10: 0.0, 20: 0.0}),
        # (1 + cos(pi * (s - 2) / 8)) / 2: s=4 -> (1 + cos(pi/4))/2, s=6 -> 0.5, s=8 -> (1 - cos(pi/4))/2
        (
            "cosine",
            {0: 0.0, 1: 0.5, 2: 1.0, 4: (1 + np.sqrt(0.5)) / 2, 6: 0.5, 8: (1 - np.sqrt(0.5)) / 2, 10: 0.0, 20: 0.0},
        ),
    ],
)
def test_schedule_values(schedule, want):
    fn = optim.make_schedule(1.0, schedule=schedule, warmup_steps=2, total_steps=10)
    got = {s: float(fn(s)) for s in want}
    np.testing.assert_allclose(list(got.values()), list(want.values()), atol=1e-6, err_msg=schedule)


def test_schedule_without_warmup_and_scaled_lr():
    assert float(optim.make_schedule(3e-4)(0)) == pytest.approx(3e-4)
    lin = optim.make_schedule(2e-3, schedule="linear", total_steps=4)
    np.testing.assert_allclose([float(lin(s)) for s in range(5)], [2e-3, 1.5e-3, 1e-3, 5e-4, 0.0], atol=1e-9)


def test_schedule_errors():
    with pytest.raises(ValueError, match="unknown schedule 'step'; valid: constant, cosine, linear"):
        optim.make_schedule(1.0, schedule="step")
    with pytest.raises(ValueError, match="total_steps=5 must exceed warmup_steps=5"):
        optim.make_schedule(1.0, schedule="cosine", warmup_steps=5, total_steps=5)
    with pytest.raises(ValueError, match="grad_accum_steps=0"):
        optim.make_optimizer(1.0, grad_accum_steps=0)
    with pytest.raises(ValueError, match="max_grad_norm=0"):
        optim.make_optimizer(1.0, max_grad_norm=0)


# ---------------------------------------------------------------------------------------------
# AdamW + clipping against NumPy
# ---------------------------------------------------------------------------------------------
def np_adamw(params, grads_seq, lrs, *, b1, b2, eps, wd, max_norm):
    """Reference: global-norm clip, Adam moments with bias correction, decoupled decay."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, (g, lr) in enumerate(zip(grads_seq, lrs), start=1):
        norm = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g.values()))
        scale = min(1.0, max_norm / norm) if max_norm is not None else 1.0
        for k in p:
            gk = g[k] * scale
            m[k] = b1 * m[k] + (1 - b1) * gk
            v[k] = b2 * v[k] + (1 - b2) * gk**2
            mhat, vhat = m[k] / (1 - b1**t), v[k] / (1 - b2**t)
            p[k] = p[k] - lr * (mhat / (np.sqrt(vhat) + eps) + wd * p[k])
    return p


@pytest.mark.parametrize("max_norm", [None, 1.0])
def test_adamw_matches_numpy_reference(max_norm):
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=(4,)).astype(np.float32)}
    # gradient norms around 0.3 .. 30, so clipping is active on some steps and not others
    grads_seq = [
        {k: (rng.normal(size=x.shape) * s).astype(np.float32) for k, x in params.items()} for s in (0.1, 10.0, 1.0, 5.0)
    ]
    tx = optim.make_optimizer(
        0.1, schedule="linear", warmup_steps=1, total_steps=5, weight_decay=0.01, b1=0.8, b2=0.95, eps=1e-6,
        max_grad_norm=max_norm,
    )
    state = tx.init(jax.tree.map(jnp.asarray, params))
    p = jax.tree.map(jnp.asarray, params)
    update = jax.jit(tx.update)
    for g in grads_seq:
        u, state = update(jax.tree.map(jnp.asarray, g), state, p)
        p = optax.apply_updates(p, u)
    lrs = [0.0, 0.1, 0.075, 0.05]  # warmup 1 step, then linear to 0 at step 5
    want = np_adamw(params, grads_seq, lrs, b1=0.8, b2=0.95, eps=1e-6, wd=0.01, max_norm=max_norm)
    for k in want:
        np.testing.assert_allclose(np.asarray(p[k]), want[k], atol=1e-6, rtol=1e-5, err_msg=k)


def test_clipping_caps_update_norm():
    """With a huge eps, Adam's first update is -lr * g / (|g| + eps) elementwise, so its norm is
    at most lr * |clipped g| / eps: a gradient of norm 1000 must give an update of norm <= lr * 1 / eps."""
    lr, eps, max_norm = 1.0, 1e4, 1.0
    g = {"w": jnp.full((100,), 100.0)}  # [100], global norm 1000
    p = {"w": jnp.zeros((100,))}
    tx = optim.make_optimizer(lr, eps=eps, max_grad_norm=max_norm)
    u, _ = tx.update(g, tx.init(p), p)
    norm = float(optax.tree.norm(u))
    assert 0.999 * lr * max_norm / eps <= norm <= lr * max_norm / eps
    tx_free = optim.make_optimizer(lr, eps=eps, max_grad_norm=None)
    u_free, _ = tx_free.update(g, tx_free.init(p), p)
    assert float(optax.tree.norm(u_free)) > 900 * norm  # unclipped: ~1000x larger
    small = {"w": jnp.full((100,), 0.01)}  # norm 0.1 < max_norm: clipping is a no-op
    clipped, free = tx.update(small, tx.init(p), p)[0], tx_free.update(small, tx_free.init(p), p)[0]
    np.testing.assert_allclose(clipped["w"], free["w"])


# ---------------------------------------------------------------------------------------------
# Gradient accumulation: k = 2 on two half-batches == 1 step on the full batch
# ---------------------------------------------------------------------------------------------
def _regression_problem():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 8, 5)), jnp.float32)  # [updates, batch, features]
    y = jnp.asarray(rng.normal(size=(3, 8)), jnp.float32)  # [updates, batch]
    params = {"w": jnp.asarray(rng.normal(size=(5,)), jnp.float32), "b": jnp.zeros(())}

    def loss(p, xb, yb):  # mean squared error over the batch
        return jnp.mean((xb @ p["w"] + p["b"] - yb) ** 2)

    return params, x, y, jax.grad(loss)


def _run(tx, params, batches, grad_fn):
    state = tx.init(params)
    updates_seen = []
    for xb, yb in batches:
        u, state = tx.update(grad_fn(params, xb, yb), state, params)
        updates_seen.append(float(optax.tree.norm(u)))
        params = optax.apply_updates(params, u)
    return params, updates_seen


@pytest.mark.parametrize(
    "name, build",
    [
        ("adamw", lambda k: optim.make_optimizer(0.05, schedule="cosine", warmup_steps=1, total_steps=4,
                                                 weight_decay=0.1, max_grad_norm=0.5, grad_accum_steps=k)),
        ("sgd", lambda k: optax.MultiSteps(optax.sgd(0.05), every_k_schedule=k).gradient_transformation()
         if k > 1 else optax.sgd(0.05)),
    ],
)
def test_accumulation_equals_full_batch(name, build):
    params, x, y, grad_fn = _regression_problem()
    full, full_norms = _run(build(1), params, [(x[i], y[i]) for i in range(3)], grad_fn)
    halves = [(x[i, h * 4:(h + 1) * 4], y[i, h * 4:(h + 1) * 4]) for i in range(3) for h in range(2)]
    acc, acc_norms = _run(build(2), params, halves, grad_fn)
    for k in full:
        np.testing.assert_allclose(np.asarray(acc[k]), np.asarray(full[k]), atol=1e-6, err_msg=f"{name}:{k}")
    assert acc_norms[0::2] == [0.0, 0.0, 0.0]  # intermediate micro-steps change nothing
    np.testing.assert_allclose(acc_norms[1::2], full_norms, rtol=1e-5)
    assert all(n > 0 for n in full_norms[1:])
