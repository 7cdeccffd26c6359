"""Frozen dataclasses from config mappings: presence, unknown keys and types checked once, by dotted path.

A config file stays an ml_collections file (presets, command-line overrides); each entry point turns
it into its typed, immutable config with :func:`build` (the training config `rl.run_config`, the
evaluation config `eval.eval_config`). A field declared with a default may be absent (configs and
workdirs written before it existed); a field whose type is a dataclass is a nested section.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from typing import Any, Mapping, Union

__all__ = ["build", "check_value"]


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def check_value(path: str, value: Any, tp: Any, error: type[Exception] = ValueError) -> Any:
    """``value`` as field type ``tp``.

    Conversions: an int where a float is declared becomes a float; a list or tuple of strings where
    ``tuple[str, ...]`` is declared becomes that tuple; a mapping where ``Mapping[str, V]`` is declared
    becomes a dict, each value checked as ``V`` under ``PATH.KEY`` (``Any``: unchecked).

    Args:
      path: the field's dotted path, for the message.
      value: the raw value.
      tp: the declared type (bool, int, float, str, None, tuple[str, ...], Mapping[str, V] or a Union of them).
      error: the exception class raised.

    Returns:
      The value, converted as above.

    Raises:
      error: ``config field PATH must be TYPE, got VALUE (TYPE)``.
    """
    options = typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else (tp,)
    for t in options:
        if t is type(None) and value is None:
            return None
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is str and isinstance(value, str):
            return value
        if (typing.get_origin(t) is tuple and isinstance(value, (list, tuple))
                and all(isinstance(v, str) for v in value)):
            return tuple(value)
        if typing.get_origin(t) in (dict, collections.abc.Mapping) and isinstance(value, Mapping):
            args = typing.get_args(t)
            if len(args) < 2 or args[1] is Any:
                return dict(value)
            return {k: check_value(f"{path}.{k}", v, args[1], error) for k, v in value.items()}
    names = " or ".join(_type_name(t) for t in options)
    raise error(f"config field {path} must be {names}, got {value!r} ({type(value).__name__})")


def build(cls: type, raw: Mapping[str, Any], prefix: str = "", error: type[Exception] = ValueError) -> Any:
    """An instance of dataclass ``cls`` from ``raw``, every field checked (:func:`check_value`).

    Args:
      cls: the (frozen) dataclass; a field whose type is a dataclass (or ``X | None``) is a section.
      raw: field name -> value (a nested mapping per section, or the section's instance, kept as is).
      prefix: the dotted path of ``raw`` itself ("" at the top).
      error: the exception class raised.

    Returns:
      ``cls(**fields)``; a field absent from ``raw`` keeps its declared default.

    Raises:
      error: an unknown field, a missing field without a default, or a value of the wrong type,
        named by its dotted path (``prefix`` + name).
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise error(f"unknown config field(s) {', '.join(prefix + k for k in unknown)}")
    out = {}
    for name, f in fields.items():
        path, tp = prefix + name, hints[name]
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise error(f"config has no field {path}")
            continue
        sub = next((t for t in typing.get_args(tp) or (tp,) if dataclasses.is_dataclass(t)), None)
        if sub is not None and isinstance(raw[name], sub):
            out[name] = raw[name]  # a section built already (its own paths named in its errors)
        elif sub is not None:
            if not isinstance(raw[name], Mapping):
                raise error(f"config field {path} must be a section, got {raw[name]!r}")
            out[name] = build(sub, raw[name], path + ".", error)
        else:
            out[name] = check_value(path, raw[name], tp, error)
    return cls(**out)
