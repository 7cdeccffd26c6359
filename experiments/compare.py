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

From Python: ``compare.run(Comparison(models=("base", "runs/grpo_exp"), out="r.md", ...))``; the
command line is a thin wrapper (``parse`` builds the ``Comparison``, one field per option).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.common import compress_transcripts, eval_config, evaluation_finished, write_json
from experiments.provenance import code_version, record_evaluation, record_evaluation_time
from experiments.report import RUN_FILES, build, write

__all__ = ["Comparison", "attach_run_files", "evaluation_jobs", "extra_pairs", "greedy_only", "inference_arms",
           "main", "pairs_with", "parse", "resolve_models", "run"]

BASE = "builtin:smollm2-135m-instruct"
# The experiment presets' reply budget and system prompt (configs/rlsta.py:experiment, eval.max_new_tokens and
# system_prompt; measured in docs/results/calibration.md): every model is compared with these unless overridden.
MAX_NEW_TOKENS = 64
SYSTEM = ""


Names = tuple[str, ...]


def _opt(default: Any, help: str = "") -> Any:  # noqa: A002 (argparse's word)
    """A ``Comparison`` field: its default and its command-line help."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One comparison: the command line's options as typed fields, with its defaults (``--lic-runs``
    is ``lic_runs``; a comma-separated option is a tuple of its items)."""

    models: Names = _opt(("base",), "comma-separated: base, a training run folder, NAME=SPEC or a model spec")
    heldout: str = _opt("docs/results/heldout.jsonl", "tasks JSONL from experiments.heldout")
    out: str = _opt("docs/results/rlsta_cpu.md", "the markdown report; files go to OUT/")
    base: str = _opt(BASE, "model spec of 'base'")
    limit: int = _opt(0, "evaluate the first N held-out problems (0: all)")
    lic_runs: int = _opt(4, "LiC runs per problem at T=1 (0: skip LiC)")
    greedy_only: Names = _opt((), "comma-separated model names evaluated without LiC")
    lic_every: int = _opt(4, "LiC on every k-th evaluated problem")
    max_new_tokens: int = _opt(MAX_NEW_TOKENS, "reply budget per turn, every model")
    system: str = _opt(SYSTEM, "system prompt, every model ('': the template's default)")
    strategy: Names = _opt((), "comma-separated NAME=STRATEGY: model NAME answers with that registered strategy "
                           "(e.g. sedt=sedt: SeDT on the model named sedt)")
    recap: Names = _opt((), "comma-separated model names evaluated on LiC's RECAP in place of MT-Add and MT-Refine")
    run_files: str = _opt("", "a folder of training runs' small files (RUN_FILES): a model without a run folder "
                          "takes FOLDER/<name> when it is there")
    pairs_with: Names = _opt((), "comma-separated model names: the paired differences are those that involve one "
                             "of them (default: every pair)")
    pairs: Names = _opt((), "comma-separated B:A items: the paired difference B - A as well (e.g. an arm against "
                        "its control, when neither is in --pairs-with)")
    title: str = _opt("", "the report's title (default: the first experiment's)")
    abstain_models: Names = _opt((), "comma-separated model names that get the abstain instruction (as --abstain "
                                 "gives it to every model)")
    abstain: bool = _opt(False, "'+ Abstain': every model gets the instruction to withhold an answer while "
                         "incomplete")
    max_batch: int = _opt(64)
    seed: int = _opt(0)
    bootstrap: int = _opt(1000, "bootstrap replicates (kept in manifest.json)")
    gzip: bool = _opt(False, "gzip each transcripts.jsonl once its evaluation is done")
    recompute: bool = _opt(False, "rebuild the report from OUT/ alone")
    command: str = _opt("")  # the command line the manifest records ("": ``command_line()``); not an option

    def argv(self) -> list[str]:
        """Command-line arguments that ``parse`` turns into this comparison (the fields off their defaults)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "command" or v == f.default:
                continue
            flag = "--" + f.name.replace("_", "-")
            out += [flag] if isinstance(v, bool) else [flag, ",".join(v) if isinstance(v, tuple) else str(v)]
        return out

    def command_line(self) -> str:
        """The shell command of this comparison, as the manifest records it."""
        return self.command or "python -m experiments.compare " + shlex.join(self.argv())


def _items(text: str | Sequence[str] | None) -> list[str]:
    """The non-empty items of a comma-separated option (or of a sequence of items), stripped."""
    parts = text.split(",") if isinstance(text, str) else (text or ())
    return [x.strip() for x in parts if x.strip()]


def _names(text: str) -> Names:
    return tuple(_items(text))


def resolve_models(names: str | Sequence[str], base: str) -> list[dict[str, Any]]:
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


def pairs_with(a: Comparison, models: list[dict[str, Any]]) -> list[str]:
    """The ``--pairs-with`` names (each must be a model's).

    Raises:
      SystemExit: a name that is not among the models.
    """
    names = _items(a.pairs_with)
    unknown = sorted(set(names) - {m["name"] for m in models})
    if unknown:
        raise SystemExit(f"--pairs-with: {unknown} are not among the --models names {[m['name'] for m in models]}")
    return names


def extra_pairs(a: Comparison, models: list[dict[str, Any]]) -> list[list[str]]:
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


def greedy_only(a: Comparison) -> list[str]:
    """The model names of ``--greedy-only`` (evaluated without the LiC runs, e.g. ablations)."""
    return _items(a.greedy_only)


def inference_arms(a: Comparison, names: list[str]) -> dict[str, dict[str, Any]]:
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


def evaluation_jobs(m: dict[str, Any], greedy: Path, lic: Path, a: Comparison) -> list[tuple[str, dict[str, Any]]]:
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


def evaluate_model(m: dict[str, Any], out: Path, greedy: Path, lic: Path, a: Comparison) -> None:
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
                          reuse_cache=True,  # exact: the same transcripts; only conversations in flight hold a cache
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


def parser(defaults: Comparison = Comparison()) -> argparse.ArgumentParser:
    """The command line of ``Comparison``: one option per field, its default taken from ``defaults``."""
    ap = argparse.ArgumentParser(prog="python -m experiments.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Comparison):
        if f.name == "command":
            continue
        flag, default = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if f.type == "bool":
            ap.add_argument(flag, action="store_true", default=default, help=f.metadata["help"] or None)
        else:
            kind = {"int": int, "str": str, "Names": _names}[f.type]
            ap.add_argument(flag, type=kind, default=default, help=f.metadata["help"] or None)
    return ap


def parse(argv: Sequence[str], defaults: Comparison = Comparison()) -> Comparison:
    """The ``Comparison`` of command-line arguments, the options not given taken from ``defaults``."""
    return dataclasses.replace(defaults, **vars(parser(defaults).parse_args(list(argv))))


def _plan(a: Comparison) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """The models to evaluate (``resolve_models`` entries with their inference arms and run files) and
    the extra pairs; SystemExit on a name that is not a model's, before anything is written."""
    models = resolve_models(a.models, a.base)
    arms = inference_arms(a, [m["name"] for m in models])
    models = [{**m, **arms.get(m["name"], {})} for m in models]
    if a.run_files:
        models = attach_run_files(models, Path(a.run_files))
    unknown = sorted(set(greedy_only(a)) - {m["name"] for m in models})
    if unknown:
        raise SystemExit(f"--greedy-only: {unknown} are not among the --models names "
                         f"{[m['name'] for m in models]}")
    return models, extra_pairs(a, models)


def run(a: Comparison) -> int:
    """Evaluates the models of ``a`` (resuming what is on disk) or, with ``a.recompute``, rebuilds the
    report from ``OUT/`` alone; writes the report. Returns 0.

    Raises:
      SystemExit: a model name that is not among the models, a duplicate, a malformed item.
    """
    md = Path(a.out)
    out = md.with_suffix("")
    if not a.recompute:
        models, pairs = _plan(a)
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
                    "command": a.command_line()}
        write_json(out / "manifest.json", manifest)
        for m in models:
            print(f"evaluating {m['name']} ({m['spec']})", file=sys.stderr, flush=True)
            evaluate_model(m, out, greedy, lic, a)
    report = build(out)
    for p in write(report, out, md):
        print(f"wrote {p}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line: ``run(parse(argv))``, the manifest recording the command as given."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(dataclasses.replace(parse(argv), command="python -m experiments.compare " + shlex.join(argv)))


if __name__ == "__main__":
    sys.exit(main())
