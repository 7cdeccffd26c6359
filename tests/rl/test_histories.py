"""The filter's samples (`rl.histories.single_and_multi_texts`): each prompt is one group of k rows, and the
rows are the draws of passing each prompt k times (same rows, same seeds), on the tiny chat model."""

from __future__ import annotations

import pytest

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.rl.histories import TrainItem, single_and_multi_texts
from jaxrl_mt.sampling import Sampler, SamplingConfig


def _items(n: int) -> list[TrainItem]:
    return [TrainItem(item_id=f"p{i}|sharded|0", task_id=f"p{i}", kind="sharded",
                      history=(("user", f"Tom has {i + 2} apples."), ("assistant", "OK.")),
                      last_user="He buys 4 more. How many now?", anchor_prompt=f"Tom has {i + 2} apples. He buys "
                      "4 more. How many now?", merged_user="", answer=str(i + 6)) for i in range(n)]


@pytest.mark.parametrize("max_batch", [64, 8])  # one chunk; chunks of 2 groups
def test_grouped_samples_are_the_repeated_prompts_draws(tiny_model, max_batch: int) -> None:
    sampler = Sampler.from_model(tiny_model, max_batch=max_batch)
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    items, k = _items(3), 4
    calls = []
    gen = sampler.generate_ids

    def spy(prompts, s, **kw):
        calls.append((len(prompts), kw.get("group_size", 1)))
        return gen(prompts, s, **kw)

    sampler.generate_ids = spy
    st, mt = single_and_multi_texts(sampler, items, sampling, k=k, seed=7, system="Be brief.")
    assert calls == [(2 * len(items), k)]  # one call, each distinct prompt once
    tok = tiny_model.tokenizer
    prompts = [encode_prompt(tok, [{"role": "user", "content": it.anchor_prompt}], system="Be brief.")
               for it in items] + [encode_prompt(tok, it.messages, system="Be brief.") for it in items]
    repeated = gen([p for p in prompts for _ in range(k)], sampling, seed=7).texts
    assert st + mt == repeated
    assert len(set(st[:k])) > 1  # k different draws of one prompt at T = 1
