"""Grouped sampling (`Sampler.generate_ids(..., group_size=G)`): each prompt prefilled once, its KV
cache copied to its G rows. The reference is the same sampler given every prompt G times."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_mt.sampling import Sampler, SamplingConfig, generate_tokens
from jaxrl_mt.sampling.methods import Greedy
from tests.test_sampling import PROMPTS, TINY, numpy_params


@pytest.fixture(scope="module")
def params():
    return numpy_params(TINY, 0, scale=0.2)


def _tiled(prompts, g):
    return [p for p in prompts for _ in range(g)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_grouped_rows_equal_the_prompts_passed_g_times(params, temperature):
    s = Sampler(params, TINY, eos_ids=TINY.eos_token_id, pad_id=0)
    cfg = SamplingConfig(12, temperature=temperature)
    budgets = [12, 3, 7] * 4  # per output row
    got = s.generate_ids(PROMPTS, cfg, seed=3, group_size=3, max_new_tokens=budgets)
    want = s.generate_ids(_tiled(PROMPTS, 3), cfg, seed=3, max_new_tokens=budgets)
    assert got.tokens == want.tokens and got.finish_reasons == want.finish_reasons
    assert got.lengths.tolist() == want.lengths.tolist() and min(got.lengths) == 3
    for a, b in zip(got.logprobs, want.logprobs):
        np.testing.assert_allclose(a, b, atol=1e-5)
    if temperature:  # the G rows of a prompt are different draws, not copies
        assert any(len({tuple(t) for t in got.tokens[i:i + 3]}) > 1 for i in range(0, 12, 3))
    # 4 distinct prompts prefilled once (4 rows) and stored apart, 12 output rows in 12 slots whose own
    # caches hold their 16 new tokens only
    assert ("admit", 4, 12, 32) in s.compiled_shapes and ("segment", 12, 16, 16) in s.compiled_shapes


def test_chunks_hold_whole_groups(params):
    """max_batch 5 with G = 2: chunks of 2 prompts (4 rows), drawn like 4-row chunks of the tiled rows."""
    cfg = SamplingConfig(8, temperature=1.0)
    got = Sampler(params, TINY, eos_ids=(), pad_id=0, max_batch=5).generate_ids(PROMPTS, cfg, seed=9, group_size=2)
    want = Sampler(params, TINY, eos_ids=(), pad_id=0, max_batch=4).generate_ids(_tiled(PROMPTS, 2), cfg, seed=9)
    assert got.tokens == want.tokens and len(got.tokens) == 8
    # a group larger than max_batch is one chunk of its own
    big = Sampler(params, TINY, eos_ids=(), pad_id=0, max_batch=2).generate_ids(PROMPTS[:2], cfg, seed=9, group_size=3)
    ref = Sampler(params, TINY, eos_ids=(), pad_id=0, max_batch=3).generate_ids(_tiled(PROMPTS[:2], 3), cfg, seed=9)
    assert big.tokens == ref.tokens


def test_the_prefill_runs_once_per_distinct_prompt(params):
    """The compiled grouped call does the prompt's arithmetic for U rows, not B: its FLOP count
    falls by about the prefill's share (long prompt, one new token)."""
    cfg = TINY.replace(max_position_embeddings=256)
    u, g, p = 2, 8, 128
    tokens = np.ones((u, p), np.int32)
    mask = np.ones((u, p), bool)
    b = u * g
    common = (jax.random.PRNGKey(0), -np.ones((b, 1), np.int32), np.ones(b, np.int32),
              SamplingConfig(1, 0.0).row_params(b))

    def flops(tok, msk, src):
        lowered = generate_tokens.lower(params, cfg, tok, msk, *common, max_new=1, method=Greedy(), row_source=src)
        return lowered.compile().cost_analysis()["flops"]

    grouped = flops(tokens, mask, np.repeat(np.arange(u, dtype=np.int32), g))
    tiled = flops(np.repeat(tokens, g, 0), np.repeat(mask, g, 0), None)
    assert grouped < tiled / 4, (grouped, tiled)


def test_bad_group_requests_raise(params):
    s = Sampler(params, TINY, eos_ids=(1,), pad_id=0)
    with pytest.raises(ValueError, match="group_size must be >= 1, got 0"):
        s.generate_ids([[5]], SamplingConfig(4), group_size=0)
    with pytest.raises(ValueError, match="max_new_tokens: 2 budgets for 6 rows"):
        s.generate_ids([[5], [6]], SamplingConfig(4), group_size=3, max_new_tokens=[2, 2])


def test_row_multiple_pads_rows_to_a_multiple_not_a_power_of_two(params):
    s = Sampler(params, TINY, eos_ids=TINY.eos_token_id, pad_id=0, row_multiple=8)
    assert [s.rows_bucket(n) for n in (1, 3, 8, 9, 17, 24, 25)] == [1, 4, 8, 16, 24, 24, 32]
    prompts = PROMPTS * 3  # 12 prompts x G 2 = 24 rows: 24, not 32
    cfg = SamplingConfig(6, 0.0)
    got = s.generate_ids(prompts, cfg, group_size=2)
    want = Sampler(params, TINY, eos_ids=TINY.eos_token_id, pad_id=0).generate_ids(prompts, cfg, group_size=2)
    assert got.tokens == want.tokens and len(got.tokens) == 24
    # 12 prompts prefilled (16 rows), admitted into 24 slots, not 32
    assert ("admit", 16, 24, 32) in s.compiled_shapes and ("segment", 24, 16, 16) in s.compiled_shapes
    assert not any(32 in x[1:3] for x in s.compiled_shapes)
