"""Conversations on the slot engine (`sampling.turns`, `conversations.slotted`).

The reference is a fresh `Sampler.generate_ids` on a turn's whole context: a slot that kept the
conversation's cache (segments appended at its own index, holes of left padding, the cache widened
on the way) must give its tokens exactly (greedy) and log-probabilities within 1e-5; and a sampled
conversation must draw the same tokens alone or among others, at any width and segment length.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.conversations import run_conversations
from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.sampling.turns import Feed
from tests.sampler_spy import spy_feeds
from tests.test_kv_reuse import GREEDY8, PROMPTS, chat_sampler, make_runs
from tests.test_sampling import TINY, numpy_params

SEGMENT = [(7 * i + 3) % 29 + 2 for i in range(41)]  # 41 ids in [2, 31): no EOS (1), no pad (0)


def _tiny(width: int, steps: int) -> Sampler:
    s = Sampler(numpy_params(TINY, 0, scale=0.2), TINY, eos_ids=TINY.eos_token_id, pad_id=0, max_batch=width)
    s.engine = dataclasses.replace(s.engine, segment_steps=steps)
    return s


def _three_turns(sampler: Sampler) -> tuple[dict, list, dict]:
    """3 conversations (PROMPTS[:3]) of 3 turns each, every later turn fed its reply's last token and
    SEGMENT; returns ({(conv, turn): (context, reply)}, the shapes run, the counters)."""
    ctx = {c: list(PROMPTS[c]) for c in range(3)}
    turn = dict.fromkeys(range(3), 0)
    got = {}

    def advance(replies):
        feeds = []
        for r in replies:
            assert r.context == len(ctx[r.conv])
            got[r.conv, turn[r.conv]] = (list(ctx[r.conv]), r)
            ctx[r.conv] += r.tokens[:-1]
            turn[r.conv] += 1
            if turn[r.conv] < 3:
                seg = [r.tokens[-1]] + SEGMENT
                ctx[r.conv] += seg
                feeds.append(Feed(r.conv, seg, seed=100 * r.conv + turn[r.conv]))
        return feeds

    first = [Feed(c, PROMPTS[c], seed=100 * c, fresh=True) for c in range(3)]
    counters = sampler.run_turns(first, GREEDY8, advance, seed=4)
    return got, sorted(sampler.compiled_shapes, key=str), counters


@pytest.mark.parametrize("width,steps", [(2, 1), (4, 16)])
def test_kept_caches_give_a_fresh_prefill_s_tokens_across_turns(width, steps):
    sampler = _tiny(width, steps)
    got, shapes, counters = _three_turns(sampler)
    assert len(got) == 9
    for (c, t), (context, reply) in got.items():
        ref = sampler.generate_ids([context], GREEDY8, seed=4, row_seeds=[100 * c + t])
        assert reply.tokens == ref.tokens[0], (c, t)
        assert reply.finish == ref.finish_reasons[0]
        np.testing.assert_allclose(reply.logprobs, ref.logprobs[0], atol=1e-5, rtol=0)
    # later turns prefill their 42-token segment (bucket 64), not the context; the first cache
    # (prompt bucket 32 + 16 new) was widened once the segments came
    assert counters["extensions"] >= 2 and counters["widenings"] >= 1
    assert {s[2] for s in shapes if s[0] == "extend"} == {64}
    assert counters["admissions"] == (2 if width == 2 else 1)  # width 2: the third waits for a free slot


def test_a_continuation_needs_the_slot_it_continues():
    sampler = _tiny(2, 16)
    with pytest.raises(ValueError, match="holds no cache"):
        sampler.run_turns([Feed(0, PROMPTS[0], seed=0, fresh=True)], GREEDY8,
                          lambda replies: [Feed(5, [3, 4], seed=1)], seed=0)


def test_a_sampled_conversation_is_the_same_alone_in_a_batch_and_without_the_cache(tiny_chat_model_dir):
    """Five conversations at width 2 (K 1), two of them alone (width 1), and all without the cache."""
    sampled = SamplingConfig(max_new_tokens=6, temperature=1.0)
    base = make_runs([3, 2, 3, 1, 2])
    variants = {}
    for width, steps in ((2, 1),):  # other widths and K: test_kept_caches_give_a_fresh_prefill_s_tokens...
        sampler = chat_sampler(tiny_chat_model_dir)
        sampler.engine = dataclasses.replace(sampler.engine, max_batch=width, segment_steps=steps)
        runs = copy.deepcopy(base)
        run_conversations(sampler, runs, sampled, seed=9, reuse_cache=True)
        variants[width, steps] = runs
    sampler = chat_sampler(tiny_chat_model_dir)
    alone = [0, 2]  # two of the multi-turn conversations, each on its own
    variants["alone"] = [run_conversations(sampler, [copy.deepcopy(base[i])], sampled, seed=9, reuse_cache=True)[0]
                         for i in alone]
    ref = variants.pop((2, 1))
    for name, runs in variants.items():
        for a, b in zip([ref[i] for i in alone] if name == "alone" else ref, runs):
            assert [t.tokens for t in a.turns] == [t.tokens for t in b.turns]
            for ta, tb in zip(a.turns, b.turns):
                np.testing.assert_allclose(ta.logprobs, tb.logprobs, atol=1e-5, rtol=1e-5)  # f32, other shapes
    assert [len(r.turns) for r in ref] == [3, 2, 3, 1, 2]
    # without the cache (each turn re-rendered and prefilled whole): the same draws, every turn (the
    # cache is reused only where it holds the re-rendered prompt's tokens)
    full = copy.deepcopy(base)
    run_conversations(sampler, full, sampled, seed=9, reuse_cache=False)
    assert [[(t.tokens, t.prompt_tokens) for t in r.turns] for r in ref] == \
        [[(t.tokens, t.prompt_tokens) for t in r.turns] for r in full]


def test_the_cache_is_reused_only_where_it_holds_the_re_rendered_prompt(tiny_chat_model_dir, monkeypatch):
    """Later turns feed only the re-rendered prompt's new tokens; a reply edited by `on_turn` (or one
    that re-tokenises otherwise) makes the next turn start over with its whole prompt."""
    sampler = chat_sampler(tiny_chat_model_dir)
    runs = make_runs([3, 3])
    feeds = spy_feeds(monkeypatch)

    def on_turn(live):
        for r in live:
            if r is runs[1] and len(r.turns) == 1:
                r.turns[-1].assistant = "An edited reply."  # e.g. a guarded self-correction

    run_conversations(sampler, runs, GREEDY8, reuse_cache=True, on_turn=on_turn)
    tok = sampler.tokenizer
    for i, r in enumerate(runs):
        mine = [f for f in feeds if f.conv == i]
        assert len(mine) == 3 and mine[0].fresh
        held = []
        for t, f in enumerate(mine):
            prompt = encode_prompt(tok, r.messages[:2 * t + 1], system=r.system)
            assert r.turns[t].prompt_tokens == len(prompt)
            if f.fresh:
                assert list(f.tokens) == prompt
            else:  # the cache held the previous prompt and reply; only the rest was fed
                assert held + list(f.tokens) == prompt and len(f.tokens) < 30
            held = prompt + r.turns[t].tokens[:-1]
    assert [f.fresh for f in feeds if f.conv == 1] == [True, True, False]  # the edit: turn 1 whole
    assert [f.fresh for f in feeds if f.conv == 0] == [True, False, False]


def test_a_prompt_past_the_context_is_refused_as_without_the_cache(tiny_chat_model_dir):
    sampler = chat_sampler(tiny_chat_model_dir)
    runs = make_runs([1])
    runs[0].user_turns = ["word " * sampler.cfg.max_position_embeddings]
    for reuse in (True, False):
        with pytest.raises(ValueError, match="exceeds the model context"):
            run_conversations(sampler, copy.deepcopy(runs), GREEDY8, reuse_cache=reuse)


def test_a_hook_may_start_a_new_conversation_in_a_free_slot():
    """A fresh feed for a conversation that holds no slot waits for a free one (first in line)."""
    sampler = _tiny(2, 16)
    got = {}

    def advance(replies):
        for r in replies:
            got[r.conv] = r
        return [Feed(5, PROMPTS[3], seed=55, fresh=True)] if 5 not in got and any(r.conv == 0 for r in replies) else []

    sampler.run_turns([Feed(c, PROMPTS[c], seed=c, fresh=True) for c in range(3)], GREEDY8, advance, seed=1)
    assert sorted(got) == [0, 1, 2, 5]
    ref = sampler.generate_ids([PROMPTS[3]], GREEDY8, seed=1, row_seeds=[55])
    assert got[5].tokens == ref.tokens[0] and got[5].context == len(PROMPTS[3])
