"""The comparison report's PNG figures, drawn from the report dict alone."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import CURVE_KEYS, DYNAMICS_KEYS, KIND_NAMES

__all__ = ["dynamics_keys", "make_plots"]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _err(cells: list[dict[str, float]], scale: float = 100.0) -> tuple[np.ndarray, np.ndarray]:
    """Bar heights and [2, n] error bars from ``{"mean"|"ratio"|"share", "lo", "hi"}`` cells."""
    def val(c: dict) -> float:
        v = c.get("mean", c.get("ratio"))
        return float("nan") if v is None else v

    h = np.array([val(c) for c in cells], np.float64) * scale
    lo = np.array([c["lo"] if c["lo"] is not None else math.nan for c in cells], np.float64) * scale
    hi = np.array([c["hi"] if c["hi"] is not None else math.nan for c in cells], np.float64) * scale
    return np.nan_to_num(h), np.nan_to_num(np.stack([h - lo, hi - h]).clip(min=0))


def _grouped(ax: Any, groups: list[str], series: dict[str, list[dict]], scale: float) -> None:
    width = 0.8 / max(len(series), 1)
    for j, (label, cells) in enumerate(series.items()):
        h, e = _err(cells, scale)
        ax.bar(np.arange(len(groups)) + (j - (len(series) - 1) / 2) * width, h, width, yerr=e, capsize=2, label=label)
    ax.set_xticks(range(len(groups)), groups)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def dynamics_keys(report: dict[str, Any]) -> list[str]:
    """The DYNAMICS_KEYS some run of the report logged (the training-dynamics figure's panels)."""
    runs = report.get("runs", {})
    return [k for k in DYNAMICS_KEYS if any(k in r["curves"] for r in runs.values())]


def _dynamics(report: dict[str, Any], out: Path, plt: Any) -> Path | None:
    """training_dynamics.png: a panel per `dynamics_keys` key, a line per run; an arm of several seeds as
    its mean curve (``report["seeds"]``, thick) over its seeds' runs (thin, same colour)."""
    keys = dynamics_keys(report)
    if not keys:
        return None
    runs, groups = report["runs"], report.get("seeds", {}).get("groups", {})
    arm_of = {m: arm for arm, g in groups.items() for m in g["models"]}
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        colours, drawn = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4), set()
        for name, r in runs.items():
            arm, pts = arm_of.get(name), r["curves"].get(key)
            if not pts or arm in drawn:
                continue
            colour = next(colours)
            if arm is None or key not in groups[arm]["curves"]:
                ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", ms=2, color=colour, label=name)
                continue
            drawn.add(arm)
            for m in groups[arm]["curve_runs"]:
                seed_pts = runs[m]["curves"][key]
                ax.plot([p[0] for p in seed_pts], [100 * p[1] for p in seed_pts], color=colour, lw=0.7, alpha=0.4)
            mean = groups[arm]["curves"][key]
            ax.plot([p[0] for p in mean], [100 * p[1] for p in mean], marker="o", ms=3, lw=2, color=colour,
                    label=f"{arm}_s* (mean of {len(groups[arm]['curve_runs'])})")
        ax.set_title(f"{key}\n{DYNAMICS_KEYS[key]}", fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("strict accuracy (%)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return _save(fig, out / "training_dynamics.png", plt)


def make_plots(report: dict[str, Any], out: Path) -> list[Path]:
    """accuracy.png, lic_score_inertia.png, response_types.png and, with runs, curves.png and
    training_dynamics.png."""
    plt = _plt()
    models = report["models"]
    names = list(models)
    paths = []
    kinds = ["full", "sharded", "mt_refine", "multi"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    _grouped(ax, [KIND_NAMES[k] for k in kinds], {n: [models[n]["strict"][k] for k in kinds] for n in names}, 100)
    ax.set_ylabel("strict accuracy, last reply (%)")
    ax.set_title("Held-out accuracy (greedy, 95% bootstrap CI)")
    paths.append(_save(fig, out / "accuracy.png", plt))

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.3))
    rk = ["sharded", "mt_refine", "multi"]
    _grouped(axes[0], [KIND_NAMES[k] for k in rk], {n: [models[n]["strict"]["ratio"][k] for k in rk] for n in names}, 1)
    axes[0].set_title("LiC score: multi / single (strict)")
    inert = {n: [models[n]["inertia"][k]["ci"] for k in ("sharded", "mt_refine", "all")] for n in names}
    _grouped(axes[1], ["MT-Add", "MT-Refine", "both"], inert, 100)
    axes[1].set_title("Contextual inertia: final = earlier wrong (%)")
    paths.append(_save(fig, out / "lic_score_inertia.png", plt))

    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), squeeze=False)
    for ax, n in zip(axes[0], names):
        per_turn = models[n]["response_types"]["sharded"]
        labels = sorted({lab for c in per_turn.values() for lab in c})
        turns = sorted(per_turn, key=int)
        bottom = np.zeros(len(turns))
        for lab in labels:
            tot = np.array([sum(per_turn[t].values()) for t in turns], np.float64)
            frac = np.array([per_turn[t].get(lab, 0) for t in turns], np.float64) / np.maximum(tot, 1)
            ax.bar([str(t) for t in turns], frac, bottom=bottom, label=lab)
            bottom += frac
        ax.set_title(f"{n}: MT-Add response types", fontsize=9)
        ax.set_xlabel("turn")
        ax.legend(fontsize=6)
    paths.append(_save(fig, out / "response_types.png", plt))

    runs = report.get("runs", {})
    keys = [k for k in CURVE_KEYS if any(k in r["curves"] for r in runs.values())]
    if keys:
        cols = min(4, len(keys))
        rows = math.ceil(len(keys) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
        for ax, k in zip(axes.flat, keys):
            for n, r in runs.items():
                pts = r["curves"].get(k)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=2, label=n)
            ax.set_title(k, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
        for ax in list(axes.flat)[len(keys):]:
            ax.axis("off")
        paths.append(_save(fig, out / "curves.png", plt))
    dyn = _dynamics(report, out, plt)
    return paths + ([dyn] if dyn else [])
