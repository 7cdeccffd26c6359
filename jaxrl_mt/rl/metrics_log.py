"""Run logging: TensorBoard events, a JSONL metrics log, sample tables and end-of-run PNG curves.

``metrics.jsonl`` is append-only; a last line cut short by a crash is dropped with one warning
when the run resumes (its step comes after the last checkpoint, so it is logged again). Rows are
keyed by ``(step, kind)`` (``kind``: ``train``, ``eval``, ``probe``; ``row_kind``): a row logged again
under a key the file holds (a rerun of a finished workdir, a rerun after a kill during the export
redoing "eval after") replaces the old one, so the file holds one row per key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxrl_mt.data.jsonl_log import read_jsonl_log, rewrite_jsonl

TRAIN_PREFIXES = ("reward", "train", "completion", "perf")  # the keys of a training step's row


def row_kind(keys: Sequence[str]) -> str:
    """The kind of a metrics row from its keys: ``train`` (reward/, train/, ...), else their prefixes joined."""
    prefixes = sorted({k.split("/")[0] for k in keys if k not in ("step", "kind")})
    if any(p in TRAIN_PREFIXES for p in prefixes):
        return "train"
    return "+".join(prefixes) or "empty"


def _key(row: Mapping[str, Any]) -> tuple[Any, str]:
    return row.get("step"), str(row.get("kind") or row_kind(list(row)))


class MetricsLog:
    """Writes scalars to TensorBoard (tensorboardX) and `<workdir>/metrics.jsonl` from process 0."""

    def __init__(self, workdir: str | Path, *, enabled: bool = True):
        self.dir = Path(workdir)
        self.enabled = enabled
        self.jsonl = self.dir / "metrics.jsonl"
        self.tb = None
        self._keys: set[tuple[Any, str]] | None = None  # (step, kind) of the file's rows, read on first use
        if enabled:
            try:
                from tensorboardX import SummaryWriter

                self.tb = SummaryWriter(str(self.dir / "tb"))
            except ImportError:  # TensorBoard is optional; the JSONL log is not
                self.tb = None

    def truncate_after(self, step: int) -> None:
        """Drops log lines of steps > step (a resumed run rewrites them), a truncated last line and
        all but the last row of each (step, kind); the file is replaced atomically."""
        if not self.enabled or not self.jsonl.exists():
            return
        rows = [r for _, r in read_jsonl_log(self.jsonl, repair=True) if r.get("step", 0) <= step]
        last = {_key(r): i for i, r in enumerate(rows)}
        rewrite_jsonl(self.jsonl, [r for i, r in enumerate(rows) if last[_key(r)] == i])
        self._keys = set(last)

    def scalars(self, step: int, values: Mapping[str, float], kind: str | None = None) -> None:
        """Logs one row ``{"step", "kind", **values}``; a row of the same (step, kind) is replaced.

        Args:
          step: the training step.
          values: metric name -> number (non-finite numbers are written as strings).
          kind: the row's kind (default: ``row_kind`` of the names).
        """
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in values.items()}
        key = (step, kind or row_kind(list(clean)))
        if self._keys is None:
            self._keys = {_key(r) for r in read_metrics(self.jsonl)}
        if key in self._keys:  # logged before (a rerun): replace the old row
            rewrite_jsonl(self.jsonl, [r for r in read_metrics(self.jsonl) if _key(r) != key])
        self._keys.add(key)
        with open(self.jsonl, "a") as f:
            row = {k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}
            f.write(json.dumps({"step": step, "kind": key[1], **row}) + "\n")
        if self.tb is not None:
            for k, v in clean.items():
                self.tb.add_scalar(k, v, step)

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> str:
        """Logs a markdown table of sample completions; returns it."""
        if not rows:
            return ""
        cols = list(rows[0].keys())
        esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")[:300]  # noqa: E731
        md = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
        md += "".join("| " + " | ".join(esc(r[c]) for c in cols) + " |\n" for r in rows)
        if self.enabled:
            with open(self.dir / "samples.md", "a") as f:
                f.write(f"\n## step {step}\n\n{md}")
            if self.tb is not None:
                self.tb.add_text("samples", md, step)
        return md

    def close(self) -> None:
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The JSONL metrics log as a list of dicts (a last line being written is skipped)."""
    return [r for _, r in read_jsonl_log(path, warn=lambda _: None)]


def held_out_before(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The held-out metrics logged at step 0 (before training), e.g. for a resumed run's summary."""
    return {k: v for r in rows if r.get("step") == 0 for k, v in r.items() if k.startswith("eval/")}


def plot_curves(path: str | Path, out_png: str | Path, keys: Sequence[str]) -> Path:
    """Plots the given metric keys against step into one PNG (one panel per key)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(path)
    keys = [k for k in keys if any(k in r for r in rows)]
    n = max(len(keys), 1)
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    for ax, k in zip(axes.flat, keys):
        pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", ms=3)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return Path(out_png)
