"""The built-in LiC tasks, registered in `jaxrl_mt.tasks.base.TASKS` (imported by it on first use)."""

from jaxrl_mt.tasks.actions import ActionsTask
from jaxrl_mt.tasks.base import register_task
from jaxrl_mt.tasks.code import CodeTask
from jaxrl_mt.tasks.database import DatabaseTask

for _task in (CodeTask(), DatabaseTask(), ActionsTask()):
    register_task(_task)
