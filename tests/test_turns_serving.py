"""The slot engine as a server drives it (`sampling.turns.run_turns` with a `poll` hook).

Work arrives between segments and is admitted into the slots that free up (refill), conversations
are dropped, the state grows; each feed carries its own budget, stop ids, sampling values and key.
The reference of every reply is a fresh `Sampler.generate_ids` of its prompt with the same budget,
stop ids, seed and row seed: exact tokens (the tiny model, fp32).
"""

from __future__ import annotations

import jax
import pytest

from jaxrl_mt.sampling import SamplingConfig
from jaxrl_mt.sampling.turns import Feed, Poll
from tests.test_kv_reuse import PROMPTS
from tests.test_turns import _tiny

GREEDY16 = SamplingConfig(max_new_tokens=16, temperature=0.0)
NONE: list[int] = []  # no stop id: a reply runs its whole budget


def _serve(sampler, first, sampling, polls, seed=0):
    """Runs `first` and the `polls` (one `Poll` per call, then closed); returns (replies by conv in
    the order they ended, the idle flags polled, the counters)."""
    got, idle = {}, []

    def advance(replies):
        for r in replies:
            assert r.conv not in got
            got[r.conv] = r
        return []

    def poll(is_idle):
        idle.append(is_idle)
        return polls.pop(0) if polls else Poll(closed=True)

    weights = sampler.engine.weights(sampler.params, sampler.decode_weights(sampler.params))
    from jaxrl_mt.sampling.turns import run_turns

    counters = run_turns(weights, sampler.engine, first, sampling, jax.random.PRNGKey(seed), advance,
                         width=sampler.engine.max_batch, poll=poll, on_shape=sampler.compiled_shapes.add)
    return got, idle, counters


def _ref(sampler, prompt, sampling, budget, stop_ids=NONE, seed=0, row_seed=0):
    return sampler.generate_ids([prompt], sampling, seed=seed, row_seeds=[row_seed], max_new_tokens=[budget],
                                stop_ids=[stop_ids])


def test_a_freed_slot_is_refilled_with_the_next_waiting_request():
    """W = 2: a third request waits, and enters the slot of the first one that ends, before the other
    of the first two ends (replies end in the order 0, 2, 1)."""
    sampler = _tiny(2, 4)
    first = [Feed(0, PROMPTS[0], seed=0, fresh=True, budget=4, stop_ids=NONE),
             Feed(1, PROMPTS[1], seed=1, fresh=True, budget=16, stop_ids=NONE)]
    late = Feed(2, PROMPTS[2], seed=2, fresh=True, budget=4, stop_ids=NONE)
    got, idle, counters = _serve(sampler, first, GREEDY16, [Poll(feeds=[late])])
    assert list(got) == [0, 2, 1]
    assert counters["admissions"] == 2 and counters["growths"] == 0 and idle[0] is False
    for f in first + [late]:
        assert got[f.conv].tokens == _ref(sampler, list(f.tokens), GREEDY16, f.budget, row_seed=f.seed).tokens[0]
        assert len(got[f.conv].tokens) == f.budget and got[f.conv].finish == "length"


def test_a_dropped_conversation_frees_its_slot_and_makes_no_reply():
    """Conversation 0 (held) and 3 (waiting) are dropped after the first segment: no reply for either,
    and conversation 2 enters 0's slot while 1 still decodes."""
    sampler = _tiny(2, 4)
    first = [Feed(c, PROMPTS[c], seed=c, fresh=True, budget=16, stop_ids=NONE) for c in (0, 1)]
    waiting = Feed(3, PROMPTS[3], seed=3, fresh=True, budget=4, stop_ids=NONE)
    late = Feed(2, PROMPTS[2], seed=2, fresh=True, budget=4, stop_ids=NONE)
    got, _, counters = _serve(sampler, first, GREEDY16, [Poll(feeds=[waiting]), Poll(feeds=[late], drops=[0, 3])])
    assert list(got) == [2, 1]
    assert counters["drops"] == 2 and counters["admissions"] == 2
    assert got[2].tokens == _ref(sampler, PROMPTS[2], GREEDY16, 4, row_seed=2).tokens[0]
    assert got[1].tokens == _ref(sampler, PROMPTS[1], GREEDY16, 16, row_seed=1).tokens[0]


def test_per_feed_budget_stop_ids_and_growth_from_an_empty_start():
    """The loop starts empty (the first poll is idle), grows from 1 slot to 3 and its output buffer
    from 16 to 64 tokens; each feed ends on its own budget or stop ids."""
    sampler = _tiny(4, 4)
    sampling = SamplingConfig(max_new_tokens=64, temperature=0.0)
    free_run = _ref(sampler, PROMPTS[1], sampling, 8).tokens[0]
    k = next(i for i in range(1, 8) if free_run[i] not in free_run[:i])  # the first new token after the first
    unused = [t for t in range(2, 32) if t not in free_run][:2]  # stop ids it never draws: 3 stop ids in all
    feeds = [Feed(0, PROMPTS[0], seed=0, fresh=True, budget=3, stop_ids=NONE),
             Feed(1, PROMPTS[1], seed=0, fresh=True, budget=8, stop_ids=[*unused, free_run[k]]),
             Feed(2, PROMPTS[2], seed=2, fresh=True, budget=40, stop_ids=NONE),
             Feed(3, PROMPTS[4], seed=4, fresh=True, budget=5)]  # the engine's EOS ids
    got, idle, counters = _serve(sampler, [], sampling, [Poll(feeds=feeds[:1]), Poll(), Poll(feeds=feeds[1:])])
    assert idle[0] is True and sorted(got) == [0, 1, 2, 3]
    assert counters["growths"] >= 1
    assert {("segment", 1, 64, 16), ("segment", 3, 128, 64)} <= sampler.compiled_shapes
    assert got[0].tokens == _ref(sampler, PROMPTS[0], sampling, 3).tokens[0] and len(got[0].tokens) == 3
    assert got[1].tokens == free_run[: k + 1] and got[1].finish == "stop"
    assert got[2].tokens == _ref(sampler, PROMPTS[2], sampling, 40, row_seed=2).tokens[0]
    assert len(got[2].tokens) == 40
    eos = _ref(sampler, PROMPTS[4], sampling, 5, stop_ids=list(sampler.eos_ids), row_seed=4)
    assert got[3].tokens == eos.tokens[0] and got[3].finish == eos.finish_reasons[0]


def test_per_feed_keys_and_sampling_values_give_each_reply_its_own_draws():
    """Sampled feeds of different temperatures, top-p and keys in one call draw what each alone would:
    generate_ids with the feed's key as seed and its seed as row seed."""
    sampler = _tiny(4, 4)
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0, top_p=0.9)
    spec = [(0.7, 0.9, 11, 0), (1.3, 0.5, 11, 1), (1.0, 0.95, 4242, 0)]
    feeds = [Feed(i, PROMPTS[i], seed=rs, fresh=True, budget=12, stop_ids=NONE, temperature=t, top_p=p,
                  key=jax.random.PRNGKey(s)) for i, (t, p, s, rs) in enumerate(spec)]
    got, _, _ = _serve(sampler, feeds[:1], sampling, [Poll(feeds=feeds[1:])], seed=99)
    for i, (t, p, s, rs) in enumerate(spec):
        ref = _ref(sampler, PROMPTS[i], SamplingConfig(max_new_tokens=12, temperature=t, top_p=p), 12, seed=s,
                   row_seed=rs)
        assert got[i].tokens == ref.tokens[0], i
    assert got[0].tokens != got[1].tokens


def test_a_budget_past_the_call_s_cap_is_refused():
    sampler = _tiny(2, 4)
    with pytest.raises(ValueError, match=r"budget 17 not in \[1, 16\]"):
        _serve(sampler, [Feed(0, PROMPTS[0], seed=0, fresh=True, budget=17)], GREEDY16, [])
