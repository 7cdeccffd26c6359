"""The embedded SmolLM2-135M-Instruct checkpoint: export, transformers parity, tokenizer, round trip.

The reference is transformers' PyTorch LlamaForCausalLM loaded from the folder we export.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from jaxrl_mt import chat
from jaxrl_mt.models.decoder import forward, positions_from_mask
from jaxrl_mt.models.hf_io import export_hf_folder, load_hf_folder

TOL = 1e-3  # fp32, max abs logit difference
SYSTEM = "You are a helpful assistant."
PROMPTS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "What is 17 * 23? Show your steps, then give the final number."}],
    [{"role": "user", "content": "I have 3 apples."}, {"role": "assistant", "content": "Okay."},
     {"role": "user", "content": "I buy 4 more and eat 2. How many are left?"}],
    [{"role": "user", "content": "Traduis « bonjour » en japonais : こんにちは 🌸"}],
]
TEXTS = [
    "12345 + 678 = 13023, and 3.14159 != 22/7",
    "naïve café – Grüße, 日本語のテキスト, emoji 🙂🚀, Ελληνικά",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "  leading spaces\n\n\ttabs and trailing   ",
    "def f(x):\n    return x**2  # square",
]


@functools.partial(jax.jit, static_argnums=(1,))
def _logits(params, cfg, tokens, mask):
    logits, _, _ = forward(params, cfg, tokens, positions_from_mask(mask), mask)
    return logits


@pytest.fixture(scope="module")
def exported(embedded_model, tmp_path_factory):
    """The embedded model written by export_hf_folder into a fresh folder."""
    m = embedded_model
    return export_hf_folder(m.cfg, m.params, tmp_path_factory.mktemp("smollm2") / "hf", tokenizer=m.tokenizer)


@pytest.fixture(scope="module")
def reference(exported):
    """(transformers model, loading info) from the exported folder."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32,
                                                       output_loading_info=True)
    return model.eval(), info


def ref_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()  # [T, V]


def test_export_writes_an_hf_folder(exported, embedded_model):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert not any(p.name.startswith(".") for p in exported.parent.iterdir())  # no tmp dir left behind
    assert embedded_model.cfg.num_layers == 30 and embedded_model.cfg.tie_word_embeddings


def test_transformers_loads_without_missing_or_unexpected_keys(reference):
    model, info = reference
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not info["error_msgs"]


def test_chat_prompt_logits_match_transformers(embedded_model, reference):
    m = embedded_model
    ids = chat.encode_prompt(m.tokenizer, PROMPTS[2], system=SYSTEM)
    tokens = np.asarray([ids], np.int32)
    ours = np.asarray(_logits(m.params, m.cfg, tokens, np.ones_like(tokens, bool)))[0]
    want = ref_logits(reference[0], ids)
    assert np.abs(ours - want).max() <= TOL
    assert ours[-1].argmax() == want[-1].argmax()


def test_left_padded_batch_matches_unpadded_transformers_rows(embedded_model, reference):
    m = embedded_model
    seqs = [chat.encode_prompt(m.tokenizer, p, system=SYSTEM) for p in PROMPTS]
    assert len({len(s) for s in seqs}) == 4
    tokens, mask = chat.left_pad(seqs, m.pad_id)
    ours = np.asarray(_logits(m.params, m.cfg, tokens, mask))  # [4, T, V]
    t = tokens.shape[1]
    for i, ids in enumerate(seqs):
        want = ref_logits(reference[0], ids)
        diff = np.abs(ours[i, t - len(ids):] - want).max()
        assert diff <= TOL, f"row {i}: {diff}"


def test_round_trip_gives_identical_arrays(embedded_model, exported):
    cfg, params = load_hf_folder(exported)
    assert cfg == embedded_model.cfg
    flat = jax.tree_util.tree_leaves_with_path(params)
    want = dict(jax.tree_util.tree_leaves_with_path(embedded_model.params))
    assert len(flat) == len(want)
    for path, a in flat:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(want[path]), err_msg=str(path))


def test_exported_tokenizer_equals_gguf_tokenizer(exported):
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    from jaxrl_mt.models.gguf_io import gguf_tokenizer
    from jaxrl_mt.models.registry import _smollm2_gguf

    path = _smollm2_gguf()
    from_gguf = gguf_tokenizer(GGUFReader(str(path)), str(path))
    from_folder = AutoTokenizer.from_pretrained(str(exported))
    for text in TEXTS:
        ids = from_gguf(text, add_special_tokens=False)["input_ids"]
        assert from_folder(text, add_special_tokens=False)["input_ids"] == ids, text
        assert from_folder.decode(ids) == from_gguf.decode(ids) == text
    # Special tokens are single ids; digits are split one by one (SmolLM2's pre-tokenizer).
    assert from_folder("<|im_start|><|im_end|><|endoftext|>", add_special_tokens=False)["input_ids"] == [1, 2, 0]
    digits = from_folder.convert_ids_to_tokens(from_folder("2024", add_special_tokens=False)["input_ids"])
    assert digits == ["2", "0", "2", "4"]
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token", "chat_template"):
        assert getattr(from_folder, attr) == getattr(from_gguf, attr), attr
    for msgs in PROMPTS:
        for gen in (True, False):
            assert chat.render(from_folder, msgs, add_generation_prompt=gen) == \
                chat.render(from_gguf, msgs, add_generation_prompt=gen)
        assert chat.encode_prompt(from_folder, msgs) == chat.encode_prompt(from_gguf, msgs)
