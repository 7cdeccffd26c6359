"""Conversation strategies by name: how a batch of conversations is answered.

A strategy has the signature of ``jaxrl_mt.conversations.run_conversations`` (``fn(sampler,
runs, sampling, *, seed, user, on_turn, progress[, reuse_cache]) -> runs``) and advances the runs
like it: one batched sampler call per turn, ``on_turn`` after each turn with the runs that got a
reply. ``"plain"`` is ``run_conversations`` itself; a method registers its own here when it is
imported (``jaxrl_mt.sedt`` registers ``"sedt"``), and the evaluator (``jaxrl_mt.eval.simulator``)
looks strategies up here by its config field ``strategy``.

This is a leaf of the engine: the methods that register and the evaluator that looks up both
import it, and it imports neither, so neither imports the other through it.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxrl_mt.conversations import ConversationRun, accepts_reuse_cache, run_conversations

__all__ = ["Strategy", "accepts_reuse_cache", "get_strategy", "register_strategy", "strategy_names"]

Strategy = Callable[..., list[ConversationRun]]
_STRATEGIES: dict[str, Strategy] = {"plain": run_conversations}


def register_strategy(name: str, fn: Strategy) -> None:
    """Registers ``fn`` as the strategy ``name`` (a later registration of the name replaces it)."""
    if not callable(fn):
        raise TypeError(f"register_strategy({name!r}): {fn!r} is not callable")
    _STRATEGIES[name] = fn


def get_strategy(name: str) -> Strategy:
    """The strategy registered as ``name``.

    Raises:
      KeyError: an unknown name; the message lists the registered ones.
    """
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r}; registered: {', '.join(strategy_names())}") from None


def strategy_names() -> tuple[str, ...]:
    """Names of the registered strategies, sorted."""
    return tuple(sorted(_STRATEGIES))
