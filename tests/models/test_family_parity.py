"""Logit parity with transformers' PyTorch models across the Llama / Qwen2 / Qwen3 family.

Each case builds a tiny random-weight model with transformers (every tensor re-drawn, so the
Qwen2 biases and the Qwen3 QK-norm weights are not their trivial init), saves it as safetensors
and loads it back through our loader.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxrl_mt.models.decoder import forward, positions_from_mask, rope_inv_freq  # noqa: E402
from jaxrl_mt.models.registry import load_model  # noqa: E402

TOL = 1e-4
VOCAB = 97
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=128)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": 500.0}
LINEAR = {"rope_type": "linear", "factor": 3.0, "rope_theta": 1000.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 1000.0}

CASES = {
    # name: (config class, config kwargs)
    "qwen2-bias-untied": ("Qwen2Config", dict(tie_word_embeddings=False)),
    "qwen2-bias-tied": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen2-yarn": ("Qwen2Config", dict(tie_word_embeddings=False, rope_parameters=YARN,
                                       max_position_embeddings=64)),
    "qwen3-qknorm-untied": ("Qwen3Config", dict(tie_word_embeddings=False, head_dim=24)),
    "qwen3-qknorm-tied": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=16)),
    "llama-llama3-rope": ("LlamaConfig", dict(tie_word_embeddings=False, rope_parameters=LLAMA3)),
    "llama-linear-rope": ("LlamaConfig", dict(tie_word_embeddings=True, rope_parameters=LINEAR)),
}
_ARCH = {"Qwen2Config": "Qwen2ForCausalLM", "Qwen3Config": "Qwen3ForCausalLM",
         "LlamaConfig": "LlamaForCausalLM"}


def make_hf_model(config_cls: str, seed: int = 0, **kw):
    """A transformers model with every parameter drawn at random (norm weights near 1)."""
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(**{**BASE, **kw})
    model = getattr(transformers, _ARCH[config_cls])(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def hf_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Reference logits [B, T, V] with an attention mask and left-pad-aware position ids."""
    pos = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    position_ids=torch.tensor(pos, dtype=torch.long))
    return out.logits.float().numpy()


@functools.partial(jax.jit, static_argnums=(1,))
def _forward(params, cfg, tokens, mask):
    logits, _, _ = forward(params, cfg, tokens, positions_from_mask(mask), mask)
    return logits


def our_logits(params, cfg, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.asarray(_forward(params, cfg, tokens, mask.astype(bool)))


def padded_batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three left-padded rows of lengths 24, 17 and 9 (T = 24)."""
    rng = np.random.default_rng(seed)
    lengths, t = (24, 17, 9), 24
    tokens = np.zeros((len(lengths), t), np.int64)
    mask = np.zeros((len(lengths), t), np.int64)
    for i, n in enumerate(lengths):
        tokens[i, t - n:] = rng.integers(0, VOCAB, n)
        mask[i, t - n:] = 1
    return tokens, mask


def max_diff_on_real(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    m = mask.astype(bool)
    return float(np.abs(a[m] - b[m]).max())


@pytest.fixture(scope="module")
def saved_cases(tmp_path_factory) -> dict[str, tuple[object, Path]]:
    out = {}
    for i, (name, (cls, kw)) in enumerate(CASES.items()):
        model = make_hf_model(cls, seed=i, **kw)
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder, safe_serialization=True)
        out[name] = (model, folder)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(saved_cases, name):
    ref, folder = saved_cases[name]
    m = load_model(str(folder), with_tokenizer=False)
    assert m.cfg.tie_word_embeddings == CASES[name][1]["tie_word_embeddings"]
    assert ("lm_head" in m.params) != m.cfg.tie_word_embeddings
    tokens, mask = padded_batch(seed=len(name))
    ours = our_logits(m.params, m.cfg, tokens, mask)
    want = hf_logits(ref, tokens, mask)
    assert np.isfinite(ours).all()
    diff = max_diff_on_real(ours, want, mask)
    assert diff <= TOL, f"{name}: max abs logit diff {diff:.3g}"
    # The full-length row has no padding: every position is compared, and it equals the
    # unpadded reference run of that row alone.
    alone = hf_logits(ref, tokens[:1], mask[:1])
    assert np.abs(ours[0] - alone[0]).max() <= TOL


def test_family_features_are_exercised(saved_cases):
    """The configs really turn on bias / QK-norm / rope scaling, and each changes the logits."""
    tokens, mask = padded_batch(seed=1)
    m = load_model(str(saved_cases["qwen2-bias-untied"][1]), with_tokenizer=False)
    assert m.cfg.attention_bias and np.abs(np.asarray(m.params["layers"]["q_bias"])).max() > 0.05
    m = load_model(str(saved_cases["qwen3-qknorm-untied"][1]), with_tokenizer=False)
    assert m.cfg.qk_norm and not m.cfg.attention_bias and m.cfg.head_dim == 24
    for name, kind in (("llama-llama3-rope", "llama3"), ("llama-linear-rope", "linear"),
                       ("qwen2-yarn", "yarn")):
        m = load_model(str(saved_cases[name][1]), with_tokenizer=False)
        assert m.cfg.rope_scaling_dict["rope_type"] == kind
        scaled = our_logits(m.params, m.cfg, tokens, mask)
        plain = our_logits(m.params, m.cfg.replace(rope_scaling=None), tokens, mask)
        assert max_diff_on_real(scaled, plain, mask) > 1e-2, name


@pytest.mark.parametrize("rope", [LLAMA3, LINEAR, YARN], ids=lambda r: r["rope_type"])
def test_rope_inv_freq_matches_transformers(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from jaxrl_mt.models.config import ModelConfig

    hf_cfg = transformers.LlamaConfig(**{**BASE, "head_dim": 32, "rope_parameters": dict(rope)})
    want_inv, want_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg, "cpu")
    cfg = ModelConfig.from_hf_dict(hf_cfg.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    inv, factor = rope_inv_freq(cfg)
    np.testing.assert_allclose(inv, want_inv.double().numpy(), rtol=1e-6)
    assert factor == pytest.approx(want_factor, rel=1e-6)


def test_sharded_checkpoint_loads(tmp_path):
    ref = make_hf_model("LlamaConfig", seed=7, tie_word_embeddings=False)
    ref.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="50KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3 and all((tmp_path / s).is_file() for s in shards)
    assert not (tmp_path / "model.safetensors").exists()
    m = load_model(str(tmp_path), with_tokenizer=False)
    tokens, mask = padded_batch(seed=3)
    diff = max_diff_on_real(our_logits(m.params, m.cfg, tokens, mask), hf_logits(ref, tokens, mask), mask)
    assert diff <= TOL
