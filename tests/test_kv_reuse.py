"""KV-cache reuse across turns: `run_conversations(reuse_cache=True)` on the slot engine, its wiring.

The reference everywhere is a fresh `Sampler.generate_ids` (a full prefill of the turn's whole
context, independent of any cache kept between turns): with greedy decoding a kept cache must
give exactly its tokens, and log-probabilities within 1e-5. The engine side (`Sampler.run_turns`
on token feeds) is tested in tests/test_turns.py.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from jaxrl_mt.chat import encode_prompt, encode_text, render
from jaxrl_mt.conversations import records
from jaxrl_mt.conversations import ConversationRun, row_seed, run_conversations, turn_suffix
from jaxrl_mt.sampling import Sampler, SamplingConfig, plan_chunks

GREEDY8 = SamplingConfig(max_new_tokens=8, temperature=0.0)
PROMPTS = [[5, 6, 7], [9, 3, 4, 12, 30, 2], [17] * 9, [8, 20, 11, 2, 5, 6, 7, 29, 31, 4, 13, 10], [3, 3]]


# --------------------------------------------------------------------------- pure helpers


def test_plan_chunks_by_hand():
    # sorted by length, 2 rows per chunk
    assert plan_chunks([5, 1, 9, 3, 7], 2) == [[1, 3], [0, 4], [2]]
    # a memory bound of 4 cells per row-length unit halves chunks of long rows
    assert plan_chunks([5, 1, 9, 3, 7], 4, lambda rows, longest: rows * longest, 12) == [[1, 3], [0], [4], [2]]


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
    """Every turn of conversations that keep their caches in slots (stops and lengths, a run ended
    early by the callback) equals a fresh prefill of the turn's re-rendered prompt."""
    plain = chat_sampler(tiny_chat_model_dir)
    probe = plain.generate_ids([encode_prompt(plain.tokenizer, [{"role": "user", "content": "Turn 0: alpha?"}])],
                               GREEDY8).tokens[0]
    # an extra stop id the model produces (after its first token), so some replies end on a stop
    extra = next(t for t in probe[1:] if t != probe[0])
    sampler = chat_sampler(tiny_chat_model_dir, extra)
    runs = make_runs([3, 4, 2, 4, 3, 1])
    checked: list[tuple[str, int, str]] = []

    def on_turn(live):
        for r in live:
            t = r.turns[-1]
            prompt = encode_prompt(sampler.tokenizer, r.messages[:-1], system=r.system)
            # the context is the chat as the template renders it (the re-rendered prompt's tokens)
            assert t.prompt_tokens == len(prompt)
            assert sampler.tokenizer.decode(prompt, skip_special_tokens=False) == \
                render(sampler.tokenizer, r.messages[:-1], system=r.system)
            ref = sampler.generate_ids([prompt], GREEDY8, seed=3, row_seeds=[row_seed(r, t.index)])
            assert t.tokens == ref.tokens[0] and t.finish_reason == ref.finish_reasons[0]
            # fp32 rounding of a log-softmax over 49k logits: relative 1e-5
            np.testing.assert_allclose(t.logprobs, ref.logprobs[0], atol=1e-5, rtol=1e-5)
            checked.append((r.conv_id, t.index, t.finish_reason))
            if r is runs[0] and len(r.turns) == 2:
                r.done, r.stop_reason = True, "stopped"  # a callback ends a run early

    before = dict(sampler.totals)
    run_conversations(sampler, runs, GREEDY8, seed=3, on_turn=on_turn, reuse_cache=True)
    assert len(checked) == sum(len(r.turns) for r in runs) == 16
    reasons = {f for _, _, f in checked}
    assert reasons == {"stop", "length"}  # both endings were continued from
    assert runs[0].stop_reason == "stopped" and len(runs[0].turns) == 2
    assert all(r.done for r in runs) and [len(r.turns) for r in runs] == [2, 4, 2, 4, 3, 1]
    # later turns were appended to kept caches: the slot programs ran, "extend" among them
    assert {s[0] for s in sampler.compiled_shapes if isinstance(s[0], str)} >= {"admit", "extend", "segment"}
    assert sampler.totals != before


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


def test_reuse_falls_back_for_generate_ids_overrides(tiny_chat_model_dir, caplog, monkeypatch):
    """A subclass overriding generate_ids is honoured: the lockstep loop runs, without a cache, with one
    warning."""
    base = chat_sampler(tiny_chat_model_dir)

    class Counting(Sampler):
        calls = 0

        def generate_ids(self, prompts, sampling, **kw):
            Counting.calls += 1
            return super().generate_ids(prompts, sampling, **kw)

    s = Counting(base.params, base.cfg, base.tokenizer, eos_ids=base.eos_ids, pad_id=base.pad_id)
    runs = make_runs([2, 2])
    monkeypatch.setattr(records, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="jaxrl_mt.conversations"):
        run_conversations(s, runs, GREEDY8, reuse_cache=True)
        run_conversations(s, make_runs([1]), GREEDY8, reuse_cache=True)
    # the lockstep loop, one generate_ids call per turn, without a cache (every prompt whole)
    assert Counting.calls == 3 and all(len(r.turns) == 2 for r in runs)
    assert [t.prompt_tokens for t in runs[0].turns] == \
        [len(encode_prompt(s.tokenizer, runs[0].messages[:2 * k + 1], system=runs[0].system)) for k in range(2)]
    assert sum("cannot keep caches" in m for m in caplog.messages) == 1  # one warning


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
