"""Conversion of a Llama-architecture GGUF file into an HF-format folder, without torch.

The weights are dequantized with the `gguf` package; Q and K rows, which llama.cpp permutes
for interleaved-pair RoPE, are un-permuted back to HF's rotate-half layout. The tokenizer is
rebuilt from the GGUF metadata (byte-level BPE vocabulary and merges) with `tokenizers`, and
the chat template is kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_mt.models.config import ModelConfig, ModelError

_GGUF_LAYER = {
    "attn_norm": "input_layernorm.weight",
    "attn_q": "self_attn.q_proj.weight",
    "attn_k": "self_attn.k_proj.weight",
    "attn_v": "self_attn.v_proj.weight",
    "attn_output": "self_attn.o_proj.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "ffn_gate": "mlp.gate_proj.weight",
    "ffn_up": "mlp.up_proj.weight",
    "ffn_down": "mlp.down_proj.weight",
}


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverts llama.cpp's Q/K row permutation (interleaved pairs -> rotate-half halves).

    Args:
      w: [n_heads * K, D_in] weight in GGUF row order.
      n_heads: number of heads of this projection.
    """
    out_dim = w.shape[0]
    k = out_dim // n_heads
    return w.reshape(n_heads, k // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_config(reader: Any, path: str) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelError(f"{path}: unsupported GGUF architecture {arch!r} (only 'llama')")
    g = lambda k, d=None: _field(reader, f"llama.{k}", d)  # noqa: E731
    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    names = {t.name for t in reader.tensors}
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=int(g("vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))),
        hidden_size=hidden,
        intermediate_size=int(g("feed_forward_length")),
        num_layers=int(g("block_count")),
        num_heads=heads,
        num_kv_heads=int(g("attention.head_count_kv", heads)),
        head_dim=int(g("rope.dimension_count", hidden // heads)),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        tie_word_embeddings="output.weight" not in names,
        max_position_embeddings=int(g("context_length", 2048)),
        architecture="llama",
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=(int(eos),) if eos is not None else (),
        pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
    )


def gguf_tensors(reader: Any, cfg: ModelConfig, path: str) -> dict[str, np.ndarray]:
    """Dequantized tensors under HF names, Q/K rows un-permuted."""
    from gguf.quants import dequantize

    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        arr = arr.reshape([int(d) for d in reversed(t.shape.tolist())])
        name = t.name
        if name == "token_embd.weight":
            out["model.embed_tokens.weight"] = arr
        elif name == "output_norm.weight":
            out["model.norm.weight"] = arr
        elif name == "output.weight":
            out["lm_head.weight"] = arr
        elif name.startswith("blk."):
            _, i, kind, _ = name.split(".", 3)
            if kind not in _GGUF_LAYER:
                raise ModelError(f"{path}: unexpected tensor {name!r}")
            if kind == "attn_q":
                arr = unpermute_rope_rows(arr, cfg.num_heads)
            elif kind == "attn_k":
                arr = unpermute_rope_rows(arr, cfg.num_kv_heads)
            out[f"model.layers.{i}.{_GGUF_LAYER[kind]}"] = arr
        elif name == "rope_freqs.weight":
            raise ModelError(f"{path}: rope_freqs (llama3 scaling in GGUF) is not supported")
        else:
            raise ModelError(f"{path}: unexpected tensor {name!r}")
    return out


def gguf_tokenizer(reader: Any, path: str) -> Any:
    """A transformers PreTrainedTokenizerFast rebuilt from the GGUF metadata (no torch)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelError(f"{path}: unsupported GGUF tokenizer model {kind!r} (only byte-level BPE 'gpt2')")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        # llama.cpp: "\p{N}" then the GPT-2 regex, i.e. individual digits + byte-level.
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("default", "gpt2"):
        tok.pre_tokenizer = byte_level
    else:
        raise ModelError(f"{path}: unsupported GGUF pre-tokenizer {pre!r}")
    tok.decoder = decoders.ByteLevel()
    # token_type 3 = control tokens: special, never split by BPE.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])

    def name(key: str) -> str | None:
        i = _field(reader, f"tokenizer.ggml.{key}_token_id")
        return tokens[int(i)] if i is not None else None

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=name("bos"), eos_token=name("eos"),
        unk_token=name("unknown"), pad_token=name("padding"),
        chat_template=_field(reader, "tokenizer.chat_template"),
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        clean_up_tokenization_spaces=False, model_max_length=int(_field(reader, "llama.context_length", 2048)),
    )


def convert_gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Dequantizes a GGUF file into an HF folder (atomic: written to a tmp dir, then renamed)."""
    from gguf import GGUFReader

    from jaxrl_mt.models.hf_io import export_hf_folder, params_from_hf

    path = str(gguf_path)
    if not os.path.isfile(path):
        raise ModelError(f"{path}: GGUF file not found")
    try:
        reader = GGUFReader(path)
    except Exception as e:  # the gguf package raises assorted errors on bad files
        raise ModelError(f"{path}: unreadable GGUF file ({e})") from None
    cfg = gguf_config(reader, path)
    params = params_from_hf(cfg, gguf_tensors(reader, cfg, path), where=path)
    return export_hf_folder(cfg, params, out_dir, tokenizer=gguf_tokenizer(reader, path))
