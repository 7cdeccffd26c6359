"""A finished run's outputs: ``summary.txt``, ``curves.png`` and the exported policy (process 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from jaxrl_mt.models.hf_io import export_hf_folder
from jaxrl_mt.parallel import gather_to_host
from jaxrl_mt.rl.metrics_log import held_out_before, plot_curves, read_metrics
from jaxrl_mt.rl.run_config import TrainConfig

__all__ = ["SUMMARY_KEYS", "fmt_metrics", "write_outputs"]

# the training metrics summarised (first, last, mean) and plotted
SUMMARY_KEYS = ("reward/total", "reward/verifier", "reward/anchor", "train/kl", "train/entropy",
                "train/clip_ratio/region_mean", "train/loss", "completion/mean_length", "perf/step_s")
# plotted too when a run logs them: the held-out LiC metrics of conversation-level RL (rl.conv_recipe)
PLOT_KEYS = SUMMARY_KEYS + ("eval/lic_sharded_P", "eval/lic_sharded_A90", "eval/lic_sharded_U90_10", "eval/lic_full_P")


def fmt_metrics(d: dict[str, float]) -> str:
    """``"acc=0.250, n=4.000"``: a metrics dict on one line, keys without their prefix."""
    return ", ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in d.items())


def write_outputs(c: TrainConfig, model_cfg: Any, tokenizer: Any, params: Any, evals: dict[str, dict[str, float]], *,
                  multi: bool, is_main: bool, log: Callable[[str], None], note: str | None = None
                  ) -> dict[str, Any]:
    """Writes summary.txt, curves.png and (``c.export``) the exported policy.

    Args:
      c: the run's config (``workdir``, ``method``, ``model``, ``rl.steps``, ``export``).
      model_cfg, tokenizer: the policy's, for the export.
      params: the final policy parameters (gathered first in a multi-process run: collective).
      evals: ``{"before"|"after": metrics}`` of this run; a resumed run's "before" is read from
        ``metrics.jsonl``.
      multi, is_main: a multi-process run; this is process 0 (the only one that writes).
      log: where the summary is printed.
      note: a line for the summary (which checkpoint ``params`` are, when not the last).

    Returns:
      ``{"evals", "export", "metrics"}`` on process 0, ``{}`` elsewhere.

    Raises:
      ExportError: the export folder cannot be written; ``summary.txt`` is written before, the
        previous export is kept.
    """
    if multi and c.export:  # collective: every process takes part in gathering the weights
        params = gather_to_host(params)
    if not is_main:
        return {}
    wd = Path(c.workdir)
    rows = read_metrics(wd / "metrics.jsonl")
    train_rows = [r for r in rows if "train/loss" in r]
    plot_curves(wd / "metrics.jsonl", wd / "curves.png", list(PLOT_KEYS))
    lines = [f"run: {wd}", f"method: {c.method}  model: {c.model}  steps: {c.rl.steps}"]
    for k in SUMMARY_KEYS:
        vals = [r[k] for r in train_rows if isinstance(r.get(k), (int, float))]
        if vals:
            lines.append(f"{k:32s} first {vals[0]:.4g}  last {vals[-1]:.4g}  mean {np.mean(vals):.4g}")
    if "before" not in evals and (before := held_out_before(rows)):
        evals = {"before": before, **evals}  # a resumed run did not evaluate "before": it is in the log
    for when, ev in evals.items():
        lines.append(f"held-out {when}: " + fmt_metrics(ev))
    if note:
        lines.append(note)
    export_dir = None
    (wd / "summary.txt").write_text("\n".join(lines) + "\n")  # before the export, which may fail
    if c.export:  # atomic; a failure is one ExportError line, the previous export is kept
        export_dir = export_hf_folder(model_cfg, params, wd / "export", tokenizer=tokenizer)
        lines.append(f"exported policy: {export_dir}")
        (wd / "summary.txt").write_text("\n".join(lines) + "\n")
    log("\n".join(lines))
    return {"evals": evals, "export": str(export_dir) if export_dir else None, "metrics": train_rows}
