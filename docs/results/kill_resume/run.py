"""Kill-and-resume runs against uninterrupted ones (issue 53, item 6: "Resume = the same run").

For full fine-tuning and LoRA (``lora.rank=8``) of RLSTA on the embedded SmolLM2-135M-Instruct
(``configs/rlsta.py:cpu``, shrunk: 2 prompts x 2 rows, 16 new tokens, 4 steps, a checkpoint every
step, no held-out evaluation, no export), each run through ``python -m jaxrl_mt.train``:

A  one uninterrupted run of 4 steps;
B  the same run killed with SIGKILL during step 2's update, resumed; killed with SIGKILL while
   step 3's (or 4's) checkpoint is being written (its orbax ``<step>.orbax-checkpoint-tmp*`` folder
   exists, the step folder does not), resumed with less free memory to the end;
C  (control, ``--control``) a copy of B's workdir at its last resume, without ``memory_plan.json``,
   resumed with the same lower free memory: the planner decides again, as every start did before
   the memory plan was recorded.

Free memory. The planner reads it in one place, ``jaxrl_mt.rl.step.available_memory()`` (on CPU:
``MemAvailable`` of /proc/meminfo, which neither a cgroup ``memory.max`` nor an RLIMIT changes),
and there is no setting for it. A resume with less free memory is therefore the resumed process
with ``available_memory`` replaced by a smaller figure (``--free-gib``, default 2 GiB against
the host's ~15 GiB: the planner's choice for both prompt buckets of this run goes from False
to "dots"), by the driver below; nothing in the package changes. The driver also appends a line to
a marker file when ``Trainer.update`` starts and ends (the kill moment of "mid-step").

Compared, A against B (and C): every per-step metric except ``perf/*`` (timings, throughput,
CPU seconds) and memory keys, exactly; the final checkpoint's arrays (parameters and optimizer
state), max abs difference. The package runs from a snapshot of ``HEAD``'s ``jaxrl_mt`` and
``configs`` (``git archive``), so that edits in the working tree during the runs change nothing;
``--tree`` runs the working tree instead.

Use: .venv/bin/python docs/results/kill_resume/run.py [--modes full,lora] [--control] [--work DIR]
Writes docs/results/kill_resume/result.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
STEPS = 4

COMMON = [
    "--config", "configs/rlsta.py:cpu",
    "--config.data.limit=4", "--config.data.heldout=0", "--config.history.max_new_tokens=8",
    f"--config.rl.steps={STEPS}", "--config.rl.batch_size=2", "--config.rl.group_size=2",
    "--config.rl.max_new_tokens=16", "--config.checkpoint.every=1", "--config.export=False",
    "--config.eval.max_new_tokens=8", "--config.log.samples_every=0",
]
MODES = {"full": [], "lora": ["--config.lora.rank=8"]}

# The training CLI, with two test-only changes made from outside the package: a smaller free-memory
# reading (KR_FREE_BYTES) and a marker line at the start and end of each update (KR_MARK).
DRIVER = r"""
import os, runpy, sys, time
free = os.environ.get("KR_FREE_BYTES")
if free:
    import jaxrl_mt.rl.step as step
    step.available_memory = lambda: int(free)
mark = os.environ.get("KR_MARK")
if mark:
    from jaxrl_mt.rl.loop import Trainer
    update = Trainer.update
    def marked(self, state, batch):
        n = state.step + 1
        with open(mark, "a") as f:
            f.write(f"update {n} {time.time():.3f}\n")
        out = update(self, state, batch)
        with open(mark, "a") as f:
            f.write(f"updated {n} {time.time():.3f}\n")
        return out
    Trainer.update = marked
sys.argv = ["jaxrl_mt.train", *sys.argv[1:]]
runpy.run_module("jaxrl_mt.train", run_name="__main__", alter_sys=True)
"""

PLAN_LINE = re.compile(r"rl\.remat|memory plan|memory_plan|resumed from|lock|orbax-checkpoint-tmp|error", re.I)
TMP_DIR = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")


def mem_available() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return -1


class Start:
    """One process of the training CLI on a workdir."""

    def __init__(self, src: Path, wd: Path, extra: list[str], name: str, *, free: int | None = None):
        self.wd, self.name = wd, name
        self.log_path = wd.parent / "logs" / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.mark = wd.parent / "logs" / f"{name}.marks"
        env = {**os.environ, "PYTHONPATH": str(src), "JAX_PLATFORMS": "cpu", "KR_MARK": str(self.mark)}
        env.pop("KR_FREE_BYTES", None)
        if free is not None:
            env["KR_FREE_BYTES"] = str(free)
        self.record: dict[str, Any] = {"name": name, "host_mem_available_gib": round(mem_available() / 2**30, 2),
                                       "planner_free_gib": None if free is None else round(free / 2**30, 2)}
        self.t0 = time.time()
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([PYTHON, "-c", DRIVER, *COMMON, f"--config.workdir={wd}", *extra], cwd=src,
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def marks(self) -> list[tuple[str, int, float]]:
        if not self.mark.is_file():
            return []
        out = []
        for line in self.mark.read_text().splitlines():
            kind, n, t = line.split()
            out.append((kind, int(n), float(t)))
        return out

    def kill(self, why: dict[str, Any]) -> None:
        self.proc.send_signal(signal.SIGKILL)
        rc = self.proc.wait(120)
        self.record.update(kill=why, rc=rc, wall_s=round(time.time() - self.t0, 1))

    def wait(self, timeout: float = 3600) -> None:
        rc = self.proc.wait(timeout)
        self.record.update(rc=rc, wall_s=round(time.time() - self.t0, 1))
        if rc != 0:
            raise SystemExit(f"{self.name}: exit {rc}; see {self.log_path}")

    def finish(self) -> dict[str, Any]:
        self.log.close()
        text = self.log_path.read_text(errors="replace").replace("\r", "\n")
        lines = [ln.rsplit("]", 1)[-1] if ("it/s" in ln or "s/it" in ln) else ln for ln in text.splitlines()]
        self.record["log"] = [ln.strip() for ln in lines if PLAN_LINE.search(ln)]  # tqdm's bar cut off
        return self.record

    def alive(self) -> bool:
        return self.proc.poll() is None


def steps_present(wd: Path) -> list[int]:
    d = wd / "checkpoints"
    return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if d.is_dir() else []


def metric_steps(wd: Path) -> list[int]:
    p = wd / "metrics.jsonl"
    if not p.is_file():
        return []
    return [json.loads(ln)["step"] for ln in p.read_text().splitlines() if ln.strip() and '"train"' in ln]


def kill_mid_update(s: Start, step: int, delay: float) -> None:
    """SIGKILL `delay` seconds after update `step` started; refused if that update ended first."""
    while s.alive():
        marks = s.marks()
        started = [t for kind, n, t in marks if kind == "update" and n == step]
        if any(kind == "updated" and n == step for kind, n, _ in marks):
            s.proc.send_signal(signal.SIGKILL)
            raise SystemExit(f"{s.name}: update {step} ended within {delay} s; lower the kill delay")
        if started and time.time() >= started[0] + delay:
            why = {"what": f"SIGKILL during step {step}'s update",
                   "s_after_update_start": round(time.time() - started[0], 2),
                   "checkpoints_at_kill": steps_present(s.wd), "metric_rows_at_kill": metric_steps(s.wd)}
            s.kill(why)
            why["update_ended_before_kill"] = any(kind == "updated" and n == step for kind, n, _ in s.marks())
            return
        time.sleep(0.02)
    raise SystemExit(f"{s.name}: ended (rc {s.proc.returncode}) before the kill in step {step}; see {s.log_path}")


def files_under(d: Path) -> list[Path]:
    out = []
    for root, _, names in os.walk(d):
        out += [Path(root) / n for n in names]
    return out


def kill_mid_save(s: Start, first: int) -> None:
    """SIGKILL while a checkpoint of step >= `first` is being written: its temporary folder exists and
    holds a chunk of array data of the ``state`` item (orbax writes each item into
    ``<item>.orbax-checkpoint-tmp`` and renames it when complete), the step folder does not."""
    d = s.wd / "checkpoints"
    missed: list[int] = []
    while s.alive():
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            names = []
        tmp = [n for n in names if (m := TMP_DIR.match(n)) and int(m.group(1)) >= first]
        if tmp and any(p.parts[0].startswith("state") and "d" in p.parts[1:-1]
                       for p in (q.relative_to(d / tmp[0]) for q in files_under(d / tmp[0]))):
            t = time.time()
            s.proc.send_signal(signal.SIGKILL)
            rc = s.proc.wait(120)
            step = int(TMP_DIR.match(tmp[0]).group(1))
            files = files_under(d / tmp[0])
            items = sorted(os.listdir(d / tmp[0])) if (d / tmp[0]).exists() else []
            why = {"what": f"SIGKILL while checkpoint {step} was being written", "tmp_dir": tmp[0],
                   "tmp_items_after_kill": items,
                   "tmp_files_after_kill": sorted(str(p.relative_to(d / tmp[0])) for p in files)[:20],
                   "tmp_n_files_after_kill": len(files),
                   "tmp_bytes_after_kill": sum(p.stat().st_size for p in files),
                   "step_folder_existed": str(step) in os.listdir(d), "checkpoints_after_kill": steps_present(s.wd),
                   "metric_rows_at_kill": metric_steps(s.wd), "saves_finished_unseen": missed,
                   "s_after_start": round(t - s.t0, 1)}
            s.record.update(kill=why, rc=rc, wall_s=round(time.time() - s.t0, 1))
            return
        for st in steps_present(s.wd):
            if st >= first and st not in missed:
                missed.append(st)  # finalised before a poll saw it being written
        time.sleep(0.0005)
    raise SystemExit(f"{s.name}: ended (rc {s.proc.returncode}) before a save could be killed; see {s.log_path}")


def rows(wd: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for ln in (wd / "metrics.jsonl").read_text().splitlines():
        if ln.strip():
            r = json.loads(ln)
            if r.get("kind") == "train":
                out[r["step"]] = r
    return out


def excluded(key: str) -> bool:
    return key.startswith(("perf/", "mem/", "memory/")) or "memory" in key


def compare_metrics(a: Path, b: Path) -> dict[str, Any]:
    ra, rb = rows(a), rows(b)
    keys = sorted({k for r in (*ra.values(), *rb.values()) for k in r})
    compared = [k for k in keys if not excluded(k) and k not in ("step", "kind")]
    per_step, differing = {}, []
    for step in sorted(set(ra) | set(rb)):
        x, y = ra.get(step, {}), rb.get(step, {})
        worst = 0.0
        for k in compared:
            u, v = x.get(k), y.get(k)
            if u == v:
                continue
            if isinstance(u, (int, float)) and isinstance(v, (int, float)):
                d = abs(u - v) if math.isfinite(u) and math.isfinite(v) else math.inf
            else:
                d = math.inf  # missing on one side or not a number
            worst = max(worst, d)
            differing.append({"step": step, "key": k, "a": u, "b": v})
        per_step[step] = worst
    return {"steps_a": sorted(ra), "steps_b": sorted(rb), "keys_compared": len(compared),
            "keys_excluded": [k for k in keys if excluded(k)], "max_abs_diff_per_step": per_step,
            "identical": not differing and sorted(ra) == sorted(rb) == list(range(1, STEPS + 1)),
            "differing": differing[:40], "n_differing": len(differing)}


def compare_state(src: Path, a: Path, b: Path) -> dict[str, Any]:
    """Max abs difference of the final checkpoint's arrays (orbax restore in a child, on the snapshot)."""
    code = r"""
import json, sys
import jax, numpy as np, orbax.checkpoint as ocp
def load(p):
    with ocp.StandardCheckpointer() as c:
        return c.restore(p)
x, y = load(sys.argv[1]), load(sys.argv[2])
out = {}
for part in ("params", "opt_state"):
    la, lb = jax.tree_util.tree_leaves_with_path(x[part]), jax.tree_util.tree_leaves_with_path(y[part])
    assert [p for p, _ in la] == [p for p, _ in lb]
    diffs = [float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64)))) if np.size(u) else 0.0
             for (_, u), (_, v) in zip(la, lb)]
    out[part] = {"arrays": len(la), "elements": int(sum(np.size(u) for _, u in la)), "max_abs_diff": max(diffs),
                 "bitwise_equal": all(np.array_equal(np.asarray(u), np.asarray(v)) for (_, u), (_, v) in zip(la, lb))}
print(json.dumps(out))
"""
    r = subprocess.run([PYTHON, "-c", code, str(a / "checkpoints" / str(STEPS) / "state"),
                        str(b / "checkpoints" / str(STEPS) / "state")], cwd=src, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(src), "JAX_PLATFORMS": "cpu"}, timeout=1200)
    if r.returncode != 0:
        raise SystemExit(f"state comparison failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def plan(wd: Path) -> Any:
    p = wd / "memory_plan.json"
    return json.loads(p.read_text()) if p.is_file() else None


def copy_workdir(b: Path, c: Path) -> None:
    """B's workdir as C: checkpoints hard-linked (orbax never rewrites a file), the rest copied."""
    shutil.copytree(b, c, ignore=shutil.ignore_patterns("checkpoints"))
    shutil.copytree(b / "checkpoints", c / "checkpoints", copy_function=os.link)


def run_mode(src: Path, work: Path, mode: str, free: int, control: bool) -> dict[str, Any]:
    extra = MODES[mode]
    a, b, c = work / f"{mode}_A", work / f"{mode}_B", work / f"{mode}_C"
    starts = []
    s = Start(src, a, extra, f"{mode}_A")
    s.wait()
    starts.append(s.finish())
    t_upd = {n: t for kind, n, t in s.marks() if kind == "update"}
    t_end = {n: t for kind, n, t in s.marks() if kind == "updated"}
    update_s = {n: round(t_end[n] - t_upd[n], 2) for n in t_upd}
    # a quarter of A's shortest update: inside step 2's update although a resumed start finds the
    # compiled step in the persistent compilation cache (A's step 2 compiled it)
    delay = round(0.25 * min(update_s.values()), 2)

    s = Start(src, b, extra, f"{mode}_B1")
    kill_mid_update(s, 2, delay)
    starts.append(s.finish())
    s = Start(src, b, extra, f"{mode}_B2")
    kill_mid_save(s, 3)
    starts.append(s.finish())
    if control:
        copy_workdir(b, c)
        (c / "memory_plan.json").unlink()
    plan_before = plan(b)
    s = Start(src, b, extra, f"{mode}_B3", free=free)
    s.wait()
    starts.append(s.finish())
    out: dict[str, Any] = {
        "A_update_s": update_s, "kill_delay_s": delay, "starts": starts,
        "memory_plan_A": plan(a), "memory_plan_B_before_last_resume": plan_before, "memory_plan_B": plan(b),
        "metrics_A_vs_B": compare_metrics(a, b), "state_A_vs_B": compare_state(src, a, b)}
    if control:
        s = Start(src, c, extra, f"{mode}_C", free=free)
        s.wait()
        out["control"] = {"start": s.finish(), "memory_plan_C": plan(c), "metrics_A_vs_C": compare_metrics(a, c),
                          "state_A_vs_C": compare_state(src, a, c)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="full,lora")
    ap.add_argument("--free-gib", type=float, default=2.0, help="free memory the last resume's planner reads")
    ap.add_argument("--control", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--work", default="", help="run folder (default: a new temporary one)")
    ap.add_argument("--tree", action="store_true", help="run the working tree, not a snapshot of HEAD")
    ap.add_argument("--out", default=str(HERE / "result.json"))
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="kill_resume_"))
    work.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if args.tree:
        src = ROOT
    else:
        src = work / "src"
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        archive = subprocess.run(["git", "archive", "HEAD", "jaxrl_mt", "configs"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    free = int(args.free_gib * 2**30)
    t0, cpu0 = time.time(), os.times()
    result: dict[str, Any] = {
        "commit": commit, "source": "working tree" if args.tree else f"git archive {commit[:12]}",
        "model": "builtin:smollm2-135m-instruct", "command": ["python -m jaxrl_mt.train", *COMMON],
        "modes": {m: MODES[m] for m in args.modes.split(",")}, "planner_free_bytes_last_resume": free,
        "excluded_key_rule": "perf/* and memory keys", "results": {}}
    for mode in args.modes.split(","):
        result["results"][mode] = run_mode(src, work, mode, free, args.control)
        print(f"{mode}: metrics identical {result['results'][mode]['metrics_A_vs_B']['identical']}, "
              f"state {result['results'][mode]['state_A_vs_B']}", flush=True)
    cpu1 = os.times()
    result["wall_s"] = round(time.time() - t0, 1)
    result["children_cpu_s"] = round(cpu1.children_user - cpu0.children_user + cpu1.children_system
                                     - cpu0.children_system, 1)
    result["work"] = str(work)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
