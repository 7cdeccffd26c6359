"""SFT: the masked loss against transformers' LlamaForCausalLM(labels=...) on a tiny random Llama (fp32), and
the SFT / DPO data built from filter samples, with exact expected outputs."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_mt.rl.histories import TrainItem
from jaxrl_mt.rl.sft import sft_loss
from jaxrl_mt.rl.sft_data import (DpoPair, FilterSample, SftItem, dpo_pairs, encode_target, filter_samples,
                                  sft_items, split_validation)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from jaxrl_mt.models.registry import load_model
    from tests.test_sampling import tiny_hf_llama

    folder = tmp_path_factory.mktemp("sft_tiny")
    return tiny_hf_llama(folder, seed=5), load_model(str(folder), with_tokenizer=False)


def hf_loss(model, tokens, mask, target):
    import torch

    labels = np.where(target, tokens, -100)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask.astype(int)),
                    labels=torch.tensor(labels, dtype=torch.long))
    return float(out.loss)


def test_sft_loss_equals_transformers_labels_loss(tiny_pair):
    ref, ours = tiny_pair
    rng = np.random.default_rng(0)
    b, t = 4, 12
    tokens = rng.integers(3, 97, (b, t)).astype(np.int32)
    lens = np.array([12, 9, 7, 11])
    mask = np.arange(t)[None] < lens[:, None]  # right padded (transformers' default positions are then right)
    starts = np.array([5, 3, 6, 1])  # the target begins after the prompt
    target = (np.arange(t)[None] >= starts[:, None]) & mask
    tokens = np.where(mask, tokens, 0)
    got, m = jax.jit(sft_loss, static_argnames=("cfg", "chunk"))(ours.params, ours.cfg, tokens, mask, target, chunk=5)
    want = hf_loss(ref, tokens, mask, target)
    assert abs(float(got) - want) < 1e-5, (float(got), want)
    assert int(m["tokens"]) == int(target.sum())  # no target token is at position 0
    # the mask matters: the same rows with the loss on every real token give another value
    assert abs(float(sft_loss(ours.params, ours.cfg, tokens, mask, mask)[0]) - want) > 1e-3


# ------------------------------------------------------------------ data construction


def _item(i: int, task: str) -> TrainItem:
    return TrainItem(item_id=f"{task}|sharded|{i}", task_id=task, kind="sharded",
                     history=(("user", "Tom has 3 apples."), ("assistant", "OK.")), last_user="He buys 4 more. Total?",
                     anchor_prompt="Tom has 3 apples and buys 4 more. How many?", merged_user="", answer="7")


def test_filter_samples_sft_items_and_dpo_pairs_exact():
    items = [_item(0, "p0"), _item(1, "p1"), _item(2, "p2")]
    st = ["The answer is 7.", "It is 8.",  # p0: one correct single-turn response
          "So 12.", "Maybe 9.",  # p1: none correct
          "7 apples. The answer is 7.", "The answer is 7."]  # p2: both correct
    mt = ["The answer is 7.", "He has 6.",  # p0: the second is wrong
          "The answer is 12.", "It is 10.",
          "The answer is 7.", "Total: 7."]  # p2: no wrong multi-turn response
    samples = filter_samples(items, st, mt, k=2)
    assert samples[0] == FilterSample(items[0], ("The answer is 7.", "It is 8."), (True, False),
                                      ("The answer is 7.", "He has 6."), (True, False))
    msgs = (("user", "Tom has 3 apples."), ("assistant", "OK."), ("user", "He buys 4 more. Total?"))
    assert sft_items(samples) == [SftItem("p0|sharded|0", "p0", msgs, "The answer is 7."),
                                  SftItem("p2|sharded|2", "p2", msgs, "7 apples. The answer is 7.")]
    assert dpo_pairs(samples) == [DpoPair("p0|sharded|0", "p0", msgs, "The answer is 7.", "He has 6.")]
    with pytest.raises(ValueError, match="texts for 3 items"):
        filter_samples(items, st[:5], mt, k=2)


def test_split_validation_by_problem_and_seed():
    rows = [SftItem(f"p{i % 5}|x|{i}", f"p{i % 5}", (), str(i)) for i in range(10)]  # 5 problems, 2 rows each
    train, val = split_validation(rows, 0.4, seed=0)
    again = split_validation(rows, 0.4, seed=0)
    assert (train, val) == again  # deterministic
    held = {r.task_id for r in val}
    assert len(held) == 2 and not held & {r.task_id for r in train} and len(train) + len(val) == 10
    assert [r.target for r in val] == [r.target for r in rows if r.task_id in held]  # input order kept
    perm = np.random.default_rng(0).permutation(5)  # the documented rule: the first round(0.4 * 5) of a permutation
    assert held == {f"p{i}" for i in perm[:2]}
    assert split_validation(rows, 0.0, seed=0) == (rows, [])
    others = {frozenset(r.task_id for r in split_validation(rows, 0.4, seed=s)[1]) for s in range(6)}
    assert len(others) > 1  # the seed changes the split
    with pytest.raises(ValueError):
        split_validation(rows, 1.0, seed=0)


def test_encode_target_is_the_response_and_end_of_turn(embedded_model):
    tok = embedded_model.tokenizer
    msgs = (("user", "Tom has 3 apples."), ("assistant", "OK."), ("user", "He buys 4 more. Total?"))
    prompt, target = encode_target(tok, msgs, "The answer is 7.", system="S")
    assert tok.decode(target) == "The answer is 7.<|im_end|>"
    assert tok.decode(prompt).endswith("He buys 4 more. Total?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(prompt).startswith("<|im_start|>system\nS<|im_end|>")
