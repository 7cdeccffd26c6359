"""LiC tasks (math, code, database, actions) as plug-ins; see ``jaxrl_mt.tasks.base``.

Built in: ``code`` (:class:`jaxrl_mt.tasks.code.CodeTask`, runs candidate programs in
:mod:`jaxrl_mt.tasks.sandbox`), ``database`` (:class:`jaxrl_mt.tasks.database.DatabaseTask`,
test-suite execution accuracy in SQLite) and ``actions`` (:class:`jaxrl_mt.tasks.actions.ActionsTask`,
BFCL's AST rules), registered in ``TASKS`` (a ``jaxrl_mt.registry.Registry``) by
``jaxrl_mt.tasks.builtin`` on the first lookup; a plug-in registers with ``register_task``.
"""

from jaxrl_mt.tasks.actions import ActionsTask
from jaxrl_mt.tasks.base import TASKS, Task, Verdict, get_task, lic_extra, register_task, task_names
from jaxrl_mt.tasks.code import CodeTask
from jaxrl_mt.tasks.database import DatabaseTask

__all__ = ["TASKS", "ActionsTask", "CodeTask", "DatabaseTask", "Task", "Verdict", "get_task", "lic_extra",
           "register_task", "task_names"]
