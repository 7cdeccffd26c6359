"""Per-row sampling keys, and the engine's one code path under a 1-device mesh.

A row samples with fold_in(key(seed), row_seed) whatever else is in its call (`sampling.engine`),
so a conversation answered alone equals the same conversation answered in a batch of others;
greedy decoding does not read keys at all.
"""

import jax
import numpy as np
import pytest

from jaxrl_mt.conversations import ConversationRun, row_seed, run_conversations
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.parallel import make_mesh
from jaxrl_mt.sampling import DecodeEngine, Sampler, SamplingConfig
from jaxrl_mt.scoring import Scorer

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, max_position_embeddings=128, eos_token_id=(1,))
PROMPTS = [[5, 6, 7], [9, 3, 4, 12, 30, 2], [17] * 9, [8, 20, 11, 2, 5, 6, 7, 29, 31, 4, 13, 10]]
HOT = SamplingConfig(max_new_tokens=12, temperature=1.0)


def _params():
    return init_params(CFG, jax.random.PRNGKey(3), scale=0.3)


def test_a_row_samples_the_same_alone_in_a_batch_and_in_chunks():
    params = _params()
    s = Sampler(params, CFG, eos_ids=(), pad_id=0)
    batch = s.generate_ids(PROMPTS, HOT, seed=7, row_seeds=[11, 22, 33, 44])
    alone = [s.generate_ids([p], HOT, seed=7, row_seeds=[rs]).tokens[0] for p, rs in zip(PROMPTS, [11, 22, 33, 44])]
    assert batch.tokens == alone
    assert len({tuple(t) for t in batch.tokens}) == 4  # really sampled (distinct rows)
    # default row seeds are the row indices: chunks of 1 row (max_batch=1) give the unchunked draws
    chunked = Sampler(params, CFG, eos_ids=(), pad_id=0, max_batch=1).generate_ids(PROMPTS, HOT, seed=7)
    assert chunked.tokens == s.generate_ids(PROMPTS, HOT, seed=7).tokens
    # a different row seed (or base seed) changes the draw
    assert s.generate_ids([PROMPTS[0]], HOT, seed=7, row_seeds=[12]).tokens[0] != alone[0]
    # params are passed per call: the sampler's own are the default
    other = jax.tree_util.tree_map(lambda x: x * 1.3, params)
    assert s.generate_ids(PROMPTS, HOT, seed=7, params=other).tokens != s.generate_ids(PROMPTS, HOT, seed=7).tokens
    assert s.params is params


def test_greedy_ignores_row_seeds():
    s = Sampler(_params(), CFG, eos_ids=(), pad_id=0)
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
    assert s.generate_ids(PROMPTS, greedy, seed=1).tokens == s.generate_ids(PROMPTS, greedy, seed=9,
                                                                               row_seeds=[5, 6, 7, 8]).tokens


@pytest.mark.slow
def test_a_conversation_alone_equals_it_inside_a_batch(tiny_model):
    """Cached multi-turn decoding (each conversation's cache kept in a slot) with per-conversation
    keys: the same 3-turn conversation run alone and among 3 others (2 slots: it waits for one)
    gives identical tokens in every turn."""
    s = Sampler(tiny_model.params, tiny_model.cfg, tiny_model.tokenizer, eos_ids=tiny_model.eos_ids,
                pad_id=tiny_model.pad_id, max_batch=2)

    def runs(ids):
        return [ConversationRun(conv_id=f"c{i}", system=None, user_turns=[f"q{i} one", f"q{i} two", "three"])
                for i in ids]

    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    together = run_conversations(s, runs(range(4)), sampling, seed=3, reuse_cache=True)
    alone = run_conversations(s, runs([2]), sampling, seed=3, reuse_cache=True)
    assert [t.tokens for t in alone[0].turns] == [t.tokens for t in together[2].turns]
    assert len(alone[0].turns) == 3
    assert row_seed(together[2], 0) != row_seed(together[1], 0) != row_seed(together[2], 1)


def test_engine_is_frozen_and_hashable_and_grouped_scoring_runs_under_a_1_device_mesh(monkeypatch):
    engine = Sampler(_params(), CFG).engine
    assert isinstance(engine, DecodeEngine) and hash(engine) == hash(DecodeEngine(**vars(engine)))
    params = _params()
    mesh = make_mesh((1, 1, 1))
    ctx = [[5, 6, 7]] * 4 + [[9, 3, 4, 12]] * 4  # two groups of 4 identical contexts
    comp = [[8, 9], [10], [11, 12, 13], [2], [4, 4], [30], [1, 2, 3], [7]]
    import jaxrl_mt.scoring as scoring

    calls = []
    real = scoring.score_grouped
    monkeypatch.setattr(scoring, "score_grouped", lambda *a, **k: calls.append(1) or real(*a, **k))
    on_mesh = Scorer(params, CFG, mesh=mesh).score(ctx, comp)
    assert calls  # the grouped layout, under a mesh
    plain = Scorer(params, CFG, batch_size=1).score(ctx, comp)  # one pair per batch: not grouped
    for a, b in zip(on_mesh.logprobs, plain.logprobs):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(on_mesh.pooled, plain.pooled, atol=1e-5)
    # the sampler under a 1-device mesh draws what it draws without one
    with_mesh = Sampler(params, CFG, mesh=mesh).generate_ids(PROMPTS, HOT, seed=2)
    assert with_mesh.tokens == Sampler(params, CFG).generate_ids(PROMPTS, HOT, seed=2).tokens
