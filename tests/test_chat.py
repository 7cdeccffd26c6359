"""Chat rendering, tokenization and assistant masks on the embedded SmolLM2 tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_mt import chat

# SmolLM2 ids, read off its vocabulary: <|endoftext|>=0 <|im_start|>=1 <|im_end|>=2 "\n"=198
# "system"=9690 "user"=4093 "ass","istant"=520,9531 "Be"=6077 "Ġbrief"=5453 "."=30 "Hi"=26843
START, END, NL = 1, 2, 198
SYSTEM_BE_BRIEF = [START, 9690, NL, 6077, 5453, 30, END, NL]
USER_HI = [START, 4093, NL, 26843, END, NL]
ASSISTANT_HEADER = [START, 520, 9531, NL]
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CONV = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"},
        {"role": "user", "content": "Times 4?"}, {"role": "assistant", "content": "It is 20."}]


@pytest.fixture(scope="module")
def tok(embedded_model):
    return embedded_model.tokenizer


def test_render_uses_the_model_template(tok):
    text = chat.render(tok, [{"role": "user", "content": "Hi"}], system="Be brief.")
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    # Without a system message the SmolLM2 template inserts its default one.
    text = chat.render(tok, [{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert text == f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    # An explicit system message wins over the `system` argument.
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat.render(tok, msgs, system="ignored").startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_encode_prompt_ids(tok):
    ids = chat.encode_prompt(tok, [{"role": "user", "content": "Hi"}], system="Be brief.")
    assert ids == SYSTEM_BE_BRIEF + USER_HI + ASSISTANT_HEADER
    assert tok.decode(ids) == chat.render(tok, [{"role": "user", "content": "Hi"}], system="Be brief.")


def test_encode_conversation_masks_exactly_assistant_content_and_end(tok):
    ids, mask = chat.encode_conversation(tok, CONV, system="Be brief.")
    assert len(ids) == len(mask) == 48
    # Tokens: ... <|im_start|> ass istant \n | 5 <|im_end|> | \n ... | It Ġis Ġ 2 0 . <|im_end|> | \n
    assert [i for i, m in enumerate(mask) if m] == [24, 25, 40, 41, 42, 43, 44, 45, 46]
    assert ids[20:24] == ASSISTANT_HEADER and ids[36:40] == ASSISTANT_HEADER
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "5<|im_end|>It is 20.<|im_end|>"
    assert ids[-1] == NL and not mask[-1]
    # The prompt for the last answer is exactly the conversation up to that answer.
    assert chat.encode_prompt(tok, CONV[:3], system="Be brief.") == ids[:40]
    assert ids[:8] == SYSTEM_BE_BRIEF


def test_encode_conversation_without_assistant_masks_nothing(tok):
    ids, mask = chat.encode_conversation(tok, [{"role": "user", "content": "Hi"}], system="Be brief.")
    assert ids == SYSTEM_BE_BRIEF + USER_HI and not any(mask)


def test_left_pad_by_hand():
    tokens, mask = chat.left_pad([[5, 6, 7], [8], []], pad_id=0)
    np.testing.assert_array_equal(tokens, [[5, 6, 7], [0, 0, 8], [0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1], [0, 0, 0]])
    assert tokens.dtype == np.int32 and mask.dtype == bool
    tokens, mask = chat.left_pad([[5, 6]], pad_id=2, length=4)
    np.testing.assert_array_equal(tokens, [[2, 2, 5, 6]])
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1]])
    with pytest.raises(chat.ChatError, match="length 3 exceeds the pad length 2"):
        chat.left_pad([[1, 2, 3]], pad_id=0, length=2)
    with pytest.raises(chat.ChatError, match="empty batch"):
        chat.left_pad([], pad_id=0)


@pytest.mark.parametrize("messages, match", [
    ([{"role": "robot", "content": "hi"}], r"message 0: unknown role 'robot'"),
    ([{"role": "user", "content": "hi"}, {"content": "x"}], r"message 1: expected a mapping with 'role'"),
    ([{"role": "user", "content": 3}], r"message 0: 'content' must be a string"),
    (["hello"], r"message 0: expected a mapping"),
])
def test_bad_messages_raise(tok, messages, match):
    with pytest.raises(chat.ChatError, match=match):
        chat.render(tok, messages)
    with pytest.raises(chat.ChatError, match=match):
        chat.encode_conversation(tok, messages)


def test_empty_conversation_raises(tok):
    with pytest.raises(chat.ChatError, match="empty conversation"):
        chat.render(tok, [])
    with pytest.raises(chat.ChatError, match="empty conversation"):
        chat.encode_prompt(tok, [])
    with pytest.raises(chat.ChatError, match="empty conversation"):
        chat.encode_conversation(tok, [])
