"""The filter's samples (`rl.histories.single_and_multi_texts`): each prompt is one group of k rows, and the
rows are the draws of passing each prompt k times (same rows, same seeds), on the tiny chat model; their
cache (`save_texts` / `load_texts`), read by SFT and DPO only under the same key."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.rl.recipe import RecipeEnv
from jaxrl_mt.rl.histories import TrainItem, load_texts, save_texts, single_and_multi_texts, texts_key
from jaxrl_mt.rl.supervised import DPOData, FILTER_TEXTS, SFTData
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


def test_a_block_sampled_alone_draws_what_the_call_over_every_item_draws(tiny_model) -> None:
    """A process's share of the filter's samples (items [first, first + n) of total) draws the rows the
    call over all items draws: split over processes, the filter sees the samples of one process."""
    sampler = Sampler.from_model(tiny_model)
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    items, k = _items(4), 2
    whole = single_and_multi_texts(sampler, items, sampling, k=k, seed=3)
    a, b = (single_and_multi_texts(sampler, items[lo:hi], sampling, k=k, seed=3, first=lo, total=4)
            for lo, hi in ((0, 1), (1, 4)))
    assert (a[0] + b[0], a[1] + b[1]) == whole
    assert single_and_multi_texts(sampler, items[1:], sampling, k=k, seed=3) != b  # the block's own row indices


def test_saved_texts_round_trip_and_stale_or_damaged_files_are_told(tmp_path) -> None:
    items, k = _items(3), 2
    st = [f"s{i}" for i in range(6)]
    mt = [f"m{i}" for i in range(6)]
    key = texts_key(items, seed=2, k=k, temperature=0.5)
    p = tmp_path / "filter_texts.jsonl"
    save_texts(p, key, items, st, mt, k=k)
    assert load_texts(p, key, items, k=k) == (st, mt)
    assert load_texts(p, texts_key(items, seed=3, k=k, temperature=0.5), items, k=k) is None  # another seed
    other = [dataclasses.replace(items[0], history=(("user", "Tom has 9 apples."), ("assistant", "OK.")))] + items[1:]
    assert texts_key(other, seed=2, k=k, temperature=0.5) != key  # other histories: other digest
    lines = p.read_text().splitlines()
    p.write_text("\n".join(lines[:2] + [lines[3], lines[2]]) + "\n")  # two items swapped
    with pytest.raises(ValueError, match=r"filter_texts\.jsonl:3: expected item 'p1\|sharded\|0'"):
        load_texts(p, key, items, k=k)
    p.write_text("\n".join(lines[:2] + ["{not json"] + lines[3:]) + "\n")
    with pytest.raises(ValueError, match=r"filter_texts\.jsonl:3: bad filter texts line"):
        load_texts(p, key, items, k=k)


def test_the_supervised_recipe_samples_once_and_reuses_a_file_with_its_key(tiny_model, tmp_path) -> None:
    cfg = SimpleNamespace(seed=0, model="tiny", filter=SimpleNamespace(k=2, temperature=1.0),
                          rl=SimpleNamespace(max_new_tokens=5))
    logs: list[str] = []

    def env(sampler, config=cfg):
        return RecipeEnv(config=config, workdir=tmp_path, is_main=True, multi=False, system=None,
                         sampler=sampler, mesh=None, log=logs.append)

    items = _items(2)
    st, mt = SFTData()._filter_texts(env(Sampler.from_model(tiny_model)), items)
    assert (tmp_path / FILTER_TEXTS).is_file() and len(st) == len(mt) == 4
    assert SFTData()._filter_texts(env(None), items) == (st, mt)  # no sampler needed: read from the file
    assert DPOData()._filter_texts(env(None), items) == (st, mt)  # DPO reads SFT's file (copied in)
    assert logs[-1].startswith("data: the filter's samples from")
    hotter = SimpleNamespace(**{**vars(cfg), "filter": SimpleNamespace(k=2, temperature=0.5)})
    SFTData()._filter_texts(env(Sampler.from_model(tiny_model), hotter), items)  # another key: sampled again
    assert "other settings" in logs[-1]
    assert json.loads((tmp_path / FILTER_TEXTS).read_text().splitlines()[0])["key"]["temperature"] == 0.5
