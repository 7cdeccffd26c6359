"""`random:NAME` (models.synthetic): published Qwen2.5 shapes, seeded weights, the embedded tokenizer,
and a tiny one that generates like any loaded model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.models.config import ModelError
from jaxrl_mt.models.decoder import forward, param_shapes
from jaxrl_mt.models.registry import DEFAULT_MODEL, load_model, resolve
from jaxrl_mt.models.synthetic import ARCHITECTURES, parse_spec, synthetic_shapes

# the Qwen2.5 model cards: hidden size, layers, attention heads, KV heads, intermediate size; and the
# parameter counts they state (billions, total / non-embedding) at Qwen's own vocabulary
PUBLISHED = {
    "qwen2.5-0.5b": ((896, 24, 14, 2, 4864), True, (0.49, 0.36)),
    "qwen2.5-1.5b": ((1536, 28, 12, 2, 8960), True, (1.54, 1.31)),
    "qwen2.5-7b": ((3584, 28, 28, 4, 18944), False, (7.61, 6.53)),
}
CHAT = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def tiny():
    return load_model("random:tiny")


def _count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_architecture_is_the_published_one(name):
    (d, layers, heads, kv, f), tied, (total_b, non_embed_b) = PUBLISHED[name]
    cfg = ARCHITECTURES[name]
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size) == (
        d, layers, heads, kv, f)
    assert (cfg.head_dim, cfg.tie_word_embeddings, cfg.attention_bias, cfg.rope_theta, cfg.rms_norm_eps,
            cfg.architecture) == (d // heads, tied, True, 1e6, 1e-6, "qwen2")
    shapes = synthetic_shapes(cfg)  # abstract: no 7B model is allocated
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(shapes))
    embed = _count([shapes["embed"]]) + (0 if tied else _count([shapes["lm_head"]]))
    # the cards round and truncate (7B: 7.6156 -> "7.61", 6.5257 -> "6.53"): within 0.01 B, less than one layer
    assert abs(_count(shapes) / 1e9 - total_b) < 0.01
    assert abs((_count(shapes) - embed) / 1e9 - non_embed_b) < 0.01
    assert shapes["layers"]["k"].shape == (layers, d, kv * d // heads)


def test_spec_carries_the_embedded_tokenizer_and_vocabulary(tiny, embedded_model):
    assert tiny.spec == "random:tiny" and tiny.path == resolve(DEFAULT_MODEL)
    assert tiny.cfg.vocab_size == embedded_model.cfg.vocab_size == len(tiny.tokenizer)
    assert tiny.cfg.eos_token_id == embedded_model.cfg.eos_token_id and tiny.pad_id == embedded_model.pad_id
    assert tiny.params["embed"].shape == (embedded_model.cfg.vocab_size, ARCHITECTURES["tiny"].hidden_size)
    shapes = jax.tree_util.tree_map(lambda a: a.shape, tiny.params)
    assert shapes == param_shapes(tiny.cfg)
    text = tiny.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert "What is 2 + 3?" in text and text.rstrip().endswith("assistant")
    assert encode_prompt(tiny.tokenizer, CHAT) == encode_prompt(embedded_model.tokenizer, CHAT)


def test_weights_are_deterministic_by_seed(tiny):
    again, other = load_model("random:tiny:0", with_tokenizer=False), load_model("random:tiny:1", with_tokenizer=False)
    same = jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), tiny.params, again.params)
    assert all(jax.tree_util.tree_leaves(same))
    assert not np.array_equal(np.asarray(tiny.params["layers"]["q"]), np.asarray(other.params["layers"]["q"]))
    bf16 = load_model("random:tiny", param_dtype="bfloat16", dtype="bfloat16", with_tokenizer=False)
    assert bf16.params["layers"]["q"].dtype == jnp.bfloat16 and bf16.cfg.dtype == "bfloat16"
    np.testing.assert_array_equal(np.asarray(bf16.params["layers"]["q"]),
                                  np.asarray(tiny.params["layers"]["q"].astype(jnp.bfloat16)))
    std = float(jnp.std(tiny.params["layers"]["gate"]))
    assert 0.018 < std < 0.022 and float(jnp.min(tiny.params["layers"]["attn_norm"])) == 1.0


def test_a_big_spec_loads_abstractly_without_allocating():
    """Memory planning: `jax.eval_shape` over load_model builds no weight (a 7B fp32 model is 30 GB)."""
    params = jax.eval_shape(lambda: load_model("random:qwen2.5-7b", with_tokenizer=False,
                                               param_dtype="bfloat16").params)
    assert params["lm_head"].shape == (3584, 49152) and params["layers"]["gate"].shape == (28, 3584, 18944)
    assert params["layers"]["gate"].dtype == jnp.bfloat16


def test_bad_specs_are_one_line_errors():
    with pytest.raises(ModelError, match="random:qwen2.5-7b"):
        load_model("random:llama-70b")
    with pytest.raises(ModelError, match="non-negative integer"):
        parse_spec("random:tiny:x")
    with pytest.raises(ModelError, match="no folder"):
        resolve("random:tiny")


def test_greedy_generation_is_the_forwards_argmax(tiny):
    """The sampler's greedy tokens are the argmax of a plain forward over prompt + reply, and a
    fresh load of the spec generates the same ones."""
    from jaxrl_mt.sampling import Sampler, SamplingConfig

    prompt = encode_prompt(tiny.tokenizer, CHAT)
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    res = Sampler.from_model(tiny, max_batch=8, row_multiple=8).generate_ids([prompt], greedy, stop_ids=[[]])
    toks = list(res.tokens[0])
    assert len(toks) == 6
    seq = jnp.asarray([prompt + toks])
    logits, _, _ = forward(tiny.params, tiny.cfg, seq, jnp.arange(seq.shape[1])[None], jnp.ones_like(seq, bool))
    assert [int(t) for t in jnp.argmax(logits[0, len(prompt) - 1:-1], -1)] == toks
    fresh = Sampler.from_model(load_model("random:tiny")).generate_ids([prompt], greedy, stop_ids=[[]])
    assert list(fresh.tokens[0]) == toks


def test_evaluation_and_server_load_it(tiny):
    """evaluate's model loader and the OpenAI server take the spec; the server's greedy reply is
    the sampler's greedy tokens decoded."""
    import json
    import urllib.request

    from jaxrl_mt.evaluate import load_eval_model
    from jaxrl_mt.sampling import Sampler, SamplingConfig
    from jaxrl_mt.serving.server import ServerThread, build_service

    m = load_eval_model("random:tiny", dtype="bfloat16")
    assert m.cfg.hidden_size == 64 and m.params["embed"].dtype == jnp.bfloat16
    service = build_service(tiny, names=["random:tiny"], max_batch=8)
    body = json.dumps({"model": "random:tiny", "messages": CHAT, "max_tokens": 4, "temperature": 0}).encode()
    with ServerThread(service) as server:
        req = urllib.request.Request(f"{server.url}/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            reply = json.loads(r.read())
    want = Sampler.from_model(tiny).generate_ids([encode_prompt(tiny.tokenizer, CHAT)],
                                                  SamplingConfig(max_new_tokens=4, temperature=0.0))
    assert reply["model"] == "random:tiny"
    assert reply["choices"][0]["message"]["content"] == want.texts[0]


def test_export_writes_a_folder_that_loads_back_as_the_same_model(tiny, tmp_path):
    from jaxrl_mt.export import main

    assert main(["--model", "random:tiny:2", "--out", str(tmp_path / "out")]) == 0
    back, again = load_model(str(tmp_path / "out")), load_model("random:tiny:2", with_tokenizer=False)
    assert back.cfg == again.cfg
    same = jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), back.params, again.params)
    assert all(jax.tree_util.tree_leaves(same))
    assert encode_prompt(back.tokenizer, CHAT) == encode_prompt(tiny.tokenizer, CHAT)
