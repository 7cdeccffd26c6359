"""Start-up checks of a training config that its sections' own checks miss (issue 32; ``TrainConfig.check``).

Every float field must be finite (``rl.lr=inf`` passed ``lr > 0`` and saved a checkpoint of infinite
parameters), and the interval and count fields must be at least 1 (``checkpoint.every=0`` was a
ZeroDivisionError after the first step).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["ConfigError", "field_checks", "flatten", "require"]


class ConfigError(ValueError):
    """A configuration that cannot run; raised at start-up, before any model is loaded."""


def require(*checks: tuple[Any, str]) -> None:
    """Raises ConfigError with the message of the first failed ``(ok, message)``."""
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)

# interval and count fields: (dotted name, least value)
_LEAST = (("checkpoint.every", 1), ("checkpoint.keep", 1), ("log.every", 1), ("log.samples_every", 0),
          ("log.n_samples", 0), ("eval.every", 0), ("eval.probe_every", 0))


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"rl.lr": 1e-6, ...}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def field_checks(config: Mapping[str, Any]) -> list[tuple[bool, str]]:
    """``(ok, message)`` pairs: every float finite, intervals and counts in range.

    Args:
      config: a training config as its nested dict (``TrainConfig.to_dict``: the file's layout).

    Returns:
      One pair per check; a failed check's message names the field and its value.
    """
    flat = flatten(config)
    checks = [(False, f"{k} must be a finite number, got {v}") for k, v in sorted(flat.items())
              if isinstance(v, float) and not math.isfinite(v)]
    for name, least in _LEAST:
        if name in flat and isinstance(flat[name], (int, float)):
            checks.append((flat[name] >= least, f"{name} must be >= {least}, got {flat[name]}"))
    return checks
