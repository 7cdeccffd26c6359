"""KV-cache reuse across turns under a template that is not prefix-preserving (Qwen3's).

Qwen3's template drops the think blocks of earlier replies (and, in no-think mode, the empty
think block of earlier generation prompts), so a conversation's kept cache holds its re-rendered
prompt's prefix only while the previous prompt plus the reply's tokens is a prefix of the new
rendering. The model here is a tiny random Llama on the Qwen3-flavoured tokenizer
(`tests.qwen3_tok`) whose tied embedding row of ``</think>`` is 1.5 x that of a token it often
emits first, so some of its greedy replies hold a ``</think>`` and some do not. The reference is
every turn prefilled from scratch (`run_conversations` without reuse); the slot path's feeds
(`Sampler.run_turns`, spied) show which turns continued a kept cache and which started over.
"""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest

from jaxrl_mt.conversations import records
from jaxrl_mt.chat import encode_prompt, encode_text, with_template_options
from jaxrl_mt.conversations import ConversationRun, run_conversations, turn_suffix
from jaxrl_mt.sampling import Sampler, SamplingConfig
from tests.qwen3_tok import qwen3_tokenizer
from tests.sampler_spy import spy_feeds

GREEDY8 = SamplingConfig(max_new_tokens=8, temperature=0.0)
LIKELY_TOKEN = 22477  # a token the random model below emits first in some greedy replies
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]


@pytest.fixture(scope="module")
def qwen3():
    from jaxrl_mt.models.registry import DEFAULT_MODEL, load_tokenizer, resolve

    return qwen3_tokenizer(load_tokenizer(resolve(DEFAULT_MODEL)))


@pytest.fixture(scope="module")
def thinker(qwen3):
    """(params, cfg) of the tiny random Llama whose replies sometimes hold ``</think>``."""
    from jaxrl_mt.models.config import ModelConfig
    from jaxrl_mt.models.decoder import init_params

    cfg = ModelConfig(vocab_size=len(qwen3), hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, rope_theta=10000.0, tie_word_embeddings=True,
                      max_position_embeddings=4096, bos_token_id=1, eos_token_id=(2,), pad_token_id=2)
    params = jax.tree_util.tree_map(np.asarray, init_params(cfg, jax.random.PRNGKey(0), scale=0.5))
    embed = params["embed"].copy()
    embed[qwen3.convert_tokens_to_ids("</think>")] = 1.5 * embed[LIKELY_TOKEN]
    return {**params, "embed": embed}, cfg


def sampler_for(thinker, tokenizer) -> Sampler:
    params, cfg = thinker
    return Sampler(params, cfg, tokenizer, eos_ids=(2,), pad_id=2, max_batch=4)


def make_runs(n: int, turns: int = 3) -> list[ConversationRun]:
    return [ConversationRun(conv_id=f"c{i}", system="Be brief." if i % 2 else None,
                            user_turns=[f"Turn {k}: {' '.join(WORDS[:1 + (i + k) % 6])}?" for k in range(turns)])
            for i in range(n)]


def test_prefix_check_is_per_conversation_not_per_template(qwen3):
    """A template-wide probe passes Qwen3 in thinking mode; the real reply decides."""
    hist = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert turn_suffix(qwen3, hist, "c", None) == "<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n"
    think = [hist[0], {"role": "assistant", "content": "<think>\nhm\n</think>\n\nb"}]
    assert turn_suffix(qwen3, think, "c", None) is None  # the next rendering drops the think block
    no_think = with_template_options(qwen3, enable_thinking=False)
    assert turn_suffix(no_think, hist, "c", None) is None  # ... and the empty block of the prompt
    assert turn_suffix(no_think, hist, "c", "Be brief.") is None


def _kinds(runs, feeds) -> dict[tuple[str, int], str]:
    """{(conv_id, turn): "reused" | "refilled"} of every later turn (a fresh feed: its prompt whole)."""
    out = {}
    for i, r in enumerate(runs):
        mine = [f for f in feeds if f.conv == i]
        assert len(mine) == len(r.turns) and mine[0].fresh
        for t, f in enumerate(mine[1:], 1):
            out[r.conv_id, t] = "refilled" if f.fresh else "reused"
    return out


@pytest.mark.slow  # the suite budget (issue 52): 19 s; reuse parity stays in CI (test_kv_reuse, test_turns)
def test_reuse_under_qwen3_thinking_matches_prefill_from_scratch(thinker, qwen3, monkeypatch, caplog):
    sampler = sampler_for(thinker, qwen3)
    scratch, cached = make_runs(6), make_runs(6)
    run_conversations(sampler, scratch, GREEDY8, seed=0)
    feeds = spy_feeds(monkeypatch)
    monkeypatch.setattr(records, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="jaxrl_mt.conversations"):
        run_conversations(sampler, cached, GREEDY8, seed=0, reuse_cache=True)
    assert sum("differ from its re-rendered prompt" in m for m in caplog.messages) == 1  # logged once
    kinds = _kinds(cached, feeds)
    compared = {"refilled": 0, "reused": 0}
    for ra, rb in zip(scratch, cached):
        # every turn conditions on the re-rendered prompt's tokens: the scratch run's turns exactly
        assert [(t.tokens, t.prompt_tokens, t.assistant) for t in ra.turns] == \
            [(t.tokens, t.prompt_tokens, t.assistant) for t in rb.turns], ra.conv_id
        for ta, tb in zip(ra.turns, rb.turns):
            np.testing.assert_allclose(ta.logprobs, tb.logprobs, atol=1e-5, rtol=1e-5)
            if ta.index:
                compared[kinds[rb.conv_id, ta.index]] += 1
        # a turn after a reply with </think> was always re-prefilled, never reused
        for t in rb.turns[1:]:
            if "</think>" in rb.turns[t.index - 1].assistant:
                assert kinds[rb.conv_id, t.index] == "refilled"
    assert compared["refilled"] >= 3 and compared["reused"] >= 2  # both paths were compared


@pytest.mark.slow  # suite budget: test_turns' re-rendered-prompt test covers the rewriting template on the slot path
def test_no_think_mode_re_prefills_every_later_turn(thinker, qwen3, monkeypatch):
    """In no-think mode every earlier prompt's empty think block is dropped: each turn after the
    first is re-prefilled, and the transcripts equal the scratch run's exactly."""
    tok = with_template_options(qwen3, enable_thinking=False)
    sampler = sampler_for(thinker, tok)
    scratch, cached = make_runs(4), make_runs(4)
    run_conversations(sampler, scratch, GREEDY8, seed=1)
    feeds = spy_feeds(monkeypatch)
    run_conversations(sampler, cached, GREEDY8, seed=1, reuse_cache=True)
    kinds = _kinds(cached, feeds)
    assert set(kinds.values()) == {"refilled"} and len(kinds) == 4 * 2
    for ra, rb in zip(scratch, cached):
        assert [(t.tokens, t.prompt_tokens) for t in ra.turns] == [(t.tokens, t.prompt_tokens) for t in rb.turns]
    # the prompts end with the empty think block
    assert encode_prompt(tok, cached[0].messages[:1])[-4:] == encode_text(qwen3, "<think>\n\n</think>\n\n")
