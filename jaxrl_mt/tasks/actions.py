"""LiC's actions task (BFCL function calling): prompt with the tool specs, call extraction, AST check.

The record (loaded by ``load_lic(..., task="actions")``) carries in ``lic_extra`` the tool specs
(``function``, BFCL format), ``reference_answer`` (BFCL possible answers) and ``test_category``
(simple, multiple, parallel, parallel_multiple). A reply is scored with BFCL's AST checker
rules (:mod:`jaxrl_mt.tasks.bfcl_check`); the calls may be written in Python call syntax or
JSON (:mod:`jaxrl_mt.tasks.calls`).

Verdict statuses: ``correct``, ``wrong`` (the reason names what failed: wrong function, missing
required argument, unexpected argument, wrong type, wrong value, wrong number of calls),
``no_answer`` (no parseable call), ``unparsable`` (a reply over ``MAX_REPLY_CHARS``; no answer
attempt either).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from jaxrl_mt.data.records import ShardedTask
from jaxrl_mt.tasks.base import MAX_REPLY_CHARS, Verdict, lic_extra, oversized
from jaxrl_mt.tasks.bfcl_check import check_calls
from jaxrl_mt.tasks.calls import Call, calls_to_json, find_calls

__all__ = ["ACTIONS_SYSTEM_PROMPT", "ActionsTask", "reference_calls", "render_functions"]

ACTIONS_SYSTEM_PROMPT = (
    "You are an assistant that acts by calling functions. The functions you may call are "
    "described below (JSON specs: name, description, parameters, required parameters). Talk "
    "with the user until you know what to do. When you act, reply with the function call(s) "
    "only, written in Python call syntax as a list, with keyword arguments and literal values: "
    "[function_name(param1=value1, param2=value2), other_function(param=value)]. Make one call "
    "per action the request needs; leave out optional parameters the user did not ask for."
)


def render_functions(functions: Sequence[Mapping]) -> str:
    """The tool specs as the prompt shows them: one JSON object per function, in record order."""
    return "\n".join(json.dumps(f, ensure_ascii=False, indent=2) for f in functions)


def reference_calls(reference: Sequence[Mapping]) -> list[Call]:
    """One concrete call per reference entry: the first accepted value of each parameter, and
    optional parameters (``""`` accepted) left out when ``""`` comes first."""
    out = []
    for entry in reference:
        name, params = next(iter(entry.items()))
        args = {k: vals[0] for k, vals in params.items() if vals and vals[0] != ""}
        out.append(Call(name, args))
    return out


class ActionsTask:
    """LiC's actions task (see module doc)."""

    name = "actions"
    system_prompt = ACTIONS_SYSTEM_PROMPT

    @staticmethod
    def _extra(task: ShardedTask) -> tuple[list, list, str]:
        extra = lic_extra(task)
        functions, reference = extra.get("function"), extra.get("reference_answer")
        if not isinstance(functions, list) or not isinstance(reference, list):
            raise ValueError(f"task {task.task_id}: actions task needs 'function' and 'reference_answer' in lic_extra")
        return functions, reference, str(extra.get("test_category", "simple"))

    def system_prompt_for(self, task: ShardedTask) -> str:
        """The system prompt followed by this task's function specs (LiC puts them in the prompt)."""
        functions, _, _ = self._extra(task)
        return f"{self.system_prompt}\n\nAvailable functions:\n{render_functions(functions)}"

    def full_prompt_for(self, task: ShardedTask) -> str:
        """The single-turn user prompt: the fully specified question (the specs are in the system prompt)."""
        return task.full_prompt

    @staticmethod
    def _order(functions: Sequence[Mapping]) -> dict[str, list[str]]:
        return {
            f["name"]: list((f.get("parameters") or {}).get("properties", {}) or {})
            for f in functions if isinstance(f, Mapping) and isinstance(f.get("name"), str)
        }

    def calls(self, reply: str, task: ShardedTask) -> list[Call] | None:
        """The function calls of ``reply`` (positional arguments mapped with the task's specs)."""
        functions, _, _ = self._extra(task)
        if isinstance(reply, str) and len(reply) > MAX_REPLY_CHARS:
            return None
        return find_calls(reply, self._order(functions))

    def extract(self, reply: str, task: ShardedTask) -> str | None:
        """The calls of ``reply`` as canonical JSON (``[{"name", "arguments"}]``), or None."""
        calls = self.calls(reply, task)
        return calls_to_json(calls) if calls else None

    def is_answer_attempt(self, reply: str, task: ShardedTask) -> bool:
        """Whether ``reply`` holds a call to one of the task's functions, or any call with arguments."""
        calls = self.calls(reply, task) or []
        names = set(self._order(self._extra(task)[0]))
        known = names | {n.replace(".", "_") for n in names}
        return any(c.name in known or c.arguments for c in calls)

    def verify(self, reply: str, task: ShardedTask) -> Verdict:
        """Scores the calls of ``reply`` against the possible answers (BFCL AST rules)."""
        functions, reference, category = self._extra(task)
        too_long = oversized(reply)
        if too_long is not None:
            return too_long
        calls = find_calls(reply, self._order(functions))
        if not calls:
            return Verdict(0.0, None, "no_answer", "no function call in the reply")
        text = calls_to_json(calls)
        why = check_calls(calls, reference, functions, category)
        if why is None:
            return Verdict(1.0, text, "correct", f"{len(calls)} call(s) match the reference ({category})")
        return Verdict(0.0, text, "wrong", why)
