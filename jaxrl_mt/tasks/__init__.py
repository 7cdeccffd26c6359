"""LiC tasks (math, code, database, actions) as plug-ins; see ``jaxrl_mt.tasks.base``.

Built in: ``code`` (:class:`jaxrl_mt.tasks.code.CodeTask`, runs candidate programs in
:mod:`jaxrl_mt.tasks.sandbox`), ``database`` (:class:`jaxrl_mt.tasks.database.DatabaseTask`,
test-suite execution accuracy in SQLite) and ``actions`` (:class:`jaxrl_mt.tasks.actions.ActionsTask`,
BFCL's AST rules), registered in ``TASKS`` (a ``jaxrl_mt.registry.Registry``) by
``jaxrl_mt.tasks.builtin`` on the first lookup; a plug-in registers with ``register_task``.
"""

import importlib
from typing import Any

from jaxrl_mt.tasks.base import TASKS, Task, Verdict, get_task, lic_extra, register_task, task_names

_CLASSES = {"ActionsTask": "jaxrl_mt.tasks.actions", "CodeTask": "jaxrl_mt.tasks.code",
            "DatabaseTask": "jaxrl_mt.tasks.database"}


def __getattr__(name: str) -> Any:
    """The task classes, imported when first named (importing the package imports no checker)."""
    if name in _CLASSES:
        return getattr(importlib.import_module(_CLASSES[name]), name)
    raise AttributeError(f"module 'jaxrl_mt.tasks' has no attribute {name!r}")


__all__ = ["TASKS", "ActionsTask", "CodeTask", "DatabaseTask", "Task", "Verdict", "get_task", "lic_extra",
           "register_task", "task_names"]
