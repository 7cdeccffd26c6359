"""A Qwen3-flavoured tokenizer for tests: the embedded SmolLM2 vocabulary (same ChatML markers) plus
the added tokens and chat template of the shipped Qwen3 tokenizer config."""

from __future__ import annotations

import copy
import json
from typing import Any

from jaxrl_mt.chat import TEMPLATE_DIR

QWEN3_CONFIG = TEMPLATE_DIR / "qwen3" / "tokenizer_config.json"


def qwen3_tokenizer(base: Any) -> Any:
    """A deep copy of `base` with Qwen3's added tokens (those it lacks, e.g. ``<think>``, ``</think>``)
    and Qwen3's chat template; `base` is left unchanged."""
    from tokenizers import AddedToken

    cfg = json.loads(QWEN3_CONFIG.read_text())
    tok = copy.deepcopy(base)
    vocab = tok.get_vocab()
    new = [AddedToken(e["content"], special=e["special"], normalized=e["normalized"], lstrip=e["lstrip"],
                      rstrip=e["rstrip"], single_word=e["single_word"])
           for e in cfg["added_tokens_decoder"].values() if e["content"] not in vocab]
    tok.add_tokens(new)
    tok.chat_template = cfg["chat_template"]
    return tok
