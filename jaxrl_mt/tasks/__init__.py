"""LiC tasks (math, code, database, actions) as plug-ins; see ``jaxrl_mt.tasks.base``.

Built in: ``code`` (:class:`jaxrl_mt.tasks.code.CodeTask`, runs candidate programs in
:mod:`jaxrl_mt.tasks.sandbox`).
"""

from jaxrl_mt.tasks.base import Task, Verdict, get_task, lic_extra, register_task, task_names
from jaxrl_mt.tasks.code import CodeTask

register_task(CodeTask())

__all__ = ["CodeTask", "Task", "Verdict", "get_task", "lic_extra", "register_task", "task_names"]
