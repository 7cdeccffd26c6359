"""The scorer: log-prob parity with transformers, geometric means, chunking, pooled hidden states.

References: transformers' forward + log_softmax + gather (one unpadded sequence at a time) for
log-probabilities, and a plain unpadded `forward` for the pooled hidden states.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from jaxrl_mt import chat
from jaxrl_mt.models.decoder import forward, positions_from_mask
from jaxrl_mt.models.registry import load_model
from jaxrl_mt.scoring import Scorer, cosine, embed_texts
from tests.test_sampling import tiny_hf_llama

TOL = 1e-4  # fp32 log-probs
# (context, completion) pairs of different lengths; batched together they need padding
PAIRS = [([5, 6, 7], [8, 9, 10, 11]), ([1, 40, 41, 42, 43, 44, 45, 46, 47], [50]),
         ([17], [17, 17, 17, 2, 60, 61, 62, 63, 64, 65, 66, 67]), ([90, 91, 92, 93, 94, 95], [3, 4, 5])]


def hf_logprobs(model, context: list[int], completion: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' log p(completion | context) per token [C], and final hidden states [T, D]."""
    import torch

    ids = torch.tensor([context + completion], dtype=torch.long)
    with torch.inference_mode():
        out = model(input_ids=ids, output_hidden_states=True)
    lp = torch.log_softmax(out.logits[0].double(), dim=-1)  # [T, V]
    n = len(context)
    rows = torch.arange(n - 1, n + len(completion) - 1)
    return lp[rows, ids[0, n:]].numpy(), out.hidden_states[-1][0].numpy()


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_tiny_scoring")
    return tiny_hf_llama(folder, seed=1), load_model(str(folder), with_tokenizer=False)


def test_logprobs_match_transformers_tiny(hf_tiny):
    ref, m = hf_tiny
    res = Scorer(m.params, m.cfg, pad_id=0, batch_size=4).score([c for c, _ in PAIRS], [x for _, x in PAIRS])
    for (ctx, comp), got, s, mean, geo in zip(PAIRS, res.logprobs, res.sum, res.mean, res.geo_mean):
        want, _ = hf_logprobs(ref, ctx, comp)
        assert got.shape == (len(comp),)
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        np.testing.assert_allclose([s, mean, geo], [want.sum(), want.mean(), np.exp(want.mean())], rtol=1e-5)
    assert np.ptp(np.concatenate(res.logprobs)) > 1.0  # not a flat distribution


def test_geo_mean_is_exp_of_the_masked_mean(hf_tiny):
    _, m = hf_tiny
    res = Scorer(m.params, m.cfg, pad_id=0, batch_size=2).score([c for c, _ in PAIRS], [x for _, x in PAIRS])
    for lp, s, mean, geo in zip(res.logprobs, res.sum, res.mean, res.geo_mean):
        assert s == pytest.approx(float(np.sum(lp, dtype=np.float64)), rel=1e-5)
        assert mean == pytest.approx(float(np.mean(lp, dtype=np.float64)), rel=1e-5)
        assert geo == pytest.approx(float(np.exp(np.mean(lp, dtype=np.float64))), rel=1e-5)
        assert 0 < geo < 1
    # the span is exactly the completion: appending tokens to the context changes the scores
    longer = Scorer(m.params, m.cfg, pad_id=0).score([[33] + c for c, _ in PAIRS], [x for _, x in PAIRS])
    assert not np.allclose(longer.mean, res.mean, atol=1e-4)


def test_chunk_size_does_not_change_results(hf_tiny):
    _, m = hf_tiny
    ctx, comp = [c for c, _ in PAIRS], [x for _, x in PAIRS]
    base = Scorer(m.params, m.cfg, pad_id=0, chunk=128).score(ctx, comp)
    for chunk in (1, 5):
        other = Scorer(m.params, m.cfg, pad_id=0, chunk=chunk).score(ctx, comp)
        for a, b in zip(base.logprobs, other.logprobs):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
        np.testing.assert_allclose(base.geo_mean, other.geo_mean, rtol=1e-6)
        np.testing.assert_allclose(base.pooled, other.pooled, atol=1e-6)


@functools.partial(jax.jit, static_argnums=(1,))
def _hidden(params, cfg, tokens, mask):
    return forward(params, cfg, tokens, positions_from_mask(mask), mask, logits="none")[1]


@pytest.mark.parametrize("pool", ["completion", "context", "all"])
def test_pooled_is_the_mean_hidden_state_over_the_span(hf_tiny, pool):
    ref, m = hf_tiny
    res = Scorer(m.params, m.cfg, pad_id=0, batch_size=4).score([c for c, _ in PAIRS], [x for _, x in PAIRS],
                                                                pool=pool)
    for (ctx, comp), got in zip(PAIRS, res.pooled):
        seq = np.array([ctx + comp], np.int32)
        h = np.asarray(_hidden(m.params, m.cfg, seq, np.ones_like(seq, bool)))[0]  # [T, D], unpadded
        span = {"completion": slice(len(ctx), None), "context": slice(0, len(ctx)), "all": slice(None)}[pool]
        np.testing.assert_allclose(got, h[span].mean(axis=0), atol=1e-5, rtol=0)
        if pool == "all":  # our final hidden states are transformers' last hidden_states
            np.testing.assert_allclose(got, hf_logprobs(ref, ctx, comp)[1].mean(axis=0), atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------
# the embedded model

ANSWERS = [
    ([{"role": "user", "content": "What is 2+2?"}], "2 + 2 = 4."),
    ([{"role": "user", "content": "Name a primary color."}], "Blue is a primary color."),
    ([{"role": "user", "content": "I have 3 apples."}, {"role": "assistant", "content": "Okay."},
      {"role": "user", "content": "I eat one. How many are left?"}], "You have 2 apples left."),
]


@pytest.fixture(scope="module")
def embedded_ref(embedded_model):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(embedded_model.path), dtype=torch.float32).eval()


@pytest.mark.slow
def test_logprobs_match_transformers_embedded(embedded_model, embedded_ref):
    m = embedded_model
    ctx = [chat.encode_prompt(m.tokenizer, conv) for conv, _ in ANSWERS]
    comp = [chat.encode_text(m.tokenizer, a + "<|im_end|>") for _, a in ANSWERS]
    res = Scorer(m.params, m.cfg, pad_id=m.pad_id).score(ctx, comp)
    for c, x, got, geo in zip(ctx, comp, res.logprobs, res.geo_mean):
        want, _ = hf_logprobs(embedded_ref, c, x)
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        assert geo == pytest.approx(float(np.exp(want.mean())), rel=1e-4)
    assert res.geo_mean.min() > 0.05  # the model finds its own kind of answer likely


def test_embed_texts_cosine(embedded_model):
    m = embedded_model
    texts = ["The cat sat on the mat.", "Quarterly revenue rose by 12 percent.", "The cat sat on the mat."]
    scorer = Scorer(m.params, m.cfg, pad_id=m.pad_id, batch_size=2)  # the copies land in different batches
    e = embed_texts(scorer, m.tokenizer, texts)
    assert e.shape == (3, m.cfg.hidden_size)
    assert cosine(e[0], e[2]) == pytest.approx(1.0, abs=1e-6)
    assert cosine(e[0], e[1]) < 0.99
    np.testing.assert_allclose(cosine(e, e), np.ones(3), atol=1e-6)
