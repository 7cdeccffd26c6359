"""Damaged LoRA adapters (issue 53 item 5): the probe's 21 variants, each one ``ModelError`` line.

Before, 11 of them ended in tracebacks (truncated safetensors, a config that is not JSON / empty / a
list, ``r`` 0 / missing / "eight", another base's shapes, an A/B rank mismatch, 1-D tensors) and the
others loaded silently (NaN / Inf weights, a NaN ``lora_alpha``, ``r`` 4 over rank-8 tensors, 40
layers on a 30-layer base, int32 tensors). Real safetensors files, written and damaged here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_mt.models.config import ModelConfig, ModelError
from jaxrl_mt.models.lora import LoraConfig, load_peft, save_peft

CFG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8, max_position_embeddings=128, eos_token_id=(2,), bos_token_id=1, pad_token_id=0)
RANK = 8
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def _good(folder: Path) -> Path:
    """A valid rank-8 adapter of q and v on CFG (B non-zero)."""
    rng = np.random.default_rng(0)
    layers = {}
    for k, d_out in (("q", 32), ("v", 16)):
        layers[k] = {"a": rng.normal(size=(CFG.num_layers, 32, RANK)).astype(np.float32),
                     "b": rng.normal(size=(CFG.num_layers, RANK, d_out)).astype(np.float32)}
    return save_peft(folder, {"layers": layers}, LoraConfig(rank=RANK, alpha=16.0))


def _conf(**kw) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        conf = json.loads((folder / "adapter_config.json").read_text())
        for k, v in kw.items():
            if v is _DROP:
                conf.pop(k)
            else:
                conf[k] = v
        (folder / "adapter_config.json").write_text(json.dumps(conf))
    return edit


_DROP = object()


def _raw_conf(text: str) -> Callable[[Path], None]:
    return lambda folder: (folder / "adapter_config.json").write_text(text)


def _tensors(fn: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "adapter_model.safetensors"
        save_file(fn(dict(load_file(str(path)))), str(path))
    return edit


def _set(name: str, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict], dict]:
    return lambda t: {**t, name: np.ascontiguousarray(fn(t[name]))}


def _truncate(folder: Path) -> None:
    path = folder / "adapter_model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _nan_at(x: np.ndarray) -> np.ndarray:
    y = x.copy()
    y[1, 3] = np.nan
    return y


def _inf_at(x: np.ndarray) -> np.ndarray:
    y = x.copy()
    y[0, 0] = np.inf
    return y


def _forty_layers(t: dict) -> dict:
    extra = {n.replace("layers.0.", f"layers.{i}."): v for n, v in t.items() if ".layers.0." in n for i in (2, 39)}
    return {**t, **extra}


def _other_base(t: dict) -> dict:  # every q tensor as if the model were twice as wide
    return {n: (np.zeros((RANK, 64), np.float32) if "q_proj.lora_A" in n else
                np.zeros((64, RANK), np.float32) if "q_proj.lora_B" in n else v) for n, v in t.items()}


VARIANTS = {
    "truncated safetensors": (_truncate, "unreadable safetensors file"),
    "safetensors not safetensors": (lambda f: (f / "adapter_model.safetensors").write_bytes(b"\x00" * 3),
                                    "unreadable safetensors file"),
    "empty safetensors": (lambda f: (f / "adapter_model.safetensors").write_bytes(b""), "unreadable safetensors"),
    "config not JSON": (_raw_conf("{r: 8,"), "adapter_config.json: not a JSON file"),
    "config empty": (_raw_conf(""), "adapter_config.json: not a JSON file"),
    "config a list": (_raw_conf("[1, 2]"), "expected a JSON object, got list"),
    "config not UTF-8": (lambda f: (f / "adapter_config.json").write_bytes(b'{"r": "\xff"}'), "not a JSON file"),
    "r 0": (_conf(r=0), "field 'r': expected a positive integer, got 0"),
    "r missing": (_conf(r=_DROP), "field 'r': expected a positive integer, got null"),
    "r eight": (_conf(r="eight"), "field 'r': expected a positive integer, got \"eight\""),
    "r true": (_conf(r=True), "field 'r': expected a positive integer, got true"),
    "r 4 over rank-8 tensors": (_conf(r=4), "rank 8 .* but adapter_config.json says r=4"),
    "lora_alpha NaN": (_raw_conf('{"peft_type": "LORA", "r": 8, "lora_alpha": NaN}'), "field 'lora_alpha'"),
    "lora_alpha Infinity": (_raw_conf('{"peft_type": "LORA", "r": 8, "lora_alpha": 1e999}'), "field 'lora_alpha'"),
    "lora_alpha a string": (_conf(lora_alpha="16"), "field 'lora_alpha'"),
    "another base's shapes": (_tensors(_other_base), "shape \\[8, 64\\]; the base model's self_attn.q_proj needs"),
    "A/B rank mismatch": (_tensors(_set(Q_B, lambda x: x[:, :4])), "rank 4 \\[32, 4\\]"),
    "1-D tensors": (_tensors(_set(Q_A, lambda x: x.reshape(-1))), "1-D \\[256\\]; expected 2-D \\[8, 32\\]"),
    "NaN weights": (_tensors(_set(Q_B, _nan_at)), "1 non-finite values"),
    "Inf weights": (_tensors(_set(Q_A, _inf_at)), "1 non-finite values"),
    "40 layers on the base's 2": (_tensors(_forty_layers), "layer 2, but the base model has 2 layers"),
    "int32 tensors": (_tensors(_set(Q_A, lambda x: x.astype(np.int32))), "dtype int32"),
    "an unknown tensor": (_tensors(lambda t: {**t, "lm_head.weight": np.zeros((2, 2), np.float32)}),
                          "'lm_head.weight': not a LoRA A/B weight"),
    "B without A": (_tensors(lambda t: {n: v for n, v in t.items() if n != Q_A}), "not adapted in every one"),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_damaged_adapter_is_one_model_error_line(tmp_path, name):
    damage, message = VARIANTS[name]
    damage(_good(tmp_path / "a"))
    with pytest.raises(ModelError, match=message) as e:
        load_peft(tmp_path / "a", CFG)
    assert len(str(e.value).splitlines()) == 1 and str(tmp_path / "a") in str(e.value)


def test_the_good_adapter_still_loads(tmp_path):
    ad, lc = load_peft(_good(tmp_path / "a"), CFG)
    assert (lc.rank, lc.alpha, set(ad["layers"])) == (8, 16.0, {"q", "v"})
    assert ad["layers"]["q"]["a"].shape == (2, 32, 8) and ad["layers"]["v"]["b"].shape == (2, 8, 16)


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory) -> Path:
    """CFG saved as an HF folder (the adapter is refused before the tokenizer is needed)."""
    from jaxrl_mt.models.hf_io import export_hf_folder
    from tests.test_sampling import numpy_params

    return export_hf_folder(CFG, numpy_params(CFG, 0, scale=0.5), tmp_path_factory.mktemp("base") / "tiny")


@pytest.mark.parametrize("name", ["truncated safetensors", "NaN weights", "r 4 over rank-8 tensors", "int32 tensors"])
def test_generate_and_serve_answer_one_line_and_exit_2(tmp_path, base_folder, capsys, name):
    """The entry points ``generate`` and ``serve`` (train and evaluate catch the same ModelError)."""
    from jaxrl_mt import generate, serve

    damage, message = VARIANTS[name]
    damage(_good(tmp_path / "a"))
    spec = f"{base_folder}+lora:{tmp_path / 'a'}"
    for run in (lambda: generate.main(["--model", spec, "--prompt", "hi", "--max-new-tokens", "2"]),
                lambda: serve.main(["--model", spec, "--port", "0"])):
        rc = run()
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("error: --model"), err
        assert re.search(message, err[0]), err
