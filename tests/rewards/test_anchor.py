"""The RLSTA anchor reward: parity with transformers on the embedded model, and its helpers."""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_mt.rewards.anchor import anchor_contexts, anchor_reward, zero_anchor_for_wrong
from jaxrl_mt.scoring import Scorer

PAIRS = [  # (anchor prompt, completion text); "<eos>" is replaced by the tokenizer's EOS token
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
     "How many clips did Natalia sell altogether in April and May?", "Natalia sold 48 + 24 = 72 clips.<eos>"),
    ("What is 2 + 3?", "2 + 3 = 5"),
    ("Name a primary color.", "Blue"),
    ("Tom has 3 apples and buys 4 more. How many apples does he have?",
     "Tom has 3 + 4 = 7 apples. The answer is 7.<eos>"),
]


def _ids(tok, text: str) -> list[int]:
    """Token ids of a completion; "<eos>" becomes the EOS id (added as an id, not as text)."""
    eos = text.endswith("<eos>")
    ids = list(tok(text.removesuffix("<eos>"), add_special_tokens=False)["input_ids"])
    return ids + [int(tok.eos_token_id)] if eos else ids


def _hf_geo_mean(hf_model, tok, prompt: str, completion: list[int]) -> float:
    """exp(mean log p(completion | one-turn chat prompt)) with transformers, built independently."""
    import torch

    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ctx = list(tok(text, add_special_tokens=False)["input_ids"])
    ids = torch.tensor([ctx + completion])
    with torch.no_grad():
        logits = hf_model(ids).logits[0].double()  # [T, V]
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]  # [T-1]
    return float(torch.exp(logp[-len(completion):].mean()))


@pytest.fixture(scope="module")
def hf_model(embedded_model):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(embedded_model.path), dtype=torch.float32).eval()


def test_anchor_reward_matches_transformers_fast(embedded_model, hf_model):
    """The default run's parity check: one short answer (a few tokens) under the embedded SmolLM2."""
    m, tok = embedded_model, embedded_model.tokenizer
    prompt, comp = PAIRS[1][0], _ids(tok, PAIRS[1][1])
    assert 3 <= len(comp) <= 8
    got = anchor_reward(Scorer(m.params, m.cfg, pad_id=m.pad_id, batch_size=1), tok, [prompt], [comp])
    want = _hf_geo_mean(hf_model, tok, prompt, comp)
    assert 0 < want < 1 and got[0] == pytest.approx(want, rel=1e-4)


@pytest.mark.slow
def test_anchor_reward_matches_transformers(embedded_model, hf_model):
    m, tok = embedded_model, embedded_model.tokenizer
    comps = [_ids(tok, c) for _, c in PAIRS]
    assert comps[0][-1] == tok.eos_token_id and comps[3][-1] == tok.eos_token_id
    assert len(comps[2]) == 1  # a one-token completion
    scorer = Scorer(m.params, m.cfg, pad_id=m.pad_id, batch_size=3)  # two batches, the second padded
    got = anchor_reward(scorer, tok, [p for p, _ in PAIRS], comps)
    want = np.array([_hf_geo_mean(hf_model, tok, p, c) for (p, _), c in zip(PAIRS, comps)])
    assert got.shape == (len(PAIRS),)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=0)
    assert np.all((want > 0) & (want < 1))


@pytest.mark.slow
def test_empty_completion_gets_zero_and_leaves_the_others(embedded_model, hf_model):
    m, tok = embedded_model, embedded_model.tokenizer
    prompt, text = PAIRS[1]
    comp = _ids(tok, text)
    scorer = Scorer(m.params, m.cfg, pad_id=m.pad_id, batch_size=4)
    got = anchor_reward(scorer, tok, [prompt, prompt, prompt], [[], comp, []])
    assert got[0] == 0.0 and got[2] == 0.0
    assert got[1] == pytest.approx(_hf_geo_mean(hf_model, tok, prompt, comp), rel=1e-4)


def test_all_empty_completions_get_zero(embedded_model):
    m = embedded_model
    scorer = Scorer(m.params, m.cfg, pad_id=m.pad_id)
    got = anchor_reward(scorer, m.tokenizer, ["What is 2 + 3?", "Name a color."], [[], ()])
    np.testing.assert_array_equal(got, np.zeros(2))


def test_anchor_contexts_are_one_turn_chat_prompts(embedded_model):
    tok = embedded_model.tokenizer
    ctx = anchor_contexts(tok, ["What is 2 + 3?"], system="Be brief.")[0]
    text = tok.decode(ctx, skip_special_tokens=False)
    assert text == tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "What is 2 + 3?"}],
                                           tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


def test_zero_anchor_for_wrong_by_hand():
    anchor = np.array([0.5, 0.6, 0.7,  # group 0: one correct -> its wrong ones are zeroed
                       0.1, 0.2, 0.3,  # group 1: none correct -> unchanged
                       0.4, 0.8, 0.9,  # group 2: all correct -> unchanged
                       0.25, 0.35, 0.45])  # group 3: two correct -> the wrong one is zeroed
    correct = np.array([1, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 1])
    before = anchor.copy()
    got = zero_anchor_for_wrong(anchor, correct, 3)
    np.testing.assert_array_equal(got, [0.5, 0.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.8, 0.9, 0.0, 0.35, 0.45])
    np.testing.assert_array_equal(anchor, before)  # the input is not modified


def test_zero_anchor_for_wrong_uses_the_group_size():
    anchor = np.array([0.5, 0.6, 0.7, 0.8])
    correct = np.array([1, 0, 0, 0])
    np.testing.assert_array_equal(zero_anchor_for_wrong(anchor, correct, 2), [0.5, 0.0, 0.7, 0.8])
    np.testing.assert_array_equal(zero_anchor_for_wrong(anchor, correct, 4), [0.5, 0.0, 0.0, 0.0])
