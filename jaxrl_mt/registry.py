"""One registry class for every kind of plug-in: rewards, tasks, strategies, recipes, methods.

A registry maps names to objects (usually builders). Plug-ins register with a decorator; the
built-ins live in modules named when the registry is made and are imported on first use, so
nothing depends on a side-effect import having happened first::

    REWARDS = Registry("reward", builtins=("jaxrl_mt.rewards.rlsta", "jaxrl_mt.rewards.icpo"))

    @REWARDS.register("rlsta")
    def build_rlsta(env): ...

    fn = REWARDS.get("rlsta")(env)     # KeyError listing the known names for a typo

This module is a foundation: it imports nothing of the package (built-in modules are imported by
name, lazily).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Named plug-ins of one kind.

    Args:
      kind: what the entries are, for messages ("reward", "task", ...).
      builtins: dotted module names whose import registers the built-in entries; imported once,
        on the first lookup (``get``, ``names``, ``in``, iteration).
    """

    def __init__(self, kind: str, builtins: Sequence[str] = ()) -> None:
        self.kind = kind
        self._builtins = tuple(builtins)
        self._entries: dict[str, T] = {}
        self._loaded = not self._builtins
        self._lock = threading.RLock()

    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]:
        """Decorator registering ``obj`` as ``name``.

        Raises:
          ValueError: ``name`` is taken by another object and ``replace`` is False.
        """
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def deco(obj: T) -> T:
            with self._lock:
                old = self._entries.get(name)
                if old is not None and old is not obj and not replace:
                    raise ValueError(f"{self.kind} {name!r} is already registered ({_describe(old)}); "
                                     "pass replace=True to override it")
                self._entries[name] = obj
            return obj
        return deco

    def add(self, name: str, obj: T, *, replace: bool = False) -> T:
        """Registers ``obj`` as ``name`` (the non-decorator form of :meth:`register`)."""
        return self.register(name, replace=replace)(obj)

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True  # set first: a built-in module may look itself up while importing
            for mod in self._builtins:
                importlib.import_module(mod)

    def get(self, name: str) -> T:
        """The entry ``name``.

        Raises:
          KeyError: unknown name; the message lists the known ones.
        """
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise KeyError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        self._load()
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self._entries)} entries)"


def _describe(obj: object) -> str:
    mod = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    return f"{mod}.{name}" if mod else str(name)
