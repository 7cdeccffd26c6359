"""The sampler: greedy parity with transformers, the sampled distribution, filters, budgets, stops.

References are computed independently of the sampling loop: transformers' `generate` for greedy
outputs, a plain teacher-forced `forward` (numpy softmax, nucleus and top-k sets) for the sampled
distributions, and the scorer's `token_logprobs` for the returned log-probabilities.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxrl_mt import chat
from jaxrl_mt.batching import pack_rows
from jaxrl_mt.chat import left_pad
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import forward, param_shapes, positions_from_mask
from jaxrl_mt.models.registry import load_model
from jaxrl_mt.sampling import Sampler, SamplingConfig, generate_tokens
from jaxrl_mt.sampling.slots import admit, segment
from jaxrl_mt.scoring import token_logprobs

# A tiny model whose next-token distributions are far from uniform (logit std ~1.2 at scale 0.2).
TINY = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=8, max_position_embeddings=128, eos_token_id=(1,))
PROMPTS = [[5, 6, 7], [9, 3, 4, 12, 30, 2], [17] * 9, [8, 20, 11, 2, 5, 6, 7, 29, 31, 4, 13, 10]]


def numpy_params(cfg: ModelConfig, seed: int, scale: float):
    """Random parameters drawn with numpy (normal(0, scale) matrices, unit norms): no per-leaf compiles."""
    rng = np.random.default_rng(seed)

    def leaf(path, shape):
        if "norm" in jax.tree_util.keystr(path):
            return np.ones(shape, np.float32)
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    return jax.device_put(jax.tree_util.tree_map_with_path(leaf, param_shapes(cfg),
                                                           is_leaf=lambda x: isinstance(x, tuple)))


@pytest.fixture(scope="module")
def tiny() -> Sampler:
    return Sampler(numpy_params(TINY, 0, scale=0.2), TINY, eos_ids=TINY.eos_token_id, pad_id=0)


@functools.partial(jax.jit, static_argnums=(1,))
def _logits(params, cfg, tokens, mask):
    logits, _, _ = forward(params, cfg, tokens, positions_from_mask(mask), mask)
    return logits


def teacher_logits(sampler: Sampler, seqs: list[list[int]]) -> np.ndarray:
    """Logits [B, T, V] (float64) of left-padded full sequences, from one teacher-forced forward."""
    tokens, mask = left_pad(seqs, sampler.pad_id)
    return np.asarray(_logits(sampler.params, sampler.cfg, tokens, mask), np.float64)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def chi2_pvalue(samples: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value of samples against probs (bins expecting < 5 merged)."""
    counts = np.bincount(samples, minlength=len(probs)).astype(np.float64)
    expected = probs * len(samples)
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


# ---------------------------------------------------------------------------------------------
# greedy parity with transformers


def tiny_hf_llama(folder: Path, seed: int = 0):
    """A random-weight transformers LlamaForCausalLM (vocab 97, 2 layers, GQA) saved to `folder`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    model.save_pretrained(str(folder))
    return model


def hf_greedy(model, prompts: list[list[int]], new_tokens: int, pad_id: int, eos: list[int]) -> list[list[int]]:
    """transformers' greedy continuations of a left-padded batch, cut after the first EOS."""
    import torch

    tokens, mask = left_pad(prompts, pad_id)
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor(tokens, dtype=torch.long),
                             attention_mask=torch.tensor(mask, dtype=torch.long), do_sample=False,
                             max_new_tokens=new_tokens, pad_token_id=pad_id, eos_token_id=eos,
                             temperature=None, top_p=None, top_k=None)
    rows = []
    for row in out[:, tokens.shape[1]:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_tiny")
    return tiny_hf_llama(folder), load_model(str(folder), with_tokenizer=False)


def test_greedy_matches_transformers_tiny_batch4_left_padded(hf_tiny):
    ref, ours = hf_tiny
    prompts = [[5, 6, 7], [9, 3, 4, 12, 30, 2, 44, 50, 61, 70, 71], [17] * 6, [8, 20, 11, 1, 96]]
    sampler = Sampler.from_model(ours)
    assert sampler.eos_ids == (2,)
    got = sampler.generate_ids(prompts, SamplingConfig(max_new_tokens=32, temperature=0.0))
    want = hf_greedy(ref, prompts, 32, pad_id=0, eos=[2])
    assert got.tokens == want
    assert got.finish_reasons == ["stop" if w[-1] == 2 else "length" for w in want]
    assert len({t for row in want for t in row}) > 5  # varied outputs, not one repeated token


CHATS = [
    "Hi",
    "What is 17 * 23?",
    "Name three colors.",
    "Write a haiku about the sea and the wind at night.",
    "I have 3 apples. I buy 4 more and eat 2. How many apples do I have now? Explain briefly.",
    "Translate to French: the cat sleeps on the warm windowsill while the rain falls outside.",
    "List the planets of the solar system in order from the sun, with one fact about each of them.",
    "Summarize: The quick brown fox jumps over the lazy dog. The dog does not react. The fox runs "
    "into the forest, where it meets an owl who asks it why it is always in such a hurry.",
]


@pytest.mark.slow
def test_greedy_matches_transformers_embedded_batch1_and_batch8(embedded_model):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    m = embedded_model
    ref = AutoModelForCausalLM.from_pretrained(str(m.path), dtype=torch.float32).eval()
    prompts = [chat.encode_prompt(m.tokenizer, [{"role": "user", "content": c}]) for c in CHATS]
    assert len({len(p) for p in prompts}) == len(prompts)  # all lengths differ
    sampler = Sampler.from_model(m)
    cfg = SamplingConfig(max_new_tokens=64, temperature=0.0)
    eos = list(m.eos_ids)
    batch = sampler.generate_ids(prompts, cfg)
    assert batch.tokens == hf_greedy(ref, prompts, 64, m.pad_id, eos)
    for i, p in enumerate(prompts):
        one = sampler.generate_ids([p], cfg)
        assert one.tokens == hf_greedy(ref, [p], 64, m.pad_id, eos) == [batch.tokens[i]]
    assert sum(len(t) for t in batch.tokens) >= 8 * 20  # real generations, not immediate stops


# ---------------------------------------------------------------------------------------------
# the sampled distribution and its filters


def test_top_k_1_equals_greedy(tiny):
    greedy = tiny.generate_ids(PROMPTS, SamplingConfig(16, temperature=0.0), stop_ids=[[]] * 4)
    top1 = tiny.generate_ids(PROMPTS, SamplingConfig(16, temperature=1.0, top_k=1), seed=7, stop_ids=[[]] * 4)
    assert top1.tokens == greedy.tokens
    for a, b in zip(top1.logprobs, greedy.logprobs):  # at T = 1 both are raw log-softmax values
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert len({t for row in greedy.tokens for t in row}) > 3  # not a single repeated token


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_first_token_distribution_is_softmax_of_logits_over_t(tiny, temperature):
    n = 4096  # one full batch bucket
    prompt = [5, 6, 7, 8, 9]
    r = tiny.generate_ids([prompt] * n, SamplingConfig(1, temperature=temperature), seed=11, stop_ids=[[]] * n)
    samples = np.array([t[0] for t in r.tokens])
    z = teacher_logits(tiny, [prompt])[0, -1]  # [V]
    other = 0.7 if temperature == 1.0 else 1.0
    p_right = chi2_pvalue(samples, softmax(z / temperature))
    p_wrong = chi2_pvalue(samples, softmax(z / other))
    assert p_right > 1e-3, p_right
    assert p_wrong < 1e-8, p_wrong


def allowed_sets(z: np.ndarray, top_k: int, top_p: float, slack: float = 0.0) -> list[set[int]]:
    """Per row of logits z [N, V]: the tokens inside the top-k set and the top-p nucleus."""
    out = []
    for row in z:
        order = np.argsort(-row, kind="stable")
        p = softmax(row)[order]
        keep = np.ones(len(row), bool)
        if top_k:
            keep &= np.arange(len(row)) < top_k
        if top_p < 1:
            keep &= (np.cumsum(p) - p) < top_p + slack  # smallest prefix whose mass reaches top_p
        out.append(set(order[keep].tolist()))
    return out


def sample_and_teacher(sampler: Sampler, cfg: SamplingConfig, seeds: range):
    """Samples cfg.max_new_tokens for every prompt under each seed (one compiled program, batch 4).

    Returns (generated [R, N], teacher-forced logits / T [R, N, V]) with R = 4 * len(seeds).
    """
    prompts, gen = [], []
    for seed in seeds:
        r = sampler.generate_ids(PROMPTS, cfg, seed=seed, stop_ids=[[]] * len(PROMPTS))
        prompts += PROMPTS
        gen += r.tokens
    n = cfg.max_new_tokens
    z = teacher_logits(sampler, [p + t for p, t in zip(prompts, gen)])[:, -n - 1:-1]  # [R, N, V]
    return np.array(gen), z / cfg.temperature


@pytest.mark.parametrize("top_k, top_p", [(0, 0.6), (3, 1.0)])
def test_filtered_sampling_stays_inside_the_allowed_set(tiny, top_k, top_p):
    cfg = SamplingConfig(16, temperature=0.9, top_k=top_k, top_p=top_p)
    gen, z = sample_and_teacher(tiny, cfg, range(16))  # 1024 sampled tokens
    flat_z, flat_t = z.reshape(-1, z.shape[-1]), gen.reshape(-1)
    allowed = allowed_sets(flat_z, top_k, top_p, slack=1e-5)
    outside = [i for i, (t, a) in enumerate(zip(flat_t, allowed)) if t not in a]
    assert outside == []
    assert np.mean([t != np.argmax(r) for t, r in zip(flat_t, flat_z)]) > 0.2  # really sampling
    # the same check on unfiltered samples fails: it has the power to catch a broken filter
    free, fz = sample_and_teacher(tiny, SamplingConfig(16, temperature=0.9), range(16))
    strict = allowed_sets(fz.reshape(-1, fz.shape[-1]), top_k, top_p)
    assert sum(t not in a for t, a in zip(free.reshape(-1), strict)) > 100


@functools.partial(jax.jit, static_argnums=(1,))
def _scorer_logprobs(params, cfg, tokens, mask, temperature):
    return token_logprobs(params, cfg, tokens, mask, temperature=temperature)[0]


@pytest.mark.parametrize("temperature, top_p", [(0.8, 0.9), (0.0, 1.0)])
def test_logprobs_equal_teacher_forced_scorer(tiny, temperature, top_p):
    r = tiny.generate_ids(PROMPTS, SamplingConfig(10, temperature=temperature, top_p=top_p), seed=4,
                          stop_ids=[[9]] * len(PROMPTS))
    assert min(r.lengths) < 10 < max(r.lengths) + 1  # ragged rows: some stopped early
    tokens, mask = pack_rows([p + t for p, t in zip(PROMPTS, r.tokens)], 0, 32, align="right")
    # greedy reports the untempered log-softmax
    lp = np.asarray(_scorer_logprobs(tiny.params, TINY, tokens, mask, temperature or 1.0))
    for i, (p, t) in enumerate(zip(PROMPTS, r.tokens)):
        np.testing.assert_allclose(r.logprobs[i], lp[i, len(p):len(p) + len(t)], atol=2e-5)


# ---------------------------------------------------------------------------------------------
# budgets, stops, seeds, shapes, errors


def test_per_row_budgets_and_stop_tokens(tiny):
    free = tiny.generate_ids(PROMPTS, SamplingConfig(12, 0.0), stop_ids=[[]] * 4)
    assert free.lengths.tolist() == [12] * 4 and free.finish_reasons == ["length"] * 4
    row0 = free.tokens[0]
    j = next(j for j in range(2, 12) if row0[j] not in row0[:j])  # a token that first appears at j
    stop = row0[j]
    stops = [[stop], [stop], [], [free.tokens[3][0]]]  # one id per row: the shape other tests compile
    budgets = [12, 5, 8, 1]
    r = tiny.generate_ids(PROMPTS, SamplingConfig(12, 0.0), max_new_tokens=budgets, stop_ids=stops)
    want_len, want_reason = [], []
    for row, s, b in zip(free.tokens, stops, budgets):
        first = next((k + 1 for k, t in enumerate(row) if t in s), None)
        if first is not None and first <= b:
            want_len.append(first), want_reason.append("stop")
        else:
            want_len.append(b), want_reason.append("length")
    assert want_len[0] == j + 1 and want_reason[0] == "stop"
    assert (want_len[2], want_reason[2]) == (8, "length")
    assert (want_len[3], want_reason[3]) == (1, "stop")  # its first token is one of its stop ids
    assert r.lengths.tolist() == want_len
    assert r.finish_reasons == want_reason
    assert r.tokens == [row[:n] for row, n in zip(free.tokens, want_len)]
    assert [len(x) for x in r.logprobs] == want_len
    # default stop ids are the model's EOS ids
    eos = tiny.generate_ids(PROMPTS, SamplingConfig(12, 0.0))
    for row, got in zip(free.tokens, eos.tokens):
        cut = next((k + 1 for k, t in enumerate(row) if t in TINY.eos_token_id), 12)
        assert got == row[:cut]


def test_seed_determinism(tiny):
    cfg = SamplingConfig(10, temperature=1.0)
    a = tiny.generate_ids(PROMPTS, cfg, seed=0, stop_ids=[[]] * 4)
    b = tiny.generate_ids(PROMPTS, cfg, seed=0, stop_ids=[[]] * 4)
    c = tiny.generate_ids(PROMPTS, cfg, seed=1, stop_ids=[[]] * 4)
    k = tiny.generate_ids(PROMPTS, cfg, seed=jax.random.PRNGKey(0), stop_ids=[[]] * 4)
    assert a.tokens == b.tokens == k.tokens
    for x, y in zip(a.logprobs, b.logprobs):
        np.testing.assert_array_equal(x, y)
    assert sum(x != y for x, y in zip(a.tokens, c.tokens)) >= 3


def test_prompt_lengths_in_one_bucket_compile_one_program(tiny):
    """Three rows whose prompts share the 32-token bucket: one admission program (3 rows x 32: the slots
    start at the narrowest width holding the call's rows) and one segment program (3 slots of 32 + 16
    cache slots), compiled once for every such call."""
    cfg = TINY.replace(max_position_embeddings=100)  # a config no other test compiles for
    s = Sampler(tiny.params, cfg, eos_ids=(1,), min_prompt_bucket=32)
    before = admit._cache_size(), segment._cache_size()
    for lens in ([5, 9, 2], [17, 30, 1], [32, 4, 4]):
        r = s.generate_ids([[7] * n for n in lens], SamplingConfig(5, 0.0), stop_ids=[[]] * 3)
        assert len(r.tokens) == 3
    assert s.compiled_shapes == {("admit", 3, 3, 32), ("segment", 3, 48, 16)}
    assert (admit._cache_size(), segment._cache_size()) == (before[0] + 1, before[1] + 1)
    s.generate_ids([[7] * 20, [7] * 3, [7] * 11], SamplingConfig(5, 0.0), stop_ids=[[]] * 3)  # same bucket
    assert (admit._cache_size(), segment._cache_size()) == (before[0] + 1, before[1] + 1)


def test_bad_requests_raise(tiny):
    ctx = TINY.max_position_embeddings
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        tiny.generate_ids([[5], []], SamplingConfig(4))
    with pytest.raises(ValueError, match=f"prompt of {ctx} tokens \\+ 1 new tokens exceeds the model context"):
        tiny.generate_ids([[5] * ctx], SamplingConfig(1))
    too_long = f"prompt of 100 tokens \\+ 29 new tokens exceeds the model context \\({ctx}\\)"
    with pytest.raises(ValueError, match=too_long):
        tiny.generate_ids([[5] * 100], SamplingConfig(29))
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"max_new_tokens must be > 0, got {bad}"):
            tiny.generate_ids([[5]], SamplingConfig(bad))
    with pytest.raises(ValueError, match=r"per-row max_new_tokens must be in \[1, 4\]"):
        tiny.generate_ids([[5], [6]], SamplingConfig(4), max_new_tokens=[2, 0])
    with pytest.raises(ValueError, match="no prompts"):
        tiny.generate_ids([], SamplingConfig(4))


@pytest.mark.parametrize("bias, tied", [(True, False), (False, True)])
def test_decode_params_give_the_same_logits_and_greedy_tokens(bias, tied):
    """The fused decode layout (one QKV dot, one gate/up dot, a [D, V] head) is the same model."""
    from jaxrl_mt.models.decoder import decode_params

    cfg = TINY.replace(attention_bias=bias, tie_word_embeddings=tied)
    params = numpy_params(cfg, 3, scale=0.2)
    fused = decode_params(params, cfg)
    layer0 = fused["layers"]
    assert "qkv" in layer0 and "q" not in layer0 and fused["lm_head"].shape == (32, 32)
    tokens, mask = left_pad(PROMPTS, 0)
    ref = np.asarray(_logits(params, cfg, tokens, mask))
    got = np.asarray(_logits(fused, cfg, tokens, mask))
    np.testing.assert_allclose(got, ref, atol=1e-5)
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.0)
    plain = Sampler(params, cfg, eos_ids=(), pad_id=0, fuse_weights=False).generate_ids(PROMPTS, sampling)
    fast = Sampler(params, cfg, eos_ids=(), pad_id=0, fuse_weights=True).generate_ids(PROMPTS, sampling)
    assert fast.tokens == plain.tokens
    np.testing.assert_allclose(np.concatenate(fast.logprobs), np.concatenate(plain.logprobs), atol=1e-5)


def test_sampler_decode_weights_are_made_once_per_parameter_version():
    """The fused weights are reused while params stay, remade when they change (never stale),
    and dropped on request."""
    params = numpy_params(TINY, 3, scale=0.2)
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.0)
    plain = Sampler(params, TINY, eos_ids=(), pad_id=0, fuse_weights=False)
    fast = Sampler(params, TINY, eos_ids=(), pad_id=0, fuse_weights=True)
    assert plain.decode_weights() is None
    first = fast.decode_weights()
    assert first is not None and fast.decode_weights() is first  # same params: reused
    fast.release_decode_weights()
    assert fast._fused._cache is None and fast.decode_weights() is not first  # released: remade on demand
    first = fast.decode_weights()
    new = jax.tree_util.tree_map(lambda x: x * 1.5, params)
    fast.params = plain.params = new
    assert fast.decode_weights() is not first  # new params: remade
    a, b = fast.generate_ids(PROMPTS, sampling), plain.generate_ids(PROMPTS, sampling)
    assert a.tokens == b.tokens
    np.testing.assert_allclose(np.concatenate(a.logprobs), np.concatenate(b.logprobs), atol=1e-5)
    old = Sampler(params, TINY, eos_ids=(), pad_id=0, fuse_weights=False).generate_ids(PROMPTS, sampling)
    assert a.tokens != old.tokens  # the new weights are really in use


def test_decode_compiler_options_choose_eigen_dots_from_jaxlib_0_10():
    from jaxrl_mt.sampling.kernels import decode_compiler_options

    off = {"xla_cpu_experimental_ynn_fusion_type": ""}
    assert decode_compiler_options("eigen", "0.10.2") == off
    assert decode_compiler_options("eigen", "0.11.0.dev20261101") == off
    assert decode_compiler_options("eigen", "1.0.0") == off
    assert decode_compiler_options("eigen", "0.9.9") == {}  # older jaxlibs: XLA's own choice
    assert decode_compiler_options("xla", "0.10.2") == {}
    with pytest.raises(ValueError, match="JAXRL_MT_DECODE_DOTS must be 'eigen' or 'xla', got 'ynn'"):
        decode_compiler_options("ynn", "0.10.2")


def test_decode_kernels_compile_with_their_options_and_other_jits_keep_xla_default():
    """The option reaches the decode kernel's compile: on jaxlib >= 0.10 (XLA:CPU, YNNPACK dots by
    default) the compiled sampler holds plain dots and no YNNPACK fusion, while the same model's
    forward under a plain jit (the scorer's and train step's path) still has YNNPACK fusions."""
    from jaxrl_mt.sampling.kernels import decode_compiler_options
    from jaxrl_mt.sampling.methods import Greedy, RowParams

    if not decode_compiler_options() or jax.default_backend() != "cpu":
        pytest.skip("the option applies to XLA:CPU from jaxlib 0.10 with JAXRL_MT_DECODE_DOTS=eigen")
    params = numpy_params(TINY, 3, scale=0.2)
    tokens, mask = left_pad(PROMPTS, 0)
    b = tokens.shape[0]
    rows = RowParams(jnp.zeros(b), jnp.zeros(b, jnp.int32), jnp.ones(b))
    sampler_hlo = generate_tokens.lower(params, TINY, tokens, mask, jax.random.PRNGKey(0), jnp.full((b, 1), -1),
                                        jnp.full((b,), 4), rows, max_new=4, method=Greedy()).compile().as_text()
    plain_hlo = jax.jit(lambda p: forward(p, TINY, tokens, positions_from_mask(mask), mask)[0]).lower(
        params).compile().as_text()
    assert "ynn_fusion" in plain_hlo
    assert "ynn_fusion" not in sampler_hlo and " dot(" in sampler_hlo
