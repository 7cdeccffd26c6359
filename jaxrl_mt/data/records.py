"""Task and scenario records: small frozen dataclasses, validated on construction.

A :class:`ShardedTask` is a single-turn problem cut into a *target* shard (the question / high
level intent) and one-fact *condition* shards, plus the clean full single-turn prompt and the
gold answer of the clean problem. A :class:`Scenario` is one conversation built from a task:
the ordered user turns plus the anchor prompt (the clean full single-turn prompt, which the
RLSTA anchor reward scores the answer under).

Everything read from a file goes through these constructors, so a bad record is caught here;
loaders prefix the message with ``file:line``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

SCENARIO_KINDS = (
    "full",
    "concat",
    "sharded",
    "recap",
    "snowball",
    "mt_refine",
    "atr",
    "aiwr",
    "underspecified",
)
KIND_ALIASES = {"mt_add": "sharded"}
# the kinds a LiC evaluation simulates (``underspecified`` is ICPO's training kind)
LIC_SCENARIOS = tuple(k for k in SCENARIO_KINDS if k != "underspecified")


class DataError(ValueError):
    """A record or file that does not have the expected shape.

    The message is one line: ``path:line: field 'name': what was expected``.
    """


def _where(where: str) -> str:
    return f"{where}: " if where else ""


def canonical_kind(kind: str, *, where: str = "", field: str = "") -> str:
    """Returns the canonical scenario kind (resolving ``mt_add`` -> ``sharded``).

    Raises:
      DataError: the kind is unknown; the message lists the valid ones.
    """
    if isinstance(kind, str):
        k = KIND_ALIASES.get(kind.lower(), kind.lower())
        if k in SCENARIO_KINDS:
            return k
    valid = ", ".join(SCENARIO_KINDS + tuple(KIND_ALIASES))
    fld = f"field '{field}': " if field else ""
    raise DataError(f"{_where(where)}{fld}unknown scenario kind {kind!r}; valid kinds: {valid}")


def freeze(value: Any) -> Any:
    """Turns JSON-like values (lists, dicts) into hashable tuples, recursively."""
    if isinstance(value, Mapping):
        return tuple((str(k), freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def to_metadata(meta: Mapping[str, Any] | tuple | None) -> tuple[tuple[str, Any], ...]:
    """Normalizes a dict (or pair tuple) into the hashable metadata form, keys sorted."""
    if not meta:
        return ()
    items = meta.items() if isinstance(meta, Mapping) else meta
    return tuple(sorted((str(k), freeze(v)) for k, v in items))


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _check_str(value: Any, field: str, *, nonempty: bool = True, where: str = "") -> None:
    if not isinstance(value, str) or (nonempty and not value.strip()):
        kind = "a non-empty string" if nonempty else "a string"
        raise DataError(f"{_where(where)}field '{field}': expected {kind}, got {_short(value)}")


def _check_str_seq(value: Any, field: str, *, allow_empty: bool, where: str = "") -> None:
    ok = isinstance(value, (tuple, list)) and all(isinstance(s, str) and s.strip() for s in value)
    if not ok or (not allow_empty and not value):
        what = "a list of non-empty strings" if allow_empty else "a non-empty list of non-empty strings"
        raise DataError(f"{_where(where)}field '{field}': expected {what}, got {_short(value)}")


def _short(value: Any, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[: n - 3] + "..."


@dataclasses.dataclass(frozen=True)
class ShardedTask:
    """A single-turn problem cut into shards.

    Attributes:
      task_id: unique id, e.g. ``"gsm8k/train/12"``.
      domain: ``"math"`` (LiC also: code, database, actions, data2text, summary).
      target: the question / high-level intent shard (first user turn of MT-Add).
      conditions: one fact per shard.
      full_prompt: the clean full single-turn prompt.
      answer: gold final answer of the CLEAN problem, as a string (``"18"``, ``"3.5"``).
      corrupted: same length as ``conditions``; entry ``i`` is a corrupted version of condition
        ``i`` (numbers changed) or ``None``. ``None`` for the whole field: no corruption.
      metadata: hashable ``((key, value), ...)`` pairs; see :attr:`meta`.
    """

    task_id: str
    domain: str
    target: str
    conditions: tuple[str, ...]
    full_prompt: str
    answer: str
    corrupted: tuple[str | None, ...] | None = None
    metadata: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        # Accept lists / dicts for convenience; store the frozen forms.
        if isinstance(self.conditions, list):
            object.__setattr__(self, "conditions", tuple(self.conditions))
        if isinstance(self.corrupted, list):
            object.__setattr__(self, "corrupted", tuple(self.corrupted))
        if not isinstance(self.metadata, tuple) or any(
            not (isinstance(p, tuple) and len(p) == 2) for p in self.metadata
        ):
            object.__setattr__(self, "metadata", to_metadata(self.metadata))
        where = f"task {self.task_id!r}" if isinstance(self.task_id, str) else ""
        _check_str(self.task_id, "task_id")
        _check_str(self.domain, "domain", where=where)
        _check_str(self.target, "target", where=where)
        _check_str_seq(self.conditions, "conditions", allow_empty=True, where=where)
        _check_str(self.full_prompt, "full_prompt", where=where)
        _check_str(self.answer, "answer", nonempty=False, where=where)
        if self.corrupted is not None:
            ok = isinstance(self.corrupted, tuple) and len(self.corrupted) == len(self.conditions)
            ok = ok and all(c is None or (isinstance(c, str) and c.strip()) for c in self.corrupted)
            if not ok:
                raise DataError(
                    f"{where}: field 'corrupted': expected {len(self.conditions)} entries "
                    f"(string or None, one per condition), got {_short(self.corrupted)}"
                )

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata as a dict."""
        return dict(self.metadata)

    @property
    def shards(self) -> tuple[str, ...]:
        """All shards in LiC order: target first, then the conditions."""
        return (self.target, *self.conditions)

    @property
    def corrupted_indices(self) -> tuple[int, ...]:
        """Indices of conditions whose corrupted version differs from the original."""
        if self.corrupted is None:
            return ()
        return tuple(
            i for i, (c, o) in enumerate(zip(self.corrupted, self.conditions)) if c is not None and c != o
        )

    def replace(self, **changes) -> ShardedTask:
        """Returns a copy with ``changes`` applied (validated again)."""
        if "metadata" in changes and isinstance(changes["metadata"], Mapping):
            changes["metadata"] = to_metadata(changes["metadata"])
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["conditions"] = list(self.conditions)
        d["corrupted"] = None if self.corrupted is None else list(self.corrupted)
        d["metadata"] = {k: _thaw(v) for k, v in self.metadata}
        return d

    @classmethod
    def from_json(cls, d: Any, *, where: str = "") -> ShardedTask:
        if not isinstance(d, Mapping):
            raise DataError(f"{_where(where)}expected a JSON object, got {_short(d)}")
        for f in ("task_id", "domain", "target", "full_prompt"):
            _check_str(d.get(f), f, where=where)
        _check_str(d.get("answer"), "answer", nonempty=False, where=where)
        _check_str_seq(d.get("conditions"), "conditions", allow_empty=True, where=where)
        meta = d.get("metadata", {})
        if not isinstance(meta, Mapping):
            raise DataError(f"{_where(where)}field 'metadata': expected an object, got {_short(meta)}")
        try:
            return cls(
                task_id=d["task_id"],
                domain=d["domain"],
                target=d["target"],
                conditions=tuple(d["conditions"]),
                full_prompt=d["full_prompt"],
                answer=d["answer"],
                corrupted=None if d.get("corrupted") is None else tuple(d["corrupted"]),
                metadata=to_metadata(meta),
            )
        except DataError as e:
            raise DataError(f"{_where(where)}{e}") from None


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One conversation built from a task.

    Attributes:
      task_id: the task it was built from.
      kind: one of :data:`SCENARIO_KINDS`.
      turns: the user turns, in order (FULL has one turn).
      anchor_prompt: the clean full single-turn prompt (RLSTA's single-turn anchor).
      answer: gold answer of the clean problem.
      domain: task domain.
      removed: UNDERSPECIFIED only: indices of the removed conditions.
      metadata: hashable ``((key, value), ...)`` pairs (shard order, corrupted indices, ...).
    """

    task_id: str
    kind: str
    turns: tuple[str, ...]
    anchor_prompt: str
    answer: str
    domain: str = "math"
    removed: tuple[int, ...] = ()
    metadata: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if isinstance(self.turns, list):
            object.__setattr__(self, "turns", tuple(self.turns))
        if isinstance(self.removed, list):
            object.__setattr__(self, "removed", tuple(self.removed))
        if not isinstance(self.metadata, tuple) or any(
            not (isinstance(p, tuple) and len(p) == 2) for p in self.metadata
        ):
            object.__setattr__(self, "metadata", to_metadata(self.metadata))
        _check_str(self.task_id, "task_id")
        where = f"scenario {self.task_id!r}"
        object.__setattr__(self, "kind", canonical_kind(self.kind, where=where))
        _check_str_seq(self.turns, "turns", allow_empty=False, where=where)
        _check_str(self.anchor_prompt, "anchor_prompt", where=where)
        _check_str(self.answer, "answer", nonempty=False, where=where)
        _check_str(self.domain, "domain", where=where)
        if not isinstance(self.removed, tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.removed
        ):
            raise DataError(
                f"{where}: field 'removed': expected a list of non-negative integers, got {_short(self.removed)}"
            )

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata as a dict."""
        return dict(self.metadata)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (lists instead of tuples, metadata as an object)."""
        return {
            "task_id": self.task_id,
            "kind": self.kind,
            "turns": list(self.turns),
            "anchor_prompt": self.anchor_prompt,
            "answer": self.answer,
            "domain": self.domain,
            "removed": list(self.removed),
            "metadata": {k: _thaw(v) for k, v in self.metadata},
        }

    @classmethod
    def from_json(cls, d: Any, *, where: str = "") -> Scenario:
        """Builds a scenario from :meth:`to_json` output, checking every field.

        Args:
          d: the decoded JSON object.
          where: location prefix for errors, e.g. ``"runs/x.jsonl:12"``.

        Raises:
          DataError: ``where: field 'name': expected ...``.
        """
        if not isinstance(d, Mapping):
            raise DataError(f"{_where(where)}expected a JSON object, got {_short(d)}")
        _check_str(d.get("task_id"), "task_id", where=where)
        kind = canonical_kind(d.get("kind"), where=where, field="kind")
        _check_str_seq(d.get("turns"), "turns", allow_empty=False, where=where)
        _check_str(d.get("anchor_prompt"), "anchor_prompt", where=where)
        _check_str(d.get("answer"), "answer", nonempty=False, where=where)
        domain = d.get("domain", "math")
        _check_str(domain, "domain", where=where)
        removed = d.get("removed", [])
        if not isinstance(removed, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in removed
        ):
            raise DataError(
                f"{_where(where)}field 'removed': expected a list of non-negative integers, got {_short(removed)}"
            )
        meta = d.get("metadata", {})
        if not isinstance(meta, Mapping):
            raise DataError(f"{_where(where)}field 'metadata': expected an object, got {_short(meta)}")
        return cls(
            task_id=d["task_id"],
            kind=kind,
            turns=tuple(d["turns"]),
            anchor_prompt=d["anchor_prompt"],
            answer=d["answer"],
            domain=domain,
            removed=tuple(removed),
            metadata=to_metadata(meta),
        )
