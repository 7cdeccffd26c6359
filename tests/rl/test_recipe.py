"""The recipe interface (``rl.recipe``): every method is a ``Recipe``, the optional hooks are no-ops by
default, and nothing in ``rl/`` discovers a recipe's hooks with ``hasattr`` / ``getattr``."""

from __future__ import annotations

import ast
from pathlib import Path

import jax.numpy as jnp
import optax
import pytest

from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.rl.recipe import METHODS, Recipe, SupervisedRecipe, is_supervised
from jaxrl_mt.rl.state import TrainState, fresh_state, restore_state, save_state

RL = Path(__file__).resolve().parents[2] / "jaxrl_mt" / "rl"
HOOKS = {"load", "prepare", "evaluate", "step_items", "observe", "state_json", "set_state", "select", "batch",
         "loss", "objective"}


class _Minimal(Recipe):
    def load(self, c):
        return [], []

    def prepare(self, env, train, held):
        return list(train), list(held)

    def evaluate(self, env, params, held):
        return {}


class _Stateful(_Minimal):
    def __init__(self):
        self.state = {"n": 3}

    def state_json(self):
        return dict(self.state)

    def set_state(self, state):
        self.state = state


class _Iter:
    def __init__(self):
        self.state = {"pos": 1}

    def get_state(self):
        return self.state

    def set_state(self, state):
        self.state = state


def test_every_method_is_a_recipe_with_every_hook():
    for name in METHODS.names():
        cls = METHODS.get(name)
        assert issubclass(cls, Recipe), name
        recipe = cls()  # concrete: no abstract hook left
        assert is_supervised(name) == isinstance(recipe, SupervisedRecipe)
    assert {n for n in METHODS.names() if is_supervised(n)} == {"sft", "dpo"}
    assert not is_supervised("no-such-method")
    assert METHODS.get("sft").select == METHODS.get("dpo").select == ("eval/val_loss", "min")
    assert METHODS.get("rlsta").select is None


def test_the_optional_hooks_are_no_ops_by_default():
    r = _Minimal()
    items = ["a", "b"]
    got, m = r.step_items(None, items, 7)
    assert got is items and m == {}
    assert r.observe({"reward/total": 1.0}) is None
    assert r.state_json() is None
    r.set_state({"x": 1})  # ignored
    assert r.select is None
    with pytest.raises(TypeError):
        Recipe()  # the required hooks are abstract


def test_a_recipe_state_goes_into_the_checkpoint_only_when_it_has_one(tmp_path):
    params = {"w": jnp.ones((2,))}
    opt = optax.sgd(0.1)
    state = fresh_state(params, opt)
    for name, recipe in (("none", _Minimal()), ("some", _Stateful())):
        ck = Checkpointer(tmp_path / name)
        save_state(ck, TrainState(state.params, state.opt_state, 1), _Iter(), recipe)
        ck.wait()
        ck.close()
        ck = Checkpointer(tmp_path / name)
        back = _Stateful()
        back.state = None
        restore_state(ck, state, _Iter(), log=print, recipe=back)
        ck.close()
        assert back.state == (None if name == "none" else {"n": 3})


def test_no_hook_of_a_recipe_is_discovered_by_name():
    """The loop calls every hook; ``hasattr(x, "observe")`` or ``getattr(x, "select", None)`` is not needed."""
    bad = []
    for path in sorted(RL.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in HOOKS):
                bad.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "\n".join(bad)
