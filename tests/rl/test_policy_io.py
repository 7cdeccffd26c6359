"""``load_policy``: a workdir's exported policy is its kept best checkpoint when the run keeps one
(SFT), else its latest; an explicit step reads that training checkpoint."""

from __future__ import annotations

import jax
import numpy as np

from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.rl.best import BestKeeper, kept_params
from jaxrl_mt.rl.optim import optimizer_from_config
from jaxrl_mt.rl.policy_io import load_policy
from jaxrl_mt.rl.run_config import typed_config
from tests.rl.test_state import run_config_json

RL = {"lr": 1e-5, "schedule": "constant", "warmup_steps": 0, "steps": 4, "weight_decay": 0.0,
      "max_grad_norm": 1.0, "grad_accum": 1}


def _first_leaf(params) -> np.ndarray:
    return np.asarray(jax.tree.leaves(params)[0])


def test_the_kept_best_is_the_policy_and_a_step_reads_its_checkpoint(tmp_path, tiny_chat_model_dir, tiny_model):
    wd = tmp_path / "run"
    wd.mkdir()
    conf = run_config_json(wd, str(tiny_chat_model_dir), RL)
    at_step = {s: jax.tree.map(lambda x, s=s: x + s, tiny_model.params) for s in (2, 4)}
    ck, opt = Checkpointer(wd / "checkpoints"), optimizer_from_config(typed_config(conf).rl)
    for s in (2, 4):
        ck.save(s, {"params": at_step[s], "opt_state": opt.init(at_step[s])}, {"step": s}, force=True)
    ck.close()
    assert kept_params(wd, tiny_model.params) is None
    np.testing.assert_array_equal(_first_leaf(load_policy(wd).params), _first_leaf(at_step[4]))  # no best: latest

    keeper = BestKeeper(wd, "eval/val_loss", "min", log=lambda _: None)
    assert keeper.offer(2, at_step[2], {"eval/val_loss": 0.5})
    assert not keeper.offer(4, at_step[4], {"eval/val_loss": 0.7})  # worse: step 2 stays the best
    np.testing.assert_array_equal(_first_leaf(kept_params(wd, tiny_model.params)), _first_leaf(at_step[2]))
    np.testing.assert_array_equal(_first_leaf(load_policy(wd).params), _first_leaf(at_step[2]))
    np.testing.assert_array_equal(_first_leaf(load_policy(wd, step=4).params), _first_leaf(at_step[4]))
