"""The user side of a simulated LiC conversation: fixed order (default) or an LLM user simulator.

A conversation's planned user turns (``ConversationRun.user_turns``, built by
``jaxrl_mt.data.build_scenario``) are the *units* the user reveals, one per turn: for SHARDED
each unit is one shard; for RECAP / SNOWBALL / MT-Refine / AtR / AiwR a unit is a planned turn
(a recap, a snowball restatement, a correction).

- ``FixedOrderUser`` (``jaxrl_mt.conversations``) reveals them verbatim, in order.
- ``LLMUserSimulator`` asks a chat backend (the local model or an OpenAI-compatible endpoint) to
  write each user message following the LiC rules: at most one unit per turn, rephrased, never
  answering for the assistant. The first turn is the first unit verbatim (the high-level intent
  opens every LiC conversation). In SHARDED conversations the simulator picks which unrevealed
  shard comes next; in the other kinds the order of the plan is kept (a correction must follow
  the shard it corrects) and the simulator only rephrases the next unit.

Every simulated message is checked (:func:`check_user_turn`): it must name (or, failing that,
its numbers must identify) exactly one unrevealed unit, carry exactly that unit's numbers (no
new number, none dropped), not leak the gold answer, and not state an answer itself. A message
that fails is replaced by the verbatim unit and counted in ``stats`` under the failure reason.
All conversations of a turn are simulated with ONE ``backend.chat`` call.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_mt.conversations import ConversationRun, FixedOrderUser, UserPolicy
from jaxrl_mt.data.numbers import number_set
from jaxrl_mt.rewards.verifier import extract_marked_answer

__all__ = [
    "CHECK_REASONS",
    "FREE_ORDER_KINDS",
    "LLMUserSimulator",
    "USER_SIM_PROMPT",
    "check_user_turn",
    "make_user",
    "parse_sim_reply",
]

FREE_ORDER_KINDS = ("sharded",)  # kinds where the simulator chooses which shard comes next
MAX_ASSISTANT_CHARS = 800  # an assistant reply is cut to this many characters in the sim prompt
CHECK_REASONS = ("ok", "empty", "unknown_shard", "answer_leak", "new_numbers", "missing_numbers",
                 "answers_for_assistant")

USER_SIM_PROMPT = """\
You are role-playing a user who chats with an AI assistant to get help with a task. You know the \
whole task, but it has been split into shards (small pieces of information), and you reveal it \
gradually. Follow these rules:
1. Reveal at most one shard per message: exactly one of the shards listed as available now. Do \
not reveal, hint at or repeat any other shard.
2. Rephrase the shard in your own words, casually, as a user would type it. Keep every number of \
the shard exactly as written and add no other number.
3. You are the user: never solve the task, never give or suggest the answer, never answer on \
behalf of the assistant. If the assistant asked something, answer only with the shard you reveal.
4. Keep the message short: one or two sentences.
Reply in exactly this format:
SHARD: <id of the shard you reveal>
MESSAGE: <your message to the assistant>"""

_USER_TEMPLATE = """\
The whole task (for your understanding only; never reveal it at once):
<task>
{task}
</task>

The conversation so far:
{history}

Shards available now:
{candidates}

Write your next message."""

_SHARD_RE = re.compile(r"\bshard\s*(?:id)?\s*[:#=]?\s*\[?\s*(\d+)\s*\]?", re.IGNORECASE)
_MESSAGE_RE = re.compile(r"\bmessage\s*:\s*(.*)", re.IGNORECASE | re.DOTALL)


def parse_sim_reply(reply: str) -> tuple[int | None, str]:
    """Reads ``SHARD: <id>`` and ``MESSAGE: <text>`` from a simulator reply.

    Args:
      reply: the backend's text.

    Returns:
      ``(shard id or None, message)``; without a ``MESSAGE:`` marker the message is the reply
      with its ``SHARD:`` line removed.
    """
    m = _SHARD_RE.search(reply)
    unit = int(m.group(1)) if m else None
    mm = _MESSAGE_RE.search(reply)
    if mm:
        message = mm.group(1)
    else:
        message = "\n".join(line for line in reply.splitlines() if not _SHARD_RE.match(line.strip()))
    return unit, message.strip().strip('"').strip()


def check_user_turn(message: str, unit: int | None, candidates: Mapping[int, str],
                    gold: str) -> tuple[str, int | None]:
    """Checks one simulated user message against the LiC rules.

    Args:
      message: the simulated message.
      unit: the shard id the simulator says it reveals (None if it named none).
      candidates: the units that may be revealed now, id -> verbatim text.
      gold: the gold answer of the task.

    Returns:
      ``(reason, unit)``: reason ``"ok"`` or the first failed check (see ``CHECK_REASONS``), and
      the unit it reveals (None when it cannot be identified). A named unit that is not a
      candidate, or no name, is resolved from the numbers: the single candidate whose numbers
      equal the message's.
    """
    if not message.strip():
        return "empty", None
    nums = number_set(message)
    if unit not in candidates:
        matches = [u for u, text in candidates.items() if number_set(text) == nums]
        if len(matches) != 1:
            return "unknown_shard", None
        unit = matches[0]
    expected = number_set(candidates[unit])
    gold_nums = number_set(gold)
    if gold_nums and gold_nums <= nums and not gold_nums <= expected:
        return "answer_leak", unit
    if nums - expected:
        return "new_numbers", unit
    if expected - nums:
        return "missing_numbers", unit
    if extract_marked_answer(message) is not None:
        return "answers_for_assistant", unit
    return "ok", unit


def _history(run: ConversationRun) -> str:
    if not run.turns:
        return "(nothing yet)"
    lines = []
    for t in run.turns:
        reply = t.assistant if len(t.assistant) <= MAX_ASSISTANT_CHARS else t.assistant[:MAX_ASSISTANT_CHARS] + " [...]"
        lines += [f"USER: {t.user}", f"ASSISTANT: {reply}"]
    return "\n".join(lines)


class LLMUserSimulator:
    """A ``UserPolicy`` whose messages are written by a chat backend, then checked.

    State per conversation lives in ``run.meta["user_sim"]``: one dict per turn with ``unit``
    (0-based index into ``user_turns``), ``reason`` (the check's verdict, ``"first_turn"`` for
    the verbatim opening) and ``fallback`` (the verbatim unit was used).
    """

    def __init__(self, backend: Any, *, max_new_tokens: int = 128, temperature: float = 0.0,
                 free_order_kinds: Sequence[str] = FREE_ORDER_KINDS):
        """Args:
          backend: a ``jaxrl_mt.backends.ChatBackend``.
          max_new_tokens: the simulator's reply budget.
          temperature: the simulator's sampling temperature.
          free_order_kinds: scenario kinds (``run.meta["kind"]``) where any unrevealed unit may
            come next; elsewhere only the next planned one.
        """
        self.backend = backend
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.free_order_kinds = tuple(free_order_kinds)
        self.stats: Counter = Counter()  # check reasons, "calls", "simulated"

    def _candidates(self, run: ConversationRun) -> dict[int, str]:
        revealed = {s["unit"] for s in run.meta.get("user_sim", [])}
        left = [i for i in range(len(run.user_turns)) if i not in revealed]
        if run.meta.get("kind") not in self.free_order_kinds:
            left = left[:1]
        return {i: run.user_turns[i] for i in left}

    def next_user_turns(self, runs: Sequence[ConversationRun]) -> list[str | None]:
        """The next user message of each run (None when every unit has been revealed)."""
        out: list[str | None] = [None] * len(runs)
        asks: list[tuple[int, dict[int, str]]] = []
        for j, run in enumerate(runs):
            log = run.meta.setdefault("user_sim", [])
            cands = self._candidates(run)
            if not cands:
                continue
            if not run.turns:  # the opening turn is the first unit, verbatim
                first = min(cands)
                log.append({"unit": first, "reason": "first_turn", "fallback": False})
                out[j] = run.user_turns[first]
            else:
                asks.append((j, cands))
        if not asks:
            return out
        conversations = []
        for j, cands in asks:
            run = runs[j]
            listing = "\n".join(f"[{i + 1}] {text}" for i, text in cands.items())
            prompt = _USER_TEMPLATE.format(task=run.meta.get("question", "\n".join(run.user_turns)),
                                           history=_history(run), candidates=listing)
            conversations.append([{"role": "system", "content": USER_SIM_PROMPT},
                                  {"role": "user", "content": prompt}])
        replies = self.backend.chat(conversations, max_new_tokens=self.max_new_tokens,
                                    temperature=self.temperature)
        self.stats["calls"] += 1
        if len(replies) != len(asks):
            raise ValueError(f"user simulator: backend gave {len(replies)} replies for {len(asks)} conversations")
        for (j, cands), reply in zip(asks, replies):
            run = runs[j]
            shard_id, message = parse_sim_reply(reply)
            unit_id = None if shard_id is None else shard_id - 1
            reason, unit = check_user_turn(message, unit_id, cands, str(run.meta.get("answer", "")))
            self.stats["simulated"] += 1
            self.stats[reason] += 1
            if reason == "ok":
                out[j] = message
            else:
                unit = min(cands)
                out[j] = cands[unit]
            run.meta["user_sim"].append({"unit": unit, "reason": reason, "fallback": reason != "ok",
                                         "raw": reply})
        return out

    def summary(self) -> dict[str, int]:
        """Counts: backend calls, simulated turns, fallbacks, and turns per check reason."""
        out = {k: int(v) for k, v in sorted(self.stats.items())}
        out["fallback"] = sum(int(v) for k, v in self.stats.items() if k in CHECK_REASONS and k != "ok")
        return out


def make_user(spec: str, *, model: Any = None, max_new_tokens: int = 128,
              temperature: float = 0.0, **backend_kw: Any) -> UserPolicy:
    """The user policy named by a config value.

    Args:
      spec: ``"fixed"`` (verbatim, planned order) or a backend spec for ``make_backend``
        (``"local"``, ``"local:MODEL"``, ``"http:URL#MODEL"``).
      model: an already loaded registry Model; ``"local"`` (or ``"local:"`` + that model's
        spec) reuses it instead of loading a second copy.
      max_new_tokens, temperature: the simulator's sampling settings.

    Raises:
      ValueError: an unknown spec.
    """
    if spec == "fixed":
        return FixedOrderUser()
    return LLMUserSimulator(backend_for(spec, model=model, role="user simulator", **backend_kw),
                            max_new_tokens=max_new_tokens, temperature=temperature)


def backend_for(spec: str, *, model: Any = None, role: str = "", **kw: Any) -> Any:
    """``make_backend(spec)``, reusing ``model`` for ``local`` / ``local:<its spec>``; an ``http:`` endpoint
    names ``role`` (``judge``, ``user simulator``) in its error lines."""
    from jaxrl_mt.backends import make_backend

    if spec.startswith("http:") and role:
        kw["role"] = role

    if model is not None and spec in ("local", f"local:{getattr(model, 'spec', None)}"):
        from jaxrl_mt.local_backend import backend_from_model

        return backend_from_model(model, **kw)
    return make_backend(spec, **kw)
