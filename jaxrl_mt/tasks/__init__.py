"""LiC tasks (math, code, database, actions) as plug-ins; see ``jaxrl_mt.tasks.base``."""

from jaxrl_mt.tasks.base import Task, Verdict, get_task, lic_extra, register_task, task_names

__all__ = ["Task", "Verdict", "get_task", "lic_extra", "register_task", "task_names"]
