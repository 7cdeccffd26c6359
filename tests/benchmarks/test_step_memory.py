"""`memory_table --measured --step` (`benchmarks.step_memory`): the sizes are paper_shapes', the programs
are the trainer's, and the step's peak is the arithmetic the module documents over compiled analyses."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from configs.rlsta import get_config
from jaxrl_mt.benchmarks import step_memory as sm

SMALL = sm.StepShape(prompt_len=64, anchor_len=64, new_tokens=16)


def test_the_default_sizes_are_paper_shapes():
    c = get_config("paper_shapes")
    s = sm.StepShape()
    assert (s.batch_size, s.group, s.new_tokens, s.max_batch, s.grad_accum, s.beta, s.loss_type) == (
        c.rl.batch_size, c.rl.group_size, c.rl.max_new_tokens, c.rl.max_batch, c.rl.grad_accum, c.rl.beta,
        c.rl.loss_type)
    from jaxrl_mt.sampling.engine import DecodeEngine

    assert s.segment_steps == DecodeEngine.segment_steps and s.anchor_rows == min(16, c.rl.batch_size * c.rl.group_size)
    assert (s.prompt_len, s.anchor_len) == (8192, 8192)


def _tree_bytes(tree) -> int:
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree))


def test_one_device_record_is_the_documented_arithmetic():
    progs = ("rollout_admit", "rollout_segment", "anchor", "reference")
    rec = sm.measure("tiny", 1, SMALL, programs=progs)
    from jaxrl_mt.models.synthetic import synthetic_shapes
    from jaxrl_mt.rl.optim import make_optimizer

    shapes = synthetic_shapes(sm.model_config("tiny"))
    opt = jax.eval_shape(make_optimizer(3e-7, grad_accum_steps=SMALL.grad_accum).init, shapes)
    assert rec["resident"] == {"policy": _tree_bytes(shapes), "reference": _tree_bytes(shapes),
                               "optimizer": _tree_bytes(opt)}
    assert rec["resident"]["optimizer"] > 3 * rec["resident"]["policy"]  # mu, nu, MultiSteps' accumulator (bf16)
    assert list(rec["programs"]) == list(progs) and rec["backend"] == "cpu"
    for name, p in rec["programs"].items():
        assert p["peak"] == p["argument"] + p["output"] - p["alias"] + p["temp"] and p["temp"] > 0
        assert p["step"] == p["peak"] + sum(rec["resident"][r] for r in sm.RESIDENT_OUTSIDE[name])
    assert rec["programs"]["rollout_segment"]["alias"] > 0  # the slot state is donated
    assert rec["programs"]["rollout_segment"]["argument"] >= rec["rollout_buffers"] + rec["resident"]["policy"]
    assert rec["step_peak"] == max(p["step"] for p in rec["programs"].values())
    assert rec["programs"][rec["step_peak_program"]]["step"] == rec["step_peak"]
    row = sm.format_step([rec]).splitlines()[2]
    assert row.startswith("| tiny | 1 (one device) | 1 x 8 | ") and f"**{rec['step_peak'] / 2**30:.2f}**" in row


@pytest.mark.slow  # two fresh processes, the train step compiled on 1 and 8 host devices (~1-2 min)
def test_fsdp8_divides_the_state_and_the_update_donates():
    one = sm.run_subprocess("tiny", 1, SMALL, "dots", ["update"])
    eight = sm.run_subprocess("tiny", 8, SMALL, "dots", ["update"])
    assert eight["devices"] == 8 and eight["resident"]["policy"] < one["resident"]["policy"] / 4
    assert eight["resident"]["optimizer"] < one["resident"]["optimizer"] / 4
    upd = one["programs"]["update"]
    assert upd["alias"] >= one["resident"]["policy"] + one["resident"]["optimizer"] - 64  # params + opt donated
    assert one["step_peak_program"] == "update" and dataclasses.asdict(SMALL) == one["shape"]
