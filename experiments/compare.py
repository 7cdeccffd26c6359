"""Compare models on the held-out set and write the report with plots.

    python -m experiments.compare --models base,runs/grpo_exp,runs/rlsta_exp,runs/icpo_exp \\
        --heldout docs/results/heldout.jsonl --out docs/results/rlsta_cpu.md

``--models``: comma-separated; ``base`` is ``--base`` (default the embedded model), a training
run folder (with ``config.json`` and ``checkpoints/``) is its latest checkpoint (``workdir:PATH``),
``NAME=SPEC`` a model spec under that name (e.g. a committed adapter, ``BASE+lora:DIR``), anything
else a model spec. Inference-time arms are named models too: ``--strategy sedt=sedt`` answers with
SeDT, ``--recap recap`` puts LiC's RECAP in place of MT-Add and MT-Refine (e.g. ``--models
base,sedt=BASE,recap=BASE``). Each model is evaluated with the same seeds through ``jaxrl_mt.evaluate``:

1. greedy (T = 0), FULL + MT-Add + MT-Refine, one run per problem, ``final_turn`` protocol: the
   accuracy tables, paired differences, LiC score (multi / single), inertia and response types;
2. LiC (T = 1, ``--lic-runs`` runs, ``lic`` protocol), FULL + SHARDED, on every
   ``--lic-every``-th problem: P / A90 / U90-10.

Everything goes under ``OUT`` (the markdown path without ``.md``): per-model transcripts, a copy
of each run's small files (metrics, config, run info, filter statistics), ``manifest.json``,
``report.json`` and PNG plots (see ``experiments.report``). ``--recompute`` rebuilds the
report from those files alone; a rerun resumes the evaluations already on disk.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from experiments.common import compress_transcripts, eval_config, evaluation_finished, write_json
from experiments.provenance import code_version, record_evaluation, record_evaluation_time
from experiments.report import RUN_FILES, build, write

__all__ = ["attach_run_files", "evaluation_jobs", "extra_pairs", "greedy_only", "inference_arms", "main",
           "pairs_with", "resolve_models"]

BASE = "builtin:smollm2-135m-instruct"
# The experiment presets' reply budget and system prompt (configs/rlsta.py:experiment, eval.max_new_tokens and
# system_prompt; measured in docs/results/calibration.md): every model is compared with these unless overridden.
MAX_NEW_TOKENS = 64
SYSTEM = ""


def _items(text: str | None) -> list[str]:
    """The non-empty items of a comma-separated option, stripped."""
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def resolve_models(names: str, base: str) -> list[dict[str, Any]]:
    """``[{"name", "spec", "run_dir"}]`` for the ``--models`` list (names must be unique).

    An item ``NAME=SPEC`` (NAME of letters, digits, ``_ . -``) names a model spec, e.g. a committed
    adapter ``grpo_s0=builtin:smollm2-135m-instruct+lora:docs/results/exp2/runs/grpo_s0/adapter``.
    """
    out: list[dict[str, Any]] = []
    for item in _items(names):
        named = re.fullmatch(r"([A-Za-z0-9_.-]+)=(.+)", item)
        if named:
            out.append({"name": named.group(1), "spec": named.group(2), "run_dir": None})
        elif item == "base":
            out.append({"name": "base", "spec": base, "run_dir": None})
        elif (Path(item) / "config.json").is_file() and (Path(item) / "checkpoints").is_dir():
            out.append({"name": Path(item).name, "spec": f"workdir:{item}", "run_dir": item})
        else:
            out.append({"name": item.replace("/", "_").replace(":", "_"), "spec": item, "run_dir": None})
    seen = [m["name"] for m in out]
    dup = {n for n in seen if seen.count(n) > 1}
    if dup:
        raise SystemExit(f"--models: duplicate model names {sorted(dup)}; rename the run folders")
    if not out:
        raise SystemExit("--models: no model given")
    return out


def attach_run_files(models: list[dict[str, Any]], folder: Path) -> list[dict[str, Any]]:
    """Models without a run folder (e.g. committed adapters) take ``folder/<name>`` as theirs when it
    holds a ``run_info.json`` (a training run's small files, as ``experiments.exp2`` commits them)."""
    return [{**m, "run_dir": m["run_dir"] or (str(folder / m["name"]) if (folder / m["name"] / "run_info.json")
                                              .is_file() else None)} for m in models]


def _subset(heldout: Path, out: Path, limit: int, every: int) -> tuple[Path, Path, list[Any]]:
    """The evaluated problems (first ``limit``) and the LiC subset (every ``every``-th), as tasks files."""
    from jaxrl_mt.data.loaders import load_tasks_jsonl, save_tasks_jsonl

    tasks = load_tasks_jsonl(heldout)
    tasks = tasks[:limit] if limit else tasks
    greedy, lic = out / "tasks.jsonl", out / "lic_tasks.jsonl"
    save_tasks_jsonl(greedy, tasks)
    save_tasks_jsonl(lic, tasks[::every])
    return greedy, lic, tasks


def pairs_with(a: argparse.Namespace, models: list[dict[str, Any]]) -> list[str]:
    """The ``--pairs-with`` names (each must be a model's).

    Raises:
      SystemExit: a name that is not among the models.
    """
    names = _items(a.pairs_with)
    unknown = sorted(set(names) - {m["name"] for m in models})
    if unknown:
        raise SystemExit(f"--pairs-with: {unknown} are not among the --models names {[m['name'] for m in models]}")
    return names


def extra_pairs(a: argparse.Namespace, models: list[dict[str, Any]]) -> list[list[str]]:
    """The ``--pairs`` items as ``[[b, a], ...]`` (``B:A``: the paired difference B - A, whatever
    ``--pairs-with`` keeps; both must be models' names).

    Raises:
      SystemExit: an item that is not ``B:A``, or a name that is not among the models.
    """
    names = {m["name"] for m in models}
    out = []
    for item in _items(a.pairs):
        pair = item.split(":")
        if len(pair) != 2 or not all(pair):
            raise SystemExit(f"--pairs: {item!r} is not B:A")
        unknown = sorted(set(pair) - names)
        if unknown:
            raise SystemExit(f"--pairs: {unknown} are not among the --models names {sorted(names)}")
        out.append(pair)
    return out


def greedy_only(a: argparse.Namespace) -> list[str]:
    """The model names of ``--greedy-only`` (evaluated without the LiC runs, e.g. ablations)."""
    return _items(a.greedy_only)


def inference_arms(a: argparse.Namespace, names: list[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"strategy": ...}, {"recap": True} and/or {"abstain": True}}`` from ``--strategy``,
    ``--recap`` and ``--abstain-models`` (a model trained to abstain, e.g. RLAAR, is evaluated with
    the instruction it was trained with; ``--abstain`` gives it to every model).

    Raises:
      SystemExit: a name that is not among ``names``, or a malformed ``NAME=STRATEGY`` item.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in _items(a.strategy):
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)=([A-Za-z0-9_.-]+)", item)
        if not m:
            raise SystemExit(f"--strategy: {item!r} is not NAME=STRATEGY")
        out.setdefault(m.group(1), {})["strategy"] = m.group(2)
    for name in _items(a.recap):
        out.setdefault(name, {})["recap"] = True
    for name in _items(a.abstain_models):
        out.setdefault(name, {})["abstain"] = True
    unknown = sorted(set(out) - set(names))
    if unknown:
        raise SystemExit(f"--strategy / --recap / --abstain-models: {unknown} are not among the --models names "
                         f"{names}")
    return out


def evaluation_jobs(m: dict[str, Any], greedy: Path, lic: Path, a: argparse.Namespace
                    ) -> list[tuple[str, dict[str, Any]]]:
    """``[(subfolder, evaluate config fields)]`` of one model (``resolve_models`` entry): greedy always,
    LiC unless skipped. A ``recap`` model answers LiC's RECAP (the sharded turns, then one that
    recaps every shard) where the others answer MT-Add (SHARDED), and no MT-Refine (RECAP has no
    corrections); a ``strategy`` model answers with that registered strategy (e.g. ``sedt``); an
    ``abstain`` model gets the abstain instruction."""
    multi = "recap" if m.get("recap") else "sharded,mt_refine"
    extra = {**({"strategy": m["strategy"]} if m.get("strategy") else {}),
             **({"abstain": True} if m.get("abstain") else {})}
    jobs = [("greedy", dict(dataset=(f"tasks:{greedy}",), scenarios=f"full,{multi}", runs=1,
                            temperature=0.0, protocol="final_turn", **extra))]
    if a.lic_runs and m["name"] not in greedy_only(a):
        jobs.append(("lic", dict(dataset=(f"tasks:{lic}",), scenarios="full,recap" if m.get("recap") else
                                 "full,sharded", runs=a.lic_runs, temperature=1.0, protocol="lic", **extra)))
    return jobs


def evaluate_model(m: dict[str, Any], out: Path, greedy: Path, lic: Path, a: argparse.Namespace) -> None:
    """Runs (or resumes) the greedy and LiC evaluations of one model into ``OUT/models/<name>/``."""
    from jaxrl_mt.evaluate import evaluate, load_eval_model

    base = out / "models" / m["name"]
    model = None
    for sub, kw in evaluation_jobs(m, greedy, lic, a):
        wd = base / sub
        if evaluation_finished(wd):
            continue  # finished and compressed by an earlier invocation
        model = model or load_eval_model(m["spec"])
        cfg = eval_config(model=m["spec"], limit=0, max_new_tokens=a.max_new_tokens, system_prompt=a.system,
                          max_batch=a.max_batch, workdir=str(wd), plots=False, seed=a.seed, bootstrap=200,
                          reuse_cache=False,  # reuse would keep every conversation's KV cache (GBs)
                          **{"abstain": a.abstain, **kw})
        record_evaluation(wd)  # which code writes (this part of) the evaluation
        res = evaluate(cfg, model=model)
        record_evaluation_time(wd, res["seconds"], res["n_generated"])  # the comparison's compute
        if a.gzip:
            compress_transcripts(wd)
    if m["run_dir"]:
        dst = out / "runs" / m["name"]
        dst.mkdir(parents=True, exist_ok=True)
        for f in RUN_FILES:
            if (Path(m["run_dir"]) / f).is_file():
                shutil.copyfile(Path(m["run_dir"]) / f, dst / f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="base")
    ap.add_argument("--heldout", default="docs/results/heldout.jsonl", help="tasks JSONL from experiments.heldout")
    ap.add_argument("--out", default="docs/results/rlsta_cpu.md", help="the markdown report; files go to OUT/")
    ap.add_argument("--base", default=BASE, help="model spec of 'base'")
    ap.add_argument("--limit", type=int, default=0, help="evaluate the first N held-out problems (0: all)")
    ap.add_argument("--lic-runs", type=int, default=4, help="LiC runs per problem at T=1 (0: skip LiC)")
    ap.add_argument("--greedy-only", default="", help="comma-separated model names evaluated without LiC")
    ap.add_argument("--lic-every", type=int, default=4, help="LiC on every k-th evaluated problem")
    ap.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="reply budget per turn, every model")
    ap.add_argument("--system", default=SYSTEM, help="system prompt, every model ('': the template's default)")
    ap.add_argument("--strategy", default="", help="comma-separated NAME=STRATEGY: model NAME answers with "
                    "that registered strategy (e.g. sedt=sedt: SeDT on the model named sedt)")
    ap.add_argument("--recap", default="", help="comma-separated model names evaluated on LiC's RECAP in place "
                    "of MT-Add and MT-Refine")
    ap.add_argument("--run-files", default="", help="a folder of training runs' small files (RUN_FILES): "
                    "a model without a run folder takes FOLDER/<name> when it is there")
    ap.add_argument("--pairs-with", default="", help="comma-separated model names: the paired differences are "
                    "those that involve one of them (default: every pair)")
    ap.add_argument("--pairs", default="", help="comma-separated B:A items: the paired difference B - A as "
                    "well (e.g. an arm against its control, when neither is in --pairs-with)")
    ap.add_argument("--title", default="", help="the report's title (default: the first experiment's)")
    ap.add_argument("--abstain-models", default="", help="comma-separated model names that get the abstain "
                    "instruction (as --abstain gives it to every model)")
    ap.add_argument("--abstain", action="store_true",
                    help="'+ Abstain': every model gets the instruction to withhold an answer while incomplete")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates (kept in manifest.json)")
    ap.add_argument("--gzip", action="store_true", help="gzip each transcripts.jsonl once its evaluation is done")
    ap.add_argument("--recompute", action="store_true", help="rebuild the report from OUT/ alone")
    a = ap.parse_args(argv)
    md = Path(a.out)
    out = md.with_suffix("")
    if not a.recompute:
        models = resolve_models(a.models, a.base)
        arms = inference_arms(a, [m["name"] for m in models])
        models = [{**m, **arms.get(m["name"], {})} for m in models]
        if a.run_files:
            models = attach_run_files(models, Path(a.run_files))
        unknown = sorted(set(greedy_only(a)) - {m["name"] for m in models})
        if unknown:
            raise SystemExit(f"--greedy-only: {unknown} are not among the --models names "
                             f"{[m['name'] for m in models]}")
        pairs = extra_pairs(a, models)
        out.mkdir(parents=True, exist_ok=True)
        greedy, lic, tasks = _subset(Path(a.heldout), out, a.limit, a.lic_every)
        from experiments.analysis import family_of

        manifest = {"models": models, "heldout": a.heldout, "n_problems": len(tasks),
                    "families": sorted({family_of(t.task_id) for t in tasks}),
                    "lic_problems": len(tasks[::a.lic_every]) if a.lic_runs else 0, "lic_runs": a.lic_runs,
                    "greedy_only": greedy_only(a),
                    "max_new_tokens": a.max_new_tokens, "system": a.system, "seed": a.seed, "bootstrap": a.bootstrap,
                    **({"abstain": True} if a.abstain else {}), "code": code_version(),
                    **({"title": a.title} if a.title else {}),
                    **({"pairs_with": pairs_with(a, models)} if a.pairs_with else {}),
                    **({"pairs": pairs} if pairs else {}),
                    "command": "python -m experiments.compare " + shlex.join(argv if argv is not None
                                                                                       else sys.argv[1:])}
        write_json(out / "manifest.json", manifest)
        for m in models:
            print(f"evaluating {m['name']} ({m['spec']})", file=sys.stderr, flush=True)
            evaluate_model(m, out, greedy, lic, a)
    report = build(out)
    for p in write(report, out, md):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
