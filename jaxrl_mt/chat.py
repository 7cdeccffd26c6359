"""Chat templates and tokenization of conversations.

A conversation is a list of `{"role": "system"|"user"|"assistant", "content": str}` messages.
Rendering uses the model's own chat template (jinja2, via transformers); token ids come from the
rendered text so that a prompt and a full conversation tokenize consistently.

Template options: Qwen3-style templates read ``enable_thinking`` (False: the generation prompt
ends with an empty ``<think>\n\n</think>\n\n`` block, so the model answers without reasoning;
True or unset: the model may think first). ``render(..., enable_thinking=)`` passes it for one
call; :func:`with_template_options` gives a tokenizer copy that passes it to every rendering
(set once where the model is loaded: every prompt of training and evaluation then renders the
same way). Setting it for a template that never reads it is an error, not a silent no-op.
Qwen3's template drops the think blocks of earlier assistant turns, so it is not
prefix-preserving (see ``jaxrl_mt.conversations`` for the KV-cache check).

Shipped templates (:func:`shipped_template`): ``jaxrl_mt/assets/chat_templates/<name>/`` (Qwen3's,
Apache-2.0, with its licence note).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_mt.batching import pack_rows

Message = Mapping[str, str]
Conversation = Sequence[Message]
ROLES = ("system", "user", "assistant")
TEMPLATE_DIR = Path(__file__).resolve().parent / "assets" / "chat_templates"
THINKING = "enable_thinking"  # the template variable of Qwen3-style thinking switches
_OPTIONS_ATTR = "_jaxrl_mt_template_options"  # a tokenizer copy's template options (with_template_options)


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


def shipped_template(name: str) -> str:
    """The chat template shipped as ``assets/chat_templates/<name>/chat_template.jinja`` (e.g. ``"qwen3"``)."""
    path = TEMPLATE_DIR / name / "chat_template.jinja"
    if not path.is_file():
        known = sorted(p.name for p in TEMPLATE_DIR.iterdir() if p.is_dir())
        raise ChatError(f"no shipped chat template {name!r}; shipped: {known}")
    return path.read_text()


def reads_variable(tokenizer: Any, name: str) -> bool:
    """Whether the tokenizer's chat template (any of its named templates) mentions the variable `name`."""
    t = getattr(tokenizer, "chat_template", None)
    texts = t.values() if isinstance(t, Mapping) else [t]
    return any(isinstance(x, str) and name in x for x in texts)


def template_options(tokenizer: Any) -> dict[str, Any]:
    """The template options every rendering with this tokenizer passes (empty for a plain tokenizer)."""
    return dict(getattr(tokenizer, _OPTIONS_ATTR, None) or {})


def _checked_thinking(tokenizer: Any, enable_thinking: bool) -> bool:
    if not isinstance(enable_thinking, bool):
        raise ChatError(f"enable_thinking must be true or false, got {enable_thinking!r}")
    if not reads_variable(tokenizer, THINKING):
        raise ChatError("enable_thinking is set but the chat template never reads `enable_thinking` (not a "
                        "Qwen3-style template); leave it unset for this model")
    return enable_thinking


def with_template_options(tokenizer: Any, *, enable_thinking: bool | None = None) -> Any:
    """The tokenizer, or a shallow copy of it whose every chat rendering passes the options.

    Args:
      tokenizer: a tokenizer with a chat template.
      enable_thinking: None: the template's default (the tokenizer is returned as is); True or
        False: passed as ``enable_thinking`` to the template.

    Returns:
      The tokenizer (no option set) or a copy (its vocabulary and template shared; the options
      are not saved with it, so an export keeps the model's own template).

    Raises:
      ChatError: an option the template never reads, or a non-boolean value.
    """
    if enable_thinking is None:
        return tokenizer
    options = {**template_options(tokenizer), THINKING: _checked_thinking(tokenizer, enable_thinking)}
    out = copy.copy(tokenizer)
    setattr(out, _OPTIONS_ATTR, options)
    return out


def render(tokenizer: Any, messages: Conversation, *, add_generation_prompt: bool = True,
           system: str | None = None, enable_thinking: bool | None = None) -> str:
    """Renders messages with the tokenizer's chat template into text.

    `enable_thinking` (None: the tokenizer's template options, else the template's default) is
    passed to templates that read it (see the module doc); it overrides the tokenizer's option.
    """
    msgs = with_system(messages, system)
    if not msgs:
        raise ChatError("empty conversation")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ChatError("the tokenizer has no chat template")
    options = template_options(tokenizer)
    if enable_thinking is not None:
        options[THINKING] = _checked_thinking(tokenizer, enable_thinking)
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **options)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of already-rendered text (special tokens in the text are kept, none added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer: Any, messages: Conversation, *, system: str | None = None,
                  enable_thinking: bool | None = None) -> list[int]:
    """Token ids of a prompt: the conversation plus the assistant generation header (`render`'s options)."""
    return encode_text(tokenizer, render(tokenizer, messages, add_generation_prompt=True, system=system,
                                         enable_thinking=enable_thinking))


def encode_conversation(tokenizer: Any, messages: Conversation, *, system: str | None = None,
                        enable_thinking: bool | None = None) -> tuple[list[int], list[bool]]:
    """Token ids of a whole conversation and a mask of the assistant tokens.

    The mask covers each assistant message's content and its end-of-turn marker (what a model
    must learn to produce), not the role header the template writes before it. A template that
    renders an earlier turn differently once later turns follow (Qwen3's, on replies with think
    blocks) raises ChatError.
    """
    msgs = with_system(messages, system)
    kw = {"enable_thinking": enable_thinking}
    full = render(tokenizer, msgs, add_generation_prompt=False, **kw)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start = render(tokenizer, msgs[:i], add_generation_prompt=True, **kw) if i else ""
        end = render(tokenizer, msgs[: i + 1], add_generation_prompt=False, **kw)
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
