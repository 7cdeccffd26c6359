"""Training an experiment's arms in order, resumably, on one data stage (experiments 2 and 3).

An experiment names its arms in an ``ArmPlan``: a config preset, a seed and overrides per arm, and
the arm whose run is the data stage (histories and the latent-capability filter). Every arm that
trains on histories starts from copies of the data stage's ``histories.jsonl*`` and
``train_items.jsonl*``, so all of them train on the same filtered items. The filter's samples, which
SFT and DPO turn into their rows, are written by the first of them and kept with the data stage
(``FILTER_TEXTS``): the other reads them instead of sampling them again. ICPO and RLAAR make their own
prompts from the problems of those items (``PROBLEMS``, written into the data stage's folder).
Each arm trains through ``experiments.train_arm`` (wall time, peak RSS and load in ``run_info.json``)
in ``<runs>/<arm>``; a killed arm resumes from its last checkpoint when it is trained again. A
finished arm's small files (``RUN_FILES``) and, for a LoRA arm, its adapter in bfloat16 are copied to
``<results>/<arm>/`` for commit.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from experiments.common import ROOT, refresh_copy
from experiments.report import RUN_FILES

__all__ = ["Arm", "ArmPlan", "FILTER_TEXTS", "PROBLEMS", "SHARED", "arm_command", "committed_adapter",
           "copy_shared_items", "finished", "keep_small_files", "list_arms", "same_training", "train",
           "write_item_problems"]

SHARED = ("histories.jsonl", "train_items.jsonl")
PROBLEMS = "train_problems.jsonl"  # the filtered items' problems (ICPO's and RLAAR's prompts are made from them)
FILTER_TEXTS = "filter_texts.jsonl"  # jaxrl_mt.rl.supervised.FILTER_TEXTS (not imported: no JAX in `list`)


@dataclasses.dataclass(frozen=True)
class Arm:
    """One training run: a config preset, a seed, overrides, and whether it trains on the shared items."""

    config: str
    seed: int
    overrides: tuple[str, ...] = ()
    shares_items: bool = True
    shares_texts: bool = False  # SFT and DPO: the filter's samples (FILTER_TEXTS), sampled once for both


@dataclasses.dataclass(frozen=True)
class ArmPlan:
    """An experiment's arm table (trained in this order) and its data stage.

    Attributes:
      name: the experiment's name in log lines ("exp2").
      arms: arm name -> ``Arm``; ``{data}`` in an override is the data stage's folder.
      data_arm: the arm whose run writes the histories and the filtered items.
      arms_config: the data stage's config (``FILE:preset``), whose sources hold the items' problems.
    """

    name: str
    arms: Mapping[str, Arm]
    data_arm: str
    arms_config: str


def arm_command(plan: ArmPlan, name: str, runs: Path, data: Path, extra: Sequence[str] = ()) -> list[str]:
    """The ``experiments.train_arm`` arguments of arm ``name`` (``{data}`` in an override: the data
    stage's folder), then ``extra`` overrides (``train --set``, e.g. a smaller run)."""
    a = plan.arms[name]
    return ["--config", a.config, f"--config.seed={a.seed}", f"--config.workdir={runs / name}",
            *(o.format(data=data) for o in a.overrides), *extra]


def list_arms(plan: ArmPlan, names: Sequence[str], runs: Path, results: Path, data: Path,
              extra: Sequence[str] = ()) -> None:
    """Prints each arm, whether it finished (here or in its committed files) and its command."""
    for n in names:
        state = "finished" if finished(runs / n) or finished(results / n) else "to train"
        cmd = " ".join(arm_command(plan, n, runs, data, extra))
        print(f"{n:17s} {state:9s} python -m experiments.train_arm {cmd}")


def finished(workdir: Path) -> bool:
    """The arm's training ended with exit status 0 (its last ``train_arm`` invocation)."""
    path = workdir / "run_info.json"
    if not path.is_file():
        return False
    info = json.loads(path.read_text())
    return (info.get("invocations") or [info])[-1].get("exit_status") == 0


def copy_shared_items(src: Path, dst: Path, *, require_items: bool = True,
                      data_arm: str = "the data arm") -> list[Path]:
    """Copies the data arm's histories and filtered items (and their sidecar files) into ``dst``.

    Raises:
      SystemExit: ``require_items`` and the data arm has not written its filtered items yet.
    """
    files = sorted(p for p in src.glob("*.jsonl*") if p.name.startswith(SHARED))
    if require_items and not any(p.name == "train_items.jsonl" for p in files):
        raise SystemExit(f"{src}/train_items.jsonl: not there; train {data_arm} first (it runs the data stage)")
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for p in files:
        if not (dst / p.name).exists():
            shutil.copyfile(p, dst / p.name)
            out.append(dst / p.name)
    return out


def write_item_problems(data: Path, config: str) -> Path:
    """``data/PROBLEMS``: the problems of the data stage's filtered items, from ``config``'s sources.

    ICPO and RLAAR train on their own prompts (underspecified ones; sharded ones with abstention)
    made from these problems, so every training arm sees the same problems.

    Raises:
      SystemExit: an item's problem is not among the sources' problems.
    """
    from jaxrl_mt.data.loaders import load_source, save_tasks_jsonl
    from jaxrl_mt.rl.histories import load_items
    from jaxrl_mt.runtime import load_config_file

    ids = {it.task_id for it in load_items(data / "train_items.jsonl")}
    path, preset = config.split(":")
    c = load_config_file(ROOT / path, preset)
    by_id = {t.task_id: t for spec in c.data.add_source.split(",") for t in load_source(spec.strip())}
    missing = sorted(ids - set(by_id))
    if missing:
        raise SystemExit(f"{data / 'train_items.jsonl'}: problems {missing[:3]} not in {c.data.add_source}")
    out = data / PROBLEMS
    save_tasks_jsonl(out, [by_id[i] for i in sorted(ids)])
    return out


def keep_small_files(workdir: Path, dst: Path) -> list[Path]:
    """Copies the run's small files and its adapter (bfloat16 PEFT folder) to ``dst`` (for commit)."""
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for f in RUN_FILES:
        if (workdir / f).is_file():
            out.append(Path(shutil.copyfile(workdir / f, dst / f)))
    if (workdir / "adapter" / "adapter_config.json").is_file():
        from jaxrl_mt.models.lora import copy_peft

        out.append(copy_peft(workdir / "adapter", dst / "adapter", dtype="bfloat16"))
    return out


def same_training(committed: Path, new: Path) -> list[str]:
    """The differences between two runs' ``metrics.jsonl`` (``perf/`` timings ignored): one line per
    differing record, ``[]`` when the retrained run repeats the committed one number for number."""
    def rows(path: Path) -> list[dict]:
        recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in recs]

    old, cur = rows(committed / "metrics.jsonl"), rows(new / "metrics.jsonl")
    diff = [f"record {i}: {a} != {b}" for i, (a, b) in enumerate(zip(old, cur)) if a != b]
    if len(old) != len(cur):
        diff.append(f"{len(old)} records committed, {len(cur)} now")
    return diff


def committed_adapter(name: str, results: Path) -> Path | None:
    """Arm ``name``'s committed adapter (a LoRA arm's bfloat16 PEFT folder), or None (full fine-tuning)."""
    adapter = results / name / "adapter"
    return adapter if (adapter / "adapter_config.json").is_file() else None


def _prepare(plan: ArmPlan, name: str, runs: Path, data: Path) -> None:
    """Gives arm ``name``'s workdir the data stage's files it trains on (before its run starts or resumes)."""
    wd, arm, log = runs / name, plan.arms[name], plan.name
    if name == plan.data_arm and data.is_dir():  # what the stage kept: histories, and items once filtered
        copy_shared_items(data, wd, require_items=False)
    if arm.shares_items and name != plan.data_arm:
        src = data if (data / "train_items.jsonl").is_file() else runs / plan.data_arm
        copy_shared_items(src, wd, data_arm=plan.data_arm)
    if not arm.shares_items and not (data / PROBLEMS).is_file():
        write_item_problems(data, plan.arms_config)
    if arm.shares_texts and (data / FILTER_TEXTS).is_file():  # a differing copy: refreshed
        had = (wd / FILTER_TEXTS).exists()
        if refresh_copy(data / FILTER_TEXTS, wd / FILTER_TEXTS) and had:
            print(f"{log}: {wd / FILTER_TEXTS} differed from {data / FILTER_TEXTS} (checksum): copied again",
                  file=sys.stderr, flush=True)


def _keep_stage_files(plan: ArmPlan, name: str, runs: Path, data: Path) -> None:
    """After arm ``name``'s run: the data stage's files (and the first filter samples) kept in ``data``."""
    wd = runs / name
    if name == plan.data_arm:
        copy_shared_items(wd, data, require_items=False)
    if plan.arms[name].shares_texts and (wd / FILTER_TEXTS).is_file() and not (data / FILTER_TEXTS).exists():
        shutil.copyfile(wd / FILTER_TEXTS, data / FILTER_TEXTS)  # the next supervised arm reads it


def train(plan: ArmPlan, names: list[str], runs: Path, results: Path, data: Path, extra: Sequence[str] = (),
          again: bool = False) -> int:
    """Trains ``names`` in order (finished ones skipped); returns the first non-zero exit status.

    The data stage's files are kept in ``data`` once written, and copied from there into the data
    arm's workdir when it lacks them (a fresh checkout resumes after the data stage) and into every
    arm that shares them. An arm whose committed files (``results/<arm>``) say it finished, with no
    workdir here, is skipped: it was trained in an earlier checkout. With ``again``, such an arm
    without a committed adapter (a fully fine-tuned one, whose weights are not committed) is trained
    again, and must repeat its committed ``metrics.jsonl`` (``same_training``; else status 1 and the
    committed files are kept).
    """
    for name in names:
        wd = runs / name
        # a fully fine-tuned arm of an earlier checkout trained again (or resumed doing so): checked at the end
        retrain = again and finished(results / name) and committed_adapter(name, results) is None
        if finished(results / name) and not wd.is_dir() and not retrain:
            continue  # trained in an earlier checkout: its committed files are the record
        if not finished(wd):
            _prepare(plan, name, runs, data)
            print(f"{plan.name}: training {name}", file=sys.stderr, flush=True)
            rc = subprocess.call([sys.executable, "-m", "experiments.train_arm",
                                  *arm_command(plan, name, runs, data, extra)], cwd=ROOT)
            if rc != 0:
                _keep_stage_files(plan, name, runs, data)
                return rc
        _keep_stage_files(plan, name, runs, data)  # also for an arm trained before: what it wrote is kept
        if retrain:
            diff = same_training(results / name, wd)
            if diff:
                print(f"{plan.name}: {name} trained again differs from its committed run:\n  " + "\n  ".join(diff[:5]),
                      file=sys.stderr, flush=True)
                return 1
            print(f"{plan.name}: {name} trained again repeats its committed metrics.jsonl", file=sys.stderr,
                  flush=True)
        keep_small_files(wd, results / name)
    return 0
