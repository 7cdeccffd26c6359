"""The slot engine (`sampling.slots`, `sampling.scheduler`): a row's tokens equal the chunked kernel's
(`generate_tokens`) whatever the width W of the slots, the steps K of a segment and the rows beside
it; freed slots are refilled, the tail narrows, a group shares its prefill."""

import jax
import numpy as np
import pytest

from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.sampling.results import GenerationResult, stop_array
from jaxrl_mt.sampling.scheduler import run_slots, slot_widths
from tests.test_row_keys import CFG, PROMPTS, _params

BUDGETS = [5, 2, 9, 7]


@pytest.fixture(scope="module")
def params():
    return _params()


def _slots(params, sampling, prompts, budgets, seeds, width, steps, stops=((1,),)):
    out = run_slots(params, CFG, prompts, np.asarray(budgets), stop_array([list(stops[0])] * len(prompts),
                                                                           len(prompts)),
                    sampling.row_params(len(prompts)), jax.random.PRNGKey(7), np.asarray(seeds, np.uint32),
                    method=sampling.method(), pad_id=0, width=width, steps=steps, prompt_bucket=16, max_new=16)
    return [out["tokens"][i, :out["lengths"][i]].tolist() for i in range(len(prompts))], out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_equal_the_chunked_sampler_at_any_width_and_segment(params, temperature):
    sampling = SamplingConfig(max_new_tokens=9, temperature=temperature)
    engine = Sampler(params, CFG, eos_ids=(1,), pad_id=0, fuse_weights=False).engine  # the chunked kernel
    out, _ = engine.generate(params, PROMPTS, np.asarray(BUDGETS), sampling, 7, np.arange(4, dtype=np.uint32))
    ref = GenerationResult([out["tokens"][i, :n].tolist() for i, n in enumerate(out["lengths"])],
                           [out["logprobs"][i, :n] for i, n in enumerate(out["lengths"])], out["lengths"], [])
    for width, steps in [(1, 1), (2, 3), (3, 2), (4, 16)]:
        toks, out = _slots(params, sampling, PROMPTS, BUDGETS, range(4), width, steps)
        assert toks == ref.tokens, (width, steps)
        np.testing.assert_allclose(np.concatenate([out["logprobs"][i, :len(t)] for i, t in enumerate(toks)]),
                                   np.concatenate(ref.logprobs), atol=1e-5)
    if temperature:  # really sampled: a row alone, at another slot, draws the same; another seed differs
        alone, _ = _slots(params, sampling, [PROMPTS[2]], [BUDGETS[2]], [2], 2, 4)
        assert alone[0] == ref.tokens[2]
        other, _ = _slots(params, sampling, [PROMPTS[2]], [BUDGETS[2]], [5], 2, 4)
        assert other[0] != ref.tokens[2]


def test_freed_slots_are_refilled_and_the_tail_narrows(params):
    """Rows of 5, 2, 9, 7 tokens with prompts of 3, 6, 9, 12: 19 decode row-steps are needed (a row's
    first token comes from its prefill). Two slots, one step a segment, longest prompts first: rows 3
    and 2 run 6 steps; row 1 takes row 3's slot (1 step), row 0 its slot next step (1 of 4); then
    alone, the slots narrow to one for row 0's last 3 steps: 8 x 2 + 3 x 1 = 19 executed. Four
    slots, 16 steps: a segment returns as soon as a slot is free, and the slots narrow by one: row 1
    ends after 1 step (4 x 1), row 0 after 3 more (3 x 3), row 3 after 2 more (2 x 2), row 2's last
    2 alone (1 x 2): 19 again, 3 narrowings."""
    greedy = SamplingConfig(max_new_tokens=9, temperature=0.0)
    _, out = _slots(params, greedy, PROMPTS, BUDGETS, range(4), 2, 1, stops=((),))
    c = out["counters"]
    assert out["lengths"].tolist() == BUDGETS
    assert (c["live_row_steps"], c["row_steps"], c["compactions"], c["admissions"]) == (19, 19, 1, 3)
    assert c["slots_read"] == 32 * c["row_steps"]  # caches of 16 + 16 slots: one prefix bucket, all read
    # live context per live step: prompt + tokens fed; row r's step j (0-based) sees len_r + j slots
    assert c["live_slots"] == sum(sum(len(p) + j for j in range(b - 1)) for p, b in zip(PROMPTS, BUDGETS))
    _, wide = _slots(params, greedy, PROMPTS, BUDGETS, range(4), 4, 16, stops=((),))
    assert (wide["counters"]["row_steps"], wide["counters"]["compactions"]) == (19, 3)
    assert slot_widths(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64) and slot_widths(3) == (1, 2, 3)


def test_a_group_shares_its_prefill_and_equals_its_rows_passed_alone(params):
    """G = 3 rows of each prompt admitted together from one prefill, the prompt stored once and read
    once per step (`models.prefix_attention`), draw what each row draws when its prompt is passed once
    per row (sampled, per-row seeds; log-probs within 1e-5)."""
    hot = SamplingConfig(max_new_tokens=9, temperature=1.0)
    prompts = PROMPTS[:2]
    rows = [p for p in prompts for _ in range(3)]
    budgets = [9, 4, 7, 2, 9, 5]
    seeds = list(range(10, 16))
    ref, ref_out = _slots(params, hot, rows, budgets, seeds, 3, 4)
    out = run_slots(params, CFG, prompts, np.asarray(budgets), stop_array([[1]] * 6, 6), hot.row_params(6),
                    jax.random.PRNGKey(7), np.asarray(seeds, np.uint32), method=hot.method(), pad_id=0, width=3,
                    steps=4, prompt_bucket=16, max_new=16, group=3)
    assert [out["tokens"][i, :out["lengths"][i]].tolist() for i in range(6)] == ref
    np.testing.assert_allclose(np.concatenate([out["logprobs"][i, :out["lengths"][i]] for i in range(6)]),
                               np.concatenate([ref_out["logprobs"][i, :len(t)] for i, t in enumerate(ref)]), atol=1e-5)
    c = out["counters"]
    assert c["admissions"] == 2  # one group at a time in 3 slots
    # each step reads the 2 stored prompts once (16 slots each) and each slot's own cache (16 slots),
    # not every row's copy of its prompt: steps x 32 + row-steps x 16
    assert c["slots_read"] == c["steps"] * 2 * 16 + c["row_steps"] * 16


def test_prefix_attention_equals_attention_over_the_concatenated_caches():
    """Rows reading their group's stored prompt once (`models.prefix_attention`) get the attention
    over [prompt, own cache, new tokens] of each row on its own; a row without a stored prompt gets
    its own cache's."""
    import jax.numpy as jnp

    from jaxrl_mt.models.cache_attention import cached_attention
    from jaxrl_mt.models.prefix_attention import PrefixCache, prefix_attention

    rng = np.random.default_rng(0)
    w, t, hq, hkv, kd, u, p, s, n_layers = 5, 1, 4, 2, 8, 2, 6, 4, 2
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    q, k_new, v_new = f(w, t, hq, kd), f(w, t, hkv, kd), f(w, t, hkv, kd)
    kp, vp, kc, vc = f(n_layers, u, hkv, p, kd), f(n_layers, u, hkv, p, kd), f(n_layers, w, hkv, s, kd), \
        f(n_layers, w, hkv, s, kd)
    pvalid = jnp.asarray([[0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]], bool)  # left-padded prompts
    seen = jnp.asarray(rng.random((w, s)) < 0.6)
    pid, gpos = np.asarray([0, 0, 1, 0, 2]), np.asarray([0, 1, 0, 2, 0])  # row 4: no stored prompt
    members = np.full((u, 3), w)
    for r in range(w):
        if pid[r] < u:
            members[pid[r], gpos[r]] = r
    new_mask = jnp.ones((w, t, t), bool)
    prefix = PrefixCache(kp, vp, pvalid, jnp.asarray(pid), jnp.asarray(gpos), jnp.asarray(members))
    got = prefix_attention(q, prefix, jnp.int32(1), kc, vc, seen, k_new, v_new, new_mask)
    for r in range(w):
        has = pid[r] < u
        kfull = jnp.concatenate([kp[1, min(pid[r], u - 1)], kc[1, r]], axis=1)[None]
        vfull = jnp.concatenate([vp[1, min(pid[r], u - 1)], vc[1, r]], axis=1)[None]
        sfull = jnp.concatenate([pvalid[min(pid[r], u - 1)] & has, seen[r]])[None]
        want = cached_attention(q[r:r + 1], kfull, vfull, sfull, k_new[r:r + 1], v_new[r:r + 1], new_mask[r:r + 1])
        np.testing.assert_allclose(np.asarray(got[r]), np.asarray(want[0]), atol=1e-5)
