"""`python -m jaxrl_mt.export`: run in-process through main([...]) on tiny saved models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxrl_mt.export import main
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.models.hf_io import export_hf_folder, load_hf_folder

CFG = ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=24, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=8, tie_word_embeddings=False, bos_token_id=1,
                  eos_token_id=(2,), pad_token_id=0)
WORDS = ["<pad>", "<s>", "</s>", "<unk>", "hello", "world", "user", "assistant"]
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"


def tiny_tokenizer():
    """A word-level tokenizer over WORDS, with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", chat_template=TEMPLATE)


@pytest.fixture
def tiny(tmp_path: Path):
    """(folder, params) of a tiny model saved with a tokenizer."""
    params = init_params(CFG, jax.random.key(0), scale=0.3)
    return export_hf_folder(CFG, params, tmp_path / "tiny", tokenizer=tiny_tokenizer()), params


def assert_same_tree(a, b):
    la, lb = jax.tree_util.tree_leaves_with_path(a), dict(jax.tree_util.tree_leaves_with_path(b))
    assert len(la) == len(lb)
    for path, x in la:
        assert x.dtype == lb[path].dtype, path
        np.testing.assert_array_equal(np.asarray(x), np.asarray(lb[path]), err_msg=str(path))


def test_export_float32(tiny, tmp_path, capsys):
    src, params = tiny
    out = tmp_path / "out"
    assert main(["--model", str(src), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    cfg, got = load_hf_folder(out)
    assert cfg == CFG
    assert_same_tree(got, params)
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 0)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok("hello world hello", add_special_tokens=False)["input_ids"] == [4, 5, 4]
    assert tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False) == "user: hello</s>"


def test_export_bfloat16(tiny, tmp_path, capsys):
    src, params = tiny
    out = tmp_path / "out16"
    assert main(["--model", str(src), "--out", str(out), "--dtype", "bfloat16"]) == 0
    tensors = load_file(out / "model.safetensors")
    assert {a.dtype for a in tensors.values()} == {np.dtype(ml_dtypes.bfloat16)}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    cfg, got = load_hf_folder(out, param_dtype="bfloat16")
    assert cfg == CFG.replace(param_dtype="bfloat16")
    assert_same_tree(got, jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params))


def test_exported_folder_loads_in_transformers(tiny, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from jaxrl_mt.models.decoder import forward

    src, params = tiny
    out = tmp_path / "out"
    assert main(["--model", str(src), "--out", str(out)]) == 0
    model, info = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = [[1, 4, 5, 6, 7, 4]]
    with torch.no_grad():
        want = model(torch.tensor(ids)).logits.numpy()
    tokens = jnp.asarray(ids)
    got, _, _ = forward(params, CFG, tokens, jnp.arange(6)[None], jnp.ones_like(tokens, bool))
    assert np.abs(np.asarray(got) - want).max() <= 1e-4


def test_export_without_tokenizer(tmp_path, capsys):
    params = init_params(CFG, jax.random.key(1))
    src = export_hf_folder(CFG, params, tmp_path / "weights-only")
    out = tmp_path / "out"
    assert main(["--model", str(src), "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "generation_config.json"}
    assert_same_tree(load_hf_folder(out)[1], params)


def test_unknown_builtin_exits_2_with_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--model", "builtin:no-such-model", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("error: unknown builtin model 'no-such-model'; "
                            "available: ['smollm2-135m-instruct']\n")
    assert not out.exists()


def test_broken_checkpoint_exits_2_naming_the_tensor(tiny, tmp_path, capsys):
    from safetensors.numpy import save_file

    src, _ = tiny
    tensors = load_file(src / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, src / "model.safetensors")
    assert main(["--model", str(src), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"error: {src}: missing tensor 'model.norm.weight'\n"


def test_bad_dtype_is_an_argparse_error(tiny, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", str(tiny[0]), "--out", str(tmp_path / "o"), "--dtype", "float16"])
    assert e.value.code == 2
    assert "invalid choice: 'float16'" in capsys.readouterr().err


def test_module_entry_point_exit_status(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "jaxrl_mt.export", "--model", "builtin:nope",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env,
                          cwd=root, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: unknown builtin model 'nope'")


@pytest.mark.slow
def test_builtin_fresh_conversion_and_bf16_export(tmp_cache, tmp_path, capsys, embedded_model):
    out = tmp_path / "smollm2-bf16"
    assert main(["--model", "builtin:smollm2-135m-instruct", "--out", str(out), "--dtype", "bfloat16"]) == 0
    converted = list((tmp_cache / "models").iterdir())
    assert len(converted) == 1 and (converted[0] / "model.safetensors").is_file()
    cfg, params = load_hf_folder(out, param_dtype="bfloat16")
    assert cfg == embedded_model.cfg.replace(param_dtype="bfloat16")
    assert_same_tree(params, jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), embedded_model.params))


# --------------------------------------------------------------------------- faults


def test_unwritable_out_exits_2_with_one_line_before_loading(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main(["--model", "builtin:never-loaded", "--out", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out: folder {blocker} is not writable (a file, not a folder)\n"
    assert main(["--model", "builtin:never-loaded", "--out", str(blocker)]) == 2
    assert capsys.readouterr().err == f"error: --out {blocker} is a file, not a folder\n"
    assert blocker.read_text() == "x"


def test_failed_export_keeps_the_previous_folder(tmp_path, small_disk, capsys):
    src = export_hf_folder(CFG, init_params(CFG, jax.random.key(0), scale=0.3), tmp_path / "src")
    out = small_disk / "out"
    assert main(["--model", str(src), "--out", str(out)]) == 0
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"\0" * (free - 4096))  # the disk fills: 4 kB left
    capsys.readouterr()
    assert main(["--model", str(src), "--out", str(out), "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: cannot write the export folder {out} (No space left on device); "
                   "the previous folder is kept\n")
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before  # lost: nothing
    assert sorted(os.listdir(small_disk)) == ["filler", "out"]  # no temporary folder left behind
