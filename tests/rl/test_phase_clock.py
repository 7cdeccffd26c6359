"""A training step's phase split (rl.metrics_log.PhaseClock): seconds, tokens/s, the update's MFU against
the dense peak, compile time and the one-line report."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.models.flops import lookup_peak
from jaxrl_mt.models.synthetic import ARCHITECTURES
from jaxrl_mt.rl.metrics_log import CountingScorer, PhaseClock, compile_seconds, format_phases, update_work

CFG = ARCHITECTURES["qwen2.5-1.5b"]


class FakeScorer:
    def __init__(self):
        self.calls = 0
        self.batch_size = 16

    def score(self, contexts, completions, pool="completion"):
        self.calls += 1
        return pool


def example(prompt_tokens: int, completion_tokens: int, *, rows: int = 8, ref: bool = True):
    """A rollout's example: one prompt (P = 64) for `rows` completions (C = 32)."""
    pm = np.zeros((1, 64), bool)
    pm[0, 64 - prompt_tokens:] = True
    cm = np.zeros((rows, 32), bool)
    cm.reshape(-1)[:completion_tokens] = True
    return types.SimpleNamespace(prompt_mask=pm, completion_mask=cm, ref_logp=np.zeros((rows, 32)) if ref else None)


def test_the_update_mfu_is_the_dense_peak_fraction_of_6n_plus_attention():
    h100 = lookup_peak("NVIDIA H100 80GB HBM3")
    assert h100.bf16_tflops == 989.5 and lookup_peak("NVIDIA H200").bf16_tflops == 989.5 and lookup_peak("cpu") is None
    clock = PhaseClock(CFG, peak=h100, devices=1)
    clock.start()
    m = clock.phases({"perf/score_s": 3.0}, example(50, 200), update_s=0.5, passes=2)
    d, L, f, k, v = 1536, 28, 8960, 128, CFG.vocab_size
    n = L * (d * (12 + 2 * 2) * k + 12 * k * d + 3 * d * f) + v * d  # the matrix-product parameters
    flops = 2 * 250 * (6 * n + 12 * L * 12 * k * 96)  # 2 passes x 250 real tokens at T = P + C = 96
    assert np.isclose(m["perf/update_tflops"], flops / 0.5 / 1e12)
    assert np.isclose(m["perf/update_mfu"], flops / 0.5 / 989.5e12)
    assert np.isclose(m["perf/update_tokens_per_s"], 2 * 250 / 0.5)
    # nothing went through the anchor's scorer: the whole scoring phase is the reference's
    assert m["perf/anchor_s"] == 0.0 and m["perf/anchor_tokens_per_s"] == 0.0 and m["perf/reference_s"] == 3.0
    assert np.isclose(m["perf/reference_tokens_per_s"], 250 / 3.0)
    line = format_phases(4, {**m, "perf/step_s": 9.0})
    assert line.startswith("step 4 phases: anchor 0.00 s (0 tok/s), reference 3.00 s (83 tok/s)") and "MFU 0.0" in line


def test_the_anchor_is_the_rewards_scorer_calls_and_cpu_has_no_peak():
    clock = PhaseClock(CFG)  # this backend's own peak and memory: the CPU has neither
    inner = FakeScorer()
    scorer = clock.count(inner)
    assert isinstance(scorer, CountingScorer) and scorer.batch_size == 16  # the rest is the scorer's
    clock.start()
    assert scorer.score([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], pool="all") == "all"
    rollout = {"perf/score_s": 10.0, "perf/rollout_s": 2.0, "perf/rollout_tokens_per_s": 40.0}
    m = clock.phases(rollout, example(10, 20, ref=False), update_s=1.0)
    assert inner.calls == 1 and 0 < m["perf/anchor_s"] < 1.0
    assert np.isclose(m["perf/reference_s"], 10.0 - m["perf/anchor_s"])
    assert np.isclose(m["perf/anchor_tokens_per_s"], 9 / m["perf/anchor_s"])
    assert "perf/reference_tokens_per_s" not in m  # no KL reference in the example (beta = 0)
    assert "perf/update_mfu" not in m and "perf/peak_memory_gib" not in m and m["perf/update_tflops"] > 0
    line = format_phases(1, {**rollout, **m})
    assert line.startswith("step 1 phases: rollout 2.00 s (40 tok/s), anchor ")
    assert "update 1.00 s (MFU n/a, 30 tok/s)" in line and line.endswith("peak memory n/a")


def test_compile_seconds_grow_only_while_compiling():
    before = compile_seconds()
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())
    f(jnp.ones(7)).block_until_ready()
    compiled = compile_seconds()
    f(jnp.ones(7)).block_until_ready()  # cached: nothing traced or compiled
    assert compiled > before and compile_seconds() == compiled


def test_update_work_of_each_batch_kind():
    assert update_work(example(50, 200)) == (250, 96)
    sft = types.SimpleNamespace(token_mask=np.ones((2, 40), bool))
    dpo = types.SimpleNamespace(prompt_mask=np.ones((2, 8), bool), chosen_mask=np.ones((2, 4), bool),
                                rejected_mask=np.zeros((2, 4), bool))
    assert update_work(sft) == (80, 40) and update_work(dpo) == (2 * 16 + 8, 12)
    assert update_work(types.SimpleNamespace()) is None
