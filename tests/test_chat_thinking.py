"""Qwen3 thinking in chat rendering: `enable_thinking` reaches the shipped Qwen3 template, and the
rendered prompts equal transformers' own ``apply_chat_template(..., enable_thinking=...)``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from jaxrl_mt import chat
from tests.qwen3_tok import QWEN3_CONFIG, qwen3_tokenizer

THINK_REPLY = "<think>\nTom had 3, he buys 4.\n</think>\n\nHe has 7 apples."
CONVERSATIONS = [
    [{"role": "user", "content": "Tom has 3 apples."}],
    [{"role": "user", "content": "Tom has 3 apples."}, {"role": "assistant", "content": THINK_REPLY},
     {"role": "user", "content": "He gives 2 away. How many now?"}],
    [{"role": "system", "content": "Answer with \\boxed{}."}, {"role": "user", "content": "What is 2+3?"},
     {"role": "assistant", "content": "5"}, {"role": "user", "content": "Times 4?"},
     {"role": "assistant", "content": "<think>\n\n</think>\n\n20"}, {"role": "user", "content": "Minus 1?"}],
]


@pytest.fixture(scope="module")
def base():
    from jaxrl_mt.models.registry import DEFAULT_MODEL, load_tokenizer, resolve

    return load_tokenizer(resolve(DEFAULT_MODEL))


@pytest.fixture(scope="module")
def qwen3(base):
    return qwen3_tokenizer(base)


def test_shipped_template_is_qwen3s():
    text = chat.shipped_template("qwen3")
    assert hashlib.sha256(text.encode()).hexdigest().startswith("a55ee1b1660128b7")
    assert json.loads(QWEN3_CONFIG.read_text())["chat_template"] == text
    assert (QWEN3_CONFIG.parent / "LICENSE").read_text().lstrip().startswith("Apache License")
    trl = pytest.importorskip("trl")
    assert (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text() == text
    with pytest.raises(chat.ChatError, match=r"no shipped chat template 'nope'; shipped: \['qwen3'\]"):
        chat.shipped_template("nope")


def test_qwen3_rendering_by_hand(qwen3):
    msgs = CONVERSATIONS[1]
    head = ("<|im_start|>user\nTom has 3 apples.<|im_end|>\n<|im_start|>assistant\nHe has 7 apples.<|im_end|>\n"
            "<|im_start|>user\nHe gives 2 away. How many now?<|im_end|>\n<|im_start|>assistant\n")
    # the earlier reply's think block is dropped; no default system prompt
    assert chat.render(qwen3, msgs) == head
    assert chat.render(qwen3, msgs, enable_thinking=True) == head
    assert chat.render(qwen3, msgs, enable_thinking=False) == head + "<think>\n\n</think>\n\n"
    off = chat.with_template_options(qwen3, enable_thinking=False)
    assert chat.render(off, msgs) == head + "<think>\n\n</think>\n\n"
    assert chat.render(off, msgs, enable_thinking=True) == head  # the call's value wins
    assert chat.render(qwen3, msgs) == head  # the original tokenizer is unchanged
    assert chat.template_options(off) == {"enable_thinking": False} and chat.template_options(qwen3) == {}
    # <think> and </think> are single (added) tokens
    ids = chat.encode_prompt(off, msgs)
    assert ids[-4:] == [qwen3.convert_tokens_to_ids("<think>"), 1116, qwen3.convert_tokens_to_ids("</think>"), 1116]


@pytest.mark.parametrize("enable_thinking", [True, False])
@pytest.mark.parametrize("k", range(len(CONVERSATIONS)))
def test_rendered_prompts_equal_transformers_apply_chat_template(qwen3, enable_thinking, k):
    msgs = CONVERSATIONS[k]
    want_text = qwen3.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                          enable_thinking=enable_thinking)
    want_ids = list(qwen3.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True,
                                              enable_thinking=enable_thinking)["input_ids"])
    tok = chat.with_template_options(qwen3, enable_thinking=enable_thinking)
    assert chat.render(tok, msgs) == want_text
    assert chat.encode_prompt(tok, msgs) == want_ids
    assert chat.encode_prompt(qwen3, msgs, enable_thinking=enable_thinking) == want_ids
    # the two settings differ exactly by the empty think block of the generation prompt
    other = chat.render(qwen3, msgs, enable_thinking=not enable_thinking)
    off, on = (want_text, other) if not enable_thinking else (other, want_text)
    assert off == on + "<think>\n\n</think>\n\n"
    # a full conversation (no generation prompt) is the same either way
    full = msgs + [{"role": "assistant", "content": "8"}]
    assert chat.render(tok, full, add_generation_prompt=False) == qwen3.apply_chat_template(
        full, tokenize=False, add_generation_prompt=False, enable_thinking=enable_thinking)


def test_enable_thinking_is_refused_where_the_template_ignores_it(base, qwen3):
    assert chat.with_template_options(base) is base
    with pytest.raises(chat.ChatError, match="never reads `enable_thinking`"):
        chat.with_template_options(base, enable_thinking=False)
    with pytest.raises(chat.ChatError, match="never reads `enable_thinking`"):
        chat.render(base, CONVERSATIONS[0], enable_thinking=True)
    with pytest.raises(chat.ChatError, match="enable_thinking must be true or false, got 'no'"):
        chat.with_template_options(qwen3, enable_thinking="no")


def test_qwen3_template_is_not_prefix_consistent_on_think_replies(qwen3):
    """encode_conversation refuses what it cannot mask (an earlier reply rendered without its think block)."""
    with pytest.raises(chat.ChatError, match="prefix-consistently"):
        chat.encode_conversation(qwen3, CONVERSATIONS[1] + [{"role": "assistant", "content": "5"}])
    # a last reply: Qwen3 writes an (empty) think block before it; in no-think mode the prompt holds it
    one = CONVERSATIONS[0] + [{"role": "assistant", "content": "7"}]
    for thinking, target in ((True, "<think>\n\n</think>\n\n7<|im_end|>"), (False, "7<|im_end|>")):
        ids, mask = chat.encode_conversation(qwen3, one, enable_thinking=thinking)
        assert qwen3.decode([i for i, m in zip(ids, mask) if m]) == target
