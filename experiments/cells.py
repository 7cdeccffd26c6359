"""The report's table cells: percentages with CIs, ratios, paired differences (``experiments.markdown``)."""

from __future__ import annotations

from typing import Any

__all__ = ["diff", "pct", "ratio", "tokens"]


def pct(c: dict[str, Any] | None) -> str:
    """A bootstrap mean (0-1) as "12.3 [9.1, 15.6]" percent; "-" when there is none."""
    if not c or c.get("mean") is None:
        return "-"
    return f"{100 * c['mean']:.1f} [{100 * c['lo']:.1f}, {100 * c['hi']:.1f}]"


def tokens(c: dict[str, Any]) -> str:
    """A mean token count to one decimal; "-" when there is none."""
    return "-" if c.get("mean") is None else f"{c['mean']:.1f}"


def ratio(c: dict[str, Any]) -> str:
    """A ratio with its CI when it has one: "0.54 [0.25, 1.00]"."""
    if c.get("ratio") is None:
        return "-"
    lo, hi = c.get("lo"), c.get("hi")
    return f"{c['ratio']:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{c['ratio']:.2f}"


def diff(c: dict[str, Any]) -> str:
    """A paired difference (0-1) in signed percentage points with its CI, "*" when the CI excludes 0."""
    if c.get("diff") is None:
        return "-"
    star = " *" if c["excludes_zero"] else ""
    return f"{100 * c['diff']:+.1f} [{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]{star}"
