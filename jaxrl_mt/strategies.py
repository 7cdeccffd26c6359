"""Conversation strategies by name: how a batch of conversations is answered.

A strategy has the signature of ``jaxrl_mt.conversations.run_conversations`` (``fn(sampler,
runs, sampling, *, seed, user, on_turn, progress[, reuse_cache]) -> runs``) and advances the runs
like it: one batched sampler call per turn, ``on_turn`` after each turn with the runs that got a
reply. ``"plain"`` is ``run_conversations`` itself; a method registers its own with
``STRATEGIES.register(name)`` (``jaxrl_mt.sedt.final_turn`` registers ``"sedt"``, a built-in
imported on the first lookup), and the evaluator (``jaxrl_mt.eval.simulator``) looks strategies
up here by its config field ``strategy``.

This is a leaf of the engine: the methods that register and the evaluator that looks up both
import it, and it imports neither (built-ins are imported by name, lazily).
"""

from __future__ import annotations

from collections.abc import Callable

from jaxrl_mt.conversations import ConversationRun, accepts_reuse_cache, run_conversations
from jaxrl_mt.registry import Registry

__all__ = ["STRATEGIES", "Strategy", "accepts_reuse_cache"]

Strategy = Callable[..., list[ConversationRun]]
STRATEGIES: Registry[Strategy] = Registry("strategy", builtins=("jaxrl_mt.sedt.final_turn",))
STRATEGIES.add("plain", run_conversations)
