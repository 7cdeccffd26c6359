"""Chat templates and tokenization of conversations.

A conversation is a list of `{"role": "system"|"user"|"assistant", "content": str}` messages.
Rendering uses the model's own chat template (jinja2, via transformers); token ids come from the
rendered text so that a prompt and a full conversation tokenize consistently.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_mt.batching import pack_rows

Message = Mapping[str, str]
Conversation = Sequence[Message]
ROLES = ("system", "user", "assistant")


class ChatError(ValueError):
    """A malformed conversation or a template that cannot render it."""


def _check(messages: Conversation) -> list[dict[str, str]]:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ChatError(f"message {i}: expected a mapping with 'role' and 'content', got {m!r}")
        if m["role"] not in ROLES:
            raise ChatError(f"message {i}: unknown role {m['role']!r}; expected one of {ROLES}")
        if not isinstance(m["content"], str):
            raise ChatError(f"message {i}: 'content' must be a string")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def with_system(messages: Conversation, system: str | None) -> list[dict[str, str]]:
    """Prepends a system message unless one is present or `system` is None."""
    msgs = _check(messages)
    if system is not None and not (msgs and msgs[0]["role"] == "system"):
        msgs = [{"role": "system", "content": system}] + msgs
    return msgs


def render(tokenizer: Any, messages: Conversation, *, add_generation_prompt: bool = True,
           system: str | None = None) -> str:
    """Renders messages with the tokenizer's chat template into text."""
    msgs = with_system(messages, system)
    if not msgs:
        raise ChatError("empty conversation")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ChatError("the tokenizer has no chat template")
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of already-rendered text (special tokens in the text are kept, none added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer: Any, messages: Conversation, *, system: str | None = None) -> list[int]:
    """Token ids of a prompt: the conversation plus the assistant generation header."""
    return encode_text(tokenizer, render(tokenizer, messages, add_generation_prompt=True, system=system))


def encode_conversation(tokenizer: Any, messages: Conversation, *, system: str | None = None
                        ) -> tuple[list[int], list[bool]]:
    """Token ids of a whole conversation and a mask of the assistant tokens.

    The mask covers each assistant message's content and its end-of-turn marker (what a model
    must learn to produce), not the role header the template writes before it.
    """
    msgs = with_system(messages, system)
    full = render(tokenizer, msgs, add_generation_prompt=False)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start = render(tokenizer, msgs[:i], add_generation_prompt=True) if i else ""
        end = render(tokenizer, msgs[: i + 1], add_generation_prompt=False)
        if not full.startswith(start) or not full.startswith(end):
            raise ChatError("the chat template does not render conversations prefix-consistently")
        spans.append((len(start), len(end.rstrip("\n")) if end.endswith("\n") else len(end)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    mask = [any(s <= a and b <= e and b > a for s, e in spans) for a, b in enc["offset_mapping"]]
    return ids, mask


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, length: int | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads id lists into tokens [B, T] int32 and a mask [B, T] bool of real tokens."""
    if not seqs:
        raise ChatError("empty batch")
    t = max(len(s) for s in seqs) if length is None else length
    if any(len(s) > t for s in seqs):
        raise ChatError(f"a sequence of length {max(len(s) for s in seqs)} exceeds the pad length {t}")
    return pack_rows(seqs, pad_id, t, align="left")
