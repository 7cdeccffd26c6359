"""LiC tasks (math, code, database, actions) as plug-ins; see ``jaxrl_mt.tasks.base``."""

from jaxrl_mt.tasks.base import Task, Verdict, get_task, lic_extra, register_task, task_names
from jaxrl_mt.tasks.actions import ActionsTask
from jaxrl_mt.tasks.database import DatabaseTask

register_task(DatabaseTask())
register_task(ActionsTask())

__all__ = ["ActionsTask", "DatabaseTask", "Task", "Verdict", "get_task", "lic_extra", "register_task", "task_names"]
