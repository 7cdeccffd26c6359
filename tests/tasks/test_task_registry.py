"""The LiC task registry: one `Registry`, built-ins loaded on the first lookup."""

import subprocess
import sys

import pytest

from jaxrl_mt.tasks import TASKS, ActionsTask, Task, get_task, register_task


def test_builtins_are_loaded_on_first_lookup_not_on_import():
    """Importing the registry's module imports no checker; the first lookup loads all three."""
    code = ("import sys; from jaxrl_mt.tasks.base import TASKS; "
            "before = 'jaxrl_mt.tasks.code' in sys.modules; names = TASKS.names(); "
            "print(before, names, 'jaxrl_mt.tasks.code' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[0] == "False ('actions', 'code', 'database') True"


def test_lookup_error_lists_known_names_and_plugins_register():
    assert isinstance(get_task("actions"), ActionsTask) and TASKS.get("actions") is get_task("actions")
    with pytest.raises(KeyError, match=r"unknown LiC task 'poetry'; known: actions, code, database"):
        get_task("poetry")

    class Poetry:
        name, system_prompt = "poetry_test", ""

        def extract(self, reply, task):
            return reply

        def verify(self, reply, task):
            raise NotImplementedError

        def is_answer_attempt(self, reply, task):
            return True

    assert isinstance(Poetry(), Task)
    p = register_task(Poetry())
    assert get_task("poetry_test") is p and "poetry_test" in TASKS
    with pytest.raises(TypeError, match="does not implement"):
        register_task(object())
