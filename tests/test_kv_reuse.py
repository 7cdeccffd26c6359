"""KV-cache reuse across turns: `continue_tokens` / `DecodeSession` and `run_conversations(reuse_cache=True)`.

The reference everywhere is a fresh `Sampler.generate_ids` (a full prefill of the row's whole
context, independent of any cache kept between calls): with greedy decoding a continuation must
give exactly its tokens, and log-probabilities within 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_mt.chat import encode_prompt, encode_text, render
from jaxrl_mt.conversations import ConversationRun, run_conversations, turn_suffix
from jaxrl_mt.sampling import DecodeSession, Sampler, SamplingConfig, cache_bucket, plan_chunks
from tests.test_sampling import TINY, numpy_params

GREEDY8 = SamplingConfig(max_new_tokens=8, temperature=0.0)
PROMPTS = [[5, 6, 7], [9, 3, 4, 12, 30, 2], [17] * 9, [8, 20, 11, 2, 5, 6, 7, 29, 31, 4, 13, 10], [3, 3]]


@pytest.fixture(scope="module")
def tiny() -> Sampler:
    """The vocabulary-32 model of test_sampling (EOS 1), chunks of 4 rows."""
    return Sampler(numpy_params(TINY, 0, scale=0.2), TINY, eos_ids=TINY.eos_token_id, pad_id=0, max_batch=4)


def assert_fresh_parity(sampler: Sampler, contexts, results, rows, budgets=None) -> None:
    """Each row's result equals a fresh generate_ids on its whole context (tokens; logprobs 1e-5)."""
    for i in rows:
        kw = {} if budgets is None else {"max_new_tokens": [budgets[i]]}
        ref = sampler.generate_ids([contexts[i]], GREEDY8, **kw)
        assert results.tokens[i] == ref.tokens[0], f"row {i}"
        assert results.finish_reasons[i] == ref.finish_reasons[0], f"row {i}"
        np.testing.assert_allclose(results.logprobs[i], ref.logprobs[0], atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- pure helpers


def test_cache_bucket_and_plan_chunks_by_hand():
    assert [cache_bucket(n) for n in (0, 1, 128, 129, 300, 513, 600, 1100, 3000)] == \
        [0, 128, 128, 256, 384, 640, 640, 1280, 3072]
    # sorted by length, 2 rows per chunk
    assert plan_chunks([5, 1, 9, 3, 7], 2) == [[1, 3], [0, 4], [2]]
    # a memory bound of 4 cells per row-length unit halves chunks of long rows
    assert plan_chunks([5, 1, 9, 3, 7], 4, lambda rows, longest: rows * longest, 12) == [[1, 3], [0], [4], [2]]


# --------------------------------------------------------------------------- the session


def test_first_step_equals_generate_ids(tiny):
    sess = DecodeSession(tiny, len(PROMPTS))
    got = sess.step(PROMPTS, GREEDY8)
    assert_fresh_parity(tiny, PROMPTS, got, range(len(PROMPTS)))
    # 5 rows, chunks of 4 sorted by length: [3 2 ... ] rows 4, 0, 1, 2 then row 3
    assert [c.rows for c in sess.chunks] == [[4, 0, 1, 2], [3]]
    for i, p in enumerate(PROMPTS):  # the cache holds the prompt and every reply token but the last
        assert sess.tokens[i] == p + got.tokens[i][:-1] and sess.pending[i] == got.tokens[i][-1]
        assert sess.finish[i] == got.finish_reasons[i]
    assert sess.positions().tolist() == [len(t) for t in sess.tokens]


def test_continuation_parity_with_stops_budgets_and_idle_rows(tiny):
    """Three steps; rows stop at EOS, by length, with small budgets, idle in between."""
    n = len(PROMPTS)
    sess = DecodeSession(tiny, n)
    budgets = [8, 8, 3, 8, 5]
    r1 = sess.step(PROMPTS, GREEDY8, max_new_tokens=budgets)
    assert "stop" in r1.finish_reasons and "length" in r1.finish_reasons  # both endings occur
    assert_fresh_parity(tiny, PROMPTS, r1, range(n), budgets)
    rng = np.random.default_rng(1)
    for step in range(2):
        idle = {2} if step == 0 else {0, 4}
        segments = []
        for i in range(n):
            if i in idle:
                segments.append(None)
                continue
            new = rng.integers(2, 32, 1 + 4 * i + step).tolist()
            segments.append(([sess.pending[i]] if sess.pending[i] is not None else []) + new)
        before = [list(t) for t in sess.tokens]
        pend = list(sess.pending)
        contexts = [before[i] + (segments[i] or []) for i in range(n)]
        got = sess.step(segments, GREEDY8, seed=step)
        assert_fresh_parity(tiny, contexts, got, [i for i in range(n) if i not in idle])
        for i in range(n):
            if i in idle:  # untouched: no tokens, cache and pending token kept
                assert got.tokens[i] == [] and got.finish_reasons[i] == "none" and got.lengths[i] == 0
                assert sess.tokens[i] == before[i] and sess.pending[i] == pend[i]
            else:
                assert sess.tokens[i] == contexts[i] + got.tokens[i][:-1]
        assert got.stats["prefill_tokens"] == sum(len(s) for s in segments if s is not None)
        assert got.stats["context_tokens"] == sum(len(contexts[i]) for i in range(n) if i not in idle)
    # one program per (batch, segment, capacity, new) shape: 2 chunks x 3 steps at most
    shapes = {s for s in tiny.compiled_shapes if isinstance(s[0], int)}
    assert len(shapes) <= 6 and all(s[2] % 128 == 0 for s in shapes)


def test_release_shrinks_chunk_and_reset_restarts_a_row(tiny):
    sess = DecodeSession(tiny, 4)
    sess.step(PROMPTS[:4], GREEDY8)
    assert [c.rows for c in sess.chunks] == [[0, 1, 2, 3]]
    sess.release([0, 1, 3])
    assert sess.tokens[0] == [] and sess.pending[0] is None
    seg = [7, 8, 9]
    got = sess.step([None, None, seg, None], GREEDY8)
    assert [c.rows for c in sess.chunks] == [[2]] and sess.chunks[0].cache.valid.shape[0] == 1
    # row 2 had its pending token dropped (not fed): context = cached + segment
    ctx = PROMPTS[2] + tiny.generate_ids([PROMPTS[2]], GREEDY8).tokens[0][:-1] + seg
    assert_fresh_parity(tiny, {2: ctx}, got, [2])
    sess.reset([2])
    got = sess.step([None, None, [4, 5], None], GREEDY8)
    assert sess.tokens[2][:2] == [4, 5]
    assert_fresh_parity(tiny, {2: [4, 5]}, got, [2])
    with pytest.raises(ValueError, match="row 0 was released"):
        sess.step([[1], None, None, None], GREEDY8)


def test_step_rejects_bad_input(tiny):
    sess = DecodeSession(tiny, 2)
    with pytest.raises(ValueError, match="expected 2 segments"):
        sess.step([[1]], GREEDY8)
    with pytest.raises(ValueError, match="row 1: empty segment"):
        sess.step([[1], []], GREEDY8)
    with pytest.raises(ValueError, match=r"row 0: max_new_tokens must be in \[1, 8\], got 9"):
        sess.step([[1], None], GREEDY8, max_new_tokens=[9, 1])
    with pytest.raises(ValueError, match=r"row 1: 0 cached \+ 125 new \+ 8 generated tokens exceed the model "
                                         r"context \(128\)"):
        sess.step([[1], [2] * 125], GREEDY8)


# --------------------------------------------------------------------------- the chat template


@pytest.fixture(scope="module")
def tokenizer():
    from jaxrl_mt.models.registry import DEFAULT_MODEL, load_tokenizer, resolve

    return load_tokenizer(resolve(DEFAULT_MODEL))


def test_turn_suffix_tokens_equal_full_chat_encoding(tokenizer):
    """prompt ids + reply ids + suffix ids == encode_prompt(full chat), on the real template."""
    chat = [{"role": "user", "content": "What is 3 + 4?"},
            {"role": "assistant", "content": "The sum of 3 and 4 is 7."},
            {"role": "user", "content": "Now add 5 to it."},
            {"role": "assistant", "content": "Adding 5 to 7 gives 12."}]
    for system in (None, "Solve it."):
        for k in (1, 3):
            history, u = chat[:k + 1], "And then double it, please."
            tail = turn_suffix(tokenizer, history, u, system)
            assert tail == f"<|im_end|>\n<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n"
            prefix = (encode_prompt(tokenizer, history[:-1], system=system)
                      + encode_text(tokenizer, history[-1]["content"]))
            full = encode_prompt(tokenizer, history + [{"role": "user", "content": u}], system=system)
            assert prefix + encode_text(tokenizer, tail) == full
            # the reply's stop token (<|im_end|>) is the suffix's first token: fed once, by the suffix
            assert encode_text(tokenizer, tail)[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_turn_suffix_detects_templates_that_rewrite_earlier_turns(tokenizer):
    import copy

    tok = copy.copy(tokenizer)
    # a template that rewrites earlier assistant turns (keeps only their first 3 characters)
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: "
                         "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'][:3] }}"
                         "{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    hist = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    assert turn_suffix(tok, hist, "next", None) is None
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    assert turn_suffix(tok, hist, "next", None) == "\nuser: next\nassistant: "


# --------------------------------------------------------------------------- the runner


def chat_sampler(model_dir, stop_extra: int | None = None, max_batch: int = 4) -> Sampler:
    from jaxrl_mt.models.registry import load_model

    m = load_model(str(model_dir))
    eos = tuple(m.eos_ids) + ((stop_extra,) if stop_extra is not None else ())
    return Sampler(m.params, m.cfg, m.tokenizer, eos_ids=eos, pad_id=m.pad_id, max_batch=max_batch)


def make_runs(n_turns: list[int]) -> list[ConversationRun]:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    return [ConversationRun(conv_id=f"c{i}", system="Be brief." if i % 2 else None,
                            user_turns=[f"Turn {k}: {' '.join(words[:1 + (i + k) % 6])}?" for k in range(n)])
            for i, n in enumerate(n_turns)]


def test_run_conversations_reuse_matches_fresh_prefill_every_turn(tiny_chat_model_dir):
    plain = chat_sampler(tiny_chat_model_dir)
    probe = plain.generate_ids([encode_prompt(plain.tokenizer, [{"role": "user", "content": "Turn 0: alpha?"}])],
                               GREEDY8).tokens[0]
    # an extra stop id the model produces (after its first token), so some replies end on a stop
    extra = next(t for t in probe[1:] if t != probe[0])
    sampler = chat_sampler(tiny_chat_model_dir, extra)
    runs = make_runs([3, 4, 2, 4, 3, 1])
    session = DecodeSession(sampler, len(runs))
    checked: list[tuple[str, int, str]] = []

    def on_turn(live):
        for r in live:
            i = runs.index(r)
            t = r.turns[-1]
            ctx = session.tokens[i]
            prompt = ctx[:t.prompt_tokens]
            assert ctx[t.prompt_tokens:] == t.tokens[:-1] and session.pending[i] == t.tokens[-1]
            # the cached context is the chat as the template renders it, with the replies' exact tokens
            text = sampler.tokenizer.decode(prompt, skip_special_tokens=False)
            assert text == render(sampler.tokenizer, r.messages[:-1], system=r.system)
            if t.index == 0:
                assert prompt == encode_prompt(sampler.tokenizer, r.messages[:1], system=r.system)
            ref = sampler.generate_ids([prompt], GREEDY8)
            assert t.tokens == ref.tokens[0] and t.finish_reason == ref.finish_reasons[0]
            # fp32 rounding of a log-softmax over 49k logits: relative 1e-5
            np.testing.assert_allclose(t.logprobs, ref.logprobs[0], atol=1e-5, rtol=1e-5)
            checked.append((r.conv_id, t.index, t.finish_reason))
        if len(live[0].turns) == 2:
            live[0].done, live[0].stop_reason = True, "stopped"  # a callback ends a run early

    run_conversations(sampler, runs, GREEDY8, seed=3, on_turn=on_turn, session=session)
    assert len(checked) == sum(len(r.turns) for r in runs) == 16
    reasons = {f for _, _, f in checked}
    assert reasons == {"stop", "length"}  # both endings were continued from
    assert runs[0].stop_reason == "stopped" and len(runs[0].turns) == 2
    assert all(r.done for r in runs) and [len(r.turns) for r in runs] == [2, 4, 2, 4, 3, 1]
    assert session.released == set(range(6)) and session.chunks == []
    # one program per (batch, segment, capacity, new) shape: 2 chunks x 4 turns at most
    assert len({s for s in sampler.compiled_shapes if isinstance(s[0], int)}) <= 8


@pytest.mark.slow  # suite budget: test_run_conversations_reuse_matches_fresh_prefill_every_turn covers the keeper
def test_reuse_greedy_transcripts_match_full_reprefill(tiny_chat_model_dir):
    """Greedy turns with and without reuse agree while every earlier reply re-tokenises to itself."""
    sampler = chat_sampler(tiny_chat_model_dir)
    a, b = make_runs([3, 2, 3, 3]), make_runs([3, 2, 3, 3])
    run_conversations(sampler, a, GREEDY8, seed=0)
    run_conversations(sampler, b, GREEDY8, seed=0, reuse_cache=True)
    compared = 0
    for ra, rb in zip(a, b):
        for ta, tb in zip(ra.turns, rb.turns):
            assert ta.prompt_tokens == tb.prompt_tokens and ta.tokens == tb.tokens and ta.assistant == tb.assistant
            np.testing.assert_allclose(ta.logprobs, tb.logprobs, atol=1e-5, rtol=1e-5)
            compared += 1
            body = ta.tokens[:-1] if ta.finish_reason == "stop" else ta.tokens
            if encode_text(sampler.tokenizer, ta.assistant) != body:
                break  # the full re-render sees other tokens from here on
    assert compared > len(a)  # later turns were compared too


def test_reuse_falls_back_for_generate_ids_overrides(tiny_chat_model_dir, caplog):
    base = chat_sampler(tiny_chat_model_dir)

    class Counting(Sampler):
        calls = 0

        def generate_ids(self, prompts, sampling, **kw):
            Counting.calls += 1
            return super().generate_ids(prompts, sampling, **kw)

    s = Counting(base.params, base.cfg, base.tokenizer, eos_ids=base.eos_ids, pad_id=base.pad_id)
    runs = make_runs([2, 2])
    run_conversations(s, runs, GREEDY8, reuse_cache=True)
    assert Counting.calls == 2 and all(len(r.turns) == 2 for r in runs)


# --------------------------------------------------------------------------- wiring: simulate, evaluate config


def test_simulate_passes_reuse_cache_only_to_strategies_that_name_it(tiny_chat_model_dir, scratch_strategies):
    from jaxrl_mt.conversations import accepts_reuse_cache
    from jaxrl_mt.data.synthetic import synthetic_tasks
    from jaxrl_mt.eval.simulator import Judge, plan_runs, simulate

    STRATEGIES = scratch_strategies

    seen: dict[str, object] = {}

    def named(sampler, runs, sampling, *, reuse_cache=False, **kw):
        seen["named"] = reuse_cache
        return run_conversations(sampler, runs, sampling, reuse_cache=reuse_cache, **kw)

    def kwargs_only(sampler, runs, sampling, **kw):  # e.g. the SeDT strategy factory
        seen["kwargs_only"] = "reuse_cache" in kw
        return run_conversations(sampler, runs, sampling, **kw)

    assert accepts_reuse_cache(run_conversations) and accepts_reuse_cache(named)
    assert not accepts_reuse_cache(kwargs_only)
    STRATEGIES.add("kv_named", named, replace=True)
    STRATEGIES.add("kv_kwargs", kwargs_only, replace=True)
    sampler = chat_sampler(tiny_chat_model_dir)
    tasks = synthetic_tasks(2, steps=1)
    got = {}
    for strategy, reuse in (("kv_named", True), ("kv_named", False), ("kv_kwargs", True), ("plain", True)):
        runs, _ = plan_runs(tasks, ["sharded"], 2, system="Solve it.")
        got[strategy, reuse] = simulate(sampler, runs, GREEDY8, judge=Judge(), protocol="final_turn",
                                        verifier_mode="strict", strategy=strategy, reuse_cache=reuse)
        if strategy == "kv_named":
            assert seen.pop("named") is reuse
    assert seen == {"kwargs_only": False}
    # with reuse, a turn's context = previous context + previous reply but its last token + new segment
    for rec in got["kv_named", True]:
        assert rec["n_turns"] == 3
        for prev, t in zip(rec["turns"], rec["turns"][1:]):
            assert t["prompt_tokens"] > prev["prompt_tokens"] + prev["new_tokens"] - 1
    # the first turn is the same prompt either way (greedy: same reply)
    for a, b in zip(got["kv_named", True], got["kv_named", False]):
        assert a["turns"][0]["prompt_tokens"] == b["turns"][0]["prompt_tokens"]
        assert a["turns"][0]["assistant"] == b["turns"][0]["assistant"]
    assert [r["turns"] for r in got["plain", True]] == [r["turns"] for r in got["kv_named", True]]


def test_eval_config_reuse_cache_field():
    import importlib.util
    from pathlib import Path

    from jaxrl_mt.eval.simulator import EvalError
    from jaxrl_mt.evaluate import normalize_config

    path = Path(__file__).resolve().parents[1] / "configs" / "eval_lic.py"
    spec = importlib.util.spec_from_file_location("eval_lic_config_kv", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for preset in ("cpu", "lic"):
        assert mod.get_config(preset).reuse_cache is True
    c = mod.get_config("cpu").to_dict()
    assert normalize_config(c).reuse_cache is True
    assert normalize_config({k: v for k, v in c.items() if k != "reuse_cache"}).reuse_cache is True
    with pytest.raises(EvalError, match="config field reuse_cache must be bool, got 'yes'"):
        normalize_config({**c, "reuse_cache": "yes"})


def test_row_idle_at_first_step_starts_later(tiny):
    sess = DecodeSession(tiny, 3)
    sess.step([PROMPTS[0], None, PROMPTS[2]], GREEDY8)
    assert sess.tokens[1] == [] and [c.rows for c in sess.chunks] == [[1, 0, 2]]
    got = sess.step([None, PROMPTS[1], None], GREEDY8)
    assert_fresh_parity(tiny, {1: PROMPTS[1]}, got, [1])
    assert sess.tokens[1] == PROMPTS[1] + got.tokens[1][:-1]


def test_runner_re_prefills_a_reply_edited_by_the_callback(tiny_chat_model_dir):
    sampler = chat_sampler(tiny_chat_model_dir)
    runs = make_runs([3, 3])
    session = DecodeSession(sampler, 2)
    prompts: list[tuple[int, list[int]]] = []

    def on_turn(live):
        for i, r in enumerate(runs):
            t = r.turns[-1]
            prompts.append((i, session.tokens[i][:t.prompt_tokens]))
        if len(runs[1].turns) == 1:
            runs[1].turns[-1].assistant = "An edited reply."  # e.g. a guarded self-correction

    run_conversations(sampler, runs, GREEDY8, on_turn=on_turn, session=session)
    # run 1's second turn: its cache was dropped and the whole (edited) chat prefilled
    second = [p for i, p in prompts if i == 1][1]
    assert second == encode_prompt(sampler.tokenizer, runs[1].messages[:3], system=runs[1].system)
    assert runs[1].turns[1].prompt_tokens == len(second)
    # run 0 kept its cache: its second prompt extends its first prompt and first reply
    first0, second0 = [p for i, p in prompts if i == 0][:2]
    assert second0[:len(first0) + len(runs[0].turns[0].tokens) - 1] == first0 + runs[0].turns[0].tokens[:-1]
