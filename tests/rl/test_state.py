"""Train-state checkpoints: checkpoints written before the typed state (with its unused ``rng``)
still restore, through the loop's ``restore_state`` and evaluation's ``load_policy``."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.rl.state import TrainState, fresh_state, restore_state, save_state


class _Iter:
    """The data iterator's checkpointed position, nothing else."""

    def __init__(self, state=None):
        self.state = state

    def get_state(self):
        return self.state

    def set_state(self, state):
        self.state = state


def _legacy_save(directory, params, opt_state, step=3):
    """A checkpoint as the loop wrote it before the typed state: params, opt_state and rng."""
    ck = Checkpointer(directory)
    ck.save(step, {"params": params, "opt_state": opt_state, "rng": jax.random.PRNGKey(7)},
            {"step": step, "data_state": {"pos": 11}}, force=True)
    ck.close()


def test_a_checkpoint_with_the_retired_rng_restores_into_the_typed_state(tmp_path):
    opt = optax.adam(1e-3)
    params = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3)}
    _, opt_state = opt.update({"w": jnp.ones((2, 3))}, opt.init(params), params)
    _legacy_save(tmp_path / "ck", params, opt_state)
    like = fresh_state({"w": jnp.zeros((2, 3))}, opt)
    it = _Iter()
    ck = Checkpointer(tmp_path / "ck")
    state = restore_state(ck, like, it, log=print)
    ck.close()
    assert isinstance(state, TrainState) and state.step == 3 and it.state == {"pos": 11}
    np.testing.assert_array_equal(np.asarray(state.params["w"]), np.arange(6).reshape(2, 3))
    assert int(state.opt_state[0].count) == 1
    # and it saves again without the retired entry
    ck = Checkpointer(tmp_path / "ck")
    save_state(ck, TrainState(state.params, state.opt_state, 4), it)
    ck.close()
    ck = Checkpointer(tmp_path / "ck", read_only=True)
    assert "rng" not in ck._manager.item_metadata(4)["state"]
    ck.close()


def test_other_unexpected_entries_are_still_refused(tmp_path):
    ck = Checkpointer(tmp_path / "ck")
    ck.save(1, {"params": {"w": jnp.ones(2)}, "stray": jnp.ones(2)}, {"step": 1}, force=True)
    ck.close()
    ck = Checkpointer(tmp_path / "ck", read_only=True)
    with pytest.raises(ValueError, match=r"in checkpoint but not in target: \['stray'\]"):
        ck.restore(target={"params": {"w": jnp.ones(2)}}, retired=("rng",))
    ck.close()


def run_config_json(wd, model: str, rl: dict) -> dict:
    """A run's ``config.json`` in ``wd`` (rlsta's cpu preset with ``model`` and the ``rl`` values), as written."""
    from configs.rlsta import get_config
    from jaxrl_mt.rl.run_config import typed_config

    conf = typed_config(get_config("cpu")).to_dict()
    conf["model"] = model
    conf["rl"].update(rl)
    (wd / "config.json").write_text(json.dumps(conf))
    return conf


def test_load_policy_reads_a_legacy_workdir(tmp_path, tiny_chat_model_dir):
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.rl.optim import optimizer_from_config
    from jaxrl_mt.rl.policy_io import load_policy
    from jaxrl_mt.rl.run_config import typed_config

    rl = {"lr": 1e-5, "schedule": "constant", "warmup_steps": 0, "steps": 4, "weight_decay": 0.0,
          "max_grad_norm": 1.0, "grad_accum": 1}
    wd = tmp_path / "run"
    wd.mkdir()
    conf = run_config_json(wd, str(tiny_chat_model_dir), rl)
    base = load_model(str(tiny_chat_model_dir))
    params = jax.tree.map(lambda x: x + 1, base.params)
    opt = optimizer_from_config(typed_config(conf).rl)
    _legacy_save(wd / "checkpoints", params, opt.init(params))
    model = load_policy(wd)
    a, b = jax.tree.leaves(model.params)[0], jax.tree.leaves(params)[0]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert model.spec == f"workdir:{wd}"
