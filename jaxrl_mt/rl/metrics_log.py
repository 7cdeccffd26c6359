"""Run logging: TensorBoard events, a JSONL metrics log, sample tables and end-of-run PNG curves.

``metrics.jsonl`` is append-only; a last line cut short by a crash is dropped with one warning
when the run resumes (its step comes after the last checkpoint, so it is logged again). Rows are
keyed by ``(step, kind)`` (``kind``: ``train``, ``eval``, ``probe``; ``row_kind``): a row logged again
under a key the file holds (a rerun of a finished workdir, a rerun after a kill during the export
redoing "eval after") replaces the old one, so the file holds one row per key.

A training step's phases (``PhaseClock``, logged in every train row and as one line per logged step):
``perf/rollout_s`` (the sampler's generation), ``perf/anchor_s`` (the reward's calls of the reference
scorer: RLSTA's anchor log-probs), ``perf/reference_s`` (the rest of the rollout's scoring: the KL
reference's log-probs of the batch, plus the verifier and the example's assembly, host work of
milliseconds), ``perf/update_s`` (the optimizer step over every micro-batch and pass), each with its
tokens/s; the update's ``perf/update_tflops`` per device and ``perf/update_mfu`` against the device's
dense bf16 peak (``models.flops.PEAKS``; absent, printed n/a, where the peak is unknown: CPU);
``perf/compile_s``, the seconds JAX spent tracing, lowering and compiling during the step (a step
that compiles nothing is a steady one: ``perf/step_s`` - ``perf/compile_s`` is its steady time);
``perf/peak_memory_gib``, the first local device's peak bytes in use so far (``memory_stats()``;
absent where the backend keeps none: CPU).
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_mt.data.jsonl_log import read_jsonl_log, rewrite_jsonl
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.flops import DevicePeak, lookup_peak, mfu, train_flops_per_token

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


# ----------------------------------------------------------------------------- a step's phases

COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")  # jax._src.dispatch's duration events
_compile = {"s": 0.0, "listening": False}
_compile_lock = threading.Lock()


def _on_event(event: str, seconds: float, **_: Any) -> None:
    if event in COMPILE_EVENTS:
        with _compile_lock:
            _compile["s"] += seconds


def compile_seconds() -> float:
    """Seconds this process has spent tracing, lowering and compiling since the first call."""
    import jax

    with _compile_lock:
        if not _compile["listening"]:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _compile["listening"] = True
        return _compile["s"]


def peak_memory_bytes() -> int | None:
    """Peak bytes in use on the first local device (``memory_stats()``), None where it keeps none (CPU)."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else int(peak)


def update_work(batch: Any) -> tuple[int, int] | None:
    """(real tokens, padded sequence length) of one pass of the update over ``batch``: a rollout's
    example (prompts once per group, completions), SFT's rows, DPO's pairs (both sides); None otherwise."""
    pm, cm = getattr(batch, "prompt_mask", None), getattr(batch, "completion_mask", None)
    ch, rj = getattr(batch, "chosen_mask", None), getattr(batch, "rejected_mask", None)
    if pm is not None and ch is not None and rj is not None:
        return 2 * int(np.sum(pm)) + int(np.sum(ch)) + int(np.sum(rj)), pm.shape[1] + ch.shape[1]
    if pm is not None and cm is not None:
        return int(np.sum(pm)) + int(np.sum(cm)), pm.shape[1] + cm.shape[1]
    tm = getattr(batch, "token_mask", None)
    return None if tm is None else (int(np.sum(tm)), tm.shape[1])


class CountingScorer:
    """A ``scoring.Scorer`` that counts the seconds and the tokens (contexts + completions) of its
    ``score`` calls; everything else is the scorer's."""

    def __init__(self, scorer: Any):
        self.scorer, self.seconds, self.tokens = scorer, 0.0, 0

    def score(self, contexts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.scorer.score(contexts, completions, **kw)
        finally:
            self.seconds += time.perf_counter() - t0
            self.tokens += sum(len(a) + len(b) for a, b in zip(contexts, completions))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scorer, name)


class PhaseClock:
    """The phase split of training steps (see the module doc): ``start()`` before a step, ``phases()`` after."""

    def __init__(self, cfg: ModelConfig, *, peak: DevicePeak | None = None, devices: int | None = None):
        """Args:
          cfg: the policy's config (the update's FLOPs).
          peak: the device's peak (default: ``models.flops.lookup_peak`` of the first local device's kind).
          devices: the local devices the update's rows are split over (default: all of this process's).
        """
        import jax

        self.cfg = cfg
        self.peak = peak if peak is not None else lookup_peak(jax.local_devices()[0].device_kind)
        self.devices = devices or jax.local_device_count()
        self.anchor = CountingScorer(None)  # replaced by `count`
        self._mark = (0.0, 0, 0.0)

    def count(self, scorer: Any) -> CountingScorer:
        """``scorer`` counted as the anchor's (the reward's reference scorer)."""
        self.anchor = CountingScorer(scorer)
        return self.anchor

    def start(self) -> None:
        self._mark = (self.anchor.seconds, self.anchor.tokens, compile_seconds())

    def phases(self, m: Mapping[str, float], batch: Any, *, update_s: float, passes: int = 1) -> dict[str, float]:
        """The phase metrics of the step since ``start()``: ``m`` holds the batch builder's metrics
        (``perf/score_s`` of a rollout), ``batch`` the step's batch, ``update_s`` the update's seconds."""
        out = {"perf/update_s": update_s, "perf/compile_s": compile_seconds() - self._mark[2]}
        anchor_s, anchor_tokens = self.anchor.seconds - self._mark[0], self.anchor.tokens - self._mark[1]
        if "perf/score_s" in m:
            out["perf/anchor_s"] = anchor_s
            out["perf/reference_s"] = max(m["perf/score_s"] - anchor_s, 0.0)
            # every process logs the same keys (rl.loop's mean over processes): 0 when nothing was scored
            out["perf/anchor_tokens_per_s"] = anchor_tokens / anchor_s if anchor_tokens else 0.0
        work = update_work(batch)
        if work is not None:
            tokens, seq = work
            if getattr(batch, "ref_logp", None) is not None and "perf/reference_s" in out:
                out["perf/reference_tokens_per_s"] = tokens / max(out["perf/reference_s"], 1e-9)
            out["perf/update_tokens_per_s"] = passes * tokens / max(update_s, 1e-9)
            flops = passes * tokens * train_flops_per_token(self.cfg, seq) / self.devices
            out["perf/update_tflops"] = flops / max(update_s, 1e-9) / 1e12
            u = mfu(1, flops, max(update_s, 1e-9), self.peak)
            if u is not None:
                out["perf/update_mfu"] = u
        peak = peak_memory_bytes()
        if peak is not None:
            out["perf/peak_memory_gib"] = peak / 2 ** 30
        return out


def format_phases(step: int, m: Mapping[str, float]) -> str:
    """One line of a step's phases: seconds, tokens/s, the update's MFU, compile time, peak memory."""
    def rate(key: str) -> str:
        return f" ({m[key]:,.0f} tok/s)" if key in m else ""

    parts = [f"rollout {m['perf/rollout_s']:.2f} s{rate('perf/rollout_tokens_per_s')}"] if "perf/rollout_s" in m else []
    for name in ("anchor", "reference"):
        if f"perf/{name}_s" in m:
            parts.append(f"{name} {m[f'perf/{name}_s']:.2f} s{rate(f'perf/{name}_tokens_per_s')}")
    mfu_s = f"{m['perf/update_mfu']:.3f}" if "perf/update_mfu" in m else "n/a"
    upd = f", {m['perf/update_tokens_per_s']:,.0f} tok/s" if "perf/update_tokens_per_s" in m else ""
    if "perf/update_s" in m:
        parts.append(f"update {m['perf/update_s']:.2f} s (MFU {mfu_s}{upd})")
    mem = f"{m['perf/peak_memory_gib']:.2f} GiB" if "perf/peak_memory_gib" in m else "n/a"
    return (f"step {step} phases: " + ", ".join(parts) + f"; compile {m.get('perf/compile_s', 0.0):.2f} s of "
            f"{m.get('perf/step_s', 0.0):.2f} s; peak memory {mem}")
