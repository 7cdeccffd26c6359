"""Task and scenario files: one checked JSON object per line (the project's own formats)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from jaxrl_mt.data.fields import read_jsonl
from jaxrl_mt.data.records import Scenario, ShardedTask

__all__ = ["load_scenarios_jsonl", "load_tasks_jsonl", "save_scenarios_jsonl", "save_tasks_jsonl"]


def _write_jsonl(path, records: Iterable[ShardedTask | Scenario]) -> None:
    """Writes each record's ``to_json()``, one JSON object per line, creating the folder."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")


def save_tasks_jsonl(path, tasks: Iterable[ShardedTask]) -> None:
    """Writes tasks, one JSON object per line (:meth:`ShardedTask.to_json`)."""
    _write_jsonl(path, tasks)


def load_tasks_jsonl(path) -> list[ShardedTask]:
    """Reads tasks written by :func:`save_tasks_jsonl`, checking every field."""
    return [ShardedTask.from_json(d, where=where) for where, _, d in read_jsonl(path)]


def save_scenarios_jsonl(path, scenarios: Iterable[Scenario]) -> None:
    """Writes scenarios, one JSON object per line (:meth:`Scenario.to_json`)."""
    _write_jsonl(path, scenarios)


def load_scenarios_jsonl(path) -> list[Scenario]:
    """Reads scenarios written by :func:`save_scenarios_jsonl`, checking every field."""
    return [Scenario.from_json(d, where=where) for where, _, d in read_jsonl(path)]
