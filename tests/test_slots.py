"""The slot engine (`sampling.slots`): a row's tokens equal the chunked sampler's whatever the width W
of the slots, the steps K of a segment and the rows beside it; freed slots are refilled."""

import jax
import numpy as np
import pytest

from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.sampling.results import stop_array
from jaxrl_mt.sampling.slots import run_slots
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
    ref = Sampler(params, CFG, eos_ids=(1,), pad_id=0).generate_ids(PROMPTS, sampling, seed=7, max_new_tokens=BUDGETS)
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


def test_freed_slots_are_refilled(params):
    """Two slots, four rows of 5, 2, 9, 7 tokens: 19 decode row-steps are needed (the first token of a
    row comes from its prefill); one slot per segment step, refilled at once, executes 20."""
    _, out = _slots(params, SamplingConfig(max_new_tokens=9, temperature=0.0), PROMPTS, BUDGETS, range(4), 2, 1,
                    stops=((),))
    c = out["counters"]
    assert out["lengths"].tolist() == BUDGETS
    assert c["live_row_steps"] == sum(BUDGETS) - 4 and c["row_steps"] == 20
    _, wide = _slots(params, SamplingConfig(max_new_tokens=9, temperature=0.0), PROMPTS, BUDGETS, range(4), 4, 16,
                     stops=((),))
    assert wide["counters"]["row_steps"] == 4 * 8  # no refill: every slot runs to the longest row
