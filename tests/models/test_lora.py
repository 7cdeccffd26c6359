"""LoRA adapters: the merge's arithmetic and gradients, and PEFT's format both ways against transformers + peft."""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.models.config import ModelConfig, ModelError
from jaxrl_mt.models.decoder import forward, init_params, positions_from_mask
from jaxrl_mt.models.hf_io import export_hf_folder
from jaxrl_mt.models.grouped import forward_grouped
from jaxrl_mt.models.lora import LoraConfig, attach, copy_peft, init_adapters, load_peft, merge, save_peft

CFG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8, max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=1,
                  eos_token_id=(2,), pad_token_id=0)
TOKENS = np.array([[5, 17, 33, 2, 64, 9, 71, 40]], np.int32)


@functools.partial(jax.jit, static_argnums=1)
def _logits(params, cfg, tokens):
    mask = jnp.ones_like(tokens, bool)
    return forward(params, cfg, tokens, positions_from_mask(mask), mask)[0]


def _random_b(adapters, key, scale=0.05):
    out = {}
    for i, (k, ab) in enumerate(adapters["layers"].items()):
        out[k] = {"a": ab["a"], "b": scale * jax.random.normal(jax.random.fold_in(key, i), ab["b"].shape)}
    return {"layers": out}


def test_b_zero_is_the_base_model_exactly_and_targets_are_chosen_by_regex():
    params = init_params(CFG, jax.random.key(0))
    lc = LoraConfig(rank=4, alpha=8.0)
    ad = init_adapters(params, lc, jax.random.key(1))
    assert set(ad["layers"]) == {"q", "k", "v", "o", "gate", "up", "down"}
    assert ad["layers"]["q"]["a"].shape == (2, 32, 4) and ad["layers"]["k"]["b"].shape == (2, 4, 16)
    assert float(jnp.abs(ad["layers"]["q"]["a"]).max()) <= 1 / np.sqrt(32)  # PEFT's kaiming-uniform bound
    np.testing.assert_array_equal(np.asarray(_logits(merge(params, ad, lc.scale), CFG, TOKENS)),
                                  np.asarray(_logits(params, CFG, TOKENS)))
    assert LoraConfig(targets="q|v").keys() == ("q", "v")
    with pytest.raises(ValueError, match="match none"):
        LoraConfig(targets="qkv").keys()


def test_gradients_wrt_a_and_b_follow_the_chain_rule_through_the_merged_weight():
    params = init_params(CFG, jax.random.key(0))
    lc = LoraConfig(rank=4, alpha=8.0, targets="q|down")
    ad = _random_b(init_adapters(params, lc, jax.random.key(1)), jax.random.key(2))
    probe = jax.random.normal(jax.random.key(3), (1, 8, 97))
    loss = lambda p: jnp.sum(_logits(p, CFG, TOKENS) * probe)  # noqa: E731
    g_ad = jax.grad(lambda a: loss(merge(params, a, lc.scale)))(ad)
    merged = merge(params, ad, lc.scale)
    g_w = jax.grad(loss)(merged)["layers"]  # dL/dW' of the merged weights
    for k in ("q", "down"):
        a, b, gw = ad["layers"][k]["a"], ad["layers"][k]["b"], g_w[k]
        want_a = lc.scale * jnp.einsum("lio,lro->lir", gw, b)  # s dL/dW' B^T
        want_b = lc.scale * jnp.einsum("lir,lio->lro", a, gw)  # s A^T dL/dW'
        np.testing.assert_allclose(g_ad["layers"][k]["a"], want_a, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(g_ad["layers"][k]["b"], want_b, rtol=1e-6, atol=1e-6)


def test_the_unmerged_forward_matches_the_merged_one_and_its_gradients_the_explicit_formula():
    params = init_params(CFG, jax.random.key(0))
    lc = LoraConfig(rank=4, alpha=8.0)
    ad = _random_b(init_adapters(params, lc, jax.random.key(1)), jax.random.key(2), scale=0.2)
    merged = np.asarray(_logits(merge(params, ad, lc.scale), CFG, TOKENS))
    unmerged = np.asarray(_logits(attach(params, ad, lc.scale), CFG, TOKENS))
    assert np.abs(merged - np.asarray(_logits(params, CFG, TOKENS))).max() > 1e-2  # the adapters do change it
    np.testing.assert_allclose(unmerged, merged, atol=1e-5)
    # the grouped prompt-then-completions forward reads the same layer keys
    prompt, comps = jnp.asarray(TOKENS[:, :5]), jnp.asarray(np.repeat(TOKENS[:, 5:], 2, axis=0))
    pm, cm = jnp.ones_like(prompt, bool), jnp.ones_like(comps, bool)
    g_m = forward_grouped(merge(params, ad, lc.scale), CFG, prompt, pm, comps, cm)
    g_u = forward_grouped(attach(params, ad, lc.scale), CFG, prompt, pm, comps, cm)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), g_u, g_m)
    # d/dA, d/dB of the unmerged forward = jax.grad of the explicit merged formula W + s A B, in fp64
    # (in fp32 the two orders of summation differ by a few 1e-6 on gradients of size ~1)
    cfg64 = dataclasses.replace(CFG, dtype="float64", param_dtype="float64")
    with jax.enable_x64(True):
        p64, ad64 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), (params, ad))
        probe = jax.random.normal(jax.random.key(3), (1, 8, 97), jnp.float64)
        loss = lambda p: jnp.sum(_logits(p, cfg64, TOKENS) * probe)  # noqa: E731
        g_unmerged = jax.grad(lambda a: loss(attach(p64, a, lc.scale)))(ad64)

        def explicit(a):
            layers = dict(p64["layers"])
            for k, ab in a["layers"].items():
                layers[k] = p64["layers"][k] + lc.scale * ab["a"] @ ab["b"]
            return loss({**p64, "layers": layers})

        g_explicit = jax.grad(explicit)(ad64)
    assert g_unmerged["layers"]["q"]["a"].dtype == jnp.float64
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6),
                           g_unmerged, g_explicit)


def _hf(tmp_path, params):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    folder = export_hf_folder(CFG, params, tmp_path / "base")
    return folder, AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def test_an_exported_adapter_loads_in_peft_and_gives_our_logits(tmp_path):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    params = init_params(CFG, jax.random.key(0))
    lc = LoraConfig(rank=4, alpha=8.0)
    ad = _random_b(init_adapters(params, lc, jax.random.key(1)), jax.random.key(2))
    out = save_peft(tmp_path / "adapter", ad, lc)
    assert json.loads((out / "adapter_config.json").read_text())["target_modules"] == [
        "down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    folder, base = _hf(tmp_path, params)
    model = peft.PeftModel.from_pretrained(base, str(out)).eval()
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS.astype(np.int64))).logits.numpy()
    ours = np.asarray(_logits(merge(params, ad, lc.scale), CFG, TOKENS))
    base_logits = np.asarray(_logits(params, CFG, TOKENS))
    assert np.abs(ours - base_logits).max() > 1e-2  # the adapter changes the model
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_an_adapter_made_by_peft_imports_and_matches(tmp_path):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    params = init_params(CFG, jax.random.key(0))
    folder, base = _hf(tmp_path, params)
    conf = peft.LoraConfig(r=3, lora_alpha=6, target_modules=["q_proj", "v_proj", "up_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(base, conf)
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    model.save_pretrained(str(tmp_path / "theirs"))
    ad, lc = load_peft(tmp_path / "theirs", CFG)
    assert set(ad["layers"]) == {"q", "v", "up"} and (lc.rank, lc.scale) == (3, 2.0)
    with torch.no_grad():
        theirs = model.eval()(torch.tensor(TOKENS.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(np.asarray(_logits(merge(params, ad, lc.scale), CFG, TOKENS)), theirs, atol=1e-4)


def test_a_folder_that_is_not_an_adapter_is_named(tmp_path):
    with pytest.raises(ModelError, match="not a PEFT adapter"):
        load_peft(tmp_path, CFG)
    save_peft(tmp_path / "a", {"layers": {}}, LoraConfig(rank=2))
    with pytest.raises(ModelError, match="no LoRA weights of a known projection"):
        load_peft(tmp_path / "a", CFG)


def test_a_bfloat16_copy_loads_as_the_rounded_adapter_at_half_the_size(tmp_path):
    import ml_dtypes

    lc = LoraConfig(rank=4, alpha=8.0)
    ad = _random_b(init_adapters(init_params(CFG, jax.random.PRNGKey(0)), lc, jax.random.PRNGKey(1)),
                   jax.random.PRNGKey(2))
    save_peft(tmp_path / "fp32", ad, lc)
    copy_peft(tmp_path / "fp32", tmp_path / "bf16", dtype="bfloat16")
    back, lc2 = load_peft(tmp_path / "bf16", CFG)
    assert lc2 == lc
    for k, ab in ad["layers"].items():
        for m in ("a", "b"):
            want = np.asarray(ab[m], np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
            np.testing.assert_array_equal(back["layers"][k][m], want)  # exactly bf16 rounding, read back as fp32
            assert np.max(np.abs(back["layers"][k][m] - np.asarray(ab[m]))) > 0  # and not the fp32 values
    def data_bytes(d):  # a safetensors file: 8-byte header length, the JSON header, then the tensors' bytes
        raw = (tmp_path / d / "adapter_model.safetensors").read_bytes()
        return len(raw) - 8 - int.from_bytes(raw[:8], "little")

    n = sum(ab[m].size for ab in ad["layers"].values() for m in ("a", "b"))
    assert (data_bytes("fp32"), data_bytes("bf16")) == (4 * n, 2 * n)
    config = [(tmp_path / d / "adapter_config.json").read_bytes() for d in ("fp32", "bf16")]
    assert config[0] == config[1]
    with pytest.raises(ModelError, match="dtype must be one of"):
        copy_peft(tmp_path / "fp32", tmp_path / "x", dtype="int8")
    with pytest.raises(ModelError, match="not a PEFT adapter"):
        copy_peft(tmp_path / "nothing", tmp_path / "y")


def test_dots_remat_keeps_one_output_per_adapted_projection():
    """remat="dots" saves each projection's output by name: the unmerged LoRA term adds no second
    [.., out] tensor per projection (JAX's dots_with_no_batch_dims_saveable kept both: 1.70x the
    full fine-tuning step's temporaries at this shape), and the gradients are those without remat."""
    cfg = ModelConfig(vocab_size=1000, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=64, max_position_embeddings=512)
    lc = LoraConfig(rank=16, alpha=32.0)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    ad = jax.eval_shape(lambda p: init_adapters(p, lc, jax.random.key(1)), params)
    tok = jax.ShapeDtypeStruct((16, 256), jnp.int32)

    def loss(p, t, remat="dots"):
        m = jnp.ones_like(t, bool)
        return forward(p, cfg, t, positions_from_mask(m), m, logits="none", remat=remat)[1].sum()

    def temp_bytes(fn, *args):
        return jax.jit(jax.grad(fn)).lower(*args).compile().memory_analysis().temp_size_in_bytes

    full = temp_bytes(loss, params, tok)
    lora = temp_bytes(lambda a, p, t: loss(attach(p, a, lc.scale), t), ad, params, tok)
    assert lora < 1.2 * full, (lora, full)
    # same gradients with and without remat (small real arrays)
    p = init_params(CFG, jax.random.key(0))
    a = _random_b(init_adapters(p, LoraConfig(rank=4, alpha=8.0), jax.random.key(1)), jax.random.key(2))
    t = jnp.asarray(TOKENS)
    g = [jax.grad(lambda a, r=r: jnp.sum(jnp.sin(forward(attach(p, a, 2.0), CFG, t, positions_from_mask(t > -1),
                                                         t > -1, logits="none", remat=r)[1])))(a)
         for r in (False, "dots")]
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5), *g)  # |g| to ~20


@pytest.mark.slow
def test_embedded_model_adapters_match_peft_both_ways(tmp_path, embedded_model):
    """SmolLM2-135M-Instruct (its own HF folder): our adapter exported and loaded by peft, and a
    peft-made adapter imported by us, each give our logits within 1e-4 (unmerged and merged)."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    m = embedded_model
    tokens = np.asarray([m.tokenizer.encode("The answer to 12 + 30 is 42, because")], np.int32)
    base = lambda: AutoModelForCausalLM.from_pretrained(str(m.path), dtype=torch.float32).eval()  # noqa: E731
    lc = LoraConfig(rank=8, alpha=16.0)
    ad = _random_b(init_adapters(m.params, lc, jax.random.key(1)), jax.random.key(2), scale=0.02)
    save_peft(tmp_path / "ours", ad, lc, base_model=str(m.path))
    with torch.no_grad():
        theirs = peft.PeftModel.from_pretrained(base(), str(tmp_path / "ours")).eval()(
            torch.tensor(tokens.astype(np.int64))).logits.numpy()
    ours = np.asarray(_logits(attach(m.params, ad, lc.scale), m.cfg, tokens))
    assert np.abs(ours - np.asarray(_logits(m.params, m.cfg, tokens))).max() > 1e-2
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    np.testing.assert_allclose(np.asarray(_logits(merge(m.params, ad, lc.scale), m.cfg, tokens)), theirs, atol=1e-4)
    # a peft-made adapter, imported
    model = peft.get_peft_model(base(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["k_proj", "down_proj"],
                                                        lora_dropout=0.0))
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
        theirs = model.eval()(torch.tensor(tokens.astype(np.int64))).logits.numpy()
    model.save_pretrained(str(tmp_path / "theirs"))
    ad2, lc2 = load_peft(tmp_path / "theirs", m.cfg)
    np.testing.assert_allclose(np.asarray(_logits(attach(m.params, ad2, lc2.scale), m.cfg, tokens)), theirs,
                               atol=1e-4)
