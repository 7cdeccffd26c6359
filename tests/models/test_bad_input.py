"""Broken checkpoints and specs raise ModelError with a one-line message naming the culprit."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_mt.models.config import ModelConfig, ModelError
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.models.gguf_io import convert_gguf_to_hf
from jaxrl_mt.models.hf_io import export_hf_folder
from jaxrl_mt.models.registry import load_model, resolve

CFG = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, tie_word_embeddings=False)
K_PROJ = "model.layers.0.self_attn.k_proj.weight"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A valid tiny HF folder (config.json + model.safetensors)."""
    out = export_hf_folder(CFG, init_params(CFG, jax.random.key(0)), tmp_path / "tiny")
    assert load_model(str(out), with_tokenizer=False).cfg.num_layers == 2  # valid before breaking it
    return out


def load_error(spec: str | Path) -> str:
    with pytest.raises(ModelError) as e:
        load_model(str(spec), with_tokenizer=False)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def shard(folder: Path) -> list[Path]:
    """Splits model.safetensors into two shards with an index, as save_pretrained does."""
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    parts = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
             "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for fname, keys in parts.items():
        save_file({k: tensors[k] for k in keys}, folder / fname, metadata={"format": "pt"})
    weight_map = {k: fname for fname, keys in parts.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return [folder / f for f in parts]


def test_sharded_folder_loads(folder):
    shard(folder)
    m = load_model(str(folder), with_tokenizer=False)
    assert m.params["layers"]["q"].shape == (2, 32, 32)


def test_missing_shard_names_the_file(folder):
    missing = shard(folder)[1]
    missing.unlink()
    msg = load_error(folder)
    assert str(missing) in msg and "missing safetensors file" in msg


def test_truncated_safetensors_names_the_file(folder):
    f = folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    msg = load_error(folder)
    assert msg.startswith(f"{f}: unreadable safetensors file")
    assert "incomplete metadata" in msg


def test_unsupported_architecture_names_it(folder):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=32, n_head=4, architectures=["GPT2LMHeadModel"]).save_pretrained(folder)
    msg = load_error(folder)
    assert msg.startswith(f"{folder / 'config.json'}: unsupported architecture ['GPT2LMHeadModel']")
    assert "LlamaForCausalLM" in msg
    GPT2Config(n_layer=2, n_embd=32, n_head=4).save_pretrained(folder)  # model_type only
    assert load_error(folder).startswith(f"{folder / 'config.json'}: unsupported architecture 'gpt2'")


def test_wrong_shape_names_the_tensor(folder):
    f = folder / "model.safetensors"
    tensors = load_file(f)
    assert tensors[K_PROJ].shape == (16, 32)  # [Hkv*K, D] in HF layout
    tensors[K_PROJ] = tensors[K_PROJ][:, :31].copy()
    save_file(tensors, f)
    msg = load_error(folder)
    assert msg == f"{folder}: tensor {K_PROJ!r} has shape (16, 31), expected (16, 32)"


def test_missing_tensor_names_it(folder):
    f = folder / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, f)
    assert load_error(folder) == f"{folder}: missing tensor 'model.layers.1.mlp.up_proj.weight'"


def test_missing_lm_head_of_untied_model(folder):
    f = folder / "model.safetensors"
    tensors = load_file(f)
    del tensors["lm_head.weight"]
    save_file(tensors, f)
    assert load_error(folder) == f"{folder}: missing tensor 'lm_head.weight'"


def test_unknown_builtin_names_it():
    with pytest.raises(ModelError, match=r"unknown builtin model 'no-such-model'; available: "
                                         r"\['smollm2-135m-instruct'\]"):
        resolve("builtin:no-such-model")
    assert "'no-such-model'" in load_error("builtin:no-such-model")


def test_unknown_spec_names_it(tmp_path):
    spec = str(tmp_path / "nowhere")
    assert load_error(spec).startswith(f"unknown model {spec!r}")


def test_config_problems_name_the_file_and_field(folder):
    cfg_path = folder / "config.json"
    d = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({k: v for k, v in d.items() if k != "intermediate_size"}))
    assert load_error(folder) == f"{cfg_path}: missing field 'intermediate_size'"
    cfg_path.write_text(json.dumps({**d, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}}))
    assert load_error(folder) == f"{cfg_path}: unsupported rope_scaling type 'longrope'"
    cfg_path.write_text("{not json")
    assert load_error(folder).startswith(f"{cfg_path}: invalid JSON")
    cfg_path.unlink()
    assert load_error(folder) == f"{cfg_path}: no config.json (not an HF model folder)"


def test_bad_gguf_files_name_the_file(tmp_path):
    missing = tmp_path / "absent.gguf"
    with pytest.raises(ModelError, match="absent.gguf: GGUF file not found"):
        convert_gguf_to_hf(missing, tmp_path / "out")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"NOTGGUF" + bytes(100))
    with pytest.raises(ModelError) as e:
        convert_gguf_to_hf(garbage, tmp_path / "out")
    assert str(e.value).startswith(f"{garbage}: unreadable GGUF file")
    assert not (tmp_path / "out").exists()
